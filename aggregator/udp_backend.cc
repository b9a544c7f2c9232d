// Kernel UDP backend (see udp_backend.h): the sockets and threads, the jobs, the snapshot and the
// counters. Each thread's loop is a UdpLane (udp_lane.h); its replies go out through a ReplyQueue
// (udp_tx.h); the sockets and the steering program are set up by udp_net.h.
#include "aggregator/udp_backend.h"

#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>
#include <utility>

#include "aggregator/udp_lane.h"
#include "aggregator/udp_net.h"
#include "ina/base/log.h"

namespace ina::agg {
namespace {

constexpr const char* kComponent = "aggregator";
constexpr uint32_t kMaxBatch = 1024;
constexpr size_t kMinRingBytes = 1 << 20;  // handoff ring per pair of lanes: at least this, and
constexpr size_t kRingPackets = 64;        // this many of the largest datagrams

unsigned allowed_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n > 0 ? static_cast<unsigned>(n) : 1;
}

}  // namespace

UdpAggregator::UdpAggregator() : shared_(std::make_unique<UdpShared>()) {}
UdpAggregator::~UdpAggregator() = default;

unsigned UdpAggregator::threads() const { return static_cast<unsigned>(shared_->lanes.size()); }
bool UdpAggregator::gso_enabled() const { return shared_->gso_on.load(std::memory_order_relaxed); }

const Engine& UdpAggregator::engine(unsigned i) const { return *shared_->lanes.at(i)->engine; }

EngineCounters UdpAggregator::engine_totals() const {
  EngineCounters t;
  for (const auto& l : shared_->lanes) add_counters(t, l->engine->counters());
  return t;
}

uint64_t UdpAggregator::dropped_by_hook() const {
  uint64_t n = 0;
  for (const auto& l : shared_->lanes) n += l->c.hook_dropped;
  return n;
}

uint64_t UdpAggregator::handed_off() const {
  uint64_t n = 0;
  for (const auto& l : shared_->lanes) n += l->c.handed_off;
  return n;
}

Result<std::unique_ptr<UdpAggregator>> UdpAggregator::create(const UdpOptions& opts,
                                                             const std::vector<JobConfig>& jobs) {
  if (opts.batch < 1 || opts.batch > kMaxBatch) {
    return invalid_argument("udp: batch must be in 1.." + std::to_string(kMaxBatch) + ", got " +
                            std::to_string(opts.batch));
  }
  if (!(opts.drop_percent >= 0 && opts.drop_percent <= 100)) {
    return invalid_argument("udp: drop_percent must be in 0..100");
  }
  if (!(opts.dup_percent >= 0 && opts.dup_percent <= 100)) {
    return invalid_argument("udp: dup_percent must be in 0..100");
  }
  if (opts.threads > kMaxUdpThreads) {
    return invalid_argument("udp: threads must be in 0.." + std::to_string(kMaxUdpThreads) +
                            " (0: one per CPU), got " + std::to_string(opts.threads));
  }
  if (jobs.empty() && opts.max_payload_bytes == 0) {
    return invalid_argument(
        "udp: at least one job is required (or max_payload_bytes for jobs "
        "added at run time)");
  }
  if (wire::max_packet_size(opts.max_payload_bytes) > udp::kMaxUdpPayload) {
    return invalid_argument("udp: max_payload_bytes " + std::to_string(opts.max_payload_bytes) +
                            " exceeds what one UDP datagram carries");
  }
  // Runtime jobs: bitmaps of up to 65535 ranks in control replies.
  size_t max_packet = opts.max_payload_bytes == 0 ? wire::control_packet_size(2)
                                                  : wire::max_packet_size(opts.max_payload_bytes);
  for (const JobConfig& j : jobs) {
    const size_t pkt = wire::max_packet_size(j.slots.max_payload_bytes);
    if (pkt > udp::kMaxUdpPayload) {
      return invalid_argument("udp: job " + std::to_string(j.job) + ": max_payload_bytes " +
                              std::to_string(j.slots.max_payload_bytes) + " makes " +
                              std::to_string(pkt) + "-byte packets; UDP carries at most " +
                              std::to_string(udp::kMaxUdpPayload) + " bytes");
    }
    max_packet = std::max(max_packet, pkt);
  }

  std::unique_ptr<UdpAggregator> a(new UdpAggregator());
  unsigned lanes = opts.threads == 0 ? std::min(allowed_cpu_count(), kMaxUdpThreads) : opts.threads;
  INA_ASSIGN_OR_RETURN(sockaddr_in sa, udp::resolve_ipv4(opts.bind_host, opts.port));

  // The sockets. One thread: a plain socket (no SO_REUSEADDR, which on UDP lets a second socket
  // bind the port and take its unicast traffic; no SO_REUSEPORT), so that a second aggregator on a
  // busy port fails here instead of starting silently. Several: a SO_REUSEPORT group, after a
  // plain bind shows the port free (the group would otherwise take in another aggregator's
  // sockets of the same user), steered by udp::attach_steering().
  std::vector<int> fds;
  auto close_all = [&fds] {
    for (int fd : fds) ::close(fd);
    fds.clear();
  };
  if (lanes > 1) {
    if (sa.sin_port != 0) {
      INA_ASSIGN_OR_RETURN(int probe, udp::bound_socket(sa, false));
      ::close(probe);
    }
    for (unsigned i = 0; i < lanes; ++i) {
      Result<int> fd = udp::bound_socket(sa, true);
      if (!fd.ok()) {
        close_all();
        return fd.status();
      }
      fds.push_back(*fd);
      if (i == 0) {
        socklen_t sl = sizeof sa;
        if (::getsockname(fds[0], reinterpret_cast<sockaddr*>(&sa), &sl) != 0) {
          const int err = errno;
          close_all();
          return errno_status("udp: getsockname", err);
        }
      }
    }
    if (opts.steer) {
      const Status st = udp::attach_steering(fds[0], lanes);
      if (!st.ok()) {
        INA_WARN(kComponent, "%s: serving on one thread instead of %u", st.message().c_str(),
                 lanes);
        close_all();
        lanes = 1;
      }
    }
  }
  if (lanes == 1) {
    INA_ASSIGN_OR_RETURN(int fd, udp::bound_socket(sa, false));
    fds.push_back(fd);
  }
  socklen_t sl = sizeof sa;
  if (::getsockname(fds[0], reinterpret_cast<sockaddr*>(&sa), &sl) != 0) {
    const int err = errno;
    close_all();
    return errno_status("udp: getsockname", err);
  }
  a->port_ = ntohs(sa.sin_port);

  const int one = 1;
  if (opts.gro) {
    a->gro_on_ = true;
    for (int fd : fds) {
      a->gro_on_ = a->gro_on_ && setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
    }
  }
  if (opts.gso) {
    // The kernel has UDP_SEGMENT when it answers for the option (the per-send cmsg is used).
    int v = 0;
    socklen_t vl = sizeof v;
    a->shared_->gso_on = getsockopt(fds[0], SOL_UDP, UDP_SEGMENT, &v, &vl) == 0;
  }

  EngineOptions eo;
  eo.telemetry = opts.telemetry;
  eo.epoch_salt = draw_epoch_salt();  // one for every lane: they must name incarnations alike
  const size_t ring_bytes = std::max(kMinRingBytes, kRingPackets * max_packet);
  for (unsigned i = 0; i < lanes; ++i) {
    auto l = std::make_unique<UdpLane>();
    l->shared = a->shared_.get();
    l->idx = i;
    l->lanes = lanes;
    l->opts = opts;
    l->max_packet = max_packet;
    l->rng = opts.seed + i;
    l->fd = fds[i];
    fds[i] = -1;  // the lane owns it now
    l->engine = std::make_unique<Engine>(eo);
    l->engine->set_slot_capacity(opts.slot_capacity);
    l->efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (l->efd < 0) {
      const int err = errno;
      for (int fd : fds)
        if (fd >= 0) ::close(fd);
      return errno_status("udp: eventfd", err);
    }
    if (lanes > 1) {
      try {
        l->out.resize(lanes);
        for (unsigned d = 0; d < lanes; ++d) {
          if (d != i) l->out[d] = std::make_unique<HandoffRing>(ring_bytes);
        }
      } catch (const std::bad_alloc&) {
        for (int fd : fds)
          if (fd >= 0) ::close(fd);
        return resource_exhausted("udp: cannot allocate handoff rings of " +
                                  std::to_string(ring_bytes) + " bytes");
      }
    }
    if (Status st = l->alloc_buffers(opts.batch); !st.ok()) {
      for (int fd : fds)
        if (fd >= 0) ::close(fd);
      return st;
    }
    a->shared_->lanes.push_back(std::move(l));
  }
  for (auto& l : a->shared_->lanes) {
    l->in.assign(lanes, nullptr);
    for (unsigned s = 0; s < lanes; ++s) {
      if (s != l->idx) l->in[s] = a->shared_->lanes[s]->out[l->idx].get();
    }
    l->apply_jobs(jobs);
    if (!l->job_errors.empty()) {
      const auto& [job, err] = *l->job_errors.begin();
      return invalid_argument("udp: job " + std::to_string(job) + ": " + err);
    }
  }
  a->shared_->board = std::make_unique<SnapshotBoard>(lanes, "threads");
  for (auto& l : a->shared_->lanes) a->shared_->board->put(l->idx, l->take_snapshot());
  a->shared_->board->publish(monotonic_ns(),
                             /*log_changes=*/false);  // main() reports the initial jobs
  return a;
}

void UdpAggregator::set_jobs(std::vector<JobConfig> jobs) {
  {
    std::lock_guard<std::mutex> g(shared_->jobs_mu);
    shared_->desired_jobs = std::move(jobs);
    shared_->desired_gen.fetch_add(1, std::memory_order_release);
  }
  for (const auto& l : shared_->lanes) {  // apply now, not after a poll timeout
    const uint64_t one = 1;
    (void)!::write(l->efd, &one, sizeof one);
  }
}

AggregatorSnapshot UdpAggregator::snapshot() const { return shared_->board->snapshot(); }

// Lane i's part (on lane i's thread, between batches); lane 0 also publishes the merge, once every
// lane has applied the jobs it has (false: deferred).
bool UdpShared::publish(unsigned i) {
  board->put(i, lanes[i]->take_snapshot());
  if (i != 0) return true;
  const uint64_t gen = lanes[0]->applied_gen.load(std::memory_order_relaxed);
  for (const auto& l : lanes) {
    if (l->applied_gen.load(std::memory_order_acquire) != gen) return false;
  }
  board->publish(monotonic_ns());
  return true;
}

Status UdpAggregator::run(const std::atomic<bool>& stop) {
  std::atomic<bool> halt{false};  // a lane failed: the others stop too
  // Lanes 1..: a thread each (std::thread allocates its start state once, here, not in the loop).
  for (size_t i = 1; i < shared_->lanes.size(); ++i) {
    UdpLane& l = *shared_->lanes[i];
    l.thread = std::thread([&l, &stop, &halt] {
      char name[16];
      std::snprintf(name, sizeof name, "ina-udp-%u", l.idx);
      pthread_setname_np(pthread_self(), name);
      l.result = l.serve(stop, halt);
      if (!l.result.ok()) halt.store(true);
    });
  }
  UdpLane& l0 = *shared_->lanes[0];
  l0.result = l0.serve(stop, halt);
  if (!l0.result.ok()) halt.store(true);
  for (size_t i = 1; i < shared_->lanes.size(); ++i) shared_->lanes[i]->thread.join();
  if (shared_->lanes.size() > 1 && l0.opts.snapshot_interval.count() > 0) {
    shared_->board->publish(monotonic_ns());  // every lane's final part
  }
  for (const auto& l : shared_->lanes) {
    if (!l->result.ok()) return l->result;
  }
  return ok_status();
}

std::string UdpAggregator::format_counters() const {
  UdpLane::Counters b;
  udp::ReplyQueue::Counters tb;
  std::vector<AggregatorSnapshot> parts;
  for (const auto& l : shared_->lanes) {
    const UdpLane::Counters& x = l->c;
    const udp::ReplyQueue::Counters& y = l->tx.counters();
    b.rx_buffers += x.rx_buffers;
    b.rx_datagrams += x.rx_datagrams;
    b.gro_buffers += x.gro_buffers;
    b.hook_dropped += x.hook_dropped;
    b.hook_duplicated += x.hook_duplicated;
    b.handed_off += x.handed_off;
    b.handoff_received += x.handoff_received;
    b.handoff_dropped += x.handoff_dropped;
    b.wakeups += x.wakeups;
    b.sleeps += x.sleeps;
    tb.tx_datagrams += y.tx_datagrams;
    tb.tx_entries += y.tx_entries;
    tb.tx_gso_entries += y.tx_gso_entries;
    tb.send_errors += y.send_errors;
    tb.unroutable += y.unroutable;
    parts.push_back(l->take_snapshot());
  }
  const AggregatorSnapshot all = merge_snapshots(parts);
  CounterTable t;
  t.engine(all.engine);
  t.section("udp:");
  t.row("threads", shared_->lanes.size());
  t.row("rx_buffers", b.rx_buffers);
  t.row("rx_datagrams", b.rx_datagrams);
  t.row("gro_buffers", b.gro_buffers);
  t.row("hook_dropped", b.hook_dropped);
  t.row("hook_duplicated", b.hook_duplicated);
  t.row("handed_off", b.handed_off);
  t.row("handoff_received", b.handoff_received);
  t.row("handoff_dropped", b.handoff_dropped);
  t.row("wakeups", b.wakeups);
  t.row("sleeps", b.sleeps);
  t.row("tx_datagrams", tb.tx_datagrams);
  t.row("tx_entries", tb.tx_entries);
  t.row("tx_gso_entries", tb.tx_gso_entries);
  t.row("send_errors", tb.send_errors);
  t.row("unroutable", tb.unroutable);
  if (shared_->lanes.size() > 1) {
    t.section("per thread:");
    char line[160];
    for (const auto& l : shared_->lanes) {
      const EngineCounters& e = l->engine->counters();
      std::snprintf(line, sizeof line,
                    "  thread %u: rx %" PRIu64 " ina %" PRIu64 " completed %" PRIu64
                    " handed_off %" PRIu64 " received_handoff %" PRIu64,
                    l->idx, l->c.rx_datagrams, e.packets_in, e.completed, l->c.handed_off,
                    l->c.handoff_received);
      t.line(line);
    }
  }
  // A rank's address as any lane learned it (a leaf job: lane 0).
  t.ranks(all, [this](JobId job, size_t r) -> std::string {
    for (const auto& l : shared_->lanes) {
      const std::vector<udp::Peer>* p = std::as_const(l->peers).find(job);
      if (p != nullptr && r < p->size() && (*p)[r].known) return udp::format_addr((*p)[r].addr);
    }
    return "-";
  });
  return t.text();
}

}  // namespace ina::agg
