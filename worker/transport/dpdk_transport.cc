// DpdkTransport: a libina transport over a DPDK port shared by the ranks of one process (see
// dpdk_transport.h): EAL start once per process, the port's setup and stop, the rx dispatcher
// (ARP/ICMP answered, INA frames to the rank owning their UDP port), burst tx.
#include "worker/transport/dpdk_transport.h"

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "ina/base/log.h"
#include "ina/protocol/frame_dpdk.h"

namespace ina::worker {

using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxEndpoints = 64;
constexpr unsigned kRxRingSize = 2048;
constexpr unsigned kPoolMbufs = 16383;
constexpr uint16_t kDescriptors = 1024;
constexpr uint16_t kPollBurst = 32;
constexpr int kDrainBursts = kRxRingSize / kPollBurst;  // one rank ring's worth of frames
constexpr int kTxAttempts = 8;

void set_len(rte_mbuf* m, size_t len) {
  m->data_len = static_cast<uint16_t>(len);
  m->pkt_len = static_cast<uint32_t>(len);
}

Status dpdk_error(const std::string& what, int rc) {
  return Status(StatusCode::kUnavailable,
                "dpdk: " + what + " failed: " + rte_strerror(rc < 0 ? -rc : rc));
}

}  // namespace

// ---- the process's port ----

class DpdkPort {
 public:
  static Result<std::shared_ptr<DpdkPort>> acquire(const DpdkTransportOptions& o);
  ~DpdkPort();

  Status add(DpdkTransport::Endpoint* ep);
  void remove(DpdkTransport::Endpoint* ep);
  // Receives one burst (if no other rank is receiving) and dispatches it.
  void poll();
  // Receives and dispatches until the port has nothing more (at most kDrainBursts bursts),
  // waiting for a rank that is receiving to finish first.
  void drain();
  // Sends m[0, n) and frees what the port did not take; returns how many went out.
  uint16_t send(rte_mbuf** m, uint16_t n);
  bool link_up() const {
    rte_eth_link link{};
    return rte_eth_link_get_nowait(id_, &link) == 0 && link.link_status == RTE_ETH_LINK_UP;
  }

  uint16_t id() const { return id_; }
  const std::string& name() const { return name_; }
  const frame::Mac& mac() const { return mac_; }
  uint16_t mtu() const { return mtu_; }
  rte_mempool* pool() const { return pool_; }
  frame::Counters drops() {
    std::lock_guard<std::mutex> lock(rx_lock_);
    return drops_;
  }

 private:
  DpdkPort() = default;
  void dispatch(rte_mbuf* m);

  uint16_t id_ = 0;
  std::string name_;
  frame::Mac mac_{};
  uint16_t mtu_ = 1500;
  rte_mempool* pool_ = nullptr;
  // Mutexes, not spinlocks: a trainer may run more ranks (threads) than it has cores, and a
  // waiter spinning on a preempted holder burns its time slice. Uncontended, a mutex costs the
  // same one atomic exchange.
  std::mutex rx_lock_;
  std::mutex tx_lock_;
  std::array<DpdkTransport::Endpoint*, kMaxEndpoints> eps_{};
  size_t n_eps_ = 0;
  frame::Counters drops_;       // under rx_lock_
  uint64_t multi_segment_ = 0;  // scattered frames (never INA-sized here), dropped; under rx_lock_
  uint64_t no_rank_ = 0;        // frames while no rank is registered; under rx_lock_
  uint64_t generation_ = 0;     // which acquire() started the port (see the destructor)
  bool started_ = false;
};

namespace {

std::mutex g_mu;
std::weak_ptr<DpdkPort> g_port;  // guarded by g_mu
bool g_eal_tried = false;
Status g_eal_status;
rte_mempool* g_pool = nullptr;
uint16_t g_started_port = RTE_MAX_ETHPORTS;  // for the exit handler
uint64_t g_generation = 0;                   // acquire() calls that started the port

// A communicator still alive at exit or unload (leaked, or exit() from another thread): stop the
// port so the peer sees a clean disconnect. A destructor rather than atexit(): it also runs when
// libina is unloaded before the process ends.
__attribute__((destructor)) void stop_at_exit() {
  if (g_started_port != RTE_MAX_ETHPORTS) (void)rte_eth_dev_stop(g_started_port);
}

Status start_eal(const std::vector<std::string>& args) {
  if (g_eal_tried) return g_eal_status;
  g_eal_tried = true;
  std::vector<std::string> copy;
  copy.push_back("libina");
  copy.insert(copy.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : copy) argv.push_back(s.data());
  argv.push_back(nullptr);
  // rte_eal_init pins the calling thread to the main lcore's CPU: the application's thread must
  // keep the CPUs it had.
  cpu_set_t saved;
  CPU_ZERO(&saved);
  const bool have_affinity = sched_getaffinity(0, sizeof saved, &saved) == 0;
  const int rc = rte_eal_init(static_cast<int>(copy.size()), argv.data());
  if (have_affinity) (void)sched_setaffinity(0, sizeof saved, &saved);
  if (rc < 0) {
    g_eal_status = Status(
        StatusCode::kUnavailable,
        std::string("dpdk: the EAL cannot start with INA_DPDK_ARGS: ") + rte_strerror(rte_errno));
  } else if (static_cast<size_t>(rc) + 1 != copy.size()) {
    g_eal_status = invalid_argument("invalid INA_DPDK_ARGS: the EAL did not understand '" +
                                    copy[static_cast<size_t>(rc) + 1] + "'");
  } else {
    g_eal_status = ok_status();
  }
  return g_eal_status;
}

Result<uint16_t> find_port(const std::string& name) {
  uint16_t id = 0;
  if (name.empty()) {
    RTE_ETH_FOREACH_DEV(id) { return id; }
    return Status(StatusCode::kUnavailable,
                  "dpdk: no port (give the EAL a --vdev or a device in INA_DPDK_ARGS)");
  }
  if (rte_eth_dev_get_port_by_name(name.c_str(), &id) == 0) return id;
  unsigned n = 0;
  auto [ptr, ec] = std::from_chars(name.data(), name.data() + name.size(), n);
  if (ec == std::errc() && ptr == name.data() + name.size() && n < RTE_MAX_ETHPORTS &&
      rte_eth_dev_is_valid_port(static_cast<uint16_t>(n))) {
    return static_cast<uint16_t>(n);
  }
  return invalid_argument("invalid INA_DPDK_PORT=\"" + name +
                          "\": no such DPDK port (a port name such as net_memif0, or a number)");
}

}  // namespace

Result<std::shared_ptr<DpdkPort>> DpdkPort::acquire(const DpdkTransportOptions& o) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto p = g_port.lock()) return p;
  INA_RETURN_IF_ERROR(start_eal(o.eal_args));
  std::shared_ptr<DpdkPort> p(new DpdkPort());
  p->generation_ = ++g_generation;
  INA_ASSIGN_OR_RETURN(p->id_, find_port(o.port));
  char name[RTE_ETH_NAME_MAX_LEN] = {};
  (void)rte_eth_dev_get_name_by_port(p->id_, name);
  p->name_ = name;
  if (g_pool == nullptr) {
    g_pool = rte_pktmbuf_pool_create(
        "ina_worker_pool", kPoolMbufs, 0, 0, RTE_MBUF_DEFAULT_BUF_SIZE,
        rte_eth_dev_socket_id(p->id_) < 0 ? SOCKET_ID_ANY : rte_eth_dev_socket_id(p->id_));
    if (g_pool == nullptr) return dpdk_error("rte_pktmbuf_pool_create", rte_errno);
  }
  p->pool_ = g_pool;
  rte_eth_conf conf{};
  int rc = rte_eth_dev_configure(p->id_, 1, 1, &conf);
  if (rc != 0) return dpdk_error("rte_eth_dev_configure of " + p->name_, rc);
  uint16_t rxd = kDescriptors;
  uint16_t txd = kDescriptors;
  (void)rte_eth_dev_adjust_nb_rx_tx_desc(p->id_, &rxd, &txd);
  const int socket = rte_eth_dev_socket_id(p->id_);
  rc = rte_eth_rx_queue_setup(p->id_, 0, rxd, socket < 0 ? SOCKET_ID_ANY : socket, nullptr,
                              p->pool_);
  if (rc != 0) return dpdk_error("rte_eth_rx_queue_setup of " + p->name_, rc);
  rc = rte_eth_tx_queue_setup(p->id_, 0, txd, socket < 0 ? SOCKET_ID_ANY : socket, nullptr);
  if (rc != 0) return dpdk_error("rte_eth_tx_queue_setup of " + p->name_, rc);
  rc = rte_eth_dev_start(p->id_);
  if (rc != 0) return dpdk_error("rte_eth_dev_start of " + p->name_, rc);
  g_started_port = p->id_;
  p->started_ = true;
  rte_ether_addr ea{};
  if (rte_eth_macaddr_get(p->id_, &ea) == 0) std::memcpy(p->mac_.data(), ea.addr_bytes, 6);
  uint16_t mtu = 0;
  if (rte_eth_dev_get_mtu(p->id_, &mtu) == 0 && mtu >= 576) p->mtu_ = mtu;
  p->mtu_ = std::min<uint16_t>(p->mtu_, RTE_MBUF_DEFAULT_DATAROOM - frame::kEthHeader);
  INA_DEBUG("worker", "dpdk port %u (%s) started: mac %s, mtu %u", p->id_, p->name_.c_str(),
            frame::format_mac(p->mac_).c_str(), p->mtu_);
  g_port = p;
  return p;
}

DpdkPort::~DpdkPort() {
  std::lock_guard<std::mutex> lock(g_mu);
  // A rank created while the last one was closing may have started the port again already.
  if (!started_ || generation_ != g_generation) return;
  (void)rte_eth_dev_stop(id_);
  g_started_port = RTE_MAX_ETHPORTS;
  INA_DEBUG("worker", "dpdk port %u (%s) stopped", id_, name_.c_str());
}

Status DpdkPort::add(DpdkTransport::Endpoint* ep) {
  std::lock_guard<std::mutex> lock(rx_lock_);
  Status st = ok_status();
  for (size_t i = 0; i < n_eps_; ++i) {
    if (eps_[i]->local.ip == ep->local.ip && eps_[i]->local.udp_port == ep->local.udp_port) {
      st = invalid_argument("dpdk: UDP port " + std::to_string(ep->local.udp_port) +
                            " is already used by another rank of this process (INA_LOCAL_PORT)");
    }
  }
  if (st.ok() && n_eps_ == kMaxEndpoints) {
    st = resource_exhausted("dpdk: more than " + std::to_string(kMaxEndpoints) +
                            " ranks on one port");
  }
  if (st.ok()) eps_[n_eps_++] = ep;
  return st;
}

void DpdkPort::remove(DpdkTransport::Endpoint* ep) {
  std::lock_guard<std::mutex> lock(rx_lock_);
  for (size_t i = 0; i < n_eps_; ++i) {
    if (eps_[i] == ep) {
      eps_[i] = eps_[--n_eps_];
      break;
    }
  }
}

uint16_t DpdkPort::send(rte_mbuf** m, uint16_t n) {
  uint16_t sent = 0;
  {
    std::lock_guard<std::mutex> lock(tx_lock_);
    for (int a = 0; a < kTxAttempts && sent < n; ++a) {
      sent += rte_eth_tx_burst(id_, 0, m + sent, static_cast<uint16_t>(n - sent));
    }
  }
  for (uint16_t i = sent; i < n; ++i) rte_pktmbuf_free(m[i]);
  return sent;
}

void DpdkPort::poll() {
  std::unique_lock<std::mutex> lock(rx_lock_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  rte_mbuf* bufs[kPollBurst];
  const uint16_t n = rte_eth_rx_burst(id_, 0, bufs, kPollBurst);
  for (uint16_t i = 0; i < n; ++i) dispatch(bufs[i]);
}

void DpdkPort::drain() {
  std::lock_guard<std::mutex> lock(rx_lock_);
  rte_mbuf* bufs[kPollBurst];
  for (int b = 0; b < kDrainBursts; ++b) {
    const uint16_t n = rte_eth_rx_burst(id_, 0, bufs, kPollBurst);
    for (uint16_t i = 0; i < n; ++i) dispatch(bufs[i]);
    if (n < kPollBurst) break;
  }
}

void DpdkPort::dispatch(rte_mbuf* m) {
  if (m->nb_segs != 1 || n_eps_ == 0) {
    ++(n_eps_ == 0 ? no_rank_ : multi_segment_);
    rte_pktmbuf_free(m);
    return;
  }
  uint8_t* data = rte_pktmbuf_mtod(m, uint8_t*);
  const std::span<const uint8_t> f(data, m->data_len);
  const frame::RxOffload off = frame::rx_offload(m->ol_flags);
  frame::Parsed p;
  frame::Verdict v = frame::Verdict::kWrongUdpPort;
  DpdkTransport::Endpoint* ep = nullptr;
  // The ranks share the address and differ by UDP port: the first rank that does not answer
  // "wrong port" decides (one full classification per rank at most; a handful of ranks).
  for (size_t i = 0; i < n_eps_ && v == frame::Verdict::kWrongUdpPort; ++i) {
    ep = eps_[i];
    v = frame::classify(f, ep->local, off, &p);
  }
  drops_.add(v);
  switch (v) {
    case frame::Verdict::kIna: {
      rte_pktmbuf_adj(m, static_cast<uint16_t>(p.ina.data() - data));
      rte_pktmbuf_trim(m, static_cast<uint16_t>(m->data_len - p.ina.size()));
      if (rte_ring_sp_enqueue(ep->ring, m) != 0) {
        ep->ring_full.fetch_add(1, std::memory_order_relaxed);
        rte_pktmbuf_free(m);
      }
      return;
    }
    case frame::Verdict::kArpRequest:
      set_len(m, frame::arp_reply(data, p, ep->local));
      (void)send(&m, 1);
      return;
    case frame::Verdict::kIcmpEcho:
      set_len(m, frame::icmp_echo_reply(data, p, ep->local));
      (void)send(&m, 1);
      return;
    case frame::Verdict::kArpNotRequest:
      for (size_t i = 0; i < n_eps_; ++i) {
        uint32_t ip = 0;
        frame::Mac mac{};
        if (frame::arp_reply_sender(f, eps_[i]->local, &ip, &mac) && ip == eps_[i]->aggregator_ip) {
          eps_[i]->owner->learn_aggregator_mac(mac);
        }
      }
      break;
    default: break;
  }
  rte_pktmbuf_free(m);
}

// ---- the transport ----

Result<std::unique_ptr<DpdkTransport>> DpdkTransport::create(const DpdkTransportOptions& opts) {
  std::unique_ptr<DpdkTransport> t(new DpdkTransport());
  INA_RETURN_IF_ERROR(t->init(opts));
  return t;
}

void DpdkTransport::learn_aggregator_mac(const frame::Mac& mac) {
  if (have_mac_.load(std::memory_order_acquire)) return;
  learned_mac_ = mac;
  have_mac_.store(true, std::memory_order_release);
}

Status DpdkTransport::init(const DpdkTransportOptions& opts) {
  if (opts.local_ip == 0) return invalid_argument("dpdk: local_ip (INA_LOCAL_IP) is required");
  if (opts.aggregator_ip == 0) return invalid_argument("dpdk: the aggregator's IPv4 is required");
  if (opts.local_port == 0) return invalid_argument("dpdk: local_port must be >= 1");
  if (opts.burst == 0 || opts.burst > 512) {
    return invalid_argument("dpdk: burst must be in [1, 512]");
  }
  burst_ = opts.burst;
  INA_ASSIGN_OR_RETURN(port_, DpdkPort::acquire(opts));
  local_.mac = opts.local_mac_set ? opts.local_mac : port_->mac();
  local_.ip = opts.local_ip;
  local_.udp_port = opts.local_port;
  max_datagram_ = port_->mtu() - frame::kIpv4MinHeader - frame::kUdpHeader;

  static std::atomic<unsigned> ring_seq{0};
  const std::string ring_name = "ina_rx" + std::to_string(ring_seq.fetch_add(1));
  ep_.ring =
      rte_ring_create(ring_name.c_str(), kRxRingSize, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
  if (ep_.ring == nullptr) return dpdk_error("rte_ring_create", rte_errno);
  ep_.local = local_;
  ep_.aggregator_ip = opts.aggregator_ip;
  ep_.owner = this;
  held_.assign(burst_, nullptr);
  tx_.assign(burst_, nullptr);
  Status st = port_->add(&ep_);
  if (!st.ok()) {
    rte_ring_free(ep_.ring);
    ep_.ring = nullptr;
    return st;
  }
  registered_ = true;

  src_ = frame::Endpoint{local_.mac, local_.ip, local_.udp_port};
  dst_.ip = opts.aggregator_ip;
  dst_.port = opts.aggregator_port;
  peer_name_ = frame::format_ipv4(opts.aggregator_ip) + ":" + std::to_string(opts.aggregator_port) +
               " (dpdk " + port_->name() + ")";
  if (opts.aggregator_mac_set) {
    dst_.mac = opts.aggregator_mac;
  } else {
    // ARP, repeated every 100 ms until the deadline (a memif link comes up when the server is
    // there; the first requests may go nowhere).
    const auto deadline = Clock::now() + opts.link_timeout;
    auto next_request = Clock::now();
    while (!have_mac_.load(std::memory_order_acquire)) {
      const auto now = Clock::now();
      if (now >= deadline) {
        return Status(StatusCode::kUnavailable,
                      "dpdk: no ARP reply from the aggregator " +
                          frame::format_ipv4(opts.aggregator_ip) + " on port " + port_->name() +
                          " within " + std::to_string(opts.link_timeout.count()) + " ms (link " +
                          (port_->link_up() ? "up" : "down") +
                          "); is it running? INA_AGGREGATOR_MAC=aa:bb:cc:dd:ee:ff skips ARP");
      }
      if (now >= next_request) {
        rte_mbuf* m = rte_pktmbuf_alloc(port_->pool());
        if (m != nullptr) {
          set_len(m, frame::arp_request(rte_pktmbuf_mtod(m, uint8_t*), local_, dst_.ip));
          (void)port_->send(&m, 1);
        }
        next_request = now + std::chrono::milliseconds(100);
      }
      port_->poll();
      std::this_thread::yield();
    }
    dst_.mac = learned_mac_;
  }
  INA_DEBUG("worker",
            "transport dpdk: port %s, %s:%u (mac %s) -> aggregator %s (mac %s%s), max datagram %zu",
            port_->name().c_str(), frame::format_ipv4(local_.ip).c_str(), local_.udp_port,
            frame::format_mac(local_.mac).c_str(), peer_name_.c_str(),
            frame::format_mac(dst_.mac).c_str(), opts.aggregator_mac_set ? ", static" : ", arp",
            max_datagram_);
  return ok_status();
}

DpdkTransport::~DpdkTransport() {
  if (port_ != nullptr && registered_) port_->remove(&ep_);
  release_held();
  if (ep_.ring != nullptr) {
    void* m = nullptr;
    while (rte_ring_sc_dequeue(ep_.ring, &m) == 0) rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
    rte_ring_free(ep_.ring);
  }
  // port_ goes last: the port stops when no rank uses it any more.
}

void DpdkTransport::release_held() {
  if (held_n_ > 0) rte_pktmbuf_free_bulk(held_.data(), static_cast<unsigned>(held_n_));
  held_n_ = 0;
}

frame::Counters DpdkTransport::port_frame_counters() const { return port_->drops(); }

Status DpdkTransport::send_batch(std::span<const std::span<const uint8_t>> pkts) {
  for (const auto& p : pkts) {
    if (p.size() > max_datagram_) {
      return invalid_argument("datagram of " + std::to_string(p.size()) +
                              " bytes exceeds the dpdk port's limit of " +
                              std::to_string(max_datagram_));
    }
  }
  size_t i = 0;
  while (i < pkts.size()) {
    const auto n = static_cast<uint16_t>(std::min<size_t>(burst_, pkts.size() - i));
    if (rte_pktmbuf_alloc_bulk(port_->pool(), tx_.data(), n) != 0) {
      counters_.no_mbuf += pkts.size() - i;  // loss: the engine retransmits
      return ok_status();
    }
    for (uint16_t k = 0; k < n; ++k) {
      const std::span<const uint8_t> d = pkts[i + k];
      rte_mbuf* m = tx_[k];
      uint8_t* f = rte_pktmbuf_mtod(m, uint8_t*);
      // Copied and summed for the UDP checksum in one vectorized pass (sum16 is the bytewise
      // loop for headers: several times slower over a payload).
      const uint32_t sum =
          d.empty() ? 0 : frame::copy_sum16(f + frame::kUdpHeadroom, d.data(), d.size());
      set_len(m, frame::write_udp_headers(f, src_, dst_, d.size(), sum, ip_id_++));
    }
    const uint16_t sent = port_->send(tx_.data(), n);
    counters_.sent += sent;
    counters_.tx_dropped += n - sent;
    i += n;
  }
  return ok_status();
}

Result<size_t> DpdkTransport::recv_batch(std::span<Datagram> out,
                                         std::chrono::microseconds timeout) {
  release_held();
  if (out.empty()) return size_t{0};
  const unsigned want = static_cast<unsigned>(std::min<size_t>(out.size(), burst_));
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    // The whole port, not one burst: the engine checks its retransmission timers when a receive
    // returns less than a full batch, so every result that has reached the port must be in our
    // ring by then. One burst per call left results of a rank that had been descheduled for a
    // while (more ranks than cores) unread in the port's ring; its timers fired, each resend
    // drew a duplicate result, and the aggregator's ring to the port overflowed (4 ranks on one
    // CPU over net_memif, 4 MiB AllReduce: 104-131 ms in 3 of 5 runs before, 27-32 ms in 5 of 5
    // after; testbed/results/dpdk-memif-ranks-20261130). A rank waits while another drains:
    // skipping the drain then (try-lock, as the one-burst poll did) gave 27-39 ms at 4 MiB and
    // once 26 ms at 1 MiB (7 ms otherwise) in 4 alternated pairs with 27-29 ms.
    port_->drain();
    const unsigned got =
        rte_ring_sc_dequeue_burst(ep_.ring, reinterpret_cast<void**>(held_.data()), want, nullptr);
    if (got > 0) {
      for (unsigned k = 0; k < got; ++k) {
        out[k] = Datagram(rte_pktmbuf_mtod(held_[k], const uint8_t*), held_[k]->data_len);
      }
      held_n_ = got;
      counters_.received += got;
      return size_t{got};
    }
    if (Clock::now() >= deadline) return size_t{0};
    // Busy polling with a yield: the CPU goes to others when they need it.
    std::this_thread::yield();
  }
}

}  // namespace ina::worker
