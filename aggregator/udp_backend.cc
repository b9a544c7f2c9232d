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
// Several threads (see udp_backend.h): each Lane is one serving thread with its own socket, Engine,
// address book and buffers, running the loop above. Its receive path routes every datagram: its own
// slots go to its Engine, another lane's are copied into that lane's HandoffRing, a worker's HELLO
// is processed here and copied to every other lane (marked as a copy: counted once). After each
// batch a lane drains the rings other lanes fill for it, flushes its replies from its own socket
// (every socket of the group sends from the port) and wakes the lanes it handed datagrams to that
// sleep in poll() (an eventfd each; a lane announces its sleep with a flag, then checks its rings
// once more, and the producer checks the flag after publishing: neither side can miss the other).
// Jobs from set_jobs() carry a generation each lane applies between batches; each lane publishes a
// snapshot of its Engine, and lane 0 merges them (merge_snapshots, as the DPDK backend does).
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
#include <linux/filter.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <new>
#include <thread>
#include <utility>
#include <time.h>

#include "aggregator/handoff_ring.h"
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
#ifndef SO_ATTACH_REUSEPORT_CBPF
#define SO_ATTACH_REUSEPORT_CBPF 51
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
constexpr size_t kMinRingBytes = 1 << 20;    // handoff ring per pair of lanes: at least this, and
constexpr size_t kRingPackets = 64;          // this many of the largest datagrams
constexpr size_t kMaxDrain = 256;            // records taken from one ring per loop pass

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

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

unsigned allowed_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n > 0 ? static_cast<unsigned>(n) : 1;
}

// A worker's HELLO (not a parent's WELCOME, which carries RESULT): every lane runs the barrier.
bool is_worker_hello(std::span<const uint8_t> d) {
  const uint8_t f = d[wire::kOffFlags];
  return (f & wire::kFlagHello) != 0 && (f & (wire::kFlagResult | wire::kFlagError)) == 0;
}

// The lane that owns a slot: runs of kSlotRun consecutive slots in turn (wire.h), so that a
// sender's GSO train, cut at run boundaries, is one lane's whole.
unsigned lane_of_slot(uint16_t slot, unsigned lanes) { return (slot / wire::kSlotRun) % lanes; }

// The reuseport group's steering program: socket index = lane_of_slot(slot), the slot read from
// the INA header (the program sees the UDP payload; loads are big-endian like the wire). A
// datagram too short for the load makes the program return 0: lane 0, whose Engine counts it.
Status attach_steering(int fd, unsigned lanes) {
  static_assert(std::has_single_bit(unsigned{wire::kSlotRun}), "a shift divides by the run");
  sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_H | BPF_ABS, static_cast<uint32_t>(wire::kOffSlot)),
      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, wire::kMaxSlot),
      BPF_STMT(BPF_ALU | BPF_RSH | BPF_K,
               static_cast<uint32_t>(std::countr_zero(unsigned{wire::kSlotRun}))),
      BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, lanes),
      BPF_STMT(BPF_RET | BPF_A, 0),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
  if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) != 0) {
    return errno_status("udp: SO_ATTACH_REUSEPORT_CBPF", errno);
  }
  return ok_status();
}

// A bound UDP socket with big buffers; `reuseport` joins the port's SO_REUSEPORT group.
Result<int> bound_socket(const sockaddr_in& sa, bool reuseport) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno_status("udp: socket", errno);
  const int one = 1;
  if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
    const int err = errno;
    ::close(fd);
    return errno_status("udp: SO_REUSEPORT", err);
  }
  grow_socket_buffer(fd, SO_RCVBUFFORCE, SO_RCVBUF);
  grow_socket_buffer(fd, SO_SNDBUFFORCE, SO_SNDBUF);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EADDRINUSE) {
      return Status(StatusCode::kUnavailable,
                    "udp: bind " + format_addr(sa) + ": UDP port " +
                        std::to_string(ntohs(sa.sin_port)) +
                        " is already in use (another ina-aggregator?); stop it or choose another "
                        "--port");
    }
    return errno_status("udp: bind " + format_addr(sa), err);
  }
  return fd;
}

}  // namespace

struct UdpAggregator::Lane {
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
    uint64_t hook_dropped = 0;
    uint64_t hook_duplicated = 0;
    uint64_t handed_off = 0;       // datagrams copied to the lane that owns their slot
    uint64_t handoff_received = 0;
    uint64_t handoff_dropped = 0;  // the owner's ring was full
    uint64_t wakeups = 0;          // eventfd writes to sleeping lanes
    uint64_t tx_datagrams = 0;
    uint64_t tx_entries = 0;       // sendmmsg entries (a GSO entry carries several datagrams)
    uint64_t tx_gso_entries = 0;
    uint64_t send_errors = 0;
    uint64_t unroutable = 0;       // replies for a rank whose address is not known yet
  };

  UdpAggregator* self = nullptr;
  unsigned idx = 0;
  unsigned lanes = 1;
  UdpOptions opts;
  size_t max_packet = 0;  // largest reply the arena holds
  int fd = -1;
  int efd = -1;           // eventfd: another lane handed over datagrams while this one slept, or
                          // set_jobs() has new jobs
  std::unique_ptr<Engine> engine;
  uint64_t batch_now = 0;  // CLOCK_MONOTONIC ns of the current batch (0: telemetry off)
  uint64_t rng = 0;
  size_t mc_rotate = 0;  // first rank of the next multicast (see flush)
  Counters c;
  std::thread thread;  // lanes 1.. (lane 0 runs on run()'s caller)
  Status result;       // what serve() returned

  // receive
  std::vector<uint8_t> rx_buf;
  std::vector<mmsghdr> rx_msgs;
  std::vector<iovec> rx_iov;
  std::vector<sockaddr_in> rx_addr;
  std::vector<CmsgBuf> rx_ctrl;

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
  AddressBook<Peer> peers;
  // leaf jobs' parent aggregators, resolved when the job is added
  std::map<JobId, sockaddr_in> parents;

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

  ~Lane() {
    if (fd >= 0) ::close(fd);
    if (efd >= 0) ::close(efd);
  }

  bool chance(double percent) {
    if (percent <= 0) return false;
    const double u = static_cast<double>(splitmix64(&rng) >> 11) * 0x1.0p-53;
    return u * 100.0 < percent;
  }

  bool is_leaf(JobId job) const {
    return std::find(leaf_jobs.begin(), leaf_jobs.end(), job) != leaf_jobs.end();
  }

  Status alloc_buffers(size_t batch);
  JobHooks job_hooks();
  void apply_jobs(const std::vector<JobConfig>& desired);
  AggregatorSnapshot take_snapshot() const;
  Status serve(const std::atomic<bool>& stop, const std::atomic<bool>& halt);
  void receive_buffer(const msghdr& h, const uint8_t* data, size_t len, const sockaddr_in& src);
  void on_datagram(std::span<const uint8_t> d, const sockaddr_in& src);
  void route(std::span<const uint8_t> d, const sockaddr_in& src);
  void hand_off(unsigned to, std::span<const uint8_t> d, const sockaddr_in& src, bool copy);
  size_t drain_handoffs();
  void wake();
  void idle_wait();
  void handle(std::span<const uint8_t> d, const sockaddr_in& src, uint64_t now, bool hello_copy);
  void enqueue(const Reply& r, const sockaddr_in& src);
  void flush();
  void stage(const sockaddr_in& dest, const Pending* first, size_t n);
  void send_staged();
  void send_one_by_one(size_t entry);
};

void UdpAggregator::Lane::on_datagram(std::span<const uint8_t> d, const sockaddr_in& src) {
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
void UdpAggregator::Lane::route(std::span<const uint8_t> d, const sockaddr_in& src) {
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
    owner = lane_of_slot(wire::slot_of(d), lanes);
  }
  if (owner == idx) {
    handle(d, src, batch_now, false);
  } else {
    hand_off(owner, d, src, false);
  }
}

void UdpAggregator::Lane::hand_off(unsigned to, std::span<const uint8_t> d, const sockaddr_in& src,
                                   bool copy) {
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

size_t UdpAggregator::Lane::drain_handoffs() {
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
void UdpAggregator::Lane::wake() {
  if (wake_mask == 0) return;
  // Pairs with idle_wait(): the rings' head stores before the loads of `sleeping`.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (uint64_t m = wake_mask; m != 0; m &= m - 1) {
    Lane& l = *self->lanes_[static_cast<size_t>(__builtin_ctzll(m))];
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
void UdpAggregator::Lane::idle_wait() {
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

void UdpAggregator::Lane::handle(std::span<const uint8_t> d, const sockaddr_in& src, uint64_t now,
                                 bool hello_copy) {
  int32_t rank = -1;
  JobId job = 0;
  // Arrival time of the batch (read once per recvmmsg): the lags telemetry looks for are
  // micro- to milliseconds, far above the spread of one batch, and one clock read per datagram
  // cost up to 100 ns on a loaded VM.
  const Reply r = engine->on_packet(d, now, &rank, &job, hello_copy);
  if (rank >= 0) {
    // Learn (or follow a move of) the rank's address. Only packets with the job's tag get here
    // (the engine sets rank after it), so nobody without the key can redirect its results.
    if (std::vector<Peer>* p = peers.find(job); p != nullptr) {
      Peer& peer = (*p)[static_cast<size_t>(rank)];
      if (!peer.known || !same_addr(peer.addr, src)) {
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

void UdpAggregator::Lane::enqueue(const Reply& r, const sockaddr_in& src) {
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
  uint8_t* o = arena.data() + arena_used;
  wire::encode_header(r.hdr, o);
  if (r.payload != nullptr) std::memcpy(o + wire::kHeaderSize, r.payload, r.payload_bytes());
  // One sealed buffer, also for a multicast: the tag does not cover the destination.
  wire::seal(std::span<uint8_t>(o, len), r.key);
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
void UdpAggregator::Lane::flush() {
  const size_t n = pending.size();
  const bool gso = self->gso_on_.load(std::memory_order_relaxed);
  size_t i = 0;
  while (i < n) {
    const Pending& first = pending[i];
    const size_t seg_max = gso ? std::min(kMaxGsoSegments, kMaxGsoBytes / first.len) : 1;
    // A run: consecutive replies of the same kind, destination (or job) and size.
    size_t j = i + 1;
    while (j < n && pending[j].multicast == first.multicast && pending[j].len == first.len &&
           (first.multicast ? pending[j].job == first.job
                            : same_addr(pending[j].dest, first.dest))) {
      ++j;
    }
    if (!first.multicast) {
      for (size_t k = i; k < j; k += seg_max) stage(first.dest, &pending[k], std::min(seg_max, j - k));
    } else if (std::vector<Peer>* p = peers.find(first.job); p != nullptr) {
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
void UdpAggregator::Lane::stage(const sockaddr_in& dest, const Pending* first, size_t n) {
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

void UdpAggregator::Lane::send_staged() {
  size_t k = 0;
  while (k < tx_n) {
    const int rc = sendmmsg(fd, &tx_msgs[k], static_cast<unsigned>(tx_n - k), 0);
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
      if (self->gso_on_.exchange(false, std::memory_order_relaxed)) {
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

void UdpAggregator::Lane::send_one_by_one(size_t entry) {
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
      rc = sendmsg(fd, &m, 0);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0) {
      ++c.send_errors;
    } else {
      ++c.tx_datagrams;
      ++c.tx_entries;
    }
  }
}

Status UdpAggregator::Lane::alloc_buffers(size_t b) {
  try {
    rx_buf.assign(b * kRecvBufSize, 0);
    rx_msgs.assign(b, mmsghdr{});
    rx_iov.assign(b, iovec{});
    rx_addr.assign(b, sockaddr_in{});
    rx_ctrl.assign(b, CmsgBuf{});
    // One received buffer can hold up to 64 GRO segments, each with a reply (two with the dup
    // hook); the arena is flushed whenever it fills, so its size only bounds GSO runs.
    pending_cap = b * 2;
    pending.reserve(pending_cap);
    arena.assign(std::max(max_packet, std::min(pending_cap * max_packet, kMaxArenaBytes)), 0);
    tx_msgs.assign(kTxMsgs, mmsghdr{});
    tx_iov.assign(kTxMsgs * kMaxGsoSegments, iovec{});
    tx_addr.assign(kTxMsgs, sockaddr_in{});
    tx_ctrl.assign(kTxMsgs, CmsgBuf{});
    tx_segs.assign(kTxMsgs, 0);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("udp: cannot allocate buffers for batch " + std::to_string(b));
  }
  return ok_status();
}

// What this lane serves of the jobs (a leaf job: lane 0 only; the others route its datagrams
// there) and the checks and bookkeeping around its Engine's.
JobHooks UdpAggregator::Lane::job_hooks() {
  JobHooks h;
  h.serves = [this](const JobConfig& j) { return idx == 0 || !j.is_leaf(); };
  h.admit = [this](const JobConfig& j) -> Status {
    if (wire::max_packet_size(j.slots.max_payload_bytes) > max_packet) {
      return invalid_argument("block of " + std::to_string(j.slots.max_payload_bytes) +
                              " bytes exceeds this aggregator's buffers");
    }
    if (j.is_leaf()) {
      Result<sockaddr_in> p = resolve_parent(j);
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
void UdpAggregator::Lane::apply_jobs(const std::vector<JobConfig>& desired) {
  job_errors = reconcile_jobs(*engine, desired, job_hooks());
  for (const auto& [job, err] : job_errors) parents.erase(job);
  leaf_jobs.clear();
  for (const JobConfig& j : desired) {
    if (j.is_leaf()) leaf_jobs.push_back(j.job);
  }
}

AggregatorSnapshot UdpAggregator::Lane::take_snapshot() const {
  const uint64_t stall_ns =
      static_cast<uint64_t>(std::chrono::nanoseconds(opts.stall_after).count());
  // Not ranked: the board's merge ranks the stragglers from every lane's telemetry.
  AggregatorSnapshot s = engine_snapshot(*engine, monotonic_ns(), stall_ns, false);
  s.tx_datagrams = c.tx_datagrams;
  s.send_errors = c.send_errors;
  s.unroutable = c.unroutable;
  s.job_errors = job_errors;
  return s;
}

// One received buffer: a datagram, or a GRO buffer of datagrams of gso_size bytes (the last
// possibly shorter).
void UdpAggregator::Lane::receive_buffer(const msghdr& h, const uint8_t* data, size_t len,
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

Status UdpAggregator::Lane::serve(const std::atomic<bool>& stop, const std::atomic<bool>& halt) {
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
    if (self->desired_gen_.load(std::memory_order_acquire) !=
        applied_gen.load(std::memory_order_relaxed)) {
      std::vector<JobConfig> desired;
      uint64_t gen;
      {
        std::lock_guard<std::mutex> g(self->jobs_mu_);
        desired = self->desired_jobs_;
        gen = self->desired_gen_.load(std::memory_order_relaxed);
      }
      apply_jobs(desired);
      applied_gen.store(gen, std::memory_order_release);
      next_snapshot = Clock::now();  // publish the change now
    }
    if (opts.snapshot_interval.count() > 0 && Clock::now() >= next_snapshot) {
      // Lane 0 defers while another lane has not applied the same jobs (soon: set_jobs() woke
      // it), so that a published job is served by every lane.
      next_snapshot = Clock::now() + (self->publish(idx) ? opts.snapshot_interval : std::chrono::milliseconds(1));
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
             "%sin %" PRIu64 " (%.0f/s) completed %" PRIu64 " (%.0f/s) out %" PRIu64
             " dup %" PRIu64 " stale %" PRIu64 " mismatch %" PRIu64 " malformed %" PRIu64
             " bad_tag %" PRIu64 " unknown_job %" PRIu64 " not_ready %" PRIu64
             " send_errors %" PRIu64 " unroutable %" PRIu64 " handed_off %" PRIu64,
             who, e.packets_in, rate_in, e.completed, rate_done, c.tx_datagrams, e.duplicates,
             e.stale, e.mismatched, e.malformed, e.bad_tag, e.unknown_job, e.not_ready,
             c.send_errors, c.unroutable, c.handed_off);
    last = e;
    last_time = now;
  };

  while (!stop.load(std::memory_order_relaxed) && !halt.load(std::memory_order_relaxed)) {
    between_batches();
    // What other lanes handed over first: it is older than what the socket holds (a HELLO's copy
    // before a DATA of the same rank that was steered here directly).
    const size_t taken = lanes > 1 ? drain_handoffs() : 0;
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
    flush();
    wake();
    if (n <= 0 && taken == 0) idle_wait();
  }
  flush();
  if (opts.snapshot_interval.count() > 0) self->publish(idx);
  return ok_status();
}

UdpAggregator::~UdpAggregator() = default;

const Engine& UdpAggregator::engine(unsigned i) const { return *lanes_.at(i)->engine; }

EngineCounters UdpAggregator::engine_totals() const {
  EngineCounters t;
  for (const auto& l : lanes_) add_counters(t, l->engine->counters());
  return t;
}

uint64_t UdpAggregator::dropped_by_hook() const {
  uint64_t n = 0;
  for (const auto& l : lanes_) n += l->c.hook_dropped;
  return n;
}

uint64_t UdpAggregator::handed_off() const {
  uint64_t n = 0;
  for (const auto& l : lanes_) n += l->c.handed_off;
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
    return invalid_argument("udp: at least one job is required (or max_payload_bytes for jobs "
                            "added at run time)");
  }
  if (wire::max_packet_size(opts.max_payload_bytes) > kMaxUdpPayload) {
    return invalid_argument("udp: max_payload_bytes " + std::to_string(opts.max_payload_bytes) +
                            " exceeds what one UDP datagram carries");
  }
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
    max_packet = std::max(max_packet, pkt);
  }

  std::unique_ptr<UdpAggregator> a(new UdpAggregator());
  unsigned lanes = opts.threads == 0 ? std::min(allowed_cpu_count(), kMaxUdpThreads) : opts.threads;
  INA_ASSIGN_OR_RETURN(sockaddr_in sa, resolve_ipv4(opts.bind_host, opts.port));

  // The sockets. One thread: a plain socket (no SO_REUSEADDR, which on UDP lets a second socket
  // bind the port and take its unicast traffic; no SO_REUSEPORT), so that a second aggregator on a
  // busy port fails here instead of starting silently. Several: a SO_REUSEPORT group, after a
  // plain bind shows the port free (the group would otherwise take in another aggregator's
  // sockets of the same user), steered by attach_steering().
  std::vector<int> fds;
  auto close_all = [&fds] {
    for (int fd : fds) ::close(fd);
    fds.clear();
  };
  if (lanes > 1) {
    if (sa.sin_port != 0) {
      INA_ASSIGN_OR_RETURN(int probe, bound_socket(sa, false));
      ::close(probe);
    }
    for (unsigned i = 0; i < lanes; ++i) {
      Result<int> fd = bound_socket(sa, true);
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
      const Status st = attach_steering(fds[0], lanes);
      if (!st.ok()) {
        INA_WARN(kComponent, "%s: serving on one thread instead of %u", st.message().c_str(),
                 lanes);
        close_all();
        lanes = 1;
      }
    }
  }
  if (lanes == 1) {
    INA_ASSIGN_OR_RETURN(int fd, bound_socket(sa, false));
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
    for (int fd : fds) a->gro_on_ = a->gro_on_ && setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
  }
  if (opts.gso) {
    // The kernel has UDP_SEGMENT when it answers for the option (the per-send cmsg is used).
    int v = 0;
    socklen_t vl = sizeof v;
    a->gso_on_ = getsockopt(fds[0], SOL_UDP, UDP_SEGMENT, &v, &vl) == 0;
  }

  EngineOptions eo;
  eo.telemetry = opts.telemetry;
  const size_t ring_bytes = std::max(kMinRingBytes, kRingPackets * max_packet);
  for (unsigned i = 0; i < lanes; ++i) {
    auto l = std::make_unique<Lane>();
    l->self = a.get();
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
      for (int fd : fds) if (fd >= 0) ::close(fd);
      return errno_status("udp: eventfd", err);
    }
    if (lanes > 1) {
      try {
        l->out.resize(lanes);
        for (unsigned d = 0; d < lanes; ++d) {
          if (d != i) l->out[d] = std::make_unique<HandoffRing>(ring_bytes);
        }
      } catch (const std::bad_alloc&) {
        for (int fd : fds) if (fd >= 0) ::close(fd);
        return resource_exhausted("udp: cannot allocate handoff rings of " +
                                  std::to_string(ring_bytes) + " bytes");
      }
    }
    if (Status st = l->alloc_buffers(opts.batch); !st.ok()) {
      for (int fd : fds) if (fd >= 0) ::close(fd);
      return st;
    }
    a->lanes_.push_back(std::move(l));
  }
  for (auto& l : a->lanes_) {
    l->in.assign(lanes, nullptr);
    for (unsigned s = 0; s < lanes; ++s) {
      if (s != l->idx) l->in[s] = a->lanes_[s]->out[l->idx].get();
    }
    l->apply_jobs(jobs);
    if (!l->job_errors.empty()) {
      const auto& [job, err] = *l->job_errors.begin();
      return invalid_argument("udp: job " + std::to_string(job) + ": " + err);
    }
  }
  a->board_ = std::make_unique<SnapshotBoard>(lanes, "threads");
  for (auto& l : a->lanes_) a->board_->put(l->idx, l->take_snapshot());
  a->board_->publish(monotonic_ns(), /*log_changes=*/false);  // main() reports the initial jobs
  return a;
}

void UdpAggregator::set_jobs(std::vector<JobConfig> jobs) {
  {
    std::lock_guard<std::mutex> g(jobs_mu_);
    desired_jobs_ = std::move(jobs);
    desired_gen_.fetch_add(1, std::memory_order_release);
  }
  for (const auto& l : lanes_) {  // apply now, not after a poll timeout
    const uint64_t one = 1;
    (void)!::write(l->efd, &one, sizeof one);
  }
}

AggregatorSnapshot UdpAggregator::snapshot() const { return board_->snapshot(); }

// Lane i's part (on lane i's thread, between batches); lane 0 also publishes the merge, once every
// lane has applied the jobs it has (false: deferred).
bool UdpAggregator::publish(unsigned i) {
  board_->put(i, lanes_[i]->take_snapshot());
  if (i != 0) return true;
  const uint64_t gen = lanes_[0]->applied_gen.load(std::memory_order_relaxed);
  for (const auto& l : lanes_) {
    if (l->applied_gen.load(std::memory_order_acquire) != gen) return false;
  }
  board_->publish(monotonic_ns());
  return true;
}

Status UdpAggregator::run(const std::atomic<bool>& stop) {
  std::atomic<bool> halt{false};  // a lane failed: the others stop too
  // Lanes 1..: a thread each (std::thread allocates its start state once, here, not in the loop).
  for (size_t i = 1; i < lanes_.size(); ++i) {
    Lane& l = *lanes_[i];
    l.thread = std::thread([&l, &stop, &halt] {
      char name[16];
      std::snprintf(name, sizeof name, "ina-udp-%u", l.idx);
      pthread_setname_np(pthread_self(), name);
      l.result = l.serve(stop, halt);
      if (!l.result.ok()) halt.store(true);
    });
  }
  Lane& l0 = *lanes_[0];
  l0.result = l0.serve(stop, halt);
  if (!l0.result.ok()) halt.store(true);
  for (size_t i = 1; i < lanes_.size(); ++i) lanes_[i]->thread.join();
  if (lanes_.size() > 1 && l0.opts.snapshot_interval.count() > 0) {
    board_->publish(monotonic_ns());  // every lane's final part
  }
  for (const auto& l : lanes_) {
    if (!l->result.ok()) return l->result;
  }
  return ok_status();
}

std::string UdpAggregator::format_counters() const {
  Lane::Counters b;
  std::vector<AggregatorSnapshot> parts;
  for (const auto& l : lanes_) {
    const Lane::Counters& x = l->c;
    b.rx_buffers += x.rx_buffers;
    b.rx_datagrams += x.rx_datagrams;
    b.gro_buffers += x.gro_buffers;
    b.hook_dropped += x.hook_dropped;
    b.hook_duplicated += x.hook_duplicated;
    b.handed_off += x.handed_off;
    b.handoff_received += x.handoff_received;
    b.handoff_dropped += x.handoff_dropped;
    b.wakeups += x.wakeups;
    b.tx_datagrams += x.tx_datagrams;
    b.tx_entries += x.tx_entries;
    b.tx_gso_entries += x.tx_gso_entries;
    b.send_errors += x.send_errors;
    b.unroutable += x.unroutable;
    parts.push_back(l->take_snapshot());
  }
  const AggregatorSnapshot all = merge_snapshots(parts);
  CounterTable t;
  t.engine(all.engine);
  t.section("udp:");
  t.row("threads", lanes_.size());
  t.row("rx_buffers", b.rx_buffers);
  t.row("rx_datagrams", b.rx_datagrams);
  t.row("gro_buffers", b.gro_buffers);
  t.row("hook_dropped", b.hook_dropped);
  t.row("hook_duplicated", b.hook_duplicated);
  t.row("handed_off", b.handed_off);
  t.row("handoff_received", b.handoff_received);
  t.row("handoff_dropped", b.handoff_dropped);
  t.row("wakeups", b.wakeups);
  t.row("tx_datagrams", b.tx_datagrams);
  t.row("tx_entries", b.tx_entries);
  t.row("tx_gso_entries", b.tx_gso_entries);
  t.row("send_errors", b.send_errors);
  t.row("unroutable", b.unroutable);
  if (lanes_.size() > 1) {
    t.section("per thread:");
    char line[160];
    for (const auto& l : lanes_) {
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
    for (const auto& l : lanes_) {
      const std::vector<Lane::Peer>* p = std::as_const(l->peers).find(job);
      if (p != nullptr && r < p->size() && (*p)[r].known) return format_addr((*p)[r].addr);
    }
    return "-";
  });
  return t.text();
}

}  // namespace ina::agg
