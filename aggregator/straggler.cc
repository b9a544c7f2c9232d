// Straggler location by lost time (see straggler.h).
#include "aggregator/straggler.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>

namespace ina::agg {

const char* lag_cause_name(LagCause c) {
  switch (c) {
    case LagCause::kStart: return "start";
    case LagCause::kLink: return "link";
    case LagCause::kLoss: return "loss";
    case LagCause::kReturn: return "return";
  }
  return "?";
}

const char* lag_cause_meaning(LagCause c) {
  switch (c) {
    case LagCause::kStart: return "late start (compute or host side)";
    case LagCause::kLink: return "slow link (its packets queued: bandwidth)";
    case LagCause::kLoss: return "lossy link (retransmissions)";
    case LagCause::kReturn: return "slow or lossy return path (results not received)";
  }
  return "?";
}

void RankLoss::add(const RankLoss& o) {
  for (size_t c = 0; c < kLagCauses; ++c) lost_ns[c] += o.lost_ns[c];
  rounds += o.rounds;
  episodes += o.episodes;
  collectives += o.collectives;
  retransmits_added += o.retransmits_added;
  resent_completed += o.resent_completed;
}

void LossWindow::add(const LossWindow& o) {
  if (ranks.size() < o.ranks.size()) ranks.resize(o.ranks.size());
  for (size_t r = 0; r < o.ranks.size(); ++r) ranks[r].add(o.ranks[r]);
  if (total_ns.size() < o.total_ns.size()) total_ns.resize(o.total_ns.size());
  for (size_t r = 0; r < o.total_ns.size(); ++r) {
    for (size_t c = 0; c < kLagCauses; ++c) total_ns[r][c] += o.total_ns[r][c];
  }
  collectives = std::max(collectives, o.collectives);
  span_ns = std::max(span_ns, o.span_ns);
  sum_sq_s2 += o.sum_sq_s2;
}

namespace {

// P(Binomial(n, p) >= k): exact up to n = 4000, normal with continuity correction beyond.
double binomial_tail(uint64_t n, uint64_t k, double p) {
  if (k == 0) return 1.0;
  if (k > n) return 0.0;
  const double nd = static_cast<double>(n);
  if (n > 4000) {
    const double sd = std::sqrt(nd * p * (1 - p));
    const double z = (static_cast<double>(k) - 0.5 - nd * p) / sd;
    return 0.5 * std::erfc(z / std::sqrt(2.0));
  }
  const double lp = std::log(p), lq = std::log1p(-p), ln = std::lgamma(nd + 1);
  double sum = 0;
  for (uint64_t i = k; i <= n; ++i) {
    const double id = static_cast<double>(i);
    const double t = ln - std::lgamma(id + 1) - std::lgamma(nd - id + 1) + id * lp + (nd - id) * lq;
    sum += std::exp(t);
    if (t < -60 && id > nd * p) break;  // the rest is negligible
  }
  return std::min(sum, 1.0);
}

}  // namespace

std::vector<RankVerdict> rank_by_lost_time(const LossWindow& w, const StragglerOptions& o) {
  const size_t n = w.ranks.size();
  std::vector<RankVerdict> out(n);
  double total_s = 0;
  for (const RankLoss& l : w.ranks) total_s += static_cast<double>(l.lost_total_ns()) * 1e-9;
  const double nd = static_cast<double>(n);
  const double var = n > 1 ? w.sum_sq_s2 * (1.0 / nd) * (1.0 - 1.0 / nd) : 0.0;
  // min_share holds at N = 8 and scales as 1/N (twice the fair share at the default), capped
  // halfway between the fair share and everything (so that N = 2 can name a rank).
  const double share_floor = n > 0 ? std::min(o.min_share * 8.0 / nd, (1.0 + 1.0 / nd) / 2.0) : 1.0;
  auto median = [&w](uint64_t RankLoss::*m) -> uint64_t {
    std::vector<uint64_t> v;
    for (const RankLoss& l : w.ranks) v.push_back(l.*m);
    if (v.empty()) return 0;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const uint64_t med_rtx = median(&RankLoss::retransmits_added);
  const uint64_t med_resent = median(&RankLoss::resent_completed);
  for (size_t r = 0; r < n; ++r) {
    RankVerdict& v = out[r];
    const RankLoss& l = w.ranks[r];
    v.rank = static_cast<uint32_t>(r);
    v.loss = l;
    v.lost_ns = l.lost_total_ns();
    const double s = static_cast<double>(v.lost_ns) * 1e-9;
    v.share = total_s > 0 ? s / total_s : 0.0;
    v.z = var > 0 ? (s - total_s / nd) / std::sqrt(var) : 0.0;
    if (n > 1 && w.sum_sq_s2 > 0) {
      const double neff = std::max(1.0, std::round(total_s * total_s / w.sum_sq_s2));
      const double k = std::min(neff, std::round(v.share * neff));
      v.p = binomial_tail(static_cast<uint64_t>(neff), static_cast<uint64_t>(k), 1.0 / nd);
    }
    v.named = n > 1 && v.lost_ns > 0 && v.p <= o.alpha / nd && v.share >= share_floor &&
              l.episodes >= o.min_episodes;
    const uint64_t start = l.lost_ns[static_cast<size_t>(LagCause::kStart)];
    const uint64_t link = l.lost_ns[static_cast<size_t>(LagCause::kLink)];
    const uint64_t lossy = l.lost_ns[static_cast<size_t>(LagCause::kLoss)] +
                           l.lost_ns[static_cast<size_t>(LagCause::kReturn)];
    if (lossy > start && lossy > link) {
      // Every rank resends some completed rounds (spurious timeouts): what counts is the excess
      // over the job's median rank.
      const uint64_t rtx = l.retransmits_added > med_rtx ? l.retransmits_added - med_rtx : 0;
      const uint64_t resent = l.resent_completed > med_resent ? l.resent_completed - med_resent : 0;
      v.cause = rtx > 0 && rtx * 4 >= resent ? LagCause::kLoss : LagCause::kReturn;
    } else {
      v.cause = link > start ? LagCause::kLink : LagCause::kStart;
    }
    v.collective_fraction =
        w.collectives > 0 ? static_cast<double>(l.collectives) / static_cast<double>(w.collectives)
                          : 0.0;
    v.mean_episode_ms = l.episodes > 0
                            ? static_cast<double>(v.lost_ns) / 1e6 / static_cast<double>(l.episodes)
                            : 0.0;
  }
  std::stable_sort(out.begin(), out.end(), [](const RankVerdict& a, const RankVerdict& b) {
    if (a.named != b.named) return a.named;
    return a.lost_ns > b.lost_ns;
  });
  return out;
}

void LossTracker::reset(uint32_t nranks, const StragglerOptions& o) {
  opts_ = o;
  if (opts_.epochs == 0) opts_.epochs = 1;
  nranks_ = nranks;
  cur_ = 0;
  collective_seq_ = 0;
  last_rank_ = 0;
  last_t_ = other_t_ = 0;
  last_completion_ = 0;
  gap_ewma_ns_ = 0;
  state_.assign(nranks, RankState{});
  epochs_.assign(opts_.epochs, Epoch{});
  loss_.assign(size_t{opts_.epochs} * nranks, RankLoss{});
  total_.assign(nranks, {});
}

void LossTracker::rotate(uint64_t now) {
  Epoch& e = epochs_[cur_];
  if (e.start == 0) {
    e.start = now;
    return;
  }
  if (now - e.start < opts_.epoch_ns && e.collectives < opts_.epoch_collectives) return;
  cur_ = (cur_ + 1) % opts_.epochs;
  epochs_[cur_] = Epoch{now, 0, 0};
  std::fill_n(loss_.begin() + static_cast<std::ptrdiff_t>(size_t{cur_} * nranks_), nranks_,
              RankLoss{});
}

void LossTracker::on_collective_start(uint64_t now) {
  if (!active()) return;
  rotate(now);
  // A pipeline that drains for a moment inside a collective is not a new one: a new collective
  // follows an idle gap longer than a few of the ranks' usual packet spacings.
  const double idle_min =
      std::max(static_cast<double>(opts_.collective_gap_ns), 4.0 * gap_ewma_ns_);
  if (last_completion_ != 0 && now >= last_completion_ &&
      static_cast<double>(now - last_completion_) < idle_min) {
    return;
  }
  ++collective_seq_;
  ++epochs_[cur_].collectives;
}

void LossTracker::on_retransmit_added(uint32_t rank, uint64_t now) {
  if (!active()) return;
  rotate(now);
  ++cur(rank).retransmits_added;
}

void LossTracker::on_resent_completed(uint32_t rank, uint64_t now) {
  if (!active()) return;
  rotate(now);
  ++cur(rank).resent_completed;
  state_[rank].return_pending = true;
}

void LossTracker::on_arrival(uint32_t rank, uint64_t now) {
  if (!active()) return;
  RankState& s = state_[rank];
  constexpr uint64_t kGapCap = 500'000;  // longer: between bursts, not a rank's usual spacing
  if (s.prev_arrival != 0 && now >= s.prev_arrival && now - s.prev_arrival < kGapCap) {
    gap_ewma_ns_ += (static_cast<double>(now - s.prev_arrival) - gap_ewma_ns_) / 64.0;
  }
  s.prev_arrival = now;
  s.prev_collective = collective_seq_;
  if (rank != last_rank_) {
    other_t_ = last_t_;
    last_rank_ = rank;
  }
  last_t_ = now;
}

void LossTracker::on_completion(uint32_t rank, uint64_t now, uint64_t second, bool retransmit) {
  if (!active()) return;
  rotate(now);
  RankState& s = state_[rank];
  const uint64_t other = last_rank_ != rank ? last_t_ : other_t_;  // any other rank's last
  const uint64_t from = std::max({second, s.held_until, other});
  if (now > from) {
    const uint64_t x = now - from;
    const bool joined = from == s.held_until && s.held_until != 0;
    if (!joined) {  // a new hold-up: how it started decides its cause
      s.episode_ns = 0;
      s.episode_counted = false;
      // Silent: nothing of L arrived since the others had all sent this round (a late start);
      // L's packets arriving after that, in a trickle or in bursts, are its link's pace.
      const bool silent = s.prev_arrival == 0 || s.prev_arrival <= second;
      // A silence inside a collective L had begun spreads its packets out (a slow
      // link: a rank whose socket drains slowly also stops while it waits); a late start is a
      // silence before L's first packet of the collective.
      const bool began = s.prev_arrival != 0 && s.prev_collective == collective_seq_;
      s.episode_cause = !silent || (began && !s.return_pending) ? LagCause::kLink
                        : s.return_pending                      ? LagCause::kReturn
                                                                : LagCause::kStart;
    }
    LagCause c = s.episode_cause;
    if (retransmit) {
      c = LagCause::kLoss;
    } else if (joined && s.prev_arrival != 0 && now > s.prev_arrival &&
               static_cast<double>(now - s.prev_arrival) > 1.5 * gap_ewma_ns_ &&
               s.prev_arrival >= from) {
      c = LagCause::kLink;  // sending, but further apart than the job's ranks usually are
    }
    RankLoss& l = cur(rank);
    l.lost_ns[static_cast<size_t>(c)] += x;
    total_[rank][static_cast<size_t>(c)] += x;
    ++l.rounds;
    const double xs = static_cast<double>(x) * 1e-9;
    epochs_[cur_].sum_sq_s2 += xs * xs;
    s.episode_ns += x;
    if (!s.episode_counted && s.episode_ns >= opts_.episode_floor_ns) {
      s.episode_counted = true;
      ++l.episodes;
      if (s.episode_collective != collective_seq_ + 1) {
        s.episode_collective = collective_seq_ + 1;
        ++l.collectives;
      }
    }
    s.held_until = now;
  }
  s.return_pending = false;
  last_completion_ = now;
}

LossWindow LossTracker::window(uint64_t now) const {
  LossWindow w;
  w.ranks.assign(nranks_, RankLoss{});
  w.total_ns = total_;
  const uint64_t span_max = opts_.epoch_ns * opts_.epochs;
  uint64_t oldest = 0;
  for (uint32_t e = 0; e < epochs_.size(); ++e) {
    const Epoch& ep = epochs_[e];
    if (ep.start == 0 || (now > ep.start && now - ep.start > span_max)) continue;
    if (oldest == 0 || ep.start < oldest) oldest = ep.start;
    w.collectives += ep.collectives;
    w.sum_sq_s2 += ep.sum_sq_s2;
    for (uint32_t r = 0; r < nranks_; ++r) w.ranks[r].add(loss_[size_t{e} * nranks_ + r]);
  }
  w.span_ns = oldest != 0 && now > oldest ? now - oldest : 0;
  return w;
}

std::vector<std::string> StragglerAlarm::check(uint32_t job, uint32_t first_rank,
                                               std::span<const RankVerdict> ranking,
                                               uint64_t window_span_ns, uint64_t now,
                                               const char* member) {
  std::vector<std::string> lines;
  for (const RankVerdict& v : ranking) {
    if (!v.named || v.share < min_share_) continue;
    const uint32_t rank = first_rank + v.rank;
    auto it = std::find_if(last_.begin(), last_.end(),
                           [&](const Last& l) { return l.job == job && l.rank == rank; });
    if (it != last_.end() && now - it->at < every_ns_) continue;
    if (it == last_.end()) {
      last_.push_back({job, rank, now});
    } else {
      it->at = now;
    }
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "job %" PRIu32 ": %s %" PRIu32
                  " is a straggler: it held the job up %.1f ms "
                  "in the last %.1f s (%.0f%% of the time lost to stragglers, z %.1f), in %" PRIu64
                  " episodes (%.0f%% of collectives, %.2f ms each); cause: %s",
                  job, member, rank, static_cast<double>(v.lost_ns) / 1e6,
                  static_cast<double>(window_span_ns) / 1e9, v.share * 100.0, v.z, v.loss.episodes,
                  v.collective_fraction * 100.0, v.mean_episode_ms, lag_cause_meaning(v.cause));
    lines.emplace_back(buf);
  }
  return lines;
}

}  // namespace ina::agg
