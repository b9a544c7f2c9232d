// DPDK backend of ina-aggregator: one DPDK port (physical NIC or any vdev: net_ring, net_memif,
// net_af_packet, net_af_xdp, net_tap, net_null), the same Engine as the kernel UDP backend, one
// Engine per worker lcore. It answers ARP for its IPv4 address and ICMP echo, classifies frames
// with protocol/frame.h (every drop counted by reason), and builds replies in place in the
// received mbuf (results going to every rank: the payload is encoded once, then copied into one
// mbuf per rank, see dpdk_lcore.cc).
//
// Multi-core: slot s of every job belongs to worker lcore s % n (its own Engine and slot table
// copy); an lcore that receives a packet of another lcore's slot hands it over through a
// single-producer single-consumer rte_ring (RSS cannot do this: the slot is inside the INA header,
// not in the 5-tuple, and a worker sends every slot from one UDP port). HELLOs go to every lcore
// (each runs its own join barrier); only lcore 0 answers them. A worker's frames share one 5-tuple,
// so a flow hash (RSS, PACKET_FANOUT) puts all of them on one rx queue: the lcore that receives
// them copies the HELLO to the others at once and stages DATA after it, so every lcore sees the
// last HELLO before the first DATA of the new round (one FIFO ring per lcore pair). A port that
// spread one worker's frames over several queues could let a DATA frame overtake the HELLO copy;
// that lcore drops it as not-ready until the worker retransmits. No locks, allocation or logging
// in the loop; each lcore publishes a few counters (relaxed atomics) that the main lcore prints.
//
// Rx queues: one per worker lcore (up to what the port has), each lcore polling its own, where the
// port spreads frames: with RSS offloads it hashes IP/UDP over them; net_af_packet (qpairs=N, the
// kernel's PACKET_FANOUT flow hash), net_tap (queues=N), net_af_xdp (queue_count=N) and net_ring
// spread by themselves. Other ports (net_memif: its queues are those its peer connects) get one
// rx queue unless DpdkOptions::rx_queues asks for more. Tx: one queue per lcore, except on
// net_memif, whose peer reads only the queue pairs it connects (taken to be the rx queues polled):
// there the lcores beyond them pass their replies to lcore 0 through a ring (tx_handed_off).
//
// Jobs at run time (the controller): set_jobs() stores the wanted jobs; the main lcore's
// service() posts them into every lcore's mailbox (a sequence number released after the request,
// acquired by the lcore at the top of each loop pass, between bursts); each lcore applies them to
// its own Engine and answers with a snapshot of it. Once every lcore answered the same request the
// main lcore merges the parts (merge_snapshots) and publishes them for the control agent. The
// packet path takes no lock: one acquire load per loop pass.
//
// Files, one concern each: dpdk_port.cc (the EAL, create(): port, queues, pool, rings; the
// destructor), dpdk_lcore.cc (the lcores' loop and replies; start, stop), dpdk_control.cc (the
// mailboxes, service(), snapshots, counters), and dpdk_lcore.h (the per-lcore state they share).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "aggregator/backend_shell.h"
#include "aggregator/engine.h"
#include "aggregator/snapshot.h"
#include "ina/base/status.h"
#include "ina/protocol/frame.h"

struct rte_mempool;
struct rte_ring;

namespace ina::agg {

// Starts the DPDK EAL with `args` (argv[0] first). Returns kUnavailable naming the reason when it
// cannot start (no hugepages, no permission, bad arguments). Once per process.
Status dpdk_eal_init(const std::vector<std::string>& args);
// Releases the EAL (after every port is closed).
void dpdk_eal_cleanup();

// The CPUs this process may run on (its affinity mask), for EAL lcore maps; {0} when unknown.
std::vector<int> allowed_cpus();
// An EAL --lcores map of lcores 0 .. count-1 spread over allowed_cpus() in turn:
// "0@c0,1@c1,..." (with fewer CPUs than lcores, lcores share them).
std::string spread_lcores(unsigned count);

struct DpdkOptions {
  std::string port;  // port name ("net_ring0", a PCI address) or number; empty: port 0
  uint32_t ip = 0;   // our IPv4 address, host order (required)
  uint16_t udp_port = 47474;
  bool mac_set = false;  // use `mac` instead of the port's own address
  frame::Mac mac{};
  uint16_t burst = 32;      // rx/tx burst size
  uint16_t rx_desc = 1024;  // descriptors per queue
  uint16_t tx_desc = 1024;
  uint32_t mbufs = 16383;        // mbuf pool size
  uint32_t handoff_ring = 1024;  // per lcore pair
  unsigned lcores = 0;           // worker lcores to use, the first ones (0: every worker lcore)
  // How a result goes to every rank. kChains: the datagram is encoded once, in one mbuf, and each
  // rank gets a 42-byte header mbuf chained to it (the datagram's reference count is the number
  // of ranks): no copy per rank. kCopies: one single-segment copy per rank (every PMD sends
  // those). kAuto: chains where the port transmits multi-segment frames
  // (RTE_ETH_TX_OFFLOAD_MULTI_SEGS, which net_memif and most NIC PMDs have; then it is enabled),
  // else copies. DpdkAggregator::chains() says what was chosen.
  enum class Fanout : uint8_t { kAuto, kCopies, kChains };
  Fanout fanout = Fanout::kAuto;
  // Configure the port (queues, pool) and start it. When false the caller configured and started
  // it (tests with rte_eth_from_rings do this to own the rings): it must have at least as many tx
  // queues as worker lcores; rx queues beyond the workers are not polled.
  bool configure_port = true;
  // Rx queues: 0: one per worker lcore (at most the port's) where the port spreads frames, else
  // one (with configure_port false: every queue the caller configured, up to one per lcore);
  // n: that many (at most the lcores).
  // The lcores beyond the rx queues only transmit and take handed-over frames.
  uint16_t rx_queues = 0;
  // Jobs added at run time (set_jobs): the slot memory shared by all jobs (0: unchecked) and the
  // largest block (in bytes) a job may have (sizes the mbufs and the MTU for DATA and RESULT; a
  // tree root's PARTIAL words are up to 4x a block: a root given to create() is sized for them,
  // one that set_jobs brings later needs this set to 4x its block; 0: the largest of the jobs
  // given to create(), which may then be empty only if this is set).
  uint32_t slot_capacity = 0;
  uint32_t max_payload_bytes = 0;
  // Telemetry (lag histograms, stalled-slot ages): read CLOCK_MONOTONIC once per loop pass that
  // has INA frames, and report rounds older than stall_after as stalled.
  bool telemetry = false;
  std::chrono::milliseconds stall_after{1000};
  // Benchmarks only (ina-dpdk-bench --no-tag): skip the per-job tag check to measure its cost.
  // Never off in a served aggregator (ina-aggregator has no switch for it).
  bool check_tag = true;
  // Benchmarks only (ina-dpdk-bench --stages): DpdkLoopCounters::rx_tsc, work_tsc and tx_tsc (four
  // TSC reads per busy iteration).
  bool stage_cycles = false;
};

// Per-lcore counters of the I/O loop (the Engine's own counters are in Engine::counters()).
struct DpdkLoopCounters {
  uint64_t rx = 0;          // frames received from the port
  uint64_t tx = 0;          // frames sent
  uint64_t tx_dropped = 0;  // the port did not take them (queue full)
  uint64_t handed_off = 0;  // INA frames passed to the lcore that owns their slot
  uint64_t handoff_received = 0;
  uint64_t handoff_dropped = 0;  // handoff ring full
  uint64_t tx_handed_off = 0;    // replies passed to lcore 0 to send (net_memif: lcores beyond the
                                 // queue pairs the peer connects have no tx queue it reads)
  uint64_t no_mbuf = 0;          // a reply copy could not be allocated
  uint64_t multi_segment = 0;    // scattered frames, dropped
  uint64_t unroutable = 0;       // a result for a rank whose address is not known yet
  uint64_t reply_too_big = 0;    // the reply does not fit the mbuf
  uint64_t tags_in_burst = 0;    // DATA whose tag the burst's pass verified (packet_mac_many)
  uint64_t polls = 0;            // loop iterations (benchmarks: idle_polls / polls is the idle
                                 // share)
  uint64_t idle_polls = 0;       // iterations that found nothing to do
  uint64_t busy_tsc = 0;         // TSC cycles in the other iterations, rx to tx (benchmarks:
                                 // cycles per frame, as testpmd --record-core-cycles counts them,
                                 // less the rx of a burst that follows an idle poll)
  // DpdkOptions::stage_cycles: the busy iterations' TSC cycles split by stage: the rx burst
  // (the PMD's receive, for net_memif its copy out of the shared ring), the frames' processing
  // (classify, tag check, slot table, result build and seal, fan-out), the tx burst (the PMD's
  // send, for net_memif its copy into the ring, and the frees).
  uint64_t rx_tsc = 0, work_tsc = 0, tx_tsc = 0;
  uint64_t cpu_ns = 0;   // CPU time of the lcore's thread in the loop (benchmarks)
  uint64_t wall_ns = 0;  // wall time in the loop
};

class DpdkAggregator {
 public:
  ~DpdkAggregator();
  DpdkAggregator(const DpdkAggregator&) = delete;
  DpdkAggregator& operator=(const DpdkAggregator&) = delete;

  // Needs the EAL and at least one worker lcore. Sets up the port (unless configure_port is
  // false), the pool, the handoff rings and one Engine per worker lcore with every job (none
  // when opts.max_payload_bytes is set: jobs come from set_jobs).
  static Result<std::unique_ptr<DpdkAggregator>> create(const DpdkOptions& opts,
                                                        const std::vector<JobConfig>& jobs);

  // Launches the loop on every worker lcore and returns.
  Status start();
  // Stops the loops, waits for them, then stops the port (when this object configured it).
  void stop();
  bool running() const { return running_; }

  // Thread safe: the jobs to serve from now on (as UdpAggregator::set_jobs: jobs not listed, or
  // listed with another key, world, slot range or block, are removed, new ones added, the others
  // untouched; errors show in snapshot().job_errors). Applied by the next service().
  void set_jobs(std::vector<JobConfig> jobs);
  // The main lcore (one thread at a time), called every few ms: hands pending set_jobs() to every
  // lcore, asks them for snapshots every `snapshot_every` (0: only when jobs change), and
  // publishes the merged snapshot once all answered. While the loops are not running it applies
  // and publishes directly. Never blocks on the lcores.
  void service(std::chrono::milliseconds snapshot_every);
  // Thread safe: the last published snapshot (every lcore's engine merged).
  AggregatorSnapshot snapshot() const;

  uint16_t port_id() const { return port_; }
  const frame::LocalConfig& local() const { return local_; }
  unsigned lcores() const { return static_cast<unsigned>(lcores_.size()); }
  uint16_t rx_queues() const { return rx_queues_; }
  // Whether results go to the ranks as header + shared datagram chains (DpdkOptions::fanout).
  bool chains() const { return chains_; }
  // The largest INA datagram its mbufs (and the port's MTU) hold: every job's DATA, RESULT and
  // control packets, and a tree root's PARTIAL words.
  size_t max_packet() const { return max_packet_; }
  // Safe while running: frames lcore i received from its rx queue (0 for an lcore without one).
  uint64_t rx_frames(unsigned i) const;

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
  // Every lcore's Engine names a job's incarnations alike (EngineOptions::epoch_salt).
  uint64_t epoch_salt_ = draw_epoch_salt();
  frame::LocalConfig local_;
  uint16_t port_ = 0;
  uint16_t rx_queues_ = 0;
  bool port_started_ = false;
  bool chains_ = false;  // DpdkOptions::fanout as resolved for the port
  bool running_ = false;
  std::atomic<bool> stop_{false};
  rte_mempool* pool_ = nullptr;
  std::vector<rte_ring*> rings_;     // handoff rings, src * n + dst
  std::vector<rte_ring*> tx_rings_;  // replies of lcore i to lcore 0 (nullptr: i sends itself)
  std::vector<std::unique_ptr<Lcore>> lcores_;
  // The largest INA datagram the mbufs hold (set_jobs checks blocks against it).
  size_t max_packet_ = 0;
  // The largest frame of any job (a reply fits an mbuf this large).
  size_t max_frame() const { return frame::kUdpHeadroom + max_packet_; }
  // set_jobs() (not the packet path) and the published snapshot.
  mutable std::mutex ctl_mu_;
  std::vector<JobConfig> desired_;
  uint64_t desired_gen_ = 0;
  std::unique_ptr<SnapshotBoard> board_;
  // The main lcore's side of the mailboxes (service() only).
  uint64_t delivered_gen_ = 0;
  uint64_t round_ = 0;       // last request posted to every lcore
  bool round_open_ = false;  // posted, not yet answered by every lcore
  std::chrono::steady_clock::time_point next_snapshot_{};
  void publish(std::vector<AggregatorSnapshot> parts);  // every lcore's, merged on the board
};

}  // namespace ina::agg
