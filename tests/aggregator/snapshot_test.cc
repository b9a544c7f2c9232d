// merge_snapshots: per-lcore snapshots of the DPDK backend as one (summed counters and lag
// histograms, readiness on every part, the straggler ranking recomputed from the sum, stalled
// slots pooled oldest first, job errors united); engine_snapshot of a real engine.
#include "aggregator/snapshot.h"

#include <gtest/gtest.h>

#include <vector>

#include "test_packets.h"

namespace ina::agg {
namespace {

JobSnapshot job(JobId id, uint32_t world, bool ready) {
  JobSnapshot j;
  j.cfg.job = id;
  j.cfg.slots.world_size = world;
  j.ready = ready;
  j.ranks.assign(world, RankCounters{});
  j.telemetry.assign(world, RankTelemetry{});
  return j;
}

StalledSlot stalled(uint16_t slot, uint64_t age_ns, std::vector<uint32_t> missing) {
  StalledSlot s;
  s.slot = slot;
  s.age_ns = age_ns;
  s.missing = std::move(missing);
  return s;
}

TEST(MergeSnapshots, SumsCountersAndRecomputesTheRanking) {
  AggregatorSnapshot a, b;
  a.engine.packets_in = 10;
  a.engine.completed = 3;
  a.engine.decode.by_error[1] = 2;
  a.tx_datagrams = 7;
  a.send_errors = 1;
  b.engine.packets_in = 5;
  b.engine.completed = 4;
  b.engine.decode.by_error[1] = 1;
  b.tx_datagrams = 2;
  b.unroutable = 3;
  b.job_errors[9] = "no room";

  JobSnapshot ja = job(1, 3, true), jb = job(1, 3, false);
  ja.counters = {100, 6, 1};
  jb.counters = {50, 4, 0};
  ja.ranks[2].packets = 8;
  jb.ranks[2].packets = 9;
  jb.ranks[1].retransmits = 2;
  // Part a: rank 0 lags a little often; part b: rank 2 lags a lot, more often in total.
  ja.telemetry[0].lag_count = 4;
  ja.telemetry[0].lag_sum_ns = 4 * 3000;
  ja.telemetry[0].lag_hist[2] = 4;
  ja.telemetry[1].lag_count = 4;
  ja.telemetry[1].lag_hist[0] = 4;
  ja.telemetry[2].lag_count = 4;
  ja.telemetry[2].lag_hist[0] = 4;
  jb.telemetry[0].lag_count = 6;
  jb.telemetry[0].lag_hist[0] = 6;
  jb.telemetry[1].lag_count = 6;
  jb.telemetry[1].lag_hist[0] = 6;
  jb.telemetry[2].lag_count = 6;
  jb.telemetry[2].lag_sum_ns = 6 * 40000;
  jb.telemetry[2].lag_hist[6] = 6;
  jb.telemetry[2].last = 6;
  // Alone, part a ranks rank 0 first.
  EXPECT_EQ(rank_stragglers(ja.telemetry).front(), 0u);
  ja.stalled = {stalled(2, 5'000'000, {1})};
  jb.stalled = {stalled(3, 9'000'000, {0, 1}), stalled(5, 1'000'000, {2})};
  a.jobs = {ja};
  b.jobs = {jb, job(4, 2, true)};

  const AggregatorSnapshot m = merge_snapshots({a, b}, 2);
  EXPECT_EQ(m.engine.packets_in, 15u);
  EXPECT_EQ(m.engine.completed, 7u);
  EXPECT_EQ(m.engine.decode.by_error[1], 3u);
  EXPECT_EQ(m.tx_datagrams, 9u);
  EXPECT_EQ(m.send_errors, 1u);
  EXPECT_EQ(m.unroutable, 3u);
  ASSERT_EQ(m.job_errors.count(9), 1u);
  ASSERT_EQ(m.jobs.size(), 2u);
  const JobSnapshot& j = m.jobs[0];
  EXPECT_EQ(j.cfg.job, 1u);
  EXPECT_FALSE(j.ready) << "not ready on part b";
  EXPECT_EQ(j.counters.packets, 150u);
  EXPECT_EQ(j.counters.completed, 10u);
  EXPECT_EQ(j.counters.bad_tag, 1u);
  EXPECT_EQ(j.ranks[2].packets, 17u);
  EXPECT_EQ(j.ranks[1].retransmits, 2u);
  EXPECT_EQ(j.telemetry[2].lag_count, 10u);
  EXPECT_EQ(j.telemetry[2].lag_hist[6], 6u);
  EXPECT_EQ(j.telemetry[2].lag_hist[0], 4u);
  EXPECT_EQ(j.telemetry[2].last, 6u);
  // Summed, rank 2's median bucket (6) is the worst: it leads the merged ranking.
  ASSERT_EQ(j.straggler_ranking.size(), 3u);
  EXPECT_EQ(j.straggler_ranking.front(), 2u);
  EXPECT_EQ(j.straggler_ranking, rank_stragglers(j.telemetry));
  // Stalled slots of both parts, oldest first, capped at 2.
  ASSERT_EQ(j.stalled.size(), 2u);
  EXPECT_EQ(j.stalled[0].slot, 3u);
  EXPECT_EQ(j.stalled[0].missing, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(j.stalled[1].slot, 2u);
  EXPECT_EQ(m.jobs[1].cfg.job, 4u);
  EXPECT_TRUE(m.jobs[1].ready);
}

// The lost-time windows of the lcores are summed and ranked anew.
TEST(MergeSnapshots, SumsLostTimeAndRanksItAnew) {
  AggregatorSnapshot a, b;
  JobSnapshot ja = job(1, 3, true), jb = job(1, 3, true);
  for (JobSnapshot* j : {&ja, &jb}) {
    j->loss.ranks.resize(3);
    j->loss.total_ns.resize(3);
    j->loss.collectives = 50;
    j->loss.span_ns = 1'000'000'000;
  }
  // Alone, each part's worst is another rank; summed, rank 1 lost the most.
  ja.loss.ranks[0].lost_ns[0] = 6'000'000;
  ja.loss.ranks[1].lost_ns[1] = 5'000'000;
  jb.loss.ranks[2].lost_ns[0] = 7'000'000;
  jb.loss.ranks[1].lost_ns[1] = 5'000'000;
  jb.loss.total_ns[1][1] = 9;
  ja.loss.sum_sq_s2 = 1e-6;
  jb.loss.sum_sq_s2 = 2e-6;
  a.jobs = {ja};
  b.jobs = {jb};
  const AggregatorSnapshot m = merge_snapshots({a, b});
  const JobSnapshot& j = m.jobs[0];
  EXPECT_EQ(j.loss.ranks[1].lost_total_ns(), 10'000'000u);
  EXPECT_EQ(j.loss.total_ns[1][1], 9u);
  EXPECT_DOUBLE_EQ(j.loss.sum_sq_s2, 3e-6);
  EXPECT_EQ(j.loss.collectives, 50u);
  ASSERT_EQ(j.lost_ranking.size(), 3u);
  EXPECT_EQ(j.lost_ranking[0].rank, 1u);
  EXPECT_EQ(j.lost_ranking[0].cause, LagCause::kLink);
}

TEST(MergeSnapshots, NoPartsIsEmptyAndOnePartIsItself) {
  EXPECT_TRUE(merge_snapshots({}).jobs.empty());
  AggregatorSnapshot a;
  a.engine.hellos = 4;
  JobSnapshot j = job(2, 2, true);
  j.telemetry[1].lag_count = 1;
  j.telemetry[1].lag_hist[3] = 1;
  j.straggler_ranking = {1, 0};
  a.jobs = {j};
  const AggregatorSnapshot m = merge_snapshots({a});
  EXPECT_EQ(m.engine.hellos, 4u);
  ASSERT_EQ(m.jobs.size(), 1u);
  EXPECT_EQ(m.jobs[0].straggler_ranking, (std::vector<uint32_t>{1, 0}));
  EXPECT_TRUE(m.jobs[0].ready);
}

TEST(EngineSnapshot, ListsTheEnginesJobsWithTheirCounters) {
  Engine e;
  const testing::ScopedEpochOf epochs{[&e](JobId job, uint8_t) { return e.epoch(job); }};
  JobConfig c;
  c.job = 5;
  c.key = 0x99;
  c.slots.world_size = 2;
  c.slots.num_slots = 2;
  c.slots.max_payload_bytes = static_cast<uint32_t>(4) * 4;
  ASSERT_TRUE(e.add_job(c).ok());
  for (uint16_t r = 0; r < 2; ++r) {
    wire::Header h = testing::hello_header(5, 0x99, r, 1 + r);
    int32_t rank = -1;
    JobId jid = 0;
    e.on_packet(testing::encode_packet(h, std::vector<int32_t>{2}), 100, &rank, &jid);
  }
  // Rank 0 contributes to slot 1 at t=1000 ns; rank 1 never does: stalled at t=5 ms.
  int32_t rank = -1;
  JobId jid = 0;
  e.on_packet(testing::encode_packet(testing::data_header(5, 0x99, 0, 1, false, 1, 4),
                                     std::vector<int32_t>{1, 2, 3, 4}),
              1000, &rank, &jid);
  const AggregatorSnapshot s = engine_snapshot(e, 5'000'000, 1'000'000);
  EXPECT_EQ(s.engine.packets_in, 3u);
  ASSERT_EQ(s.jobs.size(), 1u);
  EXPECT_EQ(s.jobs[0].cfg.job, 5u);
  EXPECT_TRUE(s.jobs[0].ready);
  EXPECT_EQ(s.jobs[0].ranks[0].packets, 2u);
  ASSERT_EQ(s.jobs[0].stalled.size(), 1u);
  EXPECT_EQ(s.jobs[0].stalled[0].slot, 1u);
  EXPECT_EQ(s.jobs[0].stalled[0].missing, (std::vector<uint32_t>{1}));
}

}  // namespace
}  // namespace ina::agg
