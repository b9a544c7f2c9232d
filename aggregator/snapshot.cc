// merge_snapshots (see snapshot.h): the DPDK backend's per-lcore snapshots as one.
#include "aggregator/snapshot.h"

#include <algorithm>

#include "ina/base/log.h"

namespace ina::agg {

AggregatorSnapshot engine_snapshot(const Engine& e, uint64_t now_ns, uint64_t stall_ns,
                                   bool with_ranking) {
  AggregatorSnapshot s;
  s.engine = e.counters();
  for (const JobConfig& cfg : e.jobs()) {
    JobSnapshot j;
    j.cfg = cfg;
    j.ready = e.job_ready(cfg.job);
    j.counters = *e.job_counters(cfg.job);
    const auto rc = e.rank_counters(cfg.job);
    j.ranks.assign(rc.begin(), rc.end());
    const auto rt = e.rank_telemetry(cfg.job);
    j.telemetry.assign(rt.begin(), rt.end());
    j.loss = e.loss_window(cfg.job, now_ns);
    if (with_ranking) {
      j.straggler_ranking = e.straggler_ranking(cfg.job);
      j.lost_ranking = rank_by_lost_time(j.loss, e.straggler_options());
    }
    j.stalled = e.stalled_slots(cfg.job, now_ns, stall_ns);
    s.jobs.push_back(std::move(j));
  }
  return s;
}

AggregatorSnapshot merge_snapshots(const std::vector<AggregatorSnapshot>& parts,
                                   size_t max_stalled) {
  AggregatorSnapshot out;
  std::map<JobId, size_t> index;  // job -> position in out.jobs
  for (const AggregatorSnapshot& p : parts) {
    add_counters(out.engine, p.engine);
    out.tx_datagrams += p.tx_datagrams;
    out.send_errors += p.send_errors;
    out.unroutable += p.unroutable;
    for (const auto& [job, err] : p.job_errors) out.job_errors.emplace(job, err);
    for (const JobSnapshot& j : p.jobs) {
      auto [it, fresh] = index.emplace(j.cfg.job, out.jobs.size());
      if (fresh) {
        out.jobs.push_back(j);
        continue;
      }
      JobSnapshot& m = out.jobs[it->second];
      m.ready = m.ready && j.ready;
      m.counters.packets += j.counters.packets;
      m.counters.completed += j.counters.completed;
      m.counters.bad_tag += j.counters.bad_tag;
      if (m.ranks.size() < j.ranks.size()) m.ranks.resize(j.ranks.size());
      for (size_t r = 0; r < j.ranks.size(); ++r) {
        m.ranks[r].packets += j.ranks[r].packets;
        m.ranks[r].retransmits += j.ranks[r].retransmits;
        m.ranks[r].duplicates += j.ranks[r].duplicates;
      }
      if (m.telemetry.size() < j.telemetry.size()) m.telemetry.resize(j.telemetry.size());
      for (size_t r = 0; r < j.telemetry.size(); ++r) {
        RankTelemetry& t = m.telemetry[r];
        const RankTelemetry& u = j.telemetry[r];
        t.lag_count += u.lag_count;
        t.lag_sum_ns += u.lag_sum_ns;
        t.last += u.last;
        for (size_t b = 0; b < kLagBuckets; ++b) t.lag_hist[b] += u.lag_hist[b];
      }
      m.loss.add(j.loss);
      m.stalled.insert(m.stalled.end(), j.stalled.begin(), j.stalled.end());
    }
  }
  for (JobSnapshot& j : out.jobs) {
    j.straggler_ranking = rank_stragglers(j.telemetry);
    j.lost_ranking = rank_by_lost_time(j.loss);
    std::stable_sort(
        j.stalled.begin(), j.stalled.end(),
        [](const StalledSlot& a, const StalledSlot& b) { return a.age_ns > b.age_ns; });
    if (j.stalled.size() > max_stalled) j.stalled.resize(max_stalled);
  }
  std::sort(out.jobs.begin(), out.jobs.end(),
            [](const JobSnapshot& a, const JobSnapshot& b) { return a.cfg.job < b.cfg.job; });
  return out;
}

void warn_stragglers(StragglerAlarm& alarm, const AggregatorSnapshot& s, uint64_t now) {
  for (const JobSnapshot& j : s.jobs) {
    for (const std::string& line :
         alarm.check(j.cfg.job, j.cfg.first_rank(), j.lost_ranking, j.loss.span_ns, now,
                     j.cfg.tree.role == TreeRole::kRoot ? "leaf" : "rank")) {
      INA_WARN("straggler", "%s", line.c_str());
    }
  }
}

}  // namespace ina::agg
