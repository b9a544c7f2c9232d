// The aggregator's packet logic, shared by every I/O backend (kernel UDP now, DPDK later): decode
// and validate, find the job, verify its tag (the packet MAC under the job's key: WIRE.md), run the
// join barrier (HELLO/WELCOME) and the slot table, and say what to send back. Pure logic: no
// sockets, no clock, no logging; one instance per thread (lcore), so no locks.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "aggregator/job.h"
#include "aggregator/slot_table.h"
#include "aggregator/straggler.h"
#include "ina/base/status.h"
#include "ina/protocol/wire.h"

namespace ina::agg {

struct EngineOptions {
  bool telemetry = true;       // lag histograms, lost time and stalled-slot times (timed on_packet)
  StragglerOptions straggler;  // the lost-time window and test (straggler.h)
  // Benchmark only: skip the per-job tag verification, to measure what it costs. Never off in a
  // served aggregator (the CLI has no switch for it).
  bool check_tag = true;
  // Mixed into every incarnation epoch this engine computes (wire::incarnation_epoch): the same for
  // every engine of one aggregator process (they must agree on the epochs), drawn once per
  // process (draw_epoch_salt()), so that a restarted aggregator or another shard of the job never
  // names an incarnation as an earlier one was named. 0 in tests: epochs then follow from the
  // nonces alone.
  uint64_t epoch_salt = 0;
};

// A random salt for EngineOptions::epoch_salt, from the kernel's CSPRNG (getrandom(2)).
uint64_t draw_epoch_salt();

struct EngineJob;  // the state the engine keeps per job (engine_job.h)

class Engine {
 public:
  Engine();
  explicit Engine(EngineOptions opts);
  ~Engine();  // out of line: Job is complete only in engine_job.h
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Slots of the aggregator's memory shared by all jobs. 0 (the default): no limit and ranges are
  // not checked (a single hand-configured job). Otherwise every job's range must lie inside
  // [0, capacity) and not overlap another job's range. Does not affect jobs already added.
  void set_slot_capacity(uint32_t slots) { slot_capacity_ = slots; }
  uint32_t slot_capacity() const { return slot_capacity_; }

  // Adds a job this engine serves. kAlreadyExists for a served job id; kInvalidArgument for a bad
  // table config; kResourceExhausted when its slot range leaves the capacity or overlaps another
  // job's. Never disturbs the other jobs.
  Status add_job(const JobConfig& cfg);
  // Stops serving a job and frees its slot range; its later packets count as unknown_job.
  // kNotFound when it is not served.
  Status remove_job(JobId job);
  // Served jobs, ascending (allocates: not for the packet path).
  std::vector<JobConfig> jobs() const;
  // The configuration of a served job; nullptr when it is not served.
  const JobConfig* job_config(JobId job) const;

  // Processes one received datagram (the INA header and payload). `sender_rank` is set to the
  // packet's rank when it is valid for its job and moved the job on: a HELLO that joined or
  // started an incarnation, DATA that added a contribution (so the backend can learn the rank's
  // address from it; a replayed packet, valid tag and all, moves nothing and redirects nothing),
  // and to -1 otherwise; for a leaf job it is the rank's index among the served ranks (global
  // rank - rank_base). Packets of a leaf job's parent (RESULT, WELCOME, ERROR) leave it -1.
  Reply on_packet(std::span<const uint8_t> datagram, int32_t* sender_rank, JobId* sender_job) {
    return on_packet(datagram, 0, sender_rank, sender_job);
  }
  // The same with the arrival time (any monotonic clock in ns; 0: not timed) for the telemetry.
  // `counted_elsewhere`: a copy of a packet another engine also processes and counts (the DPDK
  // backend hands every HELLO to each lcore's engine): processed alike, counted by none of the
  // counters on_packet moves (packets, bytes, hellos, per-job and per-rank packets, the
  // malformed and mismatch counters of its checks).
  // `tag_checked`: the backend verified the datagram's tag under this key already (a burst at
  // once: mac.h, packet_mac_many; keys from current_keys()). Taken for the engine's own check only
  // where that is the key the packet is verified with (a DATA or PARTIAL under the current
  // incarnation's key); every other packet is verified here as usual.
  Reply on_packet(std::span<const uint8_t> datagram, uint64_t now_ns, int32_t* sender_rank,
                  JobId* sender_job, bool counted_elsewhere = false,
                  const Key128* tag_checked = nullptr);

  const EngineCounters& counters() const { return counters_; }
  const StragglerOptions& straggler_options() const { return opts_.straggler; }
  // Per-rank counters of a job (index: served rank, see JobConfig::served_ranks); empty span for
  // an unknown job.
  std::span<const RankCounters> rank_counters(JobId job) const;
  // World size of a job, 0 when unknown.
  uint32_t world_size(JobId job) const;
  // True when every rank of the job has joined its current incarnation.
  bool job_ready(JobId job) const;
  // The epoch of the job's current incarnation (WIRE.md, "Incarnations"; sent in its WELCOME);
  // 0 before its first barrier completed or for a job not served.
  uint64_t epoch(JobId job) const;
  // The keys a job's packets are verified with now: `traffic`, its current incarnation's (every
  // packet but HELLO); `up`, a leaf's parent incarnation's (its parent's RESULT and ERROR; the
  // job's key for other roles). For fuzzing and tests that seal as the peers do; false for a job
  // not served.
  bool current_keys(JobId job, Key128* traffic, Key128* up) const;
  const SlotTable* slot_table(JobId job) const;
  // Counters of a job; nullptr for an unknown job.
  const JobCounters* job_counters(JobId job) const;
  // Per-rank telemetry of a job (index = served rank); empty for an unknown job.
  std::span<const RankTelemetry> rank_telemetry(JobId job) const;
  // Served ranks (indices as rank_telemetry) ordered by median lag (log2 bucket), worst first;
  // ties by mean lag, then by rounds completed last.
  std::vector<uint32_t> straggler_ranking(JobId job) const;
  // Lost time per served rank and cause over the window ending at `now_ns` (straggler.h; empty
  // for an unknown job). Allocates.
  LossWindow loss_window(JobId job, uint64_t now_ns) const;
  // Incomplete rounds whose first contribution is at least `min_age_ns` old at `now_ns`, oldest
  // first, at most `max` of them.
  std::vector<StalledSlot> stalled_slots(JobId job, uint64_t now_ns, uint64_t min_age_ns,
                                         size_t max = 16) const;

 private:
  using Job = EngineJob;
  Reply handle_hello(Job& job, const wire::PacketView& pkt);
  static uint32_t hello_limit(const wire::PacketView& pkt);
  Reply barrier_complete(Job& job, const wire::Header& h);
  void start_incarnation(Job& job);
  Reply welcome_reply(const Job& job, const wire::Header& h, Reply::Target target);
  Reply result_reply(const Job& job, const wire::Header& h, Reply::Target target,
                     uint8_t extra_flags);
  // `stored`: the receive pass already put the words in the table (SlotTable::raw_words_for).
  Reply handle_data(Job& job, const wire::PacketView& pkt, uint64_t now_ns,
                    const StoredWords* stored = nullptr);
  // Telemetry and loss tracking of a DATA the slot table judged `v` (engine_telemetry.cc).
  void note_arrival(Job& job, const wire::Header& h, Verdict v, uint64_t now_ns);
  Reply handle_abort(Job& job, const wire::PacketView& pkt, uint32_t global_rank);
  Reply handle_parent(Job& job, const wire::PacketView& pkt);
  Reply exp_answer(const Job& job, const wire::Header& h, Reply::Target target,
                   uint8_t extra_flags);
  Reply mismatch_reply(Job& job, const wire::PacketView& pkt, const CopyView& c);
  Reply mismatch_again(const Job& job, const wire::PacketView& pkt);
  Reply handle_child_mismatch(Job& job, const wire::PacketView& pkt);
  Reply finish_child_mismatch(Job& job, const wire::PacketView& pkt);
  Reply aborted_reply(const Job& job, const wire::PacketView& pkt, const CopyView& c);
  Reply error_to_sender(const Job& job, const wire::PacketView& pkt, uint16_t n);
  Reply error_reply(const Job& job, const wire::PacketView& pkt, wire::ErrorReason reason,
                    std::span<const uint64_t> bitmap, uint32_t extra);

  EngineOptions opts_;
  std::map<JobId, std::unique_ptr<Job>> jobs_;
  // One-entry cache in front of jobs_ for on_packet() (most traffic is one job): the last job
  // looked up. Cleared whenever jobs_ changes (add_job, remove_job).
  JobId last_id_ = 0;
  Job* last_job_ = nullptr;
  uint32_t slot_capacity_ = 0;
  EngineCounters counters_;
  std::vector<int32_t> scratch_;  // payload of control replies
  bool moved_ = false;            // the packet on_packet handles moved its job on (sender_rank)
};

}  // namespace ina::agg
