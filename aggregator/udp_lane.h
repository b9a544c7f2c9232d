// One serving thread of the kernel UDP aggregator (private to udp_backend.cc and udp_lane.cc):
// its socket, Engine, address book, handoff rings and buffers, and its loop.
//
// The loop: drain what other lanes handed over; recvmmsg a batch without blocking; split each
// buffer into datagrams (a UDP GRO buffer holds several of one sender, cut every gso_size bytes);
// route each (route()): this lane's slots go to its Engine, another lane's are copied into that
// lane's HandoffRing, a worker's HELLO is processed here and copied to every other lane (marked as
// a copy: counted once); encode each reply at once into the ReplyQueue (udp_tx.h); after the batch,
// flush the replies from this lane's socket (every socket of the group sends from the port) and
// wake the lanes it handed datagrams to that sleep in poll() (an eventfd each; a lane announces
// its sleep with a flag, then checks its rings once more, and the producer checks the flag after
// publishing: neither side can miss the other). When there is nothing to do and the traffic is
// sparse, first keep polling (recvmmsg and the rings, with sched_yield() between passes) for up
// to UdpOptions::spin after the last datagram or handoff (udp::SpinGate): the other ranks' blocks
// of a small collective come within tens of microseconds, and each wake-up from poll() costs
// 10-15 us on the 2-core VM and adds to the collective's latency (the workers poll the same way
// for their results: inc_engine.cc, "Waiting"); yielding leaves the core to the ranks that
// produce those blocks, where a busy spin would hold it. Then poll the socket and the eventfd for
// at most 100 ms, so that a stop request is seen promptly. A polling lane does not announce a
// sleep, so nobody wakes it. Every buffer is
// allocated before the loop: it never allocates, locks or logs (the jobs of set_jobs() and the
// periodic snapshot and stats line are handled between batches).
//
// Aggregation trees: a leaf job's parent ("host:port") is resolved once, when the job is added;
// the Engine's kParent replies (partials, the leaf's HELLO) go there from lane 0's socket, and the
// parent's answers arrive on the port like any packet (the Engine tells them apart by their flags
// and the job's key); every lane routes a leaf job's datagrams to lane 0.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/backend_shell.h"
#include "aggregator/engine.h"
#include "aggregator/handoff_ring.h"
#include "aggregator/snapshot.h"
#include "aggregator/udp_net.h"
#include "aggregator/udp_options.h"
#include "aggregator/udp_tx.h"

namespace ina::agg {

struct UdpShared;

struct UdpLane {
  struct Counters {
    uint64_t rx_calls = 0;      // recvmmsg calls that returned data
    uint64_t rx_buffers = 0;    // buffers received (a GRO buffer counts one)
    uint64_t rx_datagrams = 0;  // datagrams after splitting GRO buffers
    uint64_t gro_buffers = 0;   // buffers that held more than one datagram
    uint64_t hook_dropped = 0;
    uint64_t hook_duplicated = 0;
    uint64_t handed_off = 0;  // datagrams copied to the lane that owns their slot
    uint64_t handoff_received = 0;
    uint64_t handoff_dropped = 0;  // the owner's ring was full
    uint64_t wakeups = 0;          // eventfd writes to sleeping lanes
    uint64_t sleeps = 0;           // idle waits in poll() (each ends in a wake-up)
  };

  UdpShared* shared = nullptr;  // owned by the UdpAggregator, which outlives its lanes
  unsigned idx = 0;
  unsigned lanes = 1;
  UdpOptions opts;
  size_t max_packet = 0;  // largest datagram a job may have
  int fd = -1;
  int efd = -1;  // eventfd: another lane handed over datagrams while this one slept, or
                 // set_jobs() has new jobs
  std::unique_ptr<Engine> engine;
  uint64_t batch_now = 0;  // CLOCK_MONOTONIC ns of the current batch (0: telemetry off)
  uint64_t rng = 0;        // the test hooks' generator
  Counters c;
  udp::ReplyQueue tx;
  std::thread thread;  // lanes 1.. (lane 0 runs on run()'s caller)
  Status result;       // what serve() returned

  // receive
  std::vector<uint8_t> rx_buf;
  std::vector<mmsghdr> rx_msgs;
  std::vector<iovec> rx_iov;
  std::vector<sockaddr_in> rx_addr;
  std::vector<udp::CmsgBuf> rx_ctrl;

  // handoff: out[d] is this lane's ring to lane d (none to itself), in[s] lane s's ring to this
  std::vector<std::unique_ptr<HandoffRing>> out;
  std::vector<HandoffRing*> in;
  uint64_t wake_mask = 0;  // lanes handed datagrams since the last wake()
  alignas(64) std::atomic<bool> sleeping{false};

  // jobs: the generation of set_jobs() applied, the leaf jobs (served by lane 0 only, routed
  // there by every lane), the jobs that could not be added
  std::atomic<uint64_t> applied_gen{0};  // written by this lane, read by lane 0's publish()
  std::vector<JobId> leaf_jobs;
  std::map<JobId, std::string> job_errors;

  // rank addresses, learned from each rank's valid packets (index: served rank)
  AddressBook<udp::Peer> peers;
  // leaf jobs' parent aggregators, resolved when the job is added
  std::map<JobId, sockaddr_in> parents;

  ~UdpLane() {
    if (fd >= 0) ::close(fd);
    if (efd >= 0) ::close(efd);
  }

  bool is_leaf(JobId job) const {
    return std::find(leaf_jobs.begin(), leaf_jobs.end(), job) != leaf_jobs.end();
  }
  bool chance(double percent);

  // Buffers for `batch` datagrams per recvmmsg and their replies. Allocates.
  Status alloc_buffers(size_t batch);
  JobHooks job_hooks();
  void apply_jobs(const std::vector<JobConfig>& desired);
  AggregatorSnapshot take_snapshot() const;
  Status serve(const std::atomic<bool>& stop, const std::atomic<bool>& halt);

 private:
  void receive_buffer(const msghdr& h, const uint8_t* data, size_t len, const sockaddr_in& src);
  void on_datagram(std::span<const uint8_t> d, const sockaddr_in& src);
  void route(std::span<const uint8_t> d, const sockaddr_in& src);
  void hand_off(unsigned to, std::span<const uint8_t> d, const sockaddr_in& src, bool copy);
  size_t drain_handoffs();
  void wake();
  void idle_wait();
  void handle(std::span<const uint8_t> d, const sockaddr_in& src, uint64_t now, bool hello_copy);
  void enqueue(const Reply& r, const sockaddr_in& src);
};

// What the serving threads share, owned by their UdpAggregator.
struct UdpShared {
  std::vector<std::unique_ptr<UdpLane>> lanes;
  std::atomic<bool> gso_on{false};  // turned off by any thread whose GSO send is refused
  // set_jobs() hand-off: each thread applies a new generation between batches.
  std::mutex jobs_mu;
  std::atomic<uint64_t> desired_gen{0};
  std::vector<JobConfig> desired_jobs;
  // Each thread's snapshot part; thread 0 publishes the merge.
  std::unique_ptr<SnapshotBoard> board;
  bool publish(unsigned lane);
};

uint64_t monotonic_ns();

}  // namespace ina::agg
