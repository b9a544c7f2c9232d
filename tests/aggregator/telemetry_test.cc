// Engine telemetry: lag of each rank behind a round's first contribution (histogram, mean, rounds
// completed last), the straggler ranking, stalled slots naming their missing ranks; timed packets
// never allocate.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "aggregator/engine.h"
#include "alloc_counter.h"
#include "test_packets.h"

namespace ina::agg {
namespace {

using testing::data_header;
using testing::encode_packet;

constexpr JobId kJob = 3;
constexpr uint64_t kKey = 0x77;

class TelemetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    JobConfig c;
    c.job = kJob;
    c.key = kKey;
    c.slots.world_size = kWorld;
    c.slots.num_slots = 4;
    c.slots.max_elems = 4;
    ASSERT_TRUE(engine_.add_job(c).ok());
    for (uint16_t r = 0; r < kWorld; ++r) {
      wire::Header h = testing::hello_header(kJob, kKey, r, 9 + r);
      send(encode_packet(h, std::vector<int32_t>{kWorld}), 0);
    }
    ASSERT_TRUE(engine_.job_ready(kJob));
  }
  Reply send(const std::vector<uint8_t>& b, uint64_t now_ns) {
    int32_t rank;
    JobId job;
    return engine_.on_packet(b, now_ns, &rank, &job);
  }
  std::vector<uint8_t> data(uint16_t rank, BlockSeq seq) {
    return encode_packet(data_header(kJob, kKey, rank, static_cast<uint16_t>((seq - 1) % 4),
                                     ((seq - 1) / 4) % 2 == 1, seq, 4),
                         std::vector<int32_t>(4, 1));
  }
  static constexpr uint16_t kWorld = 8;
  Engine engine_;
};

TEST_F(TelemetryTest, LagHistogramAndRankingNameTheDelayedRank) {
  // Rank 5 arrives 300 us after the others, which arrive within 0..7 us in rotating order.
  uint64_t t = 1'000'000;
  for (BlockSeq seq = 1; seq <= 40; ++seq) {
    for (uint16_t i = 0; i < kWorld; ++i) {
      const uint16_t r = static_cast<uint16_t>((i + seq) % kWorld);
      if (r == 5) continue;
      send(data(r, seq), t + i * 1000);
    }
    const Reply rep = send(data(5, seq), t + 300'000);
    ASSERT_EQ(rep.target, Reply::Target::kAllRanks);
    t += 1'000'000;
  }
  const std::vector<uint32_t> rank = engine_.straggler_ranking(kJob);
  ASSERT_EQ(rank.size(), kWorld);
  EXPECT_EQ(rank[0], 5u);
  const auto tele = engine_.rank_telemetry(kJob);
  EXPECT_EQ(tele[5].last, 40u);
  EXPECT_EQ(tele[5].lag_count, 40u);
  EXPECT_NEAR(tele[5].mean_lag_us(), 300.0, 8.0);
  // 300 us lies in [256, 512): bucket 9.
  EXPECT_EQ(tele[5].lag_hist[9], 40u);
  uint64_t others_last = 0;
  for (uint32_t r = 0; r < kWorld; ++r) {
    if (r != 5) {
      others_last += tele[r].last;
      EXPECT_LT(tele[r].mean_lag_us(), 8.0);
    }
  }
  EXPECT_EQ(others_last, 0u);
  EXPECT_EQ(lag_bucket(0), 0u);
  // One long stall of rank 2 (a descheduled process) raises its mean above rank 5's, not its
  // median: rank 5, late every round, stays first.
  for (BlockSeq seq = 41; seq <= 42; ++seq) {
    for (uint16_t r = 0; r < kWorld; ++r) {
      if (r != 2 && r != 5) send(data(r, seq), t + r * 1000);
    }
    send(data(5, seq), t + 300'000);
    send(data(2, seq), t + 50'000'000);
    t += 100'000'000;
  }
  EXPECT_GT(engine_.rank_telemetry(kJob)[2].mean_lag_us(),
            engine_.rank_telemetry(kJob)[5].mean_lag_us());
  EXPECT_EQ(engine_.straggler_ranking(kJob)[0], 5u);
  EXPECT_EQ(lag_bucket(999), 0u);
  EXPECT_EQ(lag_bucket(1000), 1u);
  EXPECT_EQ(lag_bucket(3999), 2u);
  EXPECT_EQ(lag_bucket(uint64_t{1} << 60), kLagBuckets - 1);
}

TEST_F(TelemetryTest, StalledSlotNamesTheRankThatStopped) {
  // Round 1 completes; in rounds 2 and 3 rank 6 and rank 2 never arrive.
  for (uint16_t r = 0; r < kWorld; ++r) send(data(r, 1), 1000 + r);
  for (uint16_t r = 0; r < kWorld; ++r) {
    if (r != 6) send(data(r, 2), 2'000'000 + r);
  }
  for (uint16_t r = 0; r < kWorld; ++r) {
    if (r != 6 && r != 2) send(data(r, 3), 3'000'000 + r);
  }
  // Young rounds are not reported.
  EXPECT_TRUE(engine_.stalled_slots(kJob, 3'000'100, 1'000'200).empty());
  EXPECT_EQ(engine_.stalled_slots(kJob, 3'000'100, 1'000'000).size(), 1u);
  const std::vector<StalledSlot> s = engine_.stalled_slots(kJob, 10'000'000, 1'000'000);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].seq, 2u);  // oldest first
  EXPECT_EQ(s[0].slot, 1u);
  EXPECT_EQ(s[0].missing, std::vector<uint32_t>{6});
  EXPECT_EQ(s[0].contributors, 7u);
  EXPECT_EQ(s[0].age_ns, 8'000'000u);
  EXPECT_EQ(s[1].seq, 3u);
  EXPECT_EQ(s[1].missing, (std::vector<uint32_t>{2, 6}));
  EXPECT_EQ(engine_.stalled_slots(kJob, 10'000'000, 1'000'000, 1).size(), 1u);
  EXPECT_TRUE(engine_.stalled_slots(kJob + 1, 10'000'000, 0).empty());
}

TEST_F(TelemetryTest, TimedPacketPathDoesNotAllocate) {
  std::vector<std::vector<uint8_t>> pkts;
  for (BlockSeq seq = 1; seq <= 64; ++seq) {
    for (uint16_t r = 0; r < kWorld; ++r) pkts.push_back(data(r, seq));
  }
  const size_t before = testing::g_counted_allocs.load();
  {
    testing::CountAllocs counting;
    uint64_t t = 1;
    for (const auto& p : pkts) send(p, t += 1000);
  }
  EXPECT_EQ(testing::g_counted_allocs.load() - before, 0u);
  EXPECT_EQ(engine_.counters().completed, 64u);
  EXPECT_EQ(engine_.rank_telemetry(kJob)[kWorld - 1].last, 64u);
}

TEST_F(TelemetryTest, UntimedPacketsAndDisabledTelemetryRecordNothing) {
  for (uint16_t r = 0; r < kWorld; ++r) send(data(r, 1), 0);
  for (const RankTelemetry& t : engine_.rank_telemetry(kJob)) EXPECT_EQ(t.lag_count, 0u);
  EXPECT_EQ(engine_.counters().completed, 1u);
}

}  // namespace
}  // namespace ina::agg
