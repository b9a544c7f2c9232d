// What the two aggregator backends (kernel UDP, DPDK) share around their packet loops: the job
// reconciliation (set_jobs applied to an Engine), the per-job rank address book with its one-entry
// cache, the board their serving threads publish snapshots on (merged, stragglers and job changes
// logged), and the counter table they print. No I/O and no packets here: each backend keeps its
// loop, its addresses' type and its own counters, and calls these.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "aggregator/engine.h"
#include "aggregator/snapshot.h"
#include "aggregator/straggler.h"
#include "ina/base/status.h"

namespace ina::agg {

// Per job, by served rank: where each rank's valid packets came from (a backend's loop learns it),
// with a one-entry cache in front of the map: most traffic is one job.
template <class Peer>
class AddressBook {
 public:
  // The job's ranks, or nullptr for a job not in the book.
  std::vector<Peer>* find(JobId job) {
    if (cached_ != nullptr && cached_job_ == job) [[likely]]
      return cached_;
    auto it = by_job_.find(job);
    if (it == by_job_.end()) return nullptr;
    cached_job_ = job;
    cached_ = &it->second;
    return cached_;
  }
  const std::vector<Peer>* find(JobId job) const {
    auto it = by_job_.find(job);
    return it == by_job_.end() ? nullptr : &it->second;
  }
  // A job's ranks, none known yet.
  void reset(JobId job, size_t ranks) {
    by_job_[job].assign(ranks, Peer{});
    cached_ = nullptr;
  }
  void erase(JobId job) {
    by_job_.erase(job);
    cached_ = nullptr;
  }
  const std::map<JobId, std::vector<Peer>>& jobs() const { return by_job_; }

 private:
  std::map<JobId, std::vector<Peer>> by_job_;
  JobId cached_job_ = 0;
  std::vector<Peer>* cached_ = nullptr;
};

// How a backend takes part in reconcile_jobs.
struct JobHooks {
  // Whether this engine serves the job at all (false: left out, no error; the UDP backend serves
  // a tree leaf's job on its first thread only). Unset: every job.
  std::function<bool(const JobConfig&)> serves;
  // The backend's own limits before the Engine's checks (buffer sizes, roles it cannot serve, a
  // parent to resolve); an error is reported for the job. Unset: none.
  std::function<Status(const JobConfig&)> admit;
  // After the Engine removed a job / added one.
  std::function<void(JobId)> removed;
  std::function<void(const JobConfig&)> added;
};

// Brings `engine` to serve `desired` (set_jobs): jobs not listed, or listed with another
// configuration (key, world, slot range, block), are removed; new ones are added; the others are
// untouched. Returns the jobs that could not be added, with the reason.
std::map<JobId, std::string> reconcile_jobs(Engine& engine, const std::vector<JobConfig>& desired,
                                            const JobHooks& hooks);

// The snapshot a backend publishes for other threads (the control agent): one part per engine,
// stored by the thread that owns the engine, merged on publish. Thread safe.
class SnapshotBoard {
 public:
  // `engines_word`: what the backend calls its engines' threads in log lines ("lcores").
  SnapshotBoard(size_t parts, std::string engines_word);
  void put(size_t i, AggregatorSnapshot part);
  // Merges the parts (merge_snapshots), warns of stragglers (rate-limited), logs (log_changes)
  // the jobs that appeared, went or failed since the last publish, and publishes the result.
  void publish(uint64_t now_ns, bool log_changes = true);
  AggregatorSnapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  std::vector<AggregatorSnapshot> parts_;
  std::string engines_word_;
  AggregatorSnapshot published_;
  StragglerAlarm alarm_;
};

// The counters a backend prints (at stop, or on request): titled sections of "name value" rows,
// the engines' counters in one standard layout, and per job a table of its ranks.
class CounterTable {
 public:
  // `omit_zero`: leave out rows whose value is 0 (the DPDK backend's many rarely-moving ones).
  explicit CounterTable(bool omit_zero = false) : omit_zero_(omit_zero) {}
  void section(const std::string& title);
  void row(const std::string& name, uint64_t value);
  void line(const std::string& text);  // as is, a newline added
  // "totals" (the scalar counters; `title` names the section), "decode errors", "verdicts".
  void engine(const EngineCounters& e, const std::string& title = "totals:");
  // Per job of `s`: world, ready, and one row per served rank (global numbering) with its packets,
  // retransmits, duplicates and `address_of(job, served rank)` ("-": unknown). Ranks without
  // packets are not listed beyond kMaxRankRows ranks.
  void ranks(const AggregatorSnapshot& s,
             const std::function<std::string(JobId, size_t)>& address_of);
  std::string text() const { return s_; }

  static constexpr size_t kMaxRankRows = 1024;

 private:
  bool omit_zero_;
  std::string s_;
};

}  // namespace ina::agg
