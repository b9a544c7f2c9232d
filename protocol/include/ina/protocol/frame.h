// Ethernet/IPv4/UDP framing for kernel-bypass data planes (the DPDK aggregator now, kernel-bypass
// worker transports later): classify a received frame (INA datagram for us, ARP request for our
// address, ICMP echo request, or a counted drop reason), answer ARP and ICMP echo in place, and
// turn a received INA frame into its UDP reply in place (swap addresses and ports, fix lengths and
// checksums) without copying the payload. Pure logic over byte buffers: no DPDK, no allocation.
//
// Checks on an IPv4 frame: version 4, header length 20..60 and within the frame, total length
// between the header length and the frame (Ethernet padding after it is ignored), no fragment
// (MF or offset set), header checksum (unless the NIC vouched for it), destination = our address,
// then for UDP: length >= 8 and == IP payload length, checksum when non-zero (unless vouched),
// destination port = ours.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "ina/base/status.h"
#include "ina/protocol/wire.h"

namespace ina::frame {

inline constexpr size_t kEthHeader = 14;
inline constexpr size_t kIpv4MinHeader = 20;
inline constexpr size_t kUdpHeader = 8;
inline constexpr size_t kIcmpHeader = 8;
inline constexpr size_t kArpPayload = 28;
inline constexpr size_t kUdpHeadroom = kEthHeader + kIpv4MinHeader + kUdpHeader;  // 42
inline constexpr uint16_t kEtherTypeIpv4 = 0x0800;
inline constexpr uint16_t kEtherTypeArp = 0x0806;
inline constexpr uint8_t kIpProtoIcmp = 1;
inline constexpr uint8_t kIpProtoUdp = 17;

using Mac = std::array<uint8_t, 6>;

// Parses "aa:bb:cc:dd:ee:ff".
Result<Mac> parse_mac(std::string_view text);
std::string format_mac(const Mac& m);
// Parses dotted IPv4 into host order.
Result<uint32_t> parse_ipv4(std::string_view text);
std::string format_ipv4(uint32_t host_order);

// Our identity on the link.
struct LocalConfig {
  Mac mac{};
  uint32_t ip = 0;        // host order
  uint16_t udp_port = 0;  // host order
};

// What a frame is. Everything after kIcmpEcho is a drop reason.
enum class Verdict : uint8_t {
  kIna,            // UDP to our address and port: out.ina is the INA datagram
  kArpRequest,     // ARP request for our address: answer with arp_reply()
  kIcmpEcho,       // ICMP echo request to our address: answer with icmp_echo_reply()
  kTooShort,       // shorter than an Ethernet header, or than the headers it announces
  kBadEtherType,   // neither IPv4 nor ARP (VLAN tags included)
  kArpMalformed,   // not Ethernet/IPv4 ARP, or truncated
  kArpNotRequest,  // ARP reply or other opcode (we never ask)
  kArpNotForUs,    // ARP request for another address
  kBadIpVersion,
  kBadIpHeaderLength,  // IHL < 5 or beyond the frame
  kBadIpTotalLength,   // total length < header length or beyond the frame
  kIpFragment,         // MF set or fragment offset non-zero: refused
  kBadIpChecksum,
  kIpNotForUs,     // destination address is not ours
  kBadIpProtocol,  // neither UDP nor ICMP
  kBadUdpLength,   // UDP length < 8 or != IP payload length
  kBadUdpChecksum,
  kWrongUdpPort,
  kIcmpMalformed,  // truncated ICMP message
  kIcmpNotEcho,    // ICMP other than echo request
  kBadIcmpChecksum,
  kCount_,
};
std::string_view verdict_name(Verdict v);
inline bool is_drop(Verdict v) { return v > Verdict::kIcmpEcho; }

// Checksum checks the NIC already made (DPDK's RX offload flags). A check marked good is skipped;
// a check the NIC found bad is a drop without recomputing.
enum class HwCheck : uint8_t { kUnknown, kGood, kBad };
struct RxOffload {
  HwCheck ip = HwCheck::kUnknown;
  HwCheck l4 = HwCheck::kUnknown;
};

// Offsets found by classify(); valid for kIna, kArpRequest, kIcmpEcho.
struct Parsed {
  size_t l3 = kEthHeader;        // IPv4 or ARP header
  size_t l4 = 0;                 // UDP or ICMP header
  size_t l3_len = 0;             // IP total length (frame bytes after l3 + l3_len are padding)
  std::span<const uint8_t> ina;  // INA datagram (UDP payload), for kIna
  // The sender, for kIna (host order): where the reply goes.
  Mac src_mac{};
  uint32_t src_ip = 0;
  uint16_t src_port = 0;
};

Verdict classify(std::span<const uint8_t> frame, const LocalConfig& local, RxOffload offload,
                 Parsed* out);

// Per-verdict counters; one writer.
struct Counters {
  std::array<uint64_t, static_cast<size_t>(Verdict::kCount_)> by_verdict{};
  void add(Verdict v) { ++by_verdict[static_cast<size_t>(v)]; }
  uint64_t get(Verdict v) const { return by_verdict[static_cast<size_t>(v)]; }
  uint64_t dropped() const {
    uint64_t t = 0;
    for (size_t i = static_cast<size_t>(Verdict::kTooShort); i < by_verdict.size(); ++i) {
      t += by_verdict[i];
    }
    return t;
  }
};

// ---- Internet checksum (RFC 1071) ----
// 32-bit accumulation of big-endian 16-bit words; fold() gives the 16-bit one's-complement sum.
// Inline: most calls sum a fixed-size header (20-byte IPv4, 8-byte UDP, 32-byte INA), which the
// compiler then unrolls (the per-call loop showed in the DPDK loop's profile).
inline uint32_t sum16(const uint8_t* p, size_t n, uint32_t acc = 0) {
  // 64-bit accumulation of 32-bit big-endian words, folded at the end: no overflow below 16 GiB.
  uint64_t s = acc;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s += (uint32_t{p[i]} << 24) | (uint32_t{p[i + 1]} << 16) | (uint32_t{p[i + 2]} << 8) | p[i + 3];
  }
  if (i + 2 <= n) {
    s += (uint32_t{p[i]} << 8) | p[i + 1];
    i += 2;
  }
  if (i < n) s += uint32_t{p[i]} << 8;
  while (s >> 32) s = (s & 0xFFFFFFFF) + (s >> 32);
  const uint32_t r = static_cast<uint32_t>(s);
  return (r >> 16) + (r & 0xFFFF);
}
// sum16() for long spans (a datagram's payload): the same result up to one's-complement
// equivalence (fold() of both agree), four 32-bit words at a time in the host's byte order (the
// one's-complement sum is byte-order independent, RFC 1071 2(B): the native sum is swapped once at
// the end). classify()'s UDP and ICMP checksum checks; sum16() stays for fixed-size headers.
uint32_t sum16_bulk(const uint8_t* p, size_t n, uint32_t acc = 0);
inline uint16_t fold(uint32_t acc) {
  while (acc >> 16) acc = (acc & 0xFFFF) + (acc >> 16);
  return static_cast<uint16_t>(acc);
}
// Writes `n` int32 values big-endian at `dst` (as wire::store_payload does) and returns sum16() of
// the bytes written, in one pass: the sum of the 16-bit halves of each value is the sum of its two
// big-endian 16-bit words, so no byte swap is needed for it. The aggregator's result encoder.
uint32_t store_payload_sum16(uint8_t* dst, const int32_t* src, size_t n);
// Copies n payload bytes to dst and returns sum16() of them (up to one's-complement
// equivalence), the aggregator's result path (wire v2 payloads are copied, not encoded).
uint32_t copy_sum16(uint8_t* dst, const uint8_t* src, size_t n);
// Checksum field value over `n` bytes (the field itself must be zero in the data).
inline uint16_t checksum(const uint8_t* p, size_t n) {
  return static_cast<uint16_t>(~fold(sum16(p, n)));
}

// ---- replies, built in place in the received frame ----
// ARP reply to a kArpRequest frame; returns the reply's length (28-byte ARP after Ethernet).
size_t arp_reply(uint8_t* frame, const Parsed& p, const LocalConfig& local);
// ---- ARP as a client (kernel-bypass workers resolving the aggregator) ----
// Writes a broadcast ARP request "who has target_ip, tell local" (42 bytes) at `frame`.
size_t arp_request(uint8_t* frame, const LocalConfig& local, uint32_t target_ip);
// For a frame that classify() called kArpNotRequest: when it is an Ethernet/IPv4 ARP reply
// addressed to local.ip, stores the sender's addresses and returns true.
bool arp_reply_sender(std::span<const uint8_t> frame, const LocalConfig& local, uint32_t* ip,
                      Mac* mac);

// ICMP echo reply to a kIcmpEcho frame; returns the reply's length (padding dropped).
size_t icmp_echo_reply(uint8_t* frame, const Parsed& p, const LocalConfig& local);

// A UDP endpoint on the link.
struct Endpoint {
  Mac mac{};
  uint32_t ip = 0;    // host order
  uint16_t port = 0;  // host order
};

// Writes Ethernet + 20-byte IPv4 + UDP headers (kUdpHeadroom bytes at `frame`) for a datagram of
// `payload_len` bytes that follows them, with both checksums. `payload_sum` is sum16() of the
// payload, computed once when the same payload goes to several destinations. Returns the frame
// length. `ip_id` is the IPv4 identification (DF is set).
size_t write_udp_headers(uint8_t* frame, const Endpoint& src, const Endpoint& dst,
                         size_t payload_len, uint32_t payload_sum, uint16_t ip_id);

// The headers write_udp_headers() writes from `src` to `dst`, prepared once per destination: the
// fixed bytes and the partial sums of both checksums. write() then produces, byte for byte, what
// write_udp_headers() would for one datagram, with one 42-byte copy, four stores and two folds
// instead of building and summing the headers (the aggregator's reply to every rank).
class UdpHeaderTemplate {
 public:
  UdpHeaderTemplate() = default;
  UdpHeaderTemplate(const Endpoint& src, const Endpoint& dst);

  size_t write(uint8_t* frame, size_t payload_len, uint32_t payload_sum, uint16_t ip_id) const {
    std::memcpy(frame, bytes_.data(), kUdpHeadroom);
    const uint32_t udp_len = static_cast<uint32_t>(kUdpHeader + payload_len);
    const uint32_t ip_len = kIpv4MinHeader + udp_len;
    uint8_t* ip = frame + kEthHeader;
    wire::put_u16(ip + 2, static_cast<uint16_t>(ip_len));
    wire::put_u16(ip + 4, ip_id);
    wire::put_u16(ip + 10, static_cast<uint16_t>(~fold(ip_sum_ + ip_len + ip_id)));
    uint8_t* udp = ip + kIpv4MinHeader;
    wire::put_u16(udp + 4, static_cast<uint16_t>(udp_len));
    // The UDP length counts twice: in the pseudo header and in the UDP header.
    uint16_t c = static_cast<uint16_t>(~fold(udp_sum_ + 2 * udp_len + fold(payload_sum)));
    if (c == 0) c = 0xFFFF;  // 0 means "no checksum" in UDP over IPv4
    wire::put_u16(udp + 6, c);
    return kUdpHeadroom + payload_len;
  }

 private:
  std::array<uint8_t, kUdpHeadroom> bytes_{};  // length, id and checksum fields zero
  uint32_t ip_sum_ = 0;   // sum16 of the IPv4 header without length, id and checksum
  uint32_t udp_sum_ = 0;  // pseudo header and UDP header without the lengths and checksum
};

// Turns a kIna frame into a reply to its sender: the reply datagram (`reply_len` bytes) must
// already be written at frame + kUdpHeadroom. IP options of the request are dropped (the reply
// has a 20-byte header), so when the request had options the caller writes the reply datagram
// after calling udp_reply_offset(). Returns the frame length.
inline size_t udp_reply_offset() { return kUdpHeadroom; }
size_t udp_reply(uint8_t* frame, const Parsed& p, const LocalConfig& local, size_t reply_len,
                 uint32_t reply_sum, uint16_t ip_id);

}  // namespace ina::frame
