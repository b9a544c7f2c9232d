// What an aggregator's serving threads publish for other threads (the control agent's heartbeats,
// /metrics and /v1/telemetry): per-job counters, telemetry and stalled slots. The kernel UDP
// backend publishes one snapshot; the DPDK backend one per lcore, merged here into one (pure
// logic, unit-tested alone).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "aggregator/engine.h"

namespace ina::agg {

struct JobSnapshot {
  JobConfig cfg;
  bool ready = false;
  JobCounters counters;
  std::vector<RankCounters> ranks;
  std::vector<RankTelemetry> telemetry;
  std::vector<uint32_t> straggler_ranking;  // by arrival lag (median bucket), worst first
  LossWindow loss;                          // lost time per rank and cause (straggler.h)
  std::vector<RankVerdict> lost_ranking;    // by lost time, worst first (rank_by_lost_time)
  std::vector<StalledSlot> stalled;
};
struct AggregatorSnapshot {
  EngineCounters engine;
  uint64_t tx_datagrams = 0;
  uint64_t send_errors = 0;
  uint64_t unroutable = 0;
  std::vector<JobSnapshot> jobs;
  std::map<JobId, std::string> job_errors;  // set_jobs() entries that could not be added
};

// The jobs and counters of one engine at `now_ns` (the clock of its on_packet times), with the
// rounds older than `stall_ns` as stalled. Allocates: between batches, never on the packet path.
// The backend fills in its own I/O counters (tx_datagrams, send_errors, unroutable, job_errors).
// `with_ranking` false leaves straggler_ranking and lost_ranking empty: a part that
// merge_snapshots ranks anew from the summed telemetry and lost time.
AggregatorSnapshot engine_snapshot(const Engine& e, uint64_t now_ns, uint64_t stall_ns,
                                   bool with_ranking = true);

// One snapshot of several engines that serve the same jobs, each a part of every job's slots (the
// DPDK backend's lcores): counters, per-rank counters and lag histograms are summed; a job is
// ready when it is ready on every part; the straggler rankings are recomputed from the summed
// telemetry and lost-time windows (LossWindow::add); stalled slots are pooled, oldest first, at
// most `max_stalled` per job. A job missing from some part (a job change not yet applied
// everywhere) is merged from the parts that have it. Errors are the union. (HELLOs reach every
// lcore; the DPDK backend counts each in the part that received it only: Engine::on_packet's
// counted_elsewhere.)
AggregatorSnapshot merge_snapshots(const std::vector<AggregatorSnapshot>& parts,
                                   size_t max_stalled = 16);

// Logs (warn) the named stragglers of `s` that `alarm` lets through at `now` (rate-limited per
// job and rank). Called by the backends when they publish, never on the packet path.
void warn_stragglers(StragglerAlarm& alarm, const AggregatorSnapshot& s, uint64_t now);

}  // namespace ina::agg
