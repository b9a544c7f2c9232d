// The backends' shared control plane (see backend_shell.h).
#include "aggregator/backend_shell.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "ina/base/log.h"

namespace ina::agg {
namespace {
constexpr const char* kComponent = "aggregator";
}  // namespace

std::map<JobId, std::string> reconcile_jobs(Engine& engine, const std::vector<JobConfig>& desired,
                                            const JobHooks& hooks) {
  std::map<JobId, const JobConfig*> want;
  for (const JobConfig& j : desired) {
    if (!hooks.serves || hooks.serves(j)) want[j.job] = &j;
  }
  for (const JobConfig& have : engine.jobs()) {
    auto it = want.find(have.job);
    if (it == want.end() || have != *it->second) {
      (void)engine.remove_job(have.job);
      if (hooks.removed) hooks.removed(have.job);
    }
  }
  std::map<JobId, std::string> errors;
  for (const JobConfig& j : desired) {
    if (!want.contains(j.job) || engine.world_size(j.job) != 0) continue;  // not ours, or served
    Status st = hooks.admit ? hooks.admit(j) : ok_status();
    if (st.ok()) st = engine.add_job(j);
    if (!st.ok()) {
      errors[j.job] = st.message();
      continue;
    }
    if (hooks.added) hooks.added(j);
  }
  return errors;
}

SnapshotBoard::SnapshotBoard(size_t parts, std::string engines_word)
    : parts_(parts), engines_word_(std::move(engines_word)) {}

void SnapshotBoard::put(size_t i, AggregatorSnapshot part) {
  std::lock_guard<std::mutex> g(mu_);
  parts_.at(i) = std::move(part);
}

void SnapshotBoard::publish(uint64_t now_ns, bool log_changes) {
  std::lock_guard<std::mutex> g(mu_);
  AggregatorSnapshot m = merge_snapshots(parts_);
  warn_stragglers(alarm_, m, now_ns);
  if (log_changes) {
    for (const JobSnapshot& j : m.jobs) {
      const bool known = std::any_of(published_.jobs.begin(), published_.jobs.end(),
                                     [&](const JobSnapshot& o) { return o.cfg.job == j.cfg.job; });
      if (!known) {
        INA_INFO(kComponent,
                 "job %" PRIu32 " served: world %" PRIu32 " slots [%" PRIu32 ", %" PRIu32
                 ") block %u bytes role %s on %zu %s",
                 j.cfg.job, j.cfg.slots.world_size, j.cfg.slot_base,
                 j.cfg.slot_base + j.cfg.slots.num_slots, unsigned{j.cfg.slots.max_payload_bytes},
                 tree_role_name(j.cfg.tree.role), parts_.size(), engines_word_.c_str());
      }
    }
    for (const JobSnapshot& o : published_.jobs) {
      const bool kept = std::any_of(m.jobs.begin(), m.jobs.end(),
                                    [&](const JobSnapshot& j) { return o.cfg.job == j.cfg.job; });
      if (!kept) INA_INFO(kComponent, "job %" PRIu32 " removed", o.cfg.job);
    }
    for (const auto& [job, err] : m.job_errors) {
      if (!published_.job_errors.contains(job)) {
        INA_WARN(kComponent, "job %" PRIu32 " not added: %s", job, err.c_str());
      }
    }
  }
  published_ = std::move(m);
}

AggregatorSnapshot SnapshotBoard::snapshot() const {
  std::lock_guard<std::mutex> g(mu_);
  return published_;
}

void CounterTable::section(const std::string& title) { s_ += title + "\n"; }

void CounterTable::line(const std::string& text) { s_ += text + "\n"; }

void CounterTable::row(const std::string& name, uint64_t value) {
  if (omit_zero_ && value == 0) return;
  char b[256];
  std::snprintf(b, sizeof b, "  %-24s %" PRIu64 "\n", name.c_str(), value);
  s_ += b;
}

void CounterTable::engine(const EngineCounters& e, const std::string& title) {
  section(title);
  for_each_scalar_counter([&](const char* name, uint64_t EngineCounters::*m) { row(name, e.*m); });
  section("decode errors:");
  for (size_t i = 1; i < e.decode.by_error.size(); ++i) {
    row(std::string(wire::decode_error_name(static_cast<wire::DecodeError>(i))),
        e.decode.by_error[i]);
  }
  section("verdicts:");
  for (size_t i = 0; i < e.by_verdict.size(); ++i) {
    row(verdict_name(static_cast<Verdict>(i)), e.by_verdict[i]);
  }
}

void CounterTable::ranks(const AggregatorSnapshot& s,
                         const std::function<std::string(JobId, size_t)>& address_of) {
  char b[256];
  for (const JobSnapshot& j : s.jobs) {
    std::snprintf(b, sizeof b, "job %" PRIu32 " (world %" PRIu32 ", %s):\n", j.cfg.job,
                  j.cfg.slots.world_size, j.ready ? "ready" : "joining");
    s_ += b;
    std::snprintf(b, sizeof b, "  %6s %14s %12s %12s  %s\n", "rank", "packets", "retransmits",
                  "duplicates", "address");
    s_ += b;
    const size_t first = j.cfg.first_rank();
    size_t idle = 0;
    for (size_t r = 0; r < j.ranks.size(); ++r) {
      const RankCounters& rc = j.ranks[r];
      if (rc.packets == 0 && j.ranks.size() > kMaxRankRows) {
        ++idle;
        continue;
      }
      std::snprintf(b, sizeof b, "  %6zu %14" PRIu64 " %12" PRIu64 " %12" PRIu64 "  %s\n",
                    first + r, rc.packets, rc.retransmits, rc.duplicates,
                    address_of(j.cfg.job, r).c_str());
      s_ += b;
    }
    if (idle > 0) {
      std::snprintf(b, sizeof b, "  (%zu ranks without packets not listed)\n", idle);
      s_ += b;
    }
  }
}

}  // namespace ina::agg
