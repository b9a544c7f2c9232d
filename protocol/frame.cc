// Ethernet/IPv4/UDP classification and in-place replies (see frame.h).
#include "ina/protocol/frame.h"

#include <arpa/inet.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>

#include "ina/base/vec.h"

namespace ina::frame {
namespace {

uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
uint32_t rd32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
void wr16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void wr32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

// Pseudo-header sum of a UDP datagram (RFC 768).
uint32_t pseudo_sum(uint32_t src, uint32_t dst, size_t udp_len) {
  return (src >> 16) + (src & 0xFFFF) + (dst >> 16) + (dst & 0xFFFF) + kIpProtoUdp +
         static_cast<uint32_t>(udp_len);
}

constexpr uint8_t kIpDefaultTtl = 64;

}  // namespace

std::string_view verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kIna: return "ina";
    case Verdict::kArpRequest: return "arp_request";
    case Verdict::kIcmpEcho: return "icmp_echo";
    case Verdict::kTooShort: return "too_short";
    case Verdict::kBadEtherType: return "bad_ethertype";
    case Verdict::kArpMalformed: return "arp_malformed";
    case Verdict::kArpNotRequest: return "arp_not_request";
    case Verdict::kArpNotForUs: return "arp_not_for_us";
    case Verdict::kBadIpVersion: return "bad_ip_version";
    case Verdict::kBadIpHeaderLength: return "bad_ip_header_length";
    case Verdict::kBadIpTotalLength: return "bad_ip_total_length";
    case Verdict::kIpFragment: return "ip_fragment";
    case Verdict::kBadIpChecksum: return "bad_ip_checksum";
    case Verdict::kIpNotForUs: return "ip_not_for_us";
    case Verdict::kBadIpProtocol: return "bad_ip_protocol";
    case Verdict::kBadUdpLength: return "bad_udp_length";
    case Verdict::kBadUdpChecksum: return "bad_udp_checksum";
    case Verdict::kWrongUdpPort: return "wrong_udp_port";
    case Verdict::kIcmpMalformed: return "icmp_malformed";
    case Verdict::kIcmpNotEcho: return "icmp_not_echo";
    case Verdict::kBadIcmpChecksum: return "bad_icmp_checksum";
    case Verdict::kCount_: break;
  }
  return "?";
}

Result<Mac> parse_mac(std::string_view text) {
  // Exactly aa:bb:cc:dd:ee:ff: two hex digits per byte, colons between (sscanf's %x would also
  // take a leading blank, a sign or a lone digit).
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  Mac m{};
  bool ok = text.size() == 17;
  for (size_t i = 0; ok && i < 6; ++i) {
    const int hi = hex(text[3 * i]);
    const int lo = hex(text[3 * i + 1]);
    ok = hi >= 0 && lo >= 0 && (i == 5 || text[3 * i + 2] == ':');
    m[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  if (!ok) {
    return invalid_argument("MAC address '" + std::string(text) +
                            "': expected six hex bytes aa:bb:cc:dd:ee:ff");
  }
  return m;
}

std::string format_mac(const Mac& m) {
  char b[18];
  std::snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return b;
}

Result<uint32_t> parse_ipv4(std::string_view text) {
  const std::string s(text);
  in_addr a{};
  if (inet_pton(AF_INET, s.c_str(), &a) != 1) {
    return invalid_argument("IPv4 address '" + s + "': expected dotted quad a.b.c.d");
  }
  return ntohl(a.s_addr);
}

std::string format_ipv4(uint32_t ip) {
  char b[16];
  std::snprintf(b, sizeof b, "%u.%u.%u.%u", ip >> 24, (ip >> 16) & 0xFF, (ip >> 8) & 0xFF,
                ip & 0xFF);
  return b;
}

namespace {

// store_payload_sum16's loop, kBytes / 4 words at a time (vec.h: the byte swap is lowered with
// the caller's target; vectors stay in locals).
template <size_t kBytes, bool kShuffle>
[[gnu::always_inline]] inline uint32_t store_sum_impl(uint8_t* dst, const int32_t* src, size_t n) {
  using U32 = typename vec::Vec<kBytes>::U32;
  constexpr size_t kLanes = vec::Vec<kBytes>::kLanes;
  U32 hi{}, lo{};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    U32 v;
    std::memcpy(&v, src + i, sizeof v);
    hi += v >> 16;
    lo += v & 0xFFFFu;
    U32 be = v;
    vec::bswap_lanes<kBytes, kShuffle>(be);
    std::memcpy(dst + i * 4, &be, sizeof be);
  }
  uint64_t s = 0;
  for (size_t k = 0; k < kLanes; ++k) s += uint64_t{hi[k]} + lo[k];
  for (; i < n; ++i) {
    const uint32_t v = static_cast<uint32_t>(src[i]);
    s += (v >> 16) + (v & 0xFFFF);
    wr32(dst + i * 4, v);
  }
  while (s >> 32) s = (s & 0xFFFFFFFF) + (s >> 32);
  const uint32_t r = static_cast<uint32_t>(s);
  return (r >> 16) + (r & 0xFFFF);
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
// Chosen at run time: AVX2 (32-byte vectors; tune=haswell keeps GCC's generic tuning from
// splitting the unaligned 32-byte loads and stores) where the CPU has it, else, in builds for
// baseline x86 (the protocol library is, unlike DPDK-flagged code), SSSE3 (all x86-64 CPUs since
// 2006-2011).
#define INA_FRAME_AVX2_DISPATCH 1
[[gnu::target("avx2,tune=haswell")]] uint32_t store_sum_avx2(uint8_t* dst, const int32_t* src,
                                                             size_t n) {
  return store_sum_impl<32, true>(dst, src, n);
}
#if !defined(__SSSE3__)
#define INA_FRAME_SSSE3_DISPATCH 1
[[gnu::target("ssse3")]] uint32_t store_sum_ssse3(uint8_t* dst, const int32_t* src, size_t n) {
  return store_sum_impl<16, true>(dst, src, n);
}
#endif
#endif

}  // namespace

uint32_t store_payload_sum16(uint8_t* dst, const int32_t* src, size_t n) {
  // High and low halves summed in 32-bit lanes, which cannot overflow below 2^16 words per lane
  // (payloads are at most 16384 words); GCC 12 at -O2 vectorizes neither the byte swap nor the
  // widening sum, hence the vector extensions.
#ifdef INA_FRAME_AVX2_DISPATCH
  if (__builtin_cpu_supports("avx2")) return store_sum_avx2(dst, src, n);
#endif
#ifdef INA_FRAME_SSSE3_DISPATCH
  if (__builtin_cpu_supports("ssse3")) return store_sum_ssse3(dst, src, n);
#endif
  return store_sum_impl<16, vec::kTargetShuffle>(dst, src, n);
}

namespace {

// sum16_bulk's loop over whole kBytes-byte vectors: the native-order sum of the 16-bit halves of
// the 32-bit words of p[0, n - n % kBytes), and in *done how many bytes it covered. Each lane takes
// at most 0xFFFF per step, so lanes are drained into the 64-bit total every kChunk steps, long
// before they could overflow.
template <size_t kBytes>
[[gnu::always_inline]] inline uint64_t sum_halves_impl(const uint8_t* p, size_t n, size_t* done) {
  using U32 = typename vec::Vec<kBytes>::U32;
  constexpr size_t kChunk = 16384;
  uint64_t native = 0;
  size_t i = 0;
  while (i + kBytes <= n) {
    U32 hi{}, lo{};
    const size_t end = std::min(n - (kBytes - 1), i + kChunk * kBytes);
    for (; i < end; i += kBytes) {
      U32 v;
      std::memcpy(&v, p + i, sizeof v);
      hi += v >> 16;
      lo += v & 0xFFFFu;
    }
    for (size_t k = 0; k < kBytes / 4; ++k) native += uint64_t{hi[k]} + lo[k];
  }
  *done = i;
  return native;
}

#ifdef INA_FRAME_AVX2_DISPATCH
[[gnu::target("avx2,tune=haswell")]] uint64_t sum_halves_avx2(const uint8_t* p, size_t n,
                                                              size_t* done) {
  return sum_halves_impl<32>(p, n, done);
}
#endif

}  // namespace

uint32_t sum16_bulk(const uint8_t* p, size_t n, uint32_t acc) {
  // 16-bit halves of native 32-bit words summed in 32-bit lanes (GCC/Clang vector extensions, as
  // store_payload_sum16), 32 bytes at a time with AVX2 where the CPU has it, else 16.
  size_t i = 0;
  uint64_t native;
#ifdef INA_FRAME_AVX2_DISPATCH
  if (__builtin_cpu_supports("avx2")) {
    native = sum_halves_avx2(p, n, &i);
  } else {
    native = sum_halves_impl<16>(p, n, &i);
  }
#else
  native = sum_halves_impl<16>(p, n, &i);
#endif
  while (native >> 16) native = (native & 0xFFFF) + (native >> 16);
  uint32_t folded = static_cast<uint32_t>(native);  // 16 bits, host byte order
  if constexpr (std::endian::native == std::endian::little) {
    folded = ((folded & 0xFF) << 8) | (folded >> 8);
  }
  // The tail (under one vector) by the big-endian sum16(), which also adds `acc`.
  return sum16(p + i, n - i, acc + folded);
}

uint32_t copy_sum16(uint8_t* dst, const uint8_t* src, size_t n) {
  std::memcpy(dst, src, n);
  return sum16_bulk(dst, n);
}

Verdict classify(std::span<const uint8_t> frame, const LocalConfig& local, RxOffload offload,
                 Parsed* out) {
  const uint8_t* f = frame.data();
  const size_t n = frame.size();
  if (n < kEthHeader) return Verdict::kTooShort;
  const uint16_t type = rd16(f + 12);
  out->l3 = kEthHeader;
  std::memcpy(out->src_mac.data(), f + 6, 6);

  if (type == kEtherTypeArp) {
    const uint8_t* a = f + kEthHeader;
    if (n < kEthHeader + kArpPayload) return Verdict::kArpMalformed;
    // htype Ethernet (1), ptype IPv4, hlen 6, plen 4.
    if (rd16(a) != 1 || rd16(a + 2) != kEtherTypeIpv4 || a[4] != 6 || a[5] != 4) {
      return Verdict::kArpMalformed;
    }
    if (rd16(a + 6) != 1) return Verdict::kArpNotRequest;
    if (rd32(a + 24) != local.ip) return Verdict::kArpNotForUs;
    return Verdict::kArpRequest;
  }
  if (type != kEtherTypeIpv4) return Verdict::kBadEtherType;

  const uint8_t* ip = f + kEthHeader;
  const size_t l3_avail = n - kEthHeader;
  if (l3_avail < kIpv4MinHeader) return Verdict::kTooShort;
  if ((ip[0] >> 4) != 4) return Verdict::kBadIpVersion;
  const size_t ihl = size_t{ip[0] & 0x0Fu} * 4;
  if (ihl < kIpv4MinHeader || ihl > l3_avail) return Verdict::kBadIpHeaderLength;
  const size_t total = rd16(ip + 2);
  if (total < ihl || total > l3_avail) return Verdict::kBadIpTotalLength;
  const uint16_t frag = rd16(ip + 6);
  if ((frag & 0x2000) != 0 || (frag & 0x1FFF) != 0) return Verdict::kIpFragment;
  if (offload.ip == HwCheck::kBad) return Verdict::kBadIpChecksum;
  if (offload.ip != HwCheck::kGood && fold(sum16(ip, ihl)) != 0xFFFF) {
    return Verdict::kBadIpChecksum;
  }
  if (rd32(ip + 16) != local.ip) return Verdict::kIpNotForUs;
  out->l3_len = total;
  out->l4 = kEthHeader + ihl;
  out->src_ip = rd32(ip + 12);
  const uint8_t* l4 = ip + ihl;
  const size_t l4_len = total - ihl;

  if (ip[9] == kIpProtoIcmp) {
    if (l4_len < kIcmpHeader) return Verdict::kIcmpMalformed;
    if (l4[0] != 8 || l4[1] != 0) return Verdict::kIcmpNotEcho;
    if (fold(sum16_bulk(l4, l4_len)) != 0xFFFF) return Verdict::kBadIcmpChecksum;
    return Verdict::kIcmpEcho;
  }
  if (ip[9] != kIpProtoUdp) return Verdict::kBadIpProtocol;
  if (l4_len < kUdpHeader) return Verdict::kBadUdpLength;
  const size_t udp_len = rd16(l4 + 4);
  if (udp_len != l4_len) return Verdict::kBadUdpLength;
  if (offload.l4 == HwCheck::kBad) return Verdict::kBadUdpChecksum;
  const uint16_t csum = rd16(l4 + 6);
  if (offload.l4 != HwCheck::kGood && csum != 0) {
    const uint32_t s = sum16_bulk(l4, udp_len, pseudo_sum(out->src_ip, local.ip, udp_len));
    if (fold(s) != 0xFFFF) return Verdict::kBadUdpChecksum;
  }
  if (rd16(l4 + 2) != local.udp_port) return Verdict::kWrongUdpPort;
  out->src_port = rd16(l4);
  out->ina = frame.subspan(out->l4 + kUdpHeader, udp_len - kUdpHeader);
  return Verdict::kIna;
}

size_t arp_reply(uint8_t* f, const Parsed& p, const LocalConfig& local) {
  uint8_t* a = f + p.l3;
  // Ethernet: back to the asker.
  std::memcpy(f, p.src_mac.data(), 6);
  std::memcpy(f + 6, local.mac.data(), 6);
  wr16(a + 6, 2);  // opcode reply
  // Target := the sender (hardware and protocol address), sender := us.
  std::memcpy(a + 18, a + 8, 10);
  std::memcpy(a + 8, local.mac.data(), 6);
  wr32(a + 14, local.ip);
  return kEthHeader + kArpPayload;
}

size_t arp_request(uint8_t* f, const LocalConfig& local, uint32_t target_ip) {
  std::memset(f, 0xFF, 6);
  std::memcpy(f + 6, local.mac.data(), 6);
  wr16(f + 12, kEtherTypeArp);
  uint8_t* a = f + kEthHeader;
  wr16(a, 1);
  wr16(a + 2, kEtherTypeIpv4);
  a[4] = 6;
  a[5] = 4;
  wr16(a + 6, 1);  // request
  std::memcpy(a + 8, local.mac.data(), 6);
  wr32(a + 14, local.ip);
  std::memset(a + 18, 0, 6);
  wr32(a + 24, target_ip);
  return kEthHeader + kArpPayload;
}

bool arp_reply_sender(std::span<const uint8_t> frame, const LocalConfig& local, uint32_t* ip,
                      Mac* mac) {
  const uint8_t* f = frame.data();
  if (frame.size() < kEthHeader + kArpPayload || rd16(f + 12) != kEtherTypeArp) return false;
  const uint8_t* a = f + kEthHeader;
  if (rd16(a) != 1 || rd16(a + 2) != kEtherTypeIpv4 || a[4] != 6 || a[5] != 4) return false;
  if (rd16(a + 6) != 2 || rd32(a + 24) != local.ip) return false;
  std::memcpy(mac->data(), a + 8, 6);
  *ip = rd32(a + 14);
  return true;
}

size_t icmp_echo_reply(uint8_t* f, const Parsed& p, const LocalConfig& local) {
  uint8_t* ip = f + p.l3;
  uint8_t* icmp = f + p.l4;
  const size_t ihl = p.l4 - p.l3;
  std::memcpy(f, p.src_mac.data(), 6);
  std::memcpy(f + 6, local.mac.data(), 6);
  wr32(ip + 16, p.src_ip);
  wr32(ip + 12, local.ip);
  ip[8] = kIpDefaultTtl;
  wr16(ip + 10, 0);
  wr16(ip + 10, checksum(ip, ihl));
  icmp[0] = 0;  // echo reply; code stays 0, identifier, sequence and data are echoed
  wr16(icmp + 2, 0);
  wr16(icmp + 2, checksum(icmp, p.l3_len - ihl));
  return p.l3 + p.l3_len;
}

size_t write_udp_headers(uint8_t* f, const Endpoint& src, const Endpoint& dst, size_t payload_len,
                         uint32_t payload_sum, uint16_t ip_id) {
  std::memcpy(f, dst.mac.data(), 6);
  std::memcpy(f + 6, src.mac.data(), 6);
  wr16(f + 12, kEtherTypeIpv4);
  uint8_t* ip = f + kEthHeader;
  const size_t udp_len = kUdpHeader + payload_len;
  ip[0] = 0x45;
  ip[1] = 0;
  wr16(ip + 2, static_cast<uint16_t>(kIpv4MinHeader + udp_len));
  wr16(ip + 4, ip_id);
  wr16(ip + 6, 0x4000);  // DF
  ip[8] = kIpDefaultTtl;
  ip[9] = kIpProtoUdp;
  wr16(ip + 10, 0);
  wr32(ip + 12, src.ip);
  wr32(ip + 16, dst.ip);
  wr16(ip + 10, checksum(ip, kIpv4MinHeader));
  uint8_t* udp = ip + kIpv4MinHeader;
  wr16(udp, src.port);
  wr16(udp + 2, dst.port);
  wr16(udp + 4, static_cast<uint16_t>(udp_len));
  wr16(udp + 6, 0);
  uint16_t c = static_cast<uint16_t>(
      ~fold(sum16(udp, kUdpHeader, pseudo_sum(src.ip, dst.ip, udp_len) + fold(payload_sum))));
  if (c == 0) c = 0xFFFF;  // 0 means "no checksum" in UDP over IPv4
  wr16(udp + 6, c);
  return kUdpHeadroom + payload_len;
}

UdpHeaderTemplate::UdpHeaderTemplate(const Endpoint& src, const Endpoint& dst) {
  // The headers of an empty datagram with id 0, then the variable fields zeroed again: what
  // stays are the fixed bytes, whose sums the checksums start from.
  write_udp_headers(bytes_.data(), src, dst, 0, 0, 0);
  uint8_t* ip = bytes_.data() + kEthHeader;
  wr16(ip + 2, 0);
  wr16(ip + 10, 0);
  uint8_t* udp = ip + kIpv4MinHeader;
  wr16(udp + 4, 0);
  wr16(udp + 6, 0);
  ip_sum_ = sum16(ip, kIpv4MinHeader);
  udp_sum_ = sum16(udp, kUdpHeader, pseudo_sum(src.ip, dst.ip, 0));
}

size_t udp_reply(uint8_t* frame, const Parsed& p, const LocalConfig& local, size_t reply_len,
                 uint32_t reply_sum, uint16_t ip_id) {
  const Endpoint src{local.mac, local.ip, local.udp_port};
  const Endpoint dst{p.src_mac, p.src_ip, p.src_port};
  return write_udp_headers(frame, src, dst, reply_len, reply_sum, ip_id);
}

}  // namespace ina::frame
