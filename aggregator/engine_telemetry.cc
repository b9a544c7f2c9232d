// The engine's telemetry (engine.h): per rank the lag behind each round's first contribution and
// the lost time of the straggler test (straggler.h), recorded as DATA arrives, and the queries
// over them (the ranking, the loss window, the rounds that stall).
#include <algorithm>
#include <string>
#include <vector>

#include "aggregator/engine.h"
#include "aggregator/engine_job.h"

namespace ina::agg {

void Engine::note_arrival(Job& job, const wire::Header& h, Verdict v, uint64_t now_ns) {
  const bool retransmit = h.has(wire::kFlagRetransmit);
  if (v == Verdict::kAdded || v == Verdict::kCompleted) {
    // The lag behind the round's first contribution; the first one starts the clock.
    const size_t copy = copy_index(h.slot, h.shadow);
    uint64_t& first = job.first_ns[copy];
    const uint32_t n = job.table->contributors(h.slot, h.shadow);
    uint64_t lag = 0;
    if (n == 1) {
      first = now_ns;
      // A round replacing one still in flight (abandoned) keeps its place in the count.
      if (job.open[copy] == 0) {
        job.open[copy] = 1;
        if (job.inflight++ == 0) job.loss.on_collective_start(now_ns);
      }
    } else if (now_ns > first) {
      lag = now_ns - first;
    }
    if (n + 1 == job.nranks) job.second_ns[copy] = now_ns;  // the next-to-last contribution
    RankTelemetry& t = job.tele[h.rank];
    ++t.lag_count;
    t.lag_sum_ns += lag;
    ++t.lag_hist[lag_bucket(lag)];
    if (retransmit) job.loss.on_retransmit_added(h.rank, now_ns);
    if (v == Verdict::kCompleted) {
      if (job.open[copy] != 0) {
        job.open[copy] = 0;
        --job.inflight;
      }
      if (job.world > 1) ++t.last;
      job.loss.on_completion(h.rank, now_ns, job.second_ns[copy], retransmit);
    }
    job.loss.on_arrival(h.rank, now_ns);
  } else if (v == Verdict::kResendResult && retransmit) {
    job.loss.on_resent_completed(h.rank, now_ns);
  }
}

std::span<const RankTelemetry> Engine::rank_telemetry(JobId job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return {};
  return it->second->tele;
}

std::vector<uint32_t> rank_stragglers(std::span<const RankTelemetry> t) {
  std::vector<uint32_t> order(t.size());
  for (uint32_t r = 0; r < order.size(); ++r) order[r] = r;
  // Ranked by the median lag (the lower median's histogram bucket), then the mean: one long
  // descheduling of an otherwise punctual rank moves its mean a lot and its median not at all,
  // while a rank that is late most of the time moves both. The histogram and the mean still show
  // intermittent stragglers.
  std::vector<size_t> median(t.size(), 0);
  for (size_t r = 0; r < t.size(); ++r) {
    const uint64_t half = (t[r].lag_count + 1) / 2;
    uint64_t cum = 0;
    for (size_t b = 0; b < kLagBuckets; ++b) {
      cum += t[r].lag_hist[b];
      if (cum >= half && half > 0) {
        median[r] = b;
        break;
      }
    }
  }
  std::stable_sort(order.begin(), order.end(), [&t, &median](uint32_t a, uint32_t b) {
    if (median[a] != median[b]) return median[a] > median[b];
    const double la = t[a].mean_lag_us();
    const double lb = t[b].mean_lag_us();
    if (la != lb) return la > lb;
    return t[a].last > t[b].last;
  });
  return order;
}

std::vector<uint32_t> Engine::straggler_ranking(JobId job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return {};
  return rank_stragglers(it->second->tele);
}

LossWindow Engine::loss_window(JobId job, uint64_t now_ns) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return {};
  return it->second->loss.window(now_ns);
}

std::vector<StalledSlot> Engine::stalled_slots(JobId job, uint64_t now_ns, uint64_t min_age_ns,
                                               size_t max) const {
  std::vector<StalledSlot> out;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return out;
  const Job& j = *it->second;
  for (uint32_t slot = 0; slot < j.cfg.slots.num_slots; ++slot) {
    for (bool shadow : {false, true}) {
      const uint64_t first = j.first_ns[copy_index(static_cast<uint16_t>(slot), shadow)];
      if (first == 0 || now_ns < first || now_ns - first < min_age_ns) continue;
      const CopyView c = j.table->copy(static_cast<uint16_t>(slot), shadow);
      if (!c.used) continue;
      const size_t k = copy_index(static_cast<uint16_t>(slot), shadow);
      const bool waiting_parent = c.complete && j.relay && j.relay->awaits_parent(k);
      if (c.complete && !waiting_parent) continue;
      StalledSlot s;
      s.waiting_parent = waiting_parent;
      s.slot = static_cast<uint16_t>(slot);
      s.shadow = shadow;
      s.seq = c.seq;
      s.age_ns = now_ns - first;
      s.contributors = c.contributors;
      for (uint32_t r = 0; r < j.nranks; ++r) {
        if (((c.bitmap[r / 64] >> (r % 64)) & 1) == 0) s.missing.push_back(j.rank_base + r);
      }
      // The root's last report, in global ranks: the ranks behind the other leaves it lacks.
      if (waiting_parent) j.relay->append_root_missing(k, c.seq, &s.missing);
      out.push_back(std::move(s));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const StalledSlot& a, const StalledSlot& b) { return a.age_ns > b.age_ns; });
  if (out.size() > max) out.resize(max);
  return out;
}

}  // namespace ina::agg
