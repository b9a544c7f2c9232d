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
    c.slots.max_payload_bytes = static_cast<uint32_t>(4) * 4;
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
  // The workers seal with the incarnation key of the WELCOME's epoch (WIRE.md).
  testing::ScopedEpochOf epochs_{[this](JobId job, uint8_t) { return engine_.epoch(job); }};
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

// Lost time through the engine: rounds of 4 blocks on 4 slots, one collective per
// round of blocks; rank 3 starts 2 ms late in every fifth collective, rank 5 100 us late in
// every one (a steady small straggler), the others within 0..7 us.
TEST_F(TelemetryTest, LostTimeNamesTheIntermittentRankAndItsLateStart) {
  uint64_t t = 1'000'000;
  for (int c = 0; c < 50; ++c) {
    const bool late = c % 5 == 0;
    const BlockSeq seq = static_cast<BlockSeq>(c * 4 + 1);
    // Each rank sends its 4 blocks back to back (rotating order), so the 4 rounds are in flight
    // together: one collective.
    for (uint16_t i = 0; i < kWorld; ++i) {
      const uint16_t r = static_cast<uint16_t>((i + c) % kWorld);
      if (r == 3 && late) continue;
      if (r == 5) continue;
      for (BlockSeq b = 0; b < 4; ++b) send(data(r, seq + b), t + i * 1000 + b * 100);
    }
    for (BlockSeq b = 0; b < 4; ++b) send(data(5, seq + b), t + 100'000 + b * 100);
    if (late) {
      for (BlockSeq b = 0; b < 4; ++b) send(data(3, seq + b), t + 2'000'000 + b * 1000);
    }
    t += 3'000'000;
  }
  const LossWindow w = engine_.loss_window(kJob, t);
  ASSERT_EQ(w.ranks.size(), kWorld);
  EXPECT_EQ(w.collectives, 50u);
  // 10 late collectives, each held up from rank 5's arrival (100 us) to rank 3's last block
  // (2.003 ms): the hold-ups of one collective are one interval, not one per block.
  EXPECT_NEAR(static_cast<double>(w.ranks[3].lost_total_ns()), 10 * 1'903'000.0, 10 * 1'000.0);
  EXPECT_EQ(w.ranks[3].episodes, 10u);
  EXPECT_EQ(w.ranks[3].collectives, 10u);
  const std::vector<RankVerdict> v = rank_by_lost_time(w);
  EXPECT_EQ(v[0].rank, 3u);
  EXPECT_TRUE(v[0].named);
  EXPECT_EQ(v[0].cause, LagCause::kStart);
  EXPECT_NEAR(v[0].collective_fraction, 0.2, 1e-9);
  EXPECT_EQ(v[1].rank, 5u);
  EXPECT_FALSE(v[1].named);
  // The median ranking puts rank 5 first: rank 3's median lag is that of a punctual rank.
  EXPECT_EQ(engine_.straggler_ranking(kJob)[0], 5u);
}

// A retransmission that fills a round is loss; a retransmission for a completed round (the rank
// did not get the result) marks the rank's next hold-up as the return path.
TEST_F(TelemetryTest, RetransmissionsAndResentCompletedRoundsAreCounted) {
  uint64_t t = 1'000'000;
  for (uint16_t r = 0; r < kWorld - 1; ++r) send(data(r, 1), t + r);
  wire::Header h = data_header(kJob, kKey, kWorld - 1, 0, false, 1, 4);
  h.flags |= wire::kFlagRetransmit;
  const auto rtx = encode_packet(h, std::vector<int32_t>(4, 1));
  EXPECT_EQ(send(rtx, t + 3'000'000).target, Reply::Target::kAllRanks);
  // The same rank resends the completed round: it did not get the result.
  EXPECT_EQ(send(rtx, t + 6'000'000).target, Reply::Target::kSender);
  // Its next round: late again, now charged to the return path.
  for (uint16_t r = 0; r < kWorld - 1; ++r) send(data(r, 2), t + 3'100'000 + r);
  send(data(kWorld - 1, 2), t + 6'100'000);
  const LossWindow w = engine_.loss_window(kJob, t + 7'000'000);
  const RankLoss& l = w.ranks[kWorld - 1];
  EXPECT_EQ(l.retransmits_added, 1u);
  EXPECT_EQ(l.resent_completed, 1u);
  EXPECT_NEAR(static_cast<double>(l.lost_ns[static_cast<size_t>(LagCause::kLoss)]), 3e6, 10.0);
  EXPECT_NEAR(static_cast<double>(l.lost_ns[static_cast<size_t>(LagCause::kReturn)]), 3e6, 10.0);
  EXPECT_EQ(w.total_ns[kWorld - 1][static_cast<size_t>(LagCause::kReturn)],
            l.lost_ns[static_cast<size_t>(LagCause::kReturn)]);
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
  for (const RankLoss& l : engine_.loss_window(kJob, 1'000'000).ranks) {
    EXPECT_EQ(l.lost_total_ns(), 0u);
  }
  EXPECT_EQ(engine_.counters().completed, 1u);
}

}  // namespace
}  // namespace ina::agg
