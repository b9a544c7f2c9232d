// Kernel UDP backend of ina-aggregator: recvmmsg/sendmmsg batches, UDP GRO on receive and UDP GSO
// on send where the kernel has them. It feeds datagrams to the Engine (all packet logic) and sends
// what the Engine says; it only keeps the rank -> address table.
//
// Several cores (UdpOptions::threads): one serving thread per core, each with its own socket in
// one SO_REUSEPORT group on the port and its own Engine. Slot s of every job belongs to thread
// s % threads, as on the DPDK backend's lcores: a classic BPF program attached to the group
// (SO_ATTACH_REUSEPORT_CBPF) reads the slot from the INA header and steers each datagram to its
// owner's socket, so no slot is touched by two threads and the packet path takes no lock. What
// steering cannot place (a GRO or GSO buffer holds several slots of one sender, and the kernel
// picks its socket by the first) is copied by the receiving thread into the owner's
// single-producer ring (handoff_ring.h). HELLOs reach every thread (each runs the join barrier;
// thread 0 answers), a tree leaf's jobs are served by thread 0 alone. Without the program (a
// kernel that refuses it) the aggregator serves on one thread and says so.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "aggregator/backend_shell.h"
#include "aggregator/engine.h"
#include "aggregator/snapshot.h"
#include "ina/base/status.h"

namespace ina::agg {

struct UdpOptions {
  std::string bind_host = "0.0.0.0";
  uint16_t port = 47474;  // 0: an ephemeral port (see UdpAggregator::port())
  uint32_t batch = 64;    // datagrams per recvmmsg/sendmmsg
  // After traffic, poll the socket (yielding the CPU between polls) this long before sleeping in
  // poll(): a round whose last block arrives within it is answered without a wake-up (udp_lane.h).
  std::chrono::microseconds spin{200};
  bool gro = true;                              // UDP_GRO when the kernel has it
  bool gso = true;                              // UDP_SEGMENT when the kernel has it
  std::chrono::milliseconds stats_interval{0};  // print counters this often (0: never)
  // Test hooks: drop or duplicate received datagrams at random.
  double drop_percent = 0;
  double dup_percent = 0;
  uint64_t seed = 1;
  // Jobs added at run time (set_jobs, from the controller): the aggregator's slot memory shared
  // by all jobs (0: unchecked; per thread: each holds a copy of every job's slots) and the
  // largest block (in bytes) a job may have (sizes the buffers; 0: the largest of the jobs given
  // to create(), which may then be empty only if this is set).
  uint32_t slot_capacity = 0;
  uint32_t max_payload_bytes = 0;
  // Telemetry: time every datagram, publish a snapshot this often (0: only at create(); the
  // snapshot is built between batches and allocates, the packet path never does), report rounds
  // older than stall_after as stalled.
  bool telemetry = true;
  std::chrono::milliseconds snapshot_interval{0};
  std::chrono::milliseconds stall_after{1000};
  // Serving threads (see the top of this file): 1..kMaxUdpThreads, or 0 for one per CPU this
  // process may run on (its affinity mask).
  unsigned threads = 1;
  // Test hook: false leaves the reuseport group unsteered (the kernel's flow hash places each
  // sender on one thread) so that every foreign slot goes through the handoff rings.
  bool steer = true;
};

inline constexpr unsigned kMaxUdpThreads = 64;

class UdpAggregator {
 public:
  ~UdpAggregator();
  // Binds the sockets (so port() is known before run()) and adds the jobs.
  static Result<std::unique_ptr<UdpAggregator>> create(const UdpOptions& opts,
                                                       const std::vector<JobConfig>& jobs);
  uint16_t port() const { return port_; }
  // Serving threads (1 when more were asked for but the steering program could not be attached).
  unsigned threads() const { return static_cast<unsigned>(lanes_.size()); }
  // Serves until `stop` becomes true (checked at least every 100 ms). Safe to set from a signal
  // handler or another thread. With several threads, runs thread 0 on the caller's thread.
  Status run(const std::atomic<bool>& stop);
  // Thread safe: the jobs to serve from now on. The serving thread applies it between batches:
  // jobs not listed (or listed with another key, world, slot range or block) are removed, new
  // ones added; the others are untouched. Errors show in snapshot().job_errors.
  void set_jobs(std::vector<JobConfig> jobs);
  // Thread safe: the last published snapshot (every snapshot_interval while run() serves).
  AggregatorSnapshot snapshot() const;
  // Counters as text (a table: totals, per thread, decode errors, per rank). Call when run() is
  // not running.
  std::string format_counters() const;
  // Thread i's engine (call when run() is not running).
  const Engine& engine(unsigned i = 0) const;
  EngineCounters engine_totals() const;  // every thread's engine counters summed
  uint64_t dropped_by_hook() const;
  // Datagrams a thread received for another thread's slot and copied to it.
  uint64_t handed_off() const;
  bool gro_enabled() const { return gro_on_; }
  bool gso_enabled() const { return gso_on_.load(std::memory_order_relaxed); }

  struct Lane;  // one serving thread (udp_backend.cc)

 private:
  UdpAggregator() = default;
  std::vector<std::unique_ptr<Lane>> lanes_;
  uint16_t port_ = 0;
  bool gro_on_ = false;
  std::atomic<bool> gso_on_{false};  // turned off by any thread whose GSO send is refused
  // set_jobs() hand-off: each thread applies a new generation between batches.
  std::mutex jobs_mu_;
  std::atomic<uint64_t> desired_gen_{0};
  std::vector<JobConfig> desired_jobs_;
  // Each thread's snapshot part; thread 0 publishes the merge.
  std::unique_ptr<SnapshotBoard> board_;
  bool publish(unsigned lane);
};

}  // namespace ina::agg
