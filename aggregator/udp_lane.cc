// One serving thread of the kernel UDP aggregator: its loop (see udp_lane.h).
#include "aggregator/udp_lane.h"

#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <time.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>

#include "ina/base/log.h"

namespace ina::agg {
namespace {

constexpr const char* kComponent = "aggregator";
constexpr size_t kRecvBufSize = 65536;  // any IPv4 datagram, or one GRO buffer (<= 64 KiB)
constexpr int kPollMs = 100;            // bounds how late a stop request is seen
constexpr size_t kMaxDrain = 256;       // records taken from one ring per loop pass

// splitmix64: a tiny seeded generator for the test hooks (deterministic per seed).
uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A worker's HELLO (not a parent's WELCOME, which carries RESULT): every lane runs the barrier.
bool is_worker_hello(std::span<const uint8_t> d) {
  const uint8_t f = d[wire::kOffFlags];
  return (f & wire::kFlagHello) != 0 && (f & (wire::kFlagResult | wire::kFlagError)) == 0;
}

}  // namespace

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

bool UdpLane::chance(double percent) {
  if (percent <= 0) return false;
  const double u = static_cast<double>(splitmix64(&rng) >> 11) * 0x1.0p-53;
  return u * 100.0 < percent;
}

Status UdpLane::alloc_buffers(size_t b) {
  try {
    rx_buf.assign(b * kRecvBufSize, 0);
    rx_msgs.assign(b, mmsghdr{});
    rx_iov.assign(b, iovec{});
    rx_addr.assign(b, sockaddr_in{});
    rx_ctrl.assign(b, udp::CmsgBuf{});
  } catch (const std::bad_alloc&) {
    return resource_exhausted("udp: cannot allocate buffers for batch " + std::to_string(b));
  }
  return tx.init(b, max_packet, fd, &shared->gso_on, &peers);
}

void UdpLane::on_datagram(std::span<const uint8_t> d, const sockaddr_in& src) {
  ++c.rx_datagrams;
  if (chance(opts.drop_percent)) {
    ++c.hook_dropped;
    return;
  }
  route(d, src);
  if (chance(opts.dup_percent)) {
    ++c.hook_duplicated;
    route(d, src);
  }
}

// To this lane's Engine, to the lane that owns the datagram's slot, or (a worker's HELLO) to every
// lane. A datagram too short to route is this lane's: its Engine counts it as malformed.
void UdpLane::route(std::span<const uint8_t> d, const sockaddr_in& src) {
  if (lanes == 1 || d.size() < wire::kHeaderSize) {
    handle(d, src, batch_now, false);
    return;
  }
  unsigned owner;
  if (!leaf_jobs.empty() && is_leaf(wire::get_u32(d.data() + wire::kOffJob))) {
    owner = 0;
  } else if (is_worker_hello(d)) {
    // Rare (once per rank and incarnation): the copies go first, so that every lane holds the
    // HELLO before any DATA this lane hands over after it (one FIFO ring per pair of lanes).
    for (unsigned k = 0; k < lanes; ++k) {
      if (k != idx) hand_off(k, d, src, true);
    }
    handle(d, src, batch_now, false);
    return;
  } else {
    owner = udp::lane_of_slot(wire::slot_of(d), lanes);
  }
  if (owner == idx) {
    handle(d, src, batch_now, false);
  } else {
    hand_off(owner, d, src, false);
  }
}

void UdpLane::hand_off(unsigned to, std::span<const uint8_t> d, const sockaddr_in& src, bool copy) {
  HandoffRing& r = *out[to];
  // A copy is counted by the lane that received the datagram (Engine::on_packet's
  // counted_elsewhere), so it travels with a mark.
  if (r.push(d, batch_now, src, copy ? 1u : 0u)) {
    ++c.handed_off;
    wake_mask |= uint64_t{1} << to;
  } else {
    ++c.handoff_dropped;  // the owner is behind: the sender's retransmission repairs it
  }
}

size_t UdpLane::drain_handoffs() {
  size_t took = 0;
  for (HandoffRing* r : in) {
    if (r == nullptr) continue;
    HandoffRing::Meta m;
    std::span<const uint8_t> d;
    for (size_t k = 0; k < kMaxDrain && r->front(&m, &d); ++k) {
      ++c.handoff_received;
      handle(d, m.src, m.arrival_ns, m.mark != 0);
      r->pop(m);
      ++took;
    }
  }
  return took;
}

// After the replies are flushed: the lanes this one handed datagrams to, if they sleep.
void UdpLane::wake() {
  if (wake_mask == 0) return;
  // Pairs with idle_wait(): the rings' head stores before the loads of `sleeping`.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (uint64_t m = wake_mask; m != 0; m &= m - 1) {
    UdpLane& l = *shared->lanes[static_cast<size_t>(__builtin_ctzll(m))];
    if (l.sleeping.load(std::memory_order_relaxed)) {
      const uint64_t one = 1;
      ssize_t rc;
      do {
        rc = ::write(l.efd, &one, sizeof one);
      } while (rc < 0 && errno == EINTR);
      ++c.wakeups;
    }
  }
  wake_mask = 0;
}

// Nothing received and nothing handed over: sleeps until the socket or another lane has something,
// at most kPollMs (a stop request is seen that late at worst).
void UdpLane::idle_wait() {
  pollfd pfd[2] = {{fd, POLLIN, 0}, {efd, POLLIN, 0}};
  if (lanes > 1) {
    sleeping.store(true, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (HandoffRing* r : in) {
      if (r != nullptr && !r->empty()) {
        sleeping.store(false, std::memory_order_relaxed);
        return;
      }
    }
  }
  (void)::poll(pfd, 2, kPollMs);  // EINTR: the loop checks the stop flag and comes back
  sleeping.store(false, std::memory_order_relaxed);
  if ((pfd[1].revents & POLLIN) != 0) {
    uint64_t v;
    (void)::read(efd, &v, sizeof v);
  }
}

void UdpLane::handle(std::span<const uint8_t> d, const sockaddr_in& src, uint64_t now,
                     bool hello_copy) {
  int32_t rank = -1;
  JobId job = 0;
  // Arrival time of the batch (read once per recvmmsg): the lags telemetry looks for are
  // micro- to milliseconds, far above the spread of one batch, and one clock read per datagram
  // cost up to 100 ns on a loaded VM.
  const Reply r = engine->on_packet(d, now, &rank, &job, hello_copy);
  if (rank >= 0) {
    // Learn (or follow a move of) the rank's address. The engine sets rank only for a packet
    // with the job's tag that moved the job on (a joining HELLO, an added contribution), so
    // nobody without the key can redirect its results, nor anyone replaying its packets.
    if (std::vector<udp::Peer>* p = peers.find(job); p != nullptr) {
      udp::Peer& peer = (*p)[static_cast<size_t>(rank)];
      if (!peer.known || !udp::same_addr(peer.addr, src)) {
        peer.addr = src;
        peer.known = true;
      }
    }
  }
  if (r.target == Reply::Target::kNone) return;
  // Every lane ran the HELLO; lane 0 alone answers it.
  if (idx != 0 && d.size() >= wire::kHeaderSize && is_worker_hello(d)) return;
  enqueue(r, src);
}

// What this lane serves of the jobs (a leaf job: lane 0 only; the others route its datagrams
// there) and the checks and bookkeeping around its Engine's.
JobHooks UdpLane::job_hooks() {
  JobHooks h;
  h.serves = [this](const JobConfig& j) { return idx == 0 || !j.is_leaf(); };
  h.admit = [this](const JobConfig& j) -> Status {
    if (wire::max_packet_size(j.slots.max_payload_bytes) > max_packet) {
      return invalid_argument("block of " + std::to_string(j.slots.max_payload_bytes) +
                              " bytes exceeds this aggregator's buffers");
    }
    if (j.is_leaf()) {
      Result<sockaddr_in> p = udp::resolve_parent(j);
      if (!p.ok()) return p.status();
      parents[j.job] = *p;
    }
    return ok_status();
  };
  h.removed = [this](JobId job) {
    peers.erase(job);
    parents.erase(job);
  };
  h.added = [this](const JobConfig& j) { peers.reset(j.job, j.served_ranks()); };
  return h;
}

// Between batches (nothing pending in the arena): the jobs of the newest set_jobs() (or of
// create()).
void UdpLane::apply_jobs(const std::vector<JobConfig>& desired) {
  job_errors = reconcile_jobs(*engine, desired, job_hooks());
  for (const auto& [job, err] : job_errors) parents.erase(job);
  leaf_jobs.clear();
  for (const JobConfig& j : desired) {
    if (j.is_leaf()) leaf_jobs.push_back(j.job);
  }
}

AggregatorSnapshot UdpLane::take_snapshot() const {
  const uint64_t stall_ns =
      static_cast<uint64_t>(std::chrono::nanoseconds(opts.stall_after).count());
  // Not ranked: the board's merge ranks the stragglers from every lane's telemetry.
  AggregatorSnapshot s = engine_snapshot(*engine, monotonic_ns(), stall_ns, false);
  s.tx_datagrams = tx.counters().tx_datagrams;
  s.send_errors = tx.counters().send_errors;
  s.unroutable = tx.counters().unroutable;
  s.job_errors = job_errors;
  return s;
}

// One received buffer: a datagram, or a GRO buffer of datagrams of gso_size bytes (the last
// possibly shorter).
void UdpLane::receive_buffer(const msghdr& h, const uint8_t* data, size_t len,
                             const sockaddr_in& src) {
  ++c.rx_buffers;
  size_t seg = len;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&h); cm != nullptr;
       cm = CMSG_NXTHDR(const_cast<msghdr*>(&h), cm)) {
    if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
      int gso_size = 0;
      std::memcpy(&gso_size, CMSG_DATA(cm), sizeof gso_size);
      if (gso_size > 0) seg = static_cast<size_t>(gso_size);
    }
  }
  if (len == 0 || seg >= len) {
    on_datagram(std::span<const uint8_t>(data, len), src);
    return;
  }
  ++c.gro_buffers;
  for (size_t off = 0; off < len; off += seg) {
    on_datagram(std::span<const uint8_t>(data + off, std::min(seg, len - off)), src);
  }
}

Status UdpLane::serve(const std::atomic<bool>& stop, const std::atomic<bool>& halt) {
  const unsigned batch = opts.batch;
  using Clock = std::chrono::steady_clock;
  const bool stats = opts.stats_interval.count() > 0;
  auto next_stats = Clock::now() + opts.stats_interval;
  EngineCounters last = engine->counters();
  auto last_time = Clock::now();
  auto next_snapshot = Clock::now();
  char who[24] = "";
  if (lanes > 1) std::snprintf(who, sizeof who, "thread %u: ", idx);

  auto between_batches = [&] {
    if (shared->desired_gen.load(std::memory_order_acquire) !=
        applied_gen.load(std::memory_order_relaxed)) {
      std::vector<JobConfig> desired;
      uint64_t gen;
      {
        std::lock_guard<std::mutex> g(shared->jobs_mu);
        desired = shared->desired_jobs;
        gen = shared->desired_gen.load(std::memory_order_relaxed);
      }
      apply_jobs(desired);
      applied_gen.store(gen, std::memory_order_release);
      next_snapshot = Clock::now();  // publish the change now
    }
    if (opts.snapshot_interval.count() > 0 && Clock::now() >= next_snapshot) {
      // Lane 0 defers while another lane has not applied the same jobs (soon: set_jobs() woke
      // it), so that a published job is served by every lane.
      const bool published = shared->publish(idx);
      next_snapshot =
          Clock::now() + (published ? opts.snapshot_interval : std::chrono::milliseconds(1));
    }
    if (!stats) return;
    const auto now = Clock::now();
    if (now < next_stats) return;
    next_stats = now + opts.stats_interval;
    const EngineCounters& e = engine->counters();
    const double dt = std::chrono::duration<double>(now - last_time).count();
    const double rate_in = dt > 0 ? static_cast<double>(e.packets_in - last.packets_in) / dt : 0;
    const double rate_done = dt > 0 ? static_cast<double>(e.completed - last.completed) / dt : 0;
    INA_INFO(kComponent,
             "%sin %" PRIu64 " (%.0f/s) completed %" PRIu64 " (%.0f/s) out %" PRIu64 " dup %" PRIu64
             " stale %" PRIu64 " mismatch %" PRIu64 " malformed %" PRIu64 " bad_tag %" PRIu64
             " unknown_job %" PRIu64 " not_ready %" PRIu64 " send_errors %" PRIu64
             " unroutable %" PRIu64 " handed_off %" PRIu64,
             who, e.packets_in, rate_in, e.completed, rate_done, tx.counters().tx_datagrams,
             e.duplicates, e.stale, e.mismatched, e.malformed, e.bad_tag, e.unknown_job,
             e.not_ready, tx.counters().send_errors, tx.counters().unroutable, c.handed_off);
    last = e;
    last_time = now;
  };

  const auto spin_ns = static_cast<uint64_t>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::nanoseconds>(opts.spin).count()));
  udp::SpinGate gate(spin_ns);  // poll or sleep when idle (udp_lane.h)
  while (!stop.load(std::memory_order_relaxed) && !halt.load(std::memory_order_relaxed)) {
    between_batches();
    // What other lanes handed over first: it is older than what the socket holds (a HELLO's copy
    // before a DATA of the same rank that was steered here directly).
    const size_t taken = lanes > 1 ? drain_handoffs() : 0;
    const uint64_t rx_before = c.rx_datagrams;  // a GRO buffer holds several
    for (unsigned i = 0; i < batch; ++i) {
      rx_iov[i].iov_base = rx_buf.data() + size_t{i} * kRecvBufSize;
      rx_iov[i].iov_len = kRecvBufSize;
      msghdr& h = rx_msgs[i].msg_hdr;
      h.msg_name = &rx_addr[i];
      h.msg_namelen = sizeof(sockaddr_in);
      h.msg_iov = &rx_iov[i];
      h.msg_iovlen = 1;
      h.msg_control = rx_ctrl[i].buf;
      h.msg_controllen = sizeof rx_ctrl[i].buf;
      h.msg_flags = 0;
    }
    const int n = recvmmsg(fd, rx_msgs.data(), batch, MSG_DONTWAIT, nullptr);
    if (n < 0) {
      const int err = errno;
      if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
        return errno_status("udp: recvmmsg", err);
      }
    } else {
      ++c.rx_calls;
      if (opts.telemetry) batch_now = monotonic_ns();
      for (int i = 0; i < n; ++i) {
        receive_buffer(rx_msgs[i].msg_hdr, rx_buf.data() + static_cast<size_t>(i) * kRecvBufSize,
                       rx_msgs[i].msg_len, rx_addr[i]);
      }
    }
    // One recvmmsg per flush. In a stream (4 ranks, 16 MiB float32, loopback, the 2-core VM) a
    // flush carries about 120 RESULT datagrams (30 per rank; 10-20 GSO trains of up to 7, one
    // sendmmsg), and reading again before it finds the socket empty: draining until empty or
    // until 32 or 96 replies were pending left the flushes as many as before. The idle polls of
    // the SpinGate cost 0.15 us a call; at that stream's rate (about one datagram per 6 us on
    // the VM, near the gate's one per 5 us) the gate sometimes polls through the stream, 2-50k
    // sched_yield calls per GB reduced, without a change in CPU per GB that the alternated runs
    // could see (3 runs each of spin 0 and 200 us).
    tx.flush();
    wake();
    if (n > 0 || taken > 0) {
      if (gate.enabled()) {
        gate.on_traffic(opts.telemetry && n > 0 ? batch_now : monotonic_ns(),
                        c.rx_datagrams - rx_before + taken);
      }
    } else if (gate.enabled() && gate.poll(monotonic_ns())) {
      sched_yield();
    } else {
      ++c.sleeps;
      idle_wait();
    }
  }
  tx.flush();
  if (opts.snapshot_interval.count() > 0) shared->publish(idx);
  return ok_status();
}

void UdpLane::enqueue(const Reply& r, const sockaddr_in& src) {
  const sockaddr_in* dest = &src;
  if (r.target == Reply::Target::kParent) {
    auto it = parents.find(r.hdr.job);
    if (it == parents.end()) {
      tx.count_unroutable();
      return;
    }
    dest = &it->second;
  }
  tx.enqueue(r, *dest);
}

}  // namespace ina::agg
