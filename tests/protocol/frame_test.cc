// Unit tests of the Ethernet/IPv4/UDP framing (protocol/frame.h): classification of good and
// malformed frames (one test per drop reason), ARP and ICMP echo replies, and UDP replies built
// in place, with checksums checked by an independent byte-pair implementation.
#include "ina/protocol/frame.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <random>
#include <vector>

#include "ina/protocol/wire.h"

namespace ina::frame {
namespace {

const Mac kOurMac{0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
const Mac kPeerMac{0x02, 0x00, 0x00, 0x00, 0x00, 0x22};
constexpr uint32_t kOurIp = 0x0A000001;   // 10.0.0.1
constexpr uint32_t kPeerIp = 0x0A000022;  // 10.0.0.34
constexpr uint16_t kOurPort = 47474;
constexpr uint16_t kPeerPort = 40001;

LocalConfig local() { return LocalConfig{kOurMac, kOurIp, kOurPort}; }

// Reference checksum: RFC 1071 one 16-bit word at a time.
uint16_t ref_checksum(const uint8_t* p, size_t n, uint32_t acc = 0) {
  for (size_t i = 0; i + 1 < n; i += 2) acc += static_cast<uint32_t>((p[i] << 8) | p[i + 1]);
  if (n % 2) acc += static_cast<uint32_t>(p[n - 1] << 8);
  while (acc >> 16) acc = (acc & 0xFFFF) + (acc >> 16);
  return static_cast<uint16_t>(~acc);
}
uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
void wr16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}

bool udp_checksum_ok(const std::vector<uint8_t>& f, size_t l4) {
  const uint8_t* ip = f.data() + kEthHeader;
  const size_t udp_len = rd16(f.data() + l4 + 4);
  uint32_t acc = rd16(ip + 12) + rd16(ip + 14) + rd16(ip + 16) + rd16(ip + 18) + 17 +
                 static_cast<uint32_t>(udp_len);
  return ref_checksum(f.data() + l4, udp_len, acc) == 0;
}

// A UDP frame from the peer to us with `payload`, optional IP options (multiple of 4 bytes).
std::vector<uint8_t> udp_frame(const std::vector<uint8_t>& payload, size_t ip_opts = 0,
                               uint16_t dport = kOurPort) {
  std::vector<uint8_t> f(kEthHeader + kIpv4MinHeader + ip_opts + kUdpHeader + payload.size());
  std::memcpy(f.data(), kOurMac.data(), 6);
  std::memcpy(f.data() + 6, kPeerMac.data(), 6);
  wr16(f.data() + 12, kEtherTypeIpv4);
  uint8_t* ip = f.data() + kEthHeader;
  const size_t ihl = kIpv4MinHeader + ip_opts;
  ip[0] = static_cast<uint8_t>(0x40 | (ihl / 4));
  wr16(ip + 2, static_cast<uint16_t>(f.size() - kEthHeader));
  wr16(ip + 4, 7);
  ip[8] = 64;
  ip[9] = kIpProtoUdp;
  ip[12] = 10;
  ip[13] = 0;
  ip[14] = 0;
  ip[15] = 34;
  ip[16] = 10;
  ip[17] = 0;
  ip[18] = 0;
  ip[19] = 1;
  for (size_t i = 0; i < ip_opts; ++i) ip[kIpv4MinHeader + i] = 1;  // NOP options
  wr16(ip + 10, ref_checksum(ip, ihl));
  uint8_t* udp = ip + ihl;
  wr16(udp, kPeerPort);
  wr16(udp + 2, dport);
  wr16(udp + 4, static_cast<uint16_t>(kUdpHeader + payload.size()));
  std::memcpy(udp + kUdpHeader, payload.data(), payload.size());
  const size_t l4 = kEthHeader + ihl;
  uint32_t acc = rd16(ip + 12) + rd16(ip + 14) + rd16(ip + 16) + rd16(ip + 18) + 17 +
                 static_cast<uint32_t>(kUdpHeader + payload.size());
  wr16(udp + 6, ref_checksum(f.data() + l4, kUdpHeader + payload.size(), acc));
  return f;
}

void fix_ip_checksum(std::vector<uint8_t>& f) {
  uint8_t* ip = f.data() + kEthHeader;
  const size_t ihl = size_t{ip[0] & 0x0Fu} * 4;
  wr16(ip + 10, 0);
  wr16(ip + 10, ref_checksum(ip, ihl));
}

Verdict classify_vec(const std::vector<uint8_t>& f, Parsed* p = nullptr, RxOffload off = {}) {
  Parsed local_p;
  return classify(f, local(), off, p != nullptr ? p : &local_p);
}

std::vector<uint8_t> payload_of(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

TEST(Frame, ChecksumMatchesReferenceForOddAndEvenLengths) {
  const std::vector<uint8_t> d = payload_of(1001);
  for (size_t n : {0, 1, 2, 3, 5, 20, 64, 1001}) {
    EXPECT_EQ(checksum(d.data(), n), ref_checksum(d.data(), n)) << n;
  }
}

TEST(Frame, Sum16BulkMatchesSum16AtEveryLengthAndAlignment) {
  // Lengths around the 16- and 32-byte steps (odd ones too), unaligned starts, a carried-in
  // accumulator.
  std::vector<uint8_t> d(4200);
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>((i * 0x9E3779B9u) >> 13);
  for (size_t off : {0, 1, 2, 3}) {
    for (size_t n : {0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 65, 330, 1098, 4170, 4196}) {
      for (uint32_t acc : {0u, 1u, 0x1FFFEu}) {
        EXPECT_EQ(fold(sum16_bulk(d.data() + off, n, acc)), fold(sum16(d.data() + off, n, acc)))
            << "off " << off << " n " << n << " acc " << acc;
      }
      EXPECT_EQ(static_cast<uint16_t>(~fold(sum16_bulk(d.data() + off, n))),
                ref_checksum(d.data() + off, n))
          << "off " << off << " n " << n;
    }
  }
  // All-ones and all-zero data: the sums that differ in one's complement (0xFFFF vs 0).
  const std::vector<uint8_t> ones(4096, 0xFF), zeros(4096, 0);
  EXPECT_EQ(fold(sum16_bulk(ones.data(), ones.size())), fold(sum16(ones.data(), ones.size())));
  EXPECT_EQ(fold(sum16_bulk(zeros.data(), zeros.size())), 0);
  EXPECT_EQ(fold(sum16_bulk(zeros.data(), zeros.size(), 5)), 5);
  // Longer than one drain of the vector lanes (16384 steps), all-ones: no lane overflows.
  const std::vector<uint8_t> big(1 << 20 | 7, 0xFF);
  EXPECT_EQ(fold(sum16_bulk(big.data(), big.size())), fold(sum16(big.data(), big.size())));
}

TEST(Frame, StorePayloadSum16MatchesStoreThenSum) {
  // Values with every byte position set, negatives and extremes; lengths around the 4-word step.
  std::vector<int32_t> v(1030);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<int32_t>(0x9E3779B9u * static_cast<uint32_t>(i + 1));
  }
  v[0] = INT32_MIN;
  v[1] = -1;
  v[2] = INT32_MAX;
  for (size_t n : {0, 1, 3, 4, 5, 7, 8, 64, 256, 1023, 1024, 1030}) {
    std::vector<uint8_t> want(n * 4 + 1, 0xAB), got(n * 4 + 1, 0xAB);
    for (size_t i = 0; i < n; ++i) wire::put_u32(want.data() + 4 * i, static_cast<uint32_t>(v[i]));
    const uint32_t s = store_payload_sum16(got.data(), v.data(), n);
    EXPECT_EQ(got, want) << n;  // same bytes, nothing written past the end
    EXPECT_EQ(fold(s), fold(sum16(want.data(), n * 4))) << n;
    EXPECT_EQ(static_cast<uint16_t>(~fold(s)), ref_checksum(want.data(), n * 4)) << n;
  }
  // All-ones words: a sum that is a multiple of 0xFFFF folds to 0xFFFF, as sum16's does.
  std::vector<int32_t> ones(8, -1);
  std::vector<uint8_t> b(32);
  const uint32_t s1 = store_payload_sum16(b.data(), ones.data(), ones.size());
  EXPECT_EQ(fold(s1), fold(sum16(b.data(), b.size())));
  EXPECT_EQ(fold(s1), 0xFFFF);
}

TEST(Checksum, CopySum16CopiesAndSumsAnyLength) {
  std::vector<uint8_t> src(1031);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37 + 11);
  for (size_t n : {0, 1, 2, 3, 5, 64, 511, 1024, 1031}) {
    std::vector<uint8_t> got(n + 1, 0xAB);
    const uint32_t s = copy_sum16(got.data(), src.data(), n);
    EXPECT_TRUE(std::equal(src.begin(), src.begin() + static_cast<ptrdiff_t>(n), got.begin())) << n;
    EXPECT_EQ(got[n], 0xAB) << n;
    EXPECT_EQ(static_cast<uint16_t>(~fold(s)), ref_checksum(src.data(), n)) << n;
  }
}

// The per-destination header template writes exactly what write_udp_headers() writes, for any
// endpoints, datagram length, payload sum (including the sums that fold to 0 and 0xFFFF) and id.
TEST(Frame, HeaderTemplateWritesWhatWriteUdpHeadersWrites) {
  std::mt19937 rng(11);
  auto u32 = [&] { return static_cast<uint32_t>(rng()); };
  for (int i = 0; i < 2000; ++i) {
    Endpoint src, dst;
    for (auto& b : src.mac) b = static_cast<uint8_t>(u32());
    for (auto& b : dst.mac) b = static_cast<uint8_t>(u32());
    src.ip = u32();
    dst.ip = u32();
    src.port = static_cast<uint16_t>(u32());
    dst.port = static_cast<uint16_t>(u32());
    const size_t len = u32() % 9000;
    const uint32_t sums[] = {0, 0xFFFF, 0x1FFFE, u32() % 0x10000, u32() >> 4, u32()};
    const uint32_t sum = sums[i % 6];
    const uint16_t id = static_cast<uint16_t>(u32());
    std::vector<uint8_t> want(kUdpHeadroom, 0x5A), got(kUdpHeadroom, 0xA5);
    const UdpHeaderTemplate t(src, dst);
    EXPECT_EQ(t.write(got.data(), len, sum, id),
              write_udp_headers(want.data(), src, dst, len, sum, id));
    ASSERT_EQ(got, want) << "len " << len << " sum " << sum << " id " << id;
  }
}

TEST(Frame, ClassifiesUdpToOurPortAsIna) {
  const auto pl = payload_of(40);
  const auto f = udp_frame(pl);
  Parsed p;
  ASSERT_EQ(classify_vec(f, &p), Verdict::kIna);
  ASSERT_EQ(p.ina.size(), pl.size());
  EXPECT_EQ(std::memcmp(p.ina.data(), pl.data(), pl.size()), 0);
  EXPECT_EQ(p.src_ip, kPeerIp);
  EXPECT_EQ(p.src_port, kPeerPort);
  EXPECT_EQ(p.src_mac, kPeerMac);
}

TEST(Frame, IpOptionsAndEthernetPaddingAreHandled) {
  const auto pl = payload_of(4);
  auto f = udp_frame(pl, 8);
  f.resize(f.size() + 10, 0xEE);  // padding past the IP total length
  Parsed p;
  ASSERT_EQ(classify_vec(f, &p), Verdict::kIna);
  EXPECT_EQ(p.l4, kEthHeader + 28);
  EXPECT_EQ(p.ina.size(), 4u);
}

TEST(Frame, ZeroUdpChecksumMeansNone) {
  auto f = udp_frame(payload_of(12));
  wr16(f.data() + kEthHeader + 20 + 6, 0);
  EXPECT_EQ(classify_vec(f), Verdict::kIna);
}

TEST(Frame, EachMalformationHasItsVerdict) {
  const auto good = udp_frame(payload_of(32));
  auto mutate = [&](auto fn) {
    auto f = good;
    fn(f);
    return classify_vec(f);
  };
  EXPECT_EQ(mutate([](auto& f) { f.resize(10); }), Verdict::kTooShort);
  EXPECT_EQ(mutate([](auto& f) { f.resize(kEthHeader + 12); }), Verdict::kTooShort);
  EXPECT_EQ(mutate([](auto& f) { wr16(f.data() + 12, 0x86DD); }), Verdict::kBadEtherType);
  EXPECT_EQ(mutate([](auto& f) { wr16(f.data() + 12, 0x8100); }), Verdict::kBadEtherType);
  EXPECT_EQ(mutate([](auto& f) {
              f[kEthHeader] = 0x65;
              fix_ip_checksum(f);
            }),
            Verdict::kBadIpVersion);
  EXPECT_EQ(mutate([](auto& f) { f[kEthHeader] = 0x44; }), Verdict::kBadIpHeaderLength);
  EXPECT_EQ(mutate([](auto& f) {
              f[kEthHeader] = 0x4F;
              f.resize(kEthHeader + 40);
            }),
            Verdict::kBadIpHeaderLength);
  EXPECT_EQ(mutate([](auto& f) {
              wr16(f.data() + kEthHeader + 2, static_cast<uint16_t>(f.size()));
              fix_ip_checksum(f);
            }),
            Verdict::kBadIpTotalLength);
  EXPECT_EQ(mutate([](auto& f) {
              wr16(f.data() + kEthHeader + 2, 19);
              fix_ip_checksum(f);
            }),
            Verdict::kBadIpTotalLength);
  EXPECT_EQ(mutate([](auto& f) {
              wr16(f.data() + kEthHeader + 6, 0x2000);
              fix_ip_checksum(f);
            }),
            Verdict::kIpFragment);
  EXPECT_EQ(mutate([](auto& f) {
              wr16(f.data() + kEthHeader + 6, 0x0010);
              fix_ip_checksum(f);
            }),
            Verdict::kIpFragment);
  EXPECT_EQ(mutate([](auto& f) { f[kEthHeader + 8] ^= 1; }), Verdict::kBadIpChecksum);
  EXPECT_EQ(mutate([](auto& f) {
              f[kEthHeader + 19] = 2;
              fix_ip_checksum(f);
            }),
            Verdict::kIpNotForUs);
  EXPECT_EQ(mutate([](auto& f) {
              f[kEthHeader + 9] = 6;
              fix_ip_checksum(f);
            }),
            Verdict::kBadIpProtocol);
  EXPECT_EQ(mutate([](auto& f) { wr16(f.data() + kEthHeader + 24, 7); }), Verdict::kBadUdpLength);
  EXPECT_EQ(mutate([](auto& f) { wr16(f.data() + kEthHeader + 24, 30); }), Verdict::kBadUdpLength);
  EXPECT_EQ(mutate([](auto& f) { f.back() ^= 0x55; }), Verdict::kBadUdpChecksum);
  EXPECT_EQ(classify_vec(udp_frame(payload_of(8), 0, 9999)), Verdict::kWrongUdpPort);
}

TEST(Frame, OffloadFlagsSkipOrForceChecksumVerdicts) {
  auto f = udp_frame(payload_of(16));
  f[kEthHeader + 10] ^= 0xFF;  // corrupt IP checksum
  f.back() ^= 0x01;            // corrupt UDP checksum
  EXPECT_EQ(classify_vec(f), Verdict::kBadIpChecksum);
  EXPECT_EQ(classify_vec(f, nullptr, {HwCheck::kGood, HwCheck::kUnknown}),
            Verdict::kBadUdpChecksum);
  EXPECT_EQ(classify_vec(f, nullptr, {HwCheck::kGood, HwCheck::kGood}), Verdict::kIna);
  const auto good = udp_frame(payload_of(16));
  EXPECT_EQ(classify_vec(good, nullptr, {HwCheck::kBad, HwCheck::kUnknown}),
            Verdict::kBadIpChecksum);
  EXPECT_EQ(classify_vec(good, nullptr, {HwCheck::kGood, HwCheck::kBad}), Verdict::kBadUdpChecksum);
}

std::vector<uint8_t> arp_request(uint32_t target_ip, uint16_t op = 1) {
  std::vector<uint8_t> f(60, 0);  // padded to the Ethernet minimum
  std::memset(f.data(), 0xFF, 6);
  std::memcpy(f.data() + 6, kPeerMac.data(), 6);
  wr16(f.data() + 12, kEtherTypeArp);
  uint8_t* a = f.data() + kEthHeader;
  wr16(a, 1);
  wr16(a + 2, kEtherTypeIpv4);
  a[4] = 6;
  a[5] = 4;
  wr16(a + 6, op);
  std::memcpy(a + 8, kPeerMac.data(), 6);
  a[14] = 10;
  a[15] = 0;
  a[16] = 0;
  a[17] = 34;
  a[24] = uint8_t(target_ip >> 24);
  a[25] = uint8_t(target_ip >> 16);
  a[26] = uint8_t(target_ip >> 8);
  a[27] = uint8_t(target_ip);
  return f;
}

TEST(Frame, AnswersArpForOurAddressOnly) {
  auto f = arp_request(kOurIp);
  Parsed p;
  ASSERT_EQ(classify_vec(f, &p), Verdict::kArpRequest);
  const size_t n = arp_reply(f.data(), p, local());
  EXPECT_EQ(n, 42u);
  EXPECT_EQ(0, std::memcmp(f.data(), kPeerMac.data(), 6));
  EXPECT_EQ(0, std::memcmp(f.data() + 6, kOurMac.data(), 6));
  const uint8_t* a = f.data() + kEthHeader;
  EXPECT_EQ(rd16(a + 6), 2);
  EXPECT_EQ(0, std::memcmp(a + 8, kOurMac.data(), 6));
  EXPECT_EQ((std::vector<uint8_t>(a + 14, a + 18)), (std::vector<uint8_t>{10, 0, 0, 1}));
  EXPECT_EQ(0, std::memcmp(a + 18, kPeerMac.data(), 6));
  EXPECT_EQ((std::vector<uint8_t>(a + 24, a + 28)), (std::vector<uint8_t>{10, 0, 0, 34}));

  EXPECT_EQ(classify_vec(arp_request(kOurIp + 1)), Verdict::kArpNotForUs);
  EXPECT_EQ(classify_vec(arp_request(kOurIp, 2)), Verdict::kArpNotRequest);
  auto bad = arp_request(kOurIp);
  bad[kEthHeader + 4] = 8;
  EXPECT_EQ(classify_vec(bad), Verdict::kArpMalformed);
  bad.resize(30);
  EXPECT_EQ(classify_vec(bad), Verdict::kArpMalformed);
}

TEST(Frame, ArpClientRequestIsAnsweredAndTheReplyReadBack) {
  // A worker (kPeer) asks for our address; our arp_reply() answers; the worker reads the answer.
  const LocalConfig worker{kPeerMac, 0x0A000022, 40000};
  std::vector<uint8_t> f(64, 0xEE);
  ASSERT_EQ(::ina::frame::arp_request(f.data(), worker, kOurIp), 42u);
  f.resize(42);
  EXPECT_EQ((std::vector<uint8_t>(f.begin(), f.begin() + 6)), std::vector<uint8_t>(6, 0xFF));
  Parsed p;
  ASSERT_EQ(classify_vec(f, &p), Verdict::kArpRequest);
  EXPECT_EQ(p.src_mac, kPeerMac);
  // A request is not a reply.
  uint32_t ip = 0;
  Mac mac{};
  EXPECT_FALSE(arp_reply_sender(f, worker, &ip, &mac));
  arp_reply(f.data(), p, local());
  EXPECT_EQ(classify(f, worker, RxOffload{}, &p), Verdict::kArpNotRequest);
  ASSERT_TRUE(arp_reply_sender(f, worker, &ip, &mac));
  EXPECT_EQ(ip, kOurIp);
  EXPECT_EQ(mac, kOurMac);
  // Addressed to someone else, or truncated: not ours.
  const LocalConfig other{kPeerMac, 0x0A000023, 40000};
  EXPECT_FALSE(arp_reply_sender(f, other, &ip, &mac));
  EXPECT_FALSE(arp_reply_sender(std::span<const uint8_t>(f.data(), 41), worker, &ip, &mac));
}

std::vector<uint8_t> icmp_echo(size_t data_len, uint8_t type = 8) {
  auto f = udp_frame(payload_of(data_len));  // reuse the IP header, then turn it into ICMP
  uint8_t* ip = f.data() + kEthHeader;
  ip[9] = kIpProtoIcmp;
  fix_ip_checksum(f);
  uint8_t* icmp = ip + 20;
  icmp[0] = type;
  icmp[1] = 0;
  wr16(icmp + 2, 0);
  wr16(icmp + 4, 0x1234);
  wr16(icmp + 6, 9);
  wr16(icmp + 2, ref_checksum(icmp, f.size() - kEthHeader - 20));
  return f;
}

TEST(Frame, AnswersIcmpEcho) {
  auto f = icmp_echo(37);
  const auto req = f;
  Parsed p;
  ASSERT_EQ(classify_vec(f, &p), Verdict::kIcmpEcho);
  const size_t n = icmp_echo_reply(f.data(), p, local());
  ASSERT_EQ(n, req.size());
  const uint8_t* ip = f.data() + kEthHeader;
  EXPECT_EQ(0, std::memcmp(f.data(), kPeerMac.data(), 6));
  EXPECT_EQ(ref_checksum(ip, 20), 0);
  EXPECT_EQ(rd16(ip + 16), 0x0A00);
  EXPECT_EQ(ip[19], 34);
  EXPECT_EQ(ip[15], 1);
  const uint8_t* icmp = ip + 20;
  EXPECT_EQ(icmp[0], 0);
  EXPECT_EQ(ref_checksum(icmp, n - kEthHeader - 20), 0);
  EXPECT_EQ(0, std::memcmp(icmp + 4, req.data() + kEthHeader + 24, n - kEthHeader - 24));

  EXPECT_EQ(classify_vec(icmp_echo(8, 13)), Verdict::kIcmpNotEcho);
  auto bad = icmp_echo(8);
  bad.back() ^= 1;
  EXPECT_EQ(classify_vec(bad), Verdict::kBadIcmpChecksum);
}

TEST(Frame, UdpReplyInPlaceSwapsAddressesAndFixesChecksums) {
  for (size_t opts : {0, 8}) {
    for (size_t reply_len : {0, 1, 36, 64, 1057}) {
      auto f = udp_frame(payload_of(48), opts);
      Parsed p;
      ASSERT_EQ(classify_vec(f, &p), Verdict::kIna);
      f.resize(std::max(f.size(), kUdpHeadroom + reply_len));
      const auto reply = payload_of(reply_len + 1);
      std::memcpy(f.data() + udp_reply_offset(), reply.data() + 1, reply_len);
      const size_t n =
          udp_reply(f.data(), p, local(), reply_len, sum16(f.data() + kUdpHeadroom, reply_len), 99);
      ASSERT_EQ(n, kUdpHeadroom + reply_len);
      f.resize(n);
      EXPECT_EQ(0, std::memcmp(f.data(), kPeerMac.data(), 6));
      EXPECT_EQ(0, std::memcmp(f.data() + 6, kOurMac.data(), 6));
      const uint8_t* ip = f.data() + kEthHeader;
      EXPECT_EQ(ip[0], 0x45);
      EXPECT_EQ(rd16(ip + 2), 28 + reply_len);
      EXPECT_EQ(ref_checksum(ip, 20), 0);
      EXPECT_EQ(rd16(ip + 12), 0x0A00);
      EXPECT_EQ(ip[15], 1);
      EXPECT_EQ(ip[19], 34);
      EXPECT_EQ(rd16(f.data() + 34), kOurPort);
      EXPECT_EQ(rd16(f.data() + 36), kPeerPort);
      EXPECT_TRUE(udp_checksum_ok(f, 34)) << reply_len;
      // The reply is a valid frame for the peer: classify it from the peer's side.
      Parsed back;
      EXPECT_EQ(classify(f, LocalConfig{kPeerMac, kPeerIp, kPeerPort}, {}, &back), Verdict::kIna);
      EXPECT_EQ(back.ina.size(), reply_len);
    }
  }
}

TEST(Frame, ParsesAddressesWithClearErrors) {
  auto m = parse_mac("02:0a:FF:00:10:01");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(format_mac(*m), "02:0a:ff:00:10:01");
  EXPECT_FALSE(parse_mac("02:0a:ff:00:10").ok());
  EXPECT_FALSE(parse_mac("02:0a:ff:00:10:01:02").ok());
  // Seventeen characters that sscanf's %2x took: a blank, a sign, a lone digit; and other forms.
  for (const char* bad : {" 2:0a:ff:00:10:01", "+2:0a:ff:00:10:01", "2:0a:ff:00:10:01 ",
                          "02-0a-ff-00-10-01", "02:0a:ff:00:10:0g", "02:0a:ff:00:10:1:"}) {
    EXPECT_FALSE(parse_mac(bad).ok()) << bad;
  }
  auto ip = parse_ipv4("192.168.7.9");
  ASSERT_TRUE(ip.ok());
  EXPECT_EQ(*ip, 0xC0A80709u);
  EXPECT_EQ(format_ipv4(*ip), "192.168.7.9");
  auto bad = parse_ipv4("300.1.1.1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().to_string().find("IPv4 address"), std::string::npos);
}

TEST(Frame, CountersSumDrops) {
  Counters c;
  c.add(Verdict::kIna);
  c.add(Verdict::kTooShort);
  c.add(Verdict::kWrongUdpPort);
  c.add(Verdict::kWrongUdpPort);
  EXPECT_EQ(c.get(Verdict::kWrongUdpPort), 2u);
  EXPECT_EQ(c.dropped(), 3u);
  for (size_t i = 0; i < static_cast<size_t>(Verdict::kCount_); ++i) {
    EXPECT_NE(verdict_name(static_cast<Verdict>(i)), "?");
  }
}

}  // namespace
}  // namespace ina::frame
