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
#include "aggregator/udp_options.h"
#include "ina/base/status.h"

namespace ina::agg {

struct UdpShared;  // what the serving threads share (udp_lane.h)

class UdpAggregator {
 public:
  ~UdpAggregator();
  // Binds the sockets (so port() is known before run()) and adds the jobs.
  static Result<std::unique_ptr<UdpAggregator>> create(const UdpOptions& opts,
                                                       const std::vector<JobConfig>& jobs);
  uint16_t port() const { return port_; }
  // Serving threads (1 when more were asked for but the steering program could not be attached).
  unsigned threads() const;
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
  bool gso_enabled() const;

 private:
  UdpAggregator();
  std::unique_ptr<UdpShared> shared_;  // the serving threads (lanes) and what they share
  uint16_t port_ = 0;
  bool gro_on_ = false;
};

}  // namespace ina::agg
