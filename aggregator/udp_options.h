// The kernel UDP backend's options (udp_backend.h), apart so that its serving threads
// (udp_lane.h) see them without the backend's class.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

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

}  // namespace ina::agg
