// Kernel UDP backend (see udp_backend.h).
//
// The loop: recvmmsg a batch without blocking; split each buffer into datagrams (a UDP GRO buffer
// holds several of one sender, cut every gso_size bytes); hand each to the Engine; encode its reply
// at once (the Engine's payload pointer lives only until the next packet) into a send arena; after
// the batch, flush the arena with sendmmsg. When the socket is empty, poll for at most 100 ms so
// that a stop request is seen promptly. Every buffer is allocated in create(): the loop itself
// never allocates, locks or logs (the periodic stats line is printed between batches).
//
// Sending with UDP GSO (UDP_SEGMENT): RESULT packets of consecutive completions of one job go to
// the same ranks and usually have the same size (a full block), so for each rank a run of them
// is one sendmmsg entry whose iovecs point at the encoded packets and whose cmsg says the segment
// size: the kernel cuts it into the same datagrams, in order, for a fraction of the per-packet
// cost. Only same-size packets are grouped (GSO segments are equal but the last), at most
// kMaxGsoSegments per entry and within the 64 KiB limit of one send. If the kernel refuses a GSO
// send (a route whose MTU is below the segment size, a device without checksum offload), the
// packets are sent one by one and GSO is turned off for the rest of the run.
//
// Aggregation trees: a leaf job's parent ("host:port") is resolved once, when the job is added;
// the Engine's kParent replies (partials, the leaf's HELLO) go there from the same socket, and the
// parent's answers arrive on it like any packet (the Engine tells them apart by their flags and
// the job's key).
#include "aggregator/udp_backend.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <new>
#include <time.h>

#include "ina/protocol/log.h"

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace ina::agg {
namespace {

constexpr const char* kComponent = "aggregator";
constexpr size_t kRecvBufSize = 65536;       // any IPv4 datagram, or one GRO buffer (<= 64 KiB)
constexpr size_t kMaxUdpPayload = 65507;     // 65535 - IPv4 header - UDP header
constexpr size_t kMaxGsoSegments = 64;       // UDP_MAX_SEGMENTS of older kernels (newer: 128)
constexpr size_t kMaxGsoBytes = kMaxUdpPayload;
constexpr size_t kTxMsgs = 256;              // sendmmsg entries staged per call
constexpr int kSocketBufBytes = 8 << 20;     // SO_RCVBUF/SO_SNDBUF target
constexpr int kPollMs = 100;                 // bounds how late a stop request is seen
constexpr uint32_t kMaxBatch = 1024;
constexpr size_t kMaxArenaBytes = 8 << 20;   // encoded replies between flushes
constexpr size_t kMaxRankRows = 1024;        // format_counters lists idle ranks up to this world

// Control buffer big enough for one UDP_GRO (int) or UDP_SEGMENT (uint16) cmsg, aligned for it.
union CmsgBuf {
  char buf[CMSG_SPACE(sizeof(int))];
  cmsghdr align;
};

// splitmix64: a tiny seeded generator for the test hooks (deterministic per seed).
uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool same_addr(const sockaddr_in& a, const sockaddr_in& b) {
  return a.sin_port == b.sin_port && a.sin_addr.s_addr == b.sin_addr.s_addr;
}

Result<sockaddr_in> resolve_ipv4(const std::string& host, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  if (host.empty()) {
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    return sa;
  }
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) == 1) return sa;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return invalid_argument("bind host '" + host + "': " + gai_strerror(rc));
  }
  sa.sin_addr = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return sa;
}

// Best effort: as root SO_*BUFFORCE passes net.core.[rw]mem_max; otherwise the kernel caps it.
void grow_socket_buffer(int fd, int force_opt, int opt) {
  const int want = kSocketBufBytes;
  if (setsockopt(fd, SOL_SOCKET, force_opt, &want, sizeof want) != 0) {
    (void)setsockopt(fd, SOL_SOCKET, opt, &want, sizeof want);
  }
}

// A leaf job's parent: "host:port" (IPv4 address or host name, port 1..65535).
Result<sockaddr_in> resolve_parent(const JobConfig& j) {
  const std::string& text = j.tree.parent;
  const std::string what = "udp: job " + std::to_string(j.job) + ": parent '" + text + "'";
  const size_t c = text.rfind(':');
  if (c == std::string::npos || c == 0 || c + 1 == text.size()) {
    return invalid_argument(what + " is not host:port");
  }
  const std::string port_text = text.substr(c + 1);
  if (port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos) {
    return invalid_argument(what + ": port must be a number in 1..65535");
  }
  const unsigned long port = std::stoul(port_text);
  if (port < 1 || port > 65535) return invalid_argument(what + ": port must be in 1..65535");
  Result<sockaddr_in> sa = resolve_ipv4(text.substr(0, c), static_cast<uint16_t>(port));
  if (!sa.ok()) return invalid_argument(what + ": " + sa.status().message());
  return sa;
}

std::string format_addr(const sockaddr_in& sa) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(sa.sin_port));
}

}  // namespace

struct UdpAggregator::Impl {
  struct Peer {
    sockaddr_in addr{};
    bool known = false;
  };
  // A reply encoded in the arena, waiting for the flush.
  struct Pending {
    bool multicast = false;  // to every rank of `job`, else to `dest`
    JobId job = 0;
    sockaddr_in dest{};
    uint32_t off = 0;
    uint32_t len = 0;
  };
  struct Counters {
    uint64_t rx_calls = 0;         // recvmmsg calls that returned data
    uint64_t rx_buffers = 0;       // buffers received (a GRO buffer counts one)
    uint64_t rx_datagrams = 0;     // datagrams after splitting GRO buffers
    uint64_t gro_buffers = 0;      // buffers that held more than one datagram
    uint64_t hook_duplicated = 0;
    uint64_t tx_datagrams = 0;
    uint64_t tx_entries = 0;       // sendmmsg entries (a GSO entry carries several datagrams)
    uint64_t tx_gso_entries = 0;
    uint64_t send_errors = 0;
    uint64_t unroutable = 0;       // replies for a rank whose address is not known yet
  };

  UdpAggregator* self = nullptr;
  UdpOptions opts;
  size_t max_packet = 0;  // largest reply the arena holds
  uint64_t batch_now = 0;  // CLOCK_MONOTONIC ns of the current batch (0: telemetry off)
  uint64_t rng = 0;
  size_t mc_rotate = 0;  // first rank of the next multicast (see flush)
  Counters c;

  // receive
  std::vector<uint8_t> rx_buf;
  std::vector<mmsghdr> rx_msgs;
  std::vector<iovec> rx_iov;
  std::vector<sockaddr_in> rx_addr;
  std::vector<CmsgBuf> rx_ctrl;

  // rank addresses, learned from each rank's valid packets (index: served rank)
  std::map<JobId, std::vector<Peer>> peers;
  // leaf jobs' parent aggregators, resolved when the job is added
  std::map<JobId, sockaddr_in> parents;
  JobId cached_job = 0;
  std::vector<Peer>* cached_peers = nullptr;

  // replies waiting for the flush
  std::vector<uint8_t> arena;
  size_t arena_used = 0;
  std::vector<Pending> pending;  // capacity reserved; never grows past it
  size_t pending_cap = 0;

  // sendmmsg staging
  std::vector<mmsghdr> tx_msgs;
  std::vector<iovec> tx_iov;        // kMaxGsoSegments per entry
  std::vector<sockaddr_in> tx_addr;
  std::vector<CmsgBuf> tx_ctrl;
  std::vector<uint16_t> tx_segs;    // datagrams per entry
  size_t tx_n = 0;

  std::vector<Peer>* peers_of(JobId job) {
    if (cached_peers != nullptr && cached_job == job) return cached_peers;
    auto it = peers.find(job);
    if (it == peers.end()) return nullptr;
    cached_job = job;
    cached_peers = &it->second;
    return cached_peers;
  }

  bool chance(double percent) {
    if (percent <= 0) return false;
    const double u = static_cast<double>(splitmix64(&rng) >> 11) * 0x1.0p-53;
    return u * 100.0 < percent;
  }

  void on_datagram(std::span<const uint8_t> d, const sockaddr_in& src);
  void handle(std::span<const uint8_t> d, const sockaddr_in& src);
  void enqueue(const Reply& r, const sockaddr_in& src);
  void flush();
  void stage(const sockaddr_in& dest, const Pending* first, size_t n);
  void send_staged();
  void send_one_by_one(size_t entry);
};

void UdpAggregator::Impl::on_datagram(std::span<const uint8_t> d, const sockaddr_in& src) {
  ++c.rx_datagrams;
  if (chance(opts.drop_percent)) {
    ++self->hook_dropped_;
    return;
  }
  handle(d, src);
  if (chance(opts.dup_percent)) {
    ++c.hook_duplicated;
    handle(d, src);
  }
}

void UdpAggregator::Impl::handle(std::span<const uint8_t> d, const sockaddr_in& src) {
  int32_t rank = -1;
  JobId job = 0;
  // Arrival time of the batch (read once per recvmmsg): the lags telemetry looks for are
  // micro- to milliseconds, far above the spread of one batch, and one clock read per datagram
  // cost up to 100 ns on a loaded VM.
  const Reply r = self->engine_->on_packet(d, batch_now, &rank, &job);
  if (rank >= 0) {
    // Learn (or follow a move of) the rank's address. Only packets with the job's tag get here
    // (the engine sets rank after it), so nobody without the key can redirect its results.
    if (std::vector<Peer>* p = peers_of(job); p != nullptr) {
      Peer& peer = (*p)[static_cast<size_t>(rank)];
      if (!peer.known || !same_addr(peer.addr, src)) {
        peer.addr = src;
        peer.known = true;
      }
    }
  }
  if (r.target != Reply::Target::kNone) enqueue(r, src);
}

void UdpAggregator::Impl::enqueue(const Reply& r, const sockaddr_in& src) {
  const sockaddr_in* dest = &src;
  if (r.target == Reply::Target::kParent) {
    auto it = parents.find(r.hdr.job);
    if (it == parents.end()) {
      ++c.unroutable;
      return;
    }
    dest = &it->second;
  }
  const size_t len = r.packet_size();
  if (pending.size() == pending_cap || arena_used + len > arena.size()) flush();
  uint8_t* out = arena.data() + arena_used;
  wire::encode_header(r.hdr, out);
  if (r.payload != nullptr) std::memcpy(out + wire::kHeaderSize, r.payload, r.payload_bytes());
  // One sealed buffer, also for a multicast: the tag does not cover the destination.
  wire::seal(std::span<uint8_t>(out, len), r.key);
  Pending p;
  p.multicast = r.target == Reply::Target::kAllRanks;
  p.job = r.hdr.job;
  p.dest = *dest;
  p.off = static_cast<uint32_t>(arena_used);
  p.len = static_cast<uint32_t>(len);
  pending.push_back(p);  // within the reserved capacity: no allocation
  arena_used += len;
}

// Sends every pending reply, in order per destination.
void UdpAggregator::Impl::flush() {
  const size_t n = pending.size();
  size_t i = 0;
  while (i < n) {
    const Pending& first = pending[i];
    const size_t seg_max =
        self->gso_on_ ? std::min(kMaxGsoSegments, kMaxGsoBytes / first.len) : 1;
    // A run: consecutive replies of the same kind, destination (or job) and size.
    size_t j = i + 1;
    while (j < n && pending[j].multicast == first.multicast && pending[j].len == first.len &&
           (first.multicast ? pending[j].job == first.job
                            : same_addr(pending[j].dest, first.dest))) {
      ++j;
    }
    if (!first.multicast) {
      for (size_t k = i; k < j; k += seg_max) stage(first.dest, &pending[k], std::min(seg_max, j - k));
    } else if (std::vector<Peer>* p = peers_of(first.job); p != nullptr) {
      // From a rotating first rank: sent in rank order, the last rank would always get its
      // results last, start every collective last and show as a small persistent straggler.
      const size_t np = p->size();
      size_t q = np == 0 ? 0 : mc_rotate++ % np;
      for (size_t left = np; left > 0; --left, q = q + 1 == np ? 0 : q + 1) {
        const Peer& peer = (*p)[q];
        if (!peer.known) {
          c.unroutable += j - i;
          continue;
        }
        for (size_t k = i; k < j; k += seg_max) stage(peer.addr, &pending[k], std::min(seg_max, j - k));
      }
    } else {
      c.unroutable += j - i;
    }
    i = j;
  }
  send_staged();
  pending.clear();
  arena_used = 0;
}

// Adds one sendmmsg entry: n packets of equal size to `dest` (a GSO entry when n > 1).
void UdpAggregator::Impl::stage(const sockaddr_in& dest, const Pending* first, size_t n) {
  if (tx_n == kTxMsgs) send_staged();
  const size_t e = tx_n++;
  iovec* iov = &tx_iov[e * kMaxGsoSegments];
  for (size_t k = 0; k < n; ++k) {
    iov[k].iov_base = arena.data() + first[k].off;
    iov[k].iov_len = first[k].len;
  }
  tx_addr[e] = dest;
  msghdr& m = tx_msgs[e].msg_hdr;
  m = msghdr{};
  m.msg_name = &tx_addr[e];
  m.msg_namelen = sizeof(sockaddr_in);
  m.msg_iov = iov;
  m.msg_iovlen = n;
  tx_segs[e] = static_cast<uint16_t>(n);
  if (n > 1) {
    m.msg_control = tx_ctrl[e].buf;
    m.msg_controllen = CMSG_SPACE(sizeof(uint16_t));
    cmsghdr* cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_UDP;
    cm->cmsg_type = UDP_SEGMENT;
    cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    const auto gso_size = static_cast<uint16_t>(first[0].len);
    std::memcpy(CMSG_DATA(cm), &gso_size, sizeof gso_size);
  }
}

void UdpAggregator::Impl::send_staged() {
  size_t k = 0;
  while (k < tx_n) {
    const int rc = sendmmsg(self->fd_, &tx_msgs[k], static_cast<unsigned>(tx_n - k), 0);
    if (rc > 0) {
      for (size_t e = k; e < k + static_cast<size_t>(rc); ++e) {
        c.tx_datagrams += tx_segs[e];
        ++c.tx_entries;
        if (tx_segs[e] > 1) ++c.tx_gso_entries;
      }
      k += static_cast<size_t>(rc);
      continue;
    }
    const int err = errno;
    if (rc < 0 && err == EINTR) continue;
    // Entry k failed. A GSO entry the kernel refuses (EINVAL: segment above the route's MTU;
    // EIO: no checksum offload) goes out one datagram at a time, and GSO stays off.
    if (tx_segs[k] > 1 && (err == EINVAL || err == EIO || err == EMSGSIZE || err == EOPNOTSUPP)) {
      if (self->gso_on_) {
        self->gso_on_ = false;
        INA_WARN(kComponent, "UDP GSO send refused (%s); sending datagrams one by one",
                 std::strerror(err));
      }
      send_one_by_one(k);
    } else {
      c.send_errors += tx_segs[k];
    }
    ++k;
  }
  tx_n = 0;
}

void UdpAggregator::Impl::send_one_by_one(size_t entry) {
  msghdr m = tx_msgs[entry].msg_hdr;
  m.msg_control = nullptr;
  m.msg_controllen = 0;
  iovec* iov = m.msg_iov;
  const size_t n = m.msg_iovlen;
  m.msg_iovlen = 1;
  for (size_t s = 0; s < n; ++s) {
    m.msg_iov = &iov[s];
    ssize_t rc;
    do {
      rc = sendmsg(self->fd_, &m, 0);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0) {
      ++c.send_errors;
    } else {
      ++c.tx_datagrams;
      ++c.tx_entries;
    }
  }
}

UdpAggregator::~UdpAggregator() {
  if (fd_ >= 0) ::close(fd_);
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
  if (jobs.empty() && opts.max_payload_bytes == 0) {
    return invalid_argument("udp: at least one job is required (or max_payload_bytes for jobs "
                            "added at run time)");
  }
  if (wire::max_packet_size(opts.max_payload_bytes) > kMaxUdpPayload) {
    return invalid_argument("udp: max_payload_bytes " + std::to_string(opts.max_payload_bytes) +
                            " exceeds what one UDP datagram carries");
  }

  std::unique_ptr<UdpAggregator> a(new UdpAggregator());
  std::map<JobId, sockaddr_in> impl_parents;
  EngineOptions eo;
  eo.telemetry = opts.telemetry;
  a->engine_ = std::make_unique<Engine>(eo);
  a->engine_->set_slot_capacity(opts.slot_capacity);
  // Runtime jobs: bitmaps of up to 65535 ranks in control replies.
  size_t max_packet = opts.max_payload_bytes == 0 ? wire::control_packet_size(2)
                                                  : wire::max_packet_size(opts.max_payload_bytes);
  for (const JobConfig& j : jobs) {
    const size_t pkt = wire::max_packet_size(j.slots.max_payload_bytes);
    if (pkt > kMaxUdpPayload) {
      return invalid_argument("udp: job " + std::to_string(j.job) + ": max_payload_bytes " +
                              std::to_string(j.slots.max_payload_bytes) + " makes " +
                              std::to_string(pkt) + "-byte packets; UDP carries at most " +
                              std::to_string(kMaxUdpPayload) + " bytes");
    }
    if (j.is_leaf()) {
      INA_ASSIGN_OR_RETURN(sockaddr_in parent, resolve_parent(j));
      impl_parents[j.job] = parent;
    }
    INA_RETURN_IF_ERROR(a->engine_->add_job(j));
    max_packet = std::max(max_packet, pkt);
    // Control replies (bitmaps) can outgrow a small block.

  }

  a->fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (a->fd_ < 0) return errno_status("udp: socket", errno);
  const int one = 1;
  // No SO_REUSEADDR (on UDP it lets a second socket bind the port and take its unicast traffic)
  // and no SO_REUSEPORT: a second aggregator on a busy port must fail here, not start silently.
  grow_socket_buffer(a->fd_, SO_RCVBUFFORCE, SO_RCVBUF);
  grow_socket_buffer(a->fd_, SO_SNDBUFFORCE, SO_SNDBUF);

  INA_ASSIGN_OR_RETURN(sockaddr_in sa, resolve_ipv4(opts.bind_host, opts.port));
  if (::bind(a->fd_, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    const int err = errno;
    if (err == EADDRINUSE) {
      return Status(StatusCode::kUnavailable,
                    "udp: bind " + format_addr(sa) + ": UDP port " + std::to_string(opts.port) +
                        " is already in use (another ina-aggregator?); stop it or choose another "
                        "--port");
    }
    return errno_status("udp: bind " + format_addr(sa), err);
  }
  socklen_t sl = sizeof sa;
  if (::getsockname(a->fd_, reinterpret_cast<sockaddr*>(&sa), &sl) != 0) {
    return errno_status("udp: getsockname", errno);
  }
  a->port_ = ntohs(sa.sin_port);

  if (opts.gro) a->gro_on_ = setsockopt(a->fd_, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
  if (opts.gso) {
    // The kernel has UDP_SEGMENT when it answers for the option (the per-send cmsg is used).
    int v = 0;
    socklen_t vl = sizeof v;
    a->gso_on_ = getsockopt(a->fd_, SOL_UDP, UDP_SEGMENT, &v, &vl) == 0;
  }

  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.self = a.get();
  m.opts = opts;
  m.max_packet = max_packet;
  m.rng = opts.seed;
  const size_t b = opts.batch;
  try {
    m.rx_buf.assign(b * kRecvBufSize, 0);
    m.rx_msgs.assign(b, mmsghdr{});
    m.rx_iov.assign(b, iovec{});
    m.rx_addr.assign(b, sockaddr_in{});
    m.rx_ctrl.assign(b, CmsgBuf{});
    // One received buffer can hold up to 64 GRO segments, each with a reply (two with the dup
    // hook); the arena is flushed whenever it fills, so its size only bounds GSO runs.
    m.pending_cap = b * 2;
    m.pending.reserve(m.pending_cap);
    m.arena.assign(std::max(max_packet, std::min(m.pending_cap * max_packet, kMaxArenaBytes)), 0);
    m.tx_msgs.assign(kTxMsgs, mmsghdr{});
    m.tx_iov.assign(kTxMsgs * kMaxGsoSegments, iovec{});
    m.tx_addr.assign(kTxMsgs, sockaddr_in{});
    m.tx_ctrl.assign(kTxMsgs, CmsgBuf{});
    m.tx_segs.assign(kTxMsgs, 0);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("udp: cannot allocate buffers for batch " + std::to_string(b));
  }
  for (const JobConfig& j : jobs) m.peers[j.job].assign(j.served_ranks(), Impl::Peer{});
  m.parents = std::move(impl_parents);
  a->impl_ = std::move(impl);
  a->publish();
  return a;
}

void UdpAggregator::set_jobs(std::vector<JobConfig> jobs) {
  std::lock_guard<std::mutex> g(shared_mu_);
  desired_jobs_ = std::move(jobs);
  jobs_pending_.store(true, std::memory_order_release);
}

AggregatorSnapshot UdpAggregator::snapshot() const {
  std::lock_guard<std::mutex> g(shared_mu_);
  return published_;
}

// On the serving thread, between batches (nothing pending in the arena).
void UdpAggregator::apply_jobs() {
  std::vector<JobConfig> desired;
  {
    std::lock_guard<std::mutex> g(shared_mu_);
    desired = desired_jobs_;
    jobs_pending_.store(false, std::memory_order_relaxed);
  }
  Impl& m = *impl_;
  std::map<JobId, const JobConfig*> want;
  for (const JobConfig& j : desired) want[j.job] = &j;
  for (const JobConfig& have : engine_->jobs()) {
    auto it = want.find(have.job);
    if (it == want.end() || have != *it->second) {
      (void)engine_->remove_job(have.job);
      m.peers.erase(have.job);
      m.parents.erase(have.job);
      INA_INFO(kComponent, "job %" PRIu32 " removed", have.job);
    }
  }
  m.cached_peers = nullptr;  // the map changed
  job_errors_.clear();
  for (const JobConfig& j : desired) {
    if (engine_->world_size(j.job) != 0) continue;  // served, unchanged
    Status st = ok_status();
    sockaddr_in parent{};
    if (wire::max_packet_size(j.slots.max_payload_bytes) > m.max_packet) {
      st = invalid_argument("block of " + std::to_string(j.slots.max_payload_bytes) +
                            " bytes exceeds this aggregator's buffers");
    } else if (j.is_leaf()) {
      Result<sockaddr_in> p = resolve_parent(j);
      if (p.ok()) {
        parent = *p;
      } else {
        st = p.status();
      }
    }
    if (st.ok()) st = engine_->add_job(j);
    if (!st.ok()) {
      job_errors_[j.job] = st.message();
      INA_WARN(kComponent, "job %" PRIu32 " not added: %s", j.job, st.message().c_str());
      continue;
    }
    m.peers[j.job].assign(j.served_ranks(), Impl::Peer{});
    if (j.is_leaf()) m.parents[j.job] = parent;
    INA_INFO(kComponent, "job %" PRIu32 " added: world %" PRIu32 " slots [%" PRIu32 ", %" PRIu32
             ") role %s",
             j.job, j.slots.world_size, j.slot_base, j.slot_base + j.slots.num_slots,
             tree_role_name(j.tree.role));
  }
}

void UdpAggregator::publish() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const uint64_t now =
      static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
  const uint64_t stall_ns =
      static_cast<uint64_t>(std::chrono::nanoseconds(impl_->opts.stall_after).count());
  AggregatorSnapshot s = engine_snapshot(*engine_, now, stall_ns);
  s.tx_datagrams = impl_->c.tx_datagrams;
  s.send_errors = impl_->c.send_errors;
  s.unroutable = impl_->c.unroutable;
  s.job_errors = job_errors_;
  warn_stragglers(straggler_alarm_, s, now);
  std::lock_guard<std::mutex> g(shared_mu_);
  published_ = std::move(s);
}

Status UdpAggregator::run(const std::atomic<bool>& stop) {
  Impl& m = *impl_;
  const unsigned batch = m.opts.batch;
  using Clock = std::chrono::steady_clock;
  const bool stats = m.opts.stats_interval.count() > 0;
  auto next_stats = Clock::now() + m.opts.stats_interval;
  EngineCounters last = engine_->counters();
  auto last_time = Clock::now();

  auto next_snapshot = Clock::now();
  auto maybe_print_stats = [&] {
    if (jobs_pending_.load(std::memory_order_acquire)) apply_jobs();
    if (m.opts.snapshot_interval.count() > 0 && Clock::now() >= next_snapshot) {
      publish();
      next_snapshot = Clock::now() + m.opts.snapshot_interval;
    }
    if (!stats) return;
    const auto now = Clock::now();
    if (now < next_stats) return;
    next_stats = now + m.opts.stats_interval;
    const EngineCounters& e = engine_->counters();
    const double dt = std::chrono::duration<double>(now - last_time).count();
    const double rate_in = dt > 0 ? static_cast<double>(e.packets_in - last.packets_in) / dt : 0;
    const double rate_done = dt > 0 ? static_cast<double>(e.completed - last.completed) / dt : 0;
    INA_INFO(kComponent,
             "in %" PRIu64 " (%.0f/s) completed %" PRIu64 " (%.0f/s) out %" PRIu64
             " dup %" PRIu64 " stale %" PRIu64 " mismatch %" PRIu64 " malformed %" PRIu64
             " bad_tag %" PRIu64 " unknown_job %" PRIu64 " not_ready %" PRIu64
             " send_errors %" PRIu64 " unroutable %" PRIu64,
             e.packets_in, rate_in, e.completed, rate_done, m.c.tx_datagrams, e.duplicates,
             e.stale, e.mismatched, e.malformed, e.bad_tag, e.unknown_job, e.not_ready,
             m.c.send_errors, m.c.unroutable);
    last = e;
    last_time = now;
  };

  while (!stop.load(std::memory_order_relaxed)) {
    for (unsigned i = 0; i < batch; ++i) {
      m.rx_iov[i].iov_base = m.rx_buf.data() + size_t{i} * kRecvBufSize;
      m.rx_iov[i].iov_len = kRecvBufSize;
      msghdr& h = m.rx_msgs[i].msg_hdr;
      h.msg_name = &m.rx_addr[i];
      h.msg_namelen = sizeof(sockaddr_in);
      h.msg_iov = &m.rx_iov[i];
      h.msg_iovlen = 1;
      h.msg_control = m.rx_ctrl[i].buf;
      h.msg_controllen = sizeof m.rx_ctrl[i].buf;
      h.msg_flags = 0;
    }
    const int n = recvmmsg(fd_, m.rx_msgs.data(), batch, MSG_DONTWAIT, nullptr);
    if (n < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        maybe_print_stats();
        pollfd pfd{fd_, POLLIN, 0};
        const int prc = ::poll(&pfd, 1, kPollMs);
        if (prc < 0 && errno != EINTR) return errno_status("udp: poll", errno);
        continue;
      }
      if (err == EINTR) continue;
      return errno_status("udp: recvmmsg", err);
    }
    ++m.c.rx_calls;
    if (m.opts.telemetry) {
      timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      m.batch_now =
          static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
    }
    for (int i = 0; i < n; ++i) {
      const msghdr& h = m.rx_msgs[i].msg_hdr;
      const size_t len = m.rx_msgs[i].msg_len;
      const uint8_t* data = m.rx_buf.data() + static_cast<size_t>(i) * kRecvBufSize;
      const sockaddr_in& src = m.rx_addr[i];
      ++m.c.rx_buffers;
      // A GRO buffer: datagrams of gso_size bytes, the last possibly shorter.
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
        m.on_datagram(std::span<const uint8_t>(data, len), src);
        continue;
      }
      ++m.c.gro_buffers;
      for (size_t off = 0; off < len; off += seg) {
        m.on_datagram(std::span<const uint8_t>(data + off, std::min(seg, len - off)), src);
      }
    }
    m.flush();
    maybe_print_stats();
  }
  m.flush();
  if (m.opts.snapshot_interval.count() > 0) publish();
  return ok_status();
}

std::string UdpAggregator::format_counters() const {
  const EngineCounters& e = engine_->counters();
  const Impl::Counters& b = impl_->c;
  std::string s;
  char line[256];
  auto row = [&](const char* name, uint64_t v) {
    std::snprintf(line, sizeof line, "  %-22s %" PRIu64 "\n", name, v);
    s += line;
  };
  s += "totals:\n";
  for_each_scalar_counter([&](const char* name, uint64_t EngineCounters::*m) { row(name, e.*m); });
  s += "udp:\n";
  row("rx_buffers", b.rx_buffers);
  row("rx_datagrams", b.rx_datagrams);
  row("gro_buffers", b.gro_buffers);
  row("hook_dropped", hook_dropped_);
  row("hook_duplicated", b.hook_duplicated);
  row("tx_datagrams", b.tx_datagrams);
  row("tx_entries", b.tx_entries);
  row("tx_gso_entries", b.tx_gso_entries);
  row("send_errors", b.send_errors);
  row("unroutable", b.unroutable);
  s += "decode errors:\n";
  for (size_t i = 1; i < e.decode.by_error.size(); ++i) {
    row(std::string(wire::decode_error_name(static_cast<wire::DecodeError>(i))).c_str(),
        e.decode.by_error[i]);
  }
  s += "verdicts:\n";
  for (size_t i = 0; i < e.by_verdict.size(); ++i) {
    row(verdict_name(static_cast<Verdict>(i)), e.by_verdict[i]);
  }
  for (const auto& [job, peers] : impl_->peers) {
    std::snprintf(line, sizeof line, "job %" PRIu32 " (world %" PRIu32 ", %s):\n", job,
                  engine_->world_size(job), engine_->job_ready(job) ? "ready" : "joining");
    s += line;
    std::snprintf(line, sizeof line, "  %6s %14s %12s %12s  %s\n", "rank", "packets",
                  "retransmits", "duplicates", "address");
    s += line;
    const std::span<const RankCounters> rc = engine_->rank_counters(job);
    const JobConfig* cfg = engine_->job_config(job);
    const size_t first = cfg != nullptr ? cfg->first_rank() : 0;
    size_t idle = 0;
    for (size_t r = 0; r < rc.size(); ++r) {
      if (rc[r].packets == 0 && rc.size() > kMaxRankRows) {
        ++idle;
        continue;
      }
      const std::string addr = peers[r].known ? format_addr(peers[r].addr) : "-";
      std::snprintf(line, sizeof line, "  %6zu %14" PRIu64 " %12" PRIu64 " %12" PRIu64 "  %s\n",
                    first + r, rc[r].packets, rc[r].retransmits, rc[r].duplicates, addr.c_str());
      s += line;
    }
    if (idle > 0) {
      std::snprintf(line, sizeof line, "  (%zu ranks without packets not listed)\n", idle);
      s += line;
    }
  }
  return s;
}

}  // namespace ina::agg
