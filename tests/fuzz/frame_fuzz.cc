// libFuzzer harness: the Ethernet/IPv4/UDP frame parser (frame::classify) and the replies built
// in place from what it accepted, plus the checksum helpers and the address text forms.
//
// Input: byte 0 picks the RX offload flags (what the NIC vouched for), the rest is the frame.
// Invariants: classify reads nothing outside the frame (ASan) and its offsets lie inside it; a
// UDP reply to an accepted INA frame is accepted, with the same datagram, by the sender it is
// addressed to; an ARP reply names us to the asker; an ICMP echo reply carries valid checksums;
// the bulk, copying and storing checksum helpers agree with sum16; UdpHeaderTemplate writes what
// write_udp_headers writes; parsed MAC and IPv4 texts print back to values that parse the same.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "ina/protocol/frame.h"

using namespace ina;
using namespace ina::frame;

namespace {

constexpr LocalConfig kLocal{{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}, 0x0A000001, 47474};  // 10.0.0.1

HwCheck hw(uint8_t bits) {
  return bits == 1 ? HwCheck::kGood : bits == 2 ? HwCheck::kBad : HwCheck::kUnknown;
}

void check_checksums(const uint8_t* p, size_t n) {
  const uint16_t ref = fold(sum16(p, n));
  FUZZ_CHECK(fold(sum16_bulk(p, n)) == ref);
  FUZZ_CHECK(fold(sum16_bulk(p, n, 0x1234)) == fold(sum16(p, n, 0x1234)));
  std::vector<uint8_t> copy(n + 1);  // never a null destination, also for n = 0
  FUZZ_CHECK(fold(copy_sum16(copy.data(), p, n)) == ref);
  FUZZ_CHECK(n == 0 || std::memcmp(copy.data(), p, n) == 0);
  const size_t words = n / 4;
  std::vector<int32_t> vals(words + 1);
  if (words > 0) std::memcpy(vals.data(), p, words * 4);
  std::vector<uint8_t> stored(words * 4 + 4);
  const uint32_t s = store_payload_sum16(stored.data(), vals.data(), words);
  FUZZ_CHECK(fold(s) == fold(sum16(stored.data(), words * 4)));
  for (size_t i = 0; i < words; ++i) {
    FUZZ_CHECK(wire::get_u32(stored.data() + 4 * i) == static_cast<uint32_t>(vals[i]));
  }
}

void check_template(const uint8_t* p, size_t n) {
  if (n < 34) return;
  Endpoint a, b;
  std::memcpy(a.mac.data(), p, 6);
  std::memcpy(b.mac.data(), p + 6, 6);
  a.ip = wire::get_u32(p + 12);
  b.ip = wire::get_u32(p + 16);
  a.port = wire::get_u16(p + 20);
  b.port = wire::get_u16(p + 22);
  const size_t len = wire::get_u16(p + 24) % 9000;
  const uint32_t sum = wire::get_u32(p + 26);
  const uint16_t id = wire::get_u16(p + 30);
  uint8_t x[kUdpHeadroom], y[kUdpHeadroom];
  FUZZ_CHECK(write_udp_headers(x, a, b, len, sum, id) == kUdpHeadroom + len);
  FUZZ_CHECK(UdpHeaderTemplate(a, b).write(y, len, sum, id) == kUdpHeadroom + len);
  FUZZ_CHECK(std::memcmp(x, y, kUdpHeadroom) == 0);
}

void check_text(std::string_view t) {
  if (Result<Mac> m = parse_mac(t); m.ok()) {
    Result<Mac> again = parse_mac(format_mac(m.value()));
    FUZZ_CHECK(again.ok() && again.value() == m.value());
  }
  if (Result<uint32_t> ip = parse_ipv4(t); ip.ok()) {
    Result<uint32_t> again = parse_ipv4(format_ipv4(ip.value()));
    FUZZ_CHECK(again.ok() && again.value() == ip.value());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const RxOffload off{hw(data[0] & 3), hw((data[0] >> 2) & 3)};
  std::vector<uint8_t> f(data + 1, data + size);  // exactly the frame: ASan sees any overread
  const std::span<const uint8_t> frame(f);
  if (size < 40) check_text(std::string_view(reinterpret_cast<const char*>(f.data()), f.size()));
  check_checksums(data + 1, size - 1);  // never a null pointer, also for an empty frame
  check_template(f.data(), f.size());

  Parsed p;
  const Verdict v = classify(frame, kLocal, off, &p);
  FUZZ_CHECK(!verdict_name(v).empty());
  FUZZ_CHECK(static_cast<size_t>(v) < static_cast<size_t>(Verdict::kCount_));
  if (is_drop(v)) return 0;
  FUZZ_CHECK(p.l3 == kEthHeader && p.l3 + p.l3_len <= f.size());
  if (v == Verdict::kArpRequest) {
    const uint32_t asker_ip = wire::get_u32(f.data() + p.l3 + 14);
    std::vector<uint8_t> r = f;
    const size_t n = arp_reply(r.data(), p, kLocal);
    FUZZ_CHECK(n <= r.size());
    uint32_t ip = 0;
    Mac mac{};
    const LocalConfig asker{p.src_mac, asker_ip, 0};
    FUZZ_CHECK(arp_reply_sender(std::span<const uint8_t>(r.data(), n), asker, &ip, &mac));
    FUZZ_CHECK(ip == kLocal.ip && mac == kLocal.mac);
    return 0;
  }
  FUZZ_CHECK(p.l4 >= p.l3 + kIpv4MinHeader && p.l4 <= p.l3 + p.l3_len);
  const size_t ihl = p.l4 - p.l3;
  if (v == Verdict::kIcmpEcho) {
    std::vector<uint8_t> r = f;
    const size_t n = icmp_echo_reply(r.data(), p, kLocal);
    FUZZ_CHECK(n == p.l3 + p.l3_len && n <= r.size());
    FUZZ_CHECK(fold(sum16(r.data() + p.l3, ihl)) == 0xFFFF);
    FUZZ_CHECK(fold(sum16(r.data() + p.l4, p.l3_len - ihl)) == 0xFFFF);
    return 0;
  }
  // kIna: the datagram lies inside the UDP payload; the reply carrying it back is accepted by
  // the sender with the same bytes.
  FUZZ_CHECK(p.ina.data() == f.data() + p.l4 + kUdpHeader);
  FUZZ_CHECK(p.l4 + kUdpHeader + p.ina.size() == p.l3 + p.l3_len);
  const std::vector<uint8_t> dg(p.ina.begin(), p.ina.end());
  std::vector<uint8_t> r(udp_reply_offset() + dg.size());
  if (!dg.empty()) std::memcpy(r.data() + udp_reply_offset(), dg.data(), dg.size());
  const size_t n = udp_reply(r.data(), p, kLocal, dg.size(), sum16(dg.data(), dg.size()), 7);
  FUZZ_CHECK(n == r.size());
  const LocalConfig sender{p.src_mac, p.src_ip, p.src_port};
  Parsed q;
  const Verdict back = classify(r, sender, RxOffload{}, &q);
  FUZZ_CHECK(back == Verdict::kIna);
  FUZZ_CHECK(q.src_ip == kLocal.ip && q.src_port == kLocal.udp_port && q.src_mac == kLocal.mac);
  FUZZ_CHECK(q.ina.size() == dg.size() &&
             (dg.empty() || std::memcmp(q.ina.data(), dg.data(), dg.size()) == 0));
  return 0;
}
