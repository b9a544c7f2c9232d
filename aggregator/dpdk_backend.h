// DPDK backend of ina-aggregator: one DPDK port (physical NIC or any vdev: net_ring, net_memif,
// net_af_packet, net_af_xdp, net_tap, net_null), the same Engine as the kernel UDP backend, one
// Engine per worker lcore. It answers ARP for its IPv4 address and ICMP echo, classifies frames with
// protocol/frame.h (every drop counted by reason), and builds replies in place in the received
// mbuf (results going to every rank: the payload is encoded once, then copied into one mbuf per
// rank, see dpdk_backend.cc).
//
// Multi-core: slot s of every job belongs to worker lcore s % n (its own Engine and slot table
// copy); an lcore that receives a packet of another lcore's slot hands it over through a
// single-producer single-consumer rte_ring (RSS cannot do this: the slot is inside the INA header,
// not in the 5-tuple, and a worker sends every slot from one UDP port). HELLOs go to every lcore
// (each runs its own join barrier); only lcore 0 answers them. With one rx queue (every vdev here)
// an lcore always sees the last HELLO before the first DATA of the new round (one FIFO ring from
// the rx lcore); with RSS over several rx queues a DATA frame can overtake the HELLO copy, and that
// lcore drops it as not-ready until the worker retransmits. No locks, allocation or logging in the
// loop; each lcore publishes a few counters (relaxed atomics) that the main lcore prints.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "aggregator/engine.h"
#include "ina/protocol/frame.h"
#include "ina/protocol/status.h"

struct rte_mempool;
struct rte_ring;

namespace ina::agg {

// Starts the DPDK EAL with `args` (argv[0] first). Returns kUnavailable naming the reason when it
// cannot start (no hugepages, no permission, bad arguments). Once per process.
Status dpdk_eal_init(const std::vector<std::string>& args);
// Releases the EAL (after every port is closed).
void dpdk_eal_cleanup();

struct DpdkOptions {
  std::string port;            // port name ("net_ring0", a PCI address) or number; empty: port 0
  uint32_t ip = 0;             // our IPv4 address, host order (required)
  uint16_t udp_port = 47474;
  bool mac_set = false;        // use `mac` instead of the port's own address
  frame::Mac mac{};
  uint16_t burst = 32;         // rx/tx burst size
  uint16_t rx_desc = 1024;     // descriptors per queue
  uint16_t tx_desc = 1024;
  uint32_t mbufs = 16383;      // mbuf pool size
  uint32_t handoff_ring = 1024;  // per lcore pair
  unsigned lcores = 0;         // worker lcores to use, the first ones (0: every worker lcore)
  // Results for every rank: false: one single-segment copy per rank (the default: every PMD sends
  // those); true: per rank a 42-byte header mbuf chained to an indirect mbuf (rte_pktmbuf_clone)
  // of the one encoded datagram, for ports that transmit chains (ina-dpdk-bench --indirect).
  bool indirect_multicast = false;
  // Configure the port (queues, pool) and start it. When false the caller configured and started
  // it (tests with rte_eth_from_rings do this to own the rings): it must have at least as many tx
  // queues as worker lcores; rx queues beyond the workers are not polled.
  bool configure_port = true;
};

// Per-lcore counters of the I/O loop (the Engine's own counters are in Engine::counters()).
struct DpdkLoopCounters {
  uint64_t rx = 0;               // frames received from the port
  uint64_t tx = 0;               // frames sent
  uint64_t tx_dropped = 0;       // the port did not take them (queue full)
  uint64_t handed_off = 0;       // INA frames passed to the lcore that owns their slot
  uint64_t handoff_received = 0;
  uint64_t handoff_dropped = 0;  // handoff ring full
  uint64_t no_mbuf = 0;          // a reply copy could not be allocated
  uint64_t multi_segment = 0;    // scattered frames, dropped
  uint64_t unroutable = 0;       // a result for a rank whose address is not known yet
  uint64_t reply_too_big = 0;    // the reply does not fit the mbuf
  uint64_t polls = 0;            // loop iterations (benchmarks: idle_polls / polls is the idle share)
  uint64_t idle_polls = 0;       // iterations that found nothing to do
  uint64_t busy_tsc = 0;         // TSC cycles in the other iterations, rx to tx (benchmarks:
                                 // cycles per frame, as testpmd --record-core-cycles counts them,
                                 // less the rx of a burst that follows an idle poll)
  uint64_t cpu_ns = 0;           // CPU time of the lcore's thread in the loop (benchmarks)
  uint64_t wall_ns = 0;          // wall time in the loop
};

class DpdkAggregator {
 public:
  ~DpdkAggregator();
  DpdkAggregator(const DpdkAggregator&) = delete;
  DpdkAggregator& operator=(const DpdkAggregator&) = delete;

  // Needs the EAL and at least one worker lcore. Sets up the port (unless configure_port is
  // false), the pool, the handoff rings and one Engine per worker lcore with every job.
  static Result<std::unique_ptr<DpdkAggregator>> create(const DpdkOptions& opts,
                                                        const std::vector<JobConfig>& jobs);

  // Launches the loop on every worker lcore and returns.
  Status start();
  // Stops the loops, waits for them, then stops the port (when this object configured it).
  void stop();
  bool running() const { return running_; }

  uint16_t port_id() const { return port_; }
  const frame::LocalConfig& local() const { return local_; }
  unsigned lcores() const { return static_cast<unsigned>(lcores_.size()); }
  uint16_t rx_queues() const { return rx_queues_; }

  // Safe while running (published counters): one line per lcore.
  std::string format_lcore_counters() const;
  // After stop(): every counter, summed and per lcore.
  std::string format_counters() const;
  // After stop(): one lcore's state.
  const Engine& engine(unsigned i) const;
  const frame::Counters& frame_counters(unsigned i) const;
  const DpdkLoopCounters& loop_counters(unsigned i) const;
  frame::Counters frame_totals() const;
  EngineCounters engine_totals() const;  // the main counters summed (not per rank)
  DpdkLoopCounters loop_totals() const;

  struct Lcore;  // public so the launch trampoline can name it

 private:
  DpdkAggregator() = default;
  DpdkOptions opts_;
  frame::LocalConfig local_;
  uint16_t port_ = 0;
  uint16_t rx_queues_ = 0;
  size_t max_frame_ = 0;  // the largest frame of any job (a reply fits an mbuf this large)
  bool port_started_ = false;
  bool running_ = false;
  std::atomic<bool> stop_{false};
  rte_mempool* pool_ = nullptr;
  std::vector<rte_ring*> rings_;  // handoff rings, src * n + dst
  std::vector<std::unique_ptr<Lcore>> lcores_;
};

}  // namespace ina::agg
