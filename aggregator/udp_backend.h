// Kernel UDP backend of ina-aggregator: one socket, recvmmsg/sendmmsg batches, UDP GRO on receive
// and UDP GSO on send where the kernel has them. It feeds datagrams to the Engine (all packet
// logic) and sends what the Engine says; it only keeps the rank -> address table.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "aggregator/engine.h"
#include "aggregator/snapshot.h"
#include "ina/protocol/status.h"

namespace ina::agg {

struct UdpOptions {
  std::string bind_host = "0.0.0.0";
  uint16_t port = 47474;               // 0: an ephemeral port (see UdpAggregator::port())
  uint32_t batch = 64;                 // datagrams per recvmmsg/sendmmsg
  bool gro = true;                     // UDP_GRO when the kernel has it
  bool gso = true;                     // UDP_SEGMENT when the kernel has it
  std::chrono::milliseconds stats_interval{0};  // print counters this often (0: never)
  // Test hooks: drop or duplicate received datagrams at random.
  double drop_percent = 0;
  double dup_percent = 0;
  uint64_t seed = 1;
  // Jobs added at run time (set_jobs, from the controller): the aggregator's slot memory shared
  // by all jobs (0: unchecked) and the largest block (in bytes) a job may have (sizes the buffers; 0: the
  // largest of the jobs given to create(), which may then be empty only if this is set).
  uint32_t slot_capacity = 0;
  uint32_t max_payload_bytes = 0;
  // Telemetry: time every datagram, publish a snapshot this often (0: only at create(); the
  // snapshot is built between batches and allocates, the packet path never does), report rounds
  // older than stall_after as stalled.
  bool telemetry = true;
  std::chrono::milliseconds snapshot_interval{0};
  std::chrono::milliseconds stall_after{1000};
};

class UdpAggregator {
 public:
  ~UdpAggregator();
  // Binds the socket (so port() is known before run()) and adds the jobs.
  static Result<std::unique_ptr<UdpAggregator>> create(const UdpOptions& opts,
                                                       const std::vector<JobConfig>& jobs);
  uint16_t port() const { return port_; }
  // Serves until `stop` becomes true (checked at least every 100 ms). Safe to set from a signal
  // handler or another thread.
  Status run(const std::atomic<bool>& stop);
  // Thread safe: the jobs to serve from now on. The serving thread applies it between batches:
  // jobs not listed (or listed with another key, world, slot range or block) are removed, new
  // ones added; the others are untouched. Errors show in snapshot().job_errors.
  void set_jobs(std::vector<JobConfig> jobs);
  // Thread safe: the last published snapshot (every snapshot_interval while run() serves).
  AggregatorSnapshot snapshot() const;
  // Counters as text (a table: totals, decode errors, per rank). Call when run() is not running,
  // or from the thread that runs it.
  std::string format_counters() const;
  const Engine& engine() const { return *engine_; }
  uint64_t dropped_by_hook() const { return hook_dropped_; }
  bool gro_enabled() const { return gro_on_; }
  bool gso_enabled() const { return gso_on_; }

 private:
  UdpAggregator() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<Engine> engine_;
  int fd_ = -1;
  uint16_t port_ = 0;
  bool gro_on_ = false;
  bool gso_on_ = false;
  uint64_t hook_dropped_ = 0;
  // set_jobs() hand-off and the published snapshot.
  mutable std::mutex shared_mu_;
  std::atomic<bool> jobs_pending_{false};
  std::vector<JobConfig> desired_jobs_;
  AggregatorSnapshot published_;
  std::map<JobId, std::string> job_errors_;  // serving thread only; copied into snapshots
  StragglerAlarm straggler_alarm_;           // serving thread only (publish)
  void apply_jobs();
  void publish();
};

}  // namespace ina::agg
