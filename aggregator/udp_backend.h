// Kernel UDP backend of ina-aggregator: one socket, recvmmsg/sendmmsg batches, UDP GRO on receive
// and UDP GSO on send where the kernel has them. It feeds datagrams to the Engine (all packet
// logic) and sends what the Engine says; it only keeps the rank -> address table.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "aggregator/engine.h"
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
};

}  // namespace ina::agg
