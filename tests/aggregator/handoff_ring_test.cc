// HandoffRing: records of every size in order, across the wrap, full rings refusing without
// writing, and a producer and a consumer thread passing 200,000 records intact.
#include "aggregator/handoff_ring.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace ina::agg {
namespace {

sockaddr_in addr(uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = port;
  return sa;
}

// Record k: (k % 1500) bytes, byte i = (k * 31 + i) & 0xFF.
std::vector<uint8_t> record(uint64_t k) {
  std::vector<uint8_t> v(k % 1500);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(k * 31 + i);
  return v;
}

TEST(HandoffRing, RecordsComeOutInOrderAcrossTheWrap) {
  HandoffRing r(8192);
  uint64_t next_in = 0, next_out = 0;
  // Fill and drain by turns, so that records straddle the end of the buffer many times.
  for (int pass = 0; pass < 200; ++pass) {
    while (r.push(record(next_in), next_in, addr(static_cast<uint16_t>(next_in)),
                  static_cast<uint32_t>(next_in & 1))) {
      ++next_in;
    }
    const size_t take = 1 + pass % 5;
    for (size_t t = 0; t < take; ++t) {
      HandoffRing::Meta m;
      std::span<const uint8_t> d;
      if (!r.front(&m, &d)) break;
      ASSERT_EQ(m.arrival_ns, next_out);
      ASSERT_EQ(m.src.sin_port, static_cast<uint16_t>(next_out));
      ASSERT_EQ(m.mark, next_out & 1);
      const std::vector<uint8_t> want = record(next_out);
      ASSERT_EQ(std::vector<uint8_t>(d.begin(), d.end()), want) << "record " << next_out;
      r.pop(m);
      ++next_out;
    }
  }
  EXPECT_GT(next_out, 400u);
  EXPECT_GT(next_in * 800, 20 * r.capacity()) << "the test never wrapped";
}

TEST(HandoffRing, FullRingRefusesAndKeepsWhatItHas) {
  HandoffRing r(4096);
  const std::vector<uint8_t> big(1000, 0xAB);
  size_t n = 0;
  while (r.push(big, n, addr(1))) ++n;
  EXPECT_EQ(n, 3u);  // records of 32 + 1000 bytes: a fourth would need 4128 of 4096
  EXPECT_FALSE(r.push(std::vector<uint8_t>(5000), 0, addr(1))) << "larger than the ring";
  EXPECT_TRUE(r.push({}, 99, addr(2))) << "a small record still fits";
  for (size_t k = 0; k < n; ++k) {
    HandoffRing::Meta m;
    std::span<const uint8_t> d;
    ASSERT_TRUE(r.front(&m, &d));
    EXPECT_EQ(m.arrival_ns, k);
    EXPECT_EQ(d.size(), big.size());
    r.pop(m);
  }
  HandoffRing::Meta m;
  std::span<const uint8_t> d;
  ASSERT_TRUE(r.front(&m, &d));
  EXPECT_EQ(m.arrival_ns, 99u);
  EXPECT_TRUE(d.empty());
  r.pop(m);
  EXPECT_TRUE(r.empty());
  EXPECT_FALSE(r.front(&m, &d));
}

TEST(HandoffRing, TwoThreadsPassEveryRecordIntact) {
  constexpr uint64_t kRecords = 200000;
  HandoffRing r(64 << 10);
  std::thread producer([&] {
    for (uint64_t k = 0; k < kRecords;) {
      if (r.push(record(k), k, addr(static_cast<uint16_t>(k)))) {
        ++k;
      } else {
        std::this_thread::yield();
      }
    }
  });
  uint64_t bad = 0;
  for (uint64_t k = 0; k < kRecords;) {
    HandoffRing::Meta m;
    std::span<const uint8_t> d;
    if (!r.front(&m, &d)) {
      std::this_thread::yield();
      continue;
    }
    const std::vector<uint8_t> want = record(k);
    if (m.arrival_ns != k || d.size() != want.size() ||
        (!want.empty() && std::memcmp(d.data(), want.data(), want.size()) != 0)) {
      ++bad;
    }
    r.pop(m);
    ++k;
  }
  producer.join();
  EXPECT_EQ(bad, 0u);
  EXPECT_TRUE(r.empty());
}

}  // namespace
}  // namespace ina::agg
