// DPDK backend (see dpdk_backend.h): the control side. The per-lcore mailbox (jobs posted by the
// main lcore's service(), applied and answered with a snapshot by each lcore between bursts), the
// merged snapshot published for the control agent, and the counters: per lcore while the loops
// run, every one of them (summed, per lcore, per rank) after stop().
#include <cinttypes>
#include <cstdio>
#include <utility>

#include "aggregator/dpdk_backend.h"
#include "aggregator/dpdk_lcore.h"
#include "ina/protocol/wire.h"

namespace ina::agg {

using dpdk::now_ns;

// The lcore's side of the mailbox (or the main lcore's while the loops do not run).
void DpdkAggregator::Lcore::handle_mail() {
  if (mail.has_jobs) apply_jobs(mail.jobs);
  mail.snap = take_snapshot();
}

void DpdkAggregator::Lcore::answer_mail() {
  const uint64_t posted = mail.posted.load(std::memory_order_acquire);
  if (posted == mail_seen) [[likely]]
    return;
  handle_mail();
  mail_seen = posted;
  mail.done.store(posted, std::memory_order_release);
}

// The jobs on this lcore's engine and address book (backend_shell.h), with the DPDK loop's limits.
void DpdkAggregator::Lcore::apply_jobs(const std::vector<JobConfig>& desired) {
  JobHooks h;
  h.admit = [this](const JobConfig& j) -> Status {
    if (dpdk::job_packet_size(j, 1) > self->max_packet_) {
      return invalid_argument("block of " + std::to_string(j.slots.max_payload_bytes) + " bytes" +
                              (j.tree.role == TreeRole::kRoot
                                   ? " (a tree root: PARTIAL words up to "
                                     "4x the block)"
                                   : "") +
                              " exceeds this aggregator's mbufs (max_payload_bytes)");
    }
    if (j.is_leaf()) {
      return invalid_argument("a tree leaf (parent " + j.tree.parent +
                              ") needs --backend udp: the DPDK loop has no route to a parent");
    }
    return ok_status();
  };
  h.removed = [this](JobId job) { book.erase(job); };
  h.added = [this](const JobConfig& j) { book.reset(j.job, j.slots.world_size); };
  job_errors = reconcile_jobs(*engine, desired, h);
}

AggregatorSnapshot DpdkAggregator::Lcore::take_snapshot() const {
  const uint64_t stall_ns =
      static_cast<uint64_t>(std::chrono::nanoseconds(self->opts_.stall_after).count());
  // Not ranked: merge_snapshots ranks the stragglers of every job from the summed telemetry.
  AggregatorSnapshot s = engine_snapshot(*engine, now_ns(CLOCK_MONOTONIC), stall_ns,
                                         /*with_ranking=*/false);
  s.tx_datagrams = c.tx;
  s.send_errors = c.tx_dropped;
  s.unroutable = c.unroutable;
  s.job_errors = job_errors;
  return s;
}

void DpdkAggregator::set_jobs(std::vector<JobConfig> jobs) {
  std::lock_guard<std::mutex> g(ctl_mu_);
  desired_ = std::move(jobs);
  ++desired_gen_;
}

AggregatorSnapshot DpdkAggregator::snapshot() const { return board_->snapshot(); }

void DpdkAggregator::service(std::chrono::milliseconds snapshot_every) {
  using Clock = std::chrono::steady_clock;
  if (round_open_) {
    for (auto& l : lcores_) {
      if (l->mail.done.load(std::memory_order_acquire) != round_) return;  // not yet
    }
    std::vector<AggregatorSnapshot> parts;
    for (auto& l : lcores_) parts.push_back(std::move(l->mail.snap));
    publish(std::move(parts));
    round_open_ = false;
  }
  std::vector<JobConfig> jobs;
  bool jobs_due = false;
  {
    std::lock_guard<std::mutex> g(ctl_mu_);
    if (desired_gen_ != delivered_gen_) {
      jobs = desired_;
      delivered_gen_ = desired_gen_;
      jobs_due = true;
    }
  }
  const auto t = Clock::now();
  const bool snap_due = snapshot_every.count() > 0 && t >= next_snapshot_;
  if (!jobs_due && !snap_due) return;
  if (snap_due) next_snapshot_ = t + snapshot_every;
  if (!running_) {
    // No loop runs: this thread owns every lcore's state.
    std::vector<AggregatorSnapshot> parts;
    for (auto& l : lcores_) {
      if (jobs_due) l->apply_jobs(jobs);
      parts.push_back(l->take_snapshot());
    }
    publish(std::move(parts));
    return;
  }
  ++round_;
  for (auto& l : lcores_) {
    l->mail.has_jobs = jobs_due;
    if (jobs_due) l->mail.jobs = jobs;
    l->mail.posted.store(round_, std::memory_order_release);
  }
  round_open_ = true;
}

void DpdkAggregator::publish(std::vector<AggregatorSnapshot> parts) {
  for (size_t i = 0; i < parts.size(); ++i) board_->put(i, std::move(parts[i]));
  board_->publish(now_ns(CLOCK_MONOTONIC));
}

uint64_t DpdkAggregator::rx_frames(unsigned i) const {
  return lcores_.at(i)->pub.rx.load(std::memory_order_relaxed);
}

std::string DpdkAggregator::format_lcore_counters() const {
  std::string s;
  char line[200];
  for (const auto& l : lcores_) {
    std::snprintf(line, sizeof line,
                  "lcore %u (q%u%s): rx %" PRIu64 " tx %" PRIu64 " completed %" PRIu64
                  " handed_off %" PRIu64 " dropped %" PRIu64 "\n",
                  l->lcore_id, unsigned{l->queue}, l->has_rxq ? "" : " tx only",
                  l->pub.rx.load(std::memory_order_relaxed),
                  l->pub.tx.load(std::memory_order_relaxed),
                  l->pub.completed.load(std::memory_order_relaxed),
                  l->pub.handed_off.load(std::memory_order_relaxed),
                  l->pub.dropped.load(std::memory_order_relaxed));
    s += line;
  }
  return s;
}

const Engine& DpdkAggregator::engine(unsigned i) const { return *lcores_.at(i)->engine; }
const frame::Counters& DpdkAggregator::frame_counters(unsigned i) const {
  return lcores_.at(i)->fc;
}
const DpdkLoopCounters& DpdkAggregator::loop_counters(unsigned i) const { return lcores_.at(i)->c; }

frame::Counters DpdkAggregator::frame_totals() const {
  frame::Counters t;
  for (const auto& l : lcores_) {
    for (size_t i = 0; i < t.by_verdict.size(); ++i) t.by_verdict[i] += l->fc.by_verdict[i];
  }
  return t;
}

EngineCounters DpdkAggregator::engine_totals() const {
  EngineCounters t;
  for (const auto& l : lcores_) {
    add_counters(t, l->engine->counters());
  }
  return t;
}

DpdkLoopCounters DpdkAggregator::loop_totals() const {
  DpdkLoopCounters t;
  for (const auto& l : lcores_) {
    const DpdkLoopCounters& c = l->c;
    t.rx += c.rx;
    t.tx += c.tx;
    t.tx_dropped += c.tx_dropped;
    t.handed_off += c.handed_off;
    t.handoff_received += c.handoff_received;
    t.handoff_dropped += c.handoff_dropped;
    t.tx_handed_off += c.tx_handed_off;
    t.no_mbuf += c.no_mbuf;
    t.multi_segment += c.multi_segment;
    t.unroutable += c.unroutable;
    t.reply_too_big += c.reply_too_big;
    t.tags_in_burst += c.tags_in_burst;
    t.polls += c.polls;
    t.idle_polls += c.idle_polls;
    t.busy_tsc += c.busy_tsc;
    t.rx_tsc += c.rx_tsc;
    t.work_tsc += c.work_tsc;
    t.tx_tsc += c.tx_tsc;
  }
  return t;
}

std::string DpdkAggregator::format_counters() const {
  const DpdkLoopCounters lt = loop_totals();
  const frame::Counters ft = frame_totals();
  CounterTable t(/*omit_zero=*/true);
  t.section("totals (all lcores; zero counters omitted):");
  t.row("rx_frames", lt.rx);
  t.row("tx_frames", lt.tx);
  t.row("tx_dropped", lt.tx_dropped);
  t.row("handed_off", lt.handed_off);
  t.row("handoff_dropped", lt.handoff_dropped);
  t.row("tx_handed_off", lt.tx_handed_off);
  t.row("no_mbuf", lt.no_mbuf);
  t.row("multi_segment", lt.multi_segment);
  t.row("unroutable", lt.unroutable);
  t.row("reply_too_big", lt.reply_too_big);
  t.row("tags_in_burst", lt.tags_in_burst);
  t.section("frames by verdict:");
  for (size_t i = 0; i < ft.by_verdict.size(); ++i) {
    t.row(std::string(frame::verdict_name(static_cast<frame::Verdict>(i))), ft.by_verdict[i]);
  }
  // The engines' counters summed over lcores (a HELLO is counted by the lcore that received it,
  // not by the others its copies reach).
  std::vector<AggregatorSnapshot> parts;
  for (const auto& l : lcores_) parts.push_back(l->take_snapshot());
  const AggregatorSnapshot all = merge_snapshots(parts);
  t.engine(all.engine, "engine (all lcores):");
  t.section("per lcore:");
  char line[200];
  for (const auto& l : lcores_) {
    const EngineCounters& le = l->engine->counters();
    std::snprintf(line, sizeof line,
                  "  lcore %u: rx %" PRIu64 " tx %" PRIu64 " ina %" PRIu64 " completed %" PRIu64
                  " handed_off %" PRIu64 " received_handoff %" PRIu64,
                  l->lcore_id, l->c.rx, l->c.tx, le.packets_in, le.completed, l->c.handed_off,
                  l->c.handoff_received);
    t.line(line);
  }
  // A rank's address as any lcore learned it.
  t.ranks(all, [this](JobId job, size_t r) -> std::string {
    for (const auto& l : lcores_) {
      const std::vector<Lcore::Peer>* p = std::as_const(l->book).find(job);
      if (p == nullptr || r >= p->size() || !(*p)[r].known) continue;
      const frame::Endpoint& ep = (*p)[r].ep;
      char b[32];
      std::snprintf(b, sizeof b, "%u.%u.%u.%u:%u", ep.ip >> 24, (ep.ip >> 16) & 0xFF,
                    (ep.ip >> 8) & 0xFF, ep.ip & 0xFF, unsigned{ep.port});
      return b;
    }
    return "-";
  });
  return t.text();
}

}  // namespace ina::agg
