// DPDK backend (see dpdk_backend.h).
//
// Each worker lcore runs the same loop, chosen once before it starts:
//   1. rx_burst on its rx queue (when it has one), prefetching a few frames ahead;
//   2. classify each frame (frame.h, with the NIC's checksum flags when it reports them): ARP and
//      ICMP echo are answered in place; drops are counted and freed; an INA frame of a slot owned
//      by another lcore is staged for that lcore, a HELLO copied to every lcore;
//   3. the staged frames go out in one enqueue per destination ring;
//   4. frames handed over by the other lcores are processed (their checksums were checked);
//   5. replies collected in a tx array go out in bursts (on net_memif, from an lcore beyond the
//      queue pairs the peer connects, to lcore 0, which sends them with its own); the few
//      counters are published.
// A reply to the sender reuses the received mbuf. A result for every rank is encoded once in the
// received mbuf; each other rank's frame is a fresh mbuf with a copy of the encoded datagram and
// its own headers (the UDP checksum of the datagram is summed once). Copies are the default because
// every PMD transmits single-segment frames (not every one takes chains); indirect_multicast
// chains a header mbuf to a clone of the one datagram instead (see ina-dpdk-bench --indirect for
// the cost of each).
#include "aggregator/dpdk_backend.h"

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_prefetch.h>
#include <rte_ring.h>

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <utility>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>

#include "ina/protocol/frame_dpdk.h"
#include "ina/base/log.h"
#include "ina/protocol/wire.h"

namespace ina::agg {

namespace {
constexpr const char* kComponent = "dpdk";
constexpr uint16_t kMaxBurst = 256;
constexpr unsigned kPrefetchAhead = 3;
constexpr unsigned kRecycle = 64;  // absorbed frames kept per lcore for the next results
std::atomic<unsigned> g_instance{0};  // unique names of pools and rings

Status dpdk_error(const std::string& what, int err) {
  return Status(StatusCode::kInternal, "dpdk: " + what + ": " + rte_strerror(err < 0 ? -err : err));
}
}  // namespace

struct Peer {
  bool known = false;
  frame::Endpoint ep;
  frame::UdpHeaderTemplate hdr;  // our headers to ep, rebuilt when ep changes
};

// Published counters, read by the main lcore while the loop runs.
struct alignas(64) Published {
  std::atomic<uint64_t> rx{0}, tx{0}, completed{0}, dropped{0}, handed_off{0};
};

struct alignas(64) DpdkAggregator::Lcore {
  DpdkAggregator* self = nullptr;
  unsigned idx = 0;
  unsigned lcore_id = 0;
  bool has_rxq = false;
  uint16_t queue = 0;  // rx queue (when has_rxq) and tx queue
  std::unique_ptr<Engine> engine;
  frame::Counters fc;
  DpdkLoopCounters c;
  Published pub;
  AddressBook<Peer> book;  // per job, by rank: learnt from packets
  std::vector<rte_ring*> in;                  // from lcore src (nullptr for self)
  std::vector<rte_ring*> out;                 // to lcore dst (nullptr for self)
  std::vector<std::vector<rte_mbuf*>> stage;  // per destination, capacity burst
  std::vector<rte_mbuf*> tx;                  // replies waiting for tx_burst
  rte_ring* tx_out = nullptr;                 // set: replies go to lcore 0 instead (tx_rings_)
  std::vector<rte_ring*> tx_in;               // lcore 0: the other lcores' tx_out
  size_t tx_n = 0;
  uint16_t ip_id = 0;
  uint64_t now = 0;  // telemetry: CLOCK_MONOTONIC of this loop pass, read at its first INA frame

  // Control mailbox (see dpdk_backend.h): the main lcore writes the request, then releases
  // `posted`; this lcore acquires it between bursts, applies the jobs, answers in `snap`, then
  // releases `done`. Its own cache line: the lcore reads `posted` on every pass.
  struct alignas(64) Mailbox {
    std::atomic<uint64_t> posted{0};
    std::atomic<uint64_t> done{0};
    bool has_jobs = false;
    std::vector<JobConfig> jobs;
    AggregatorSnapshot snap;
  } mail;
  uint64_t mail_seen = 0;                     // the last request this lcore handled
  std::map<JobId, std::string> job_errors;    // of the last jobs applied

  // DATA frames the Engine absorbed (no reply) are kept here instead of going back to the pool,
  // and the next results to every rank are written into them: their mbuf header and buffer are
  // still in this core's cache, and a pool put + get is saved per reply.
  std::array<rte_mbuf*, kRecycle> recycled{};
  unsigned n_recycled = 0;

  void loop();
  void recycle(rte_mbuf* m);
  rte_mbuf* reply_mbuf();
  void handle_mail();
  // Answers a request posted since the last one (handle_mail, then releases `done`).
  void answer_mail();
  void apply_jobs(const std::vector<JobConfig>& desired);
  AggregatorSnapshot take_snapshot() const;
  void on_frame(rte_mbuf* m, bool verified);
  // hello_copy: a HELLO another lcore received and counts (every lcore runs the join barrier).
  void process_ina(rte_mbuf* m, const frame::Parsed& p, bool hello, bool hello_copy);
  void send(rte_mbuf* m);
  void flush_tx();
  void flush_stage();
};

namespace {
int launch(void* arg) {
  static_cast<DpdkAggregator::Lcore*>(arg)->loop();
  return 0;
}


// PMDs that spread received frames over their rx queues without RSS offloads: af_packet (the
// kernel's PACKET_FANOUT hash over qpairs sockets), tap (the tap's flow hash over its queues),
// af_xdp (one socket per NIC queue, the NIC's RSS), ring (the peer picks the ring). Others (memif,
// whose queues are the ones its peer connects, null) get one rx queue unless asked for more.
bool spreads_without_rss(const char* driver) {
  if (driver == nullptr) return false;
  for (const char* d : {"net_af_packet", "net_tap", "net_af_xdp", "net_ring"}) {
    if (std::strcmp(driver, d) == 0) return true;
  }
  return false;
}

uint64_t now_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

// Every cache line of a frame (headers and payload, at most kPrefetchBytes), for the read by
// classify() and the Engine's add.
constexpr size_t kPrefetchBytes = 4352;
inline void prefetch_frame(const rte_mbuf* m) {
  const char* p = rte_pktmbuf_mtod(m, const char*);
  const size_t n = std::min<size_t>(m->data_len, kPrefetchBytes);
  for (size_t o = 0; o < n; o += RTE_CACHE_LINE_SIZE) rte_prefetch0(p + o);
}

// Six bytes as two loads (std::array's operator!= called memcmp here, per packet).
inline bool same_mac(const frame::Mac& a, const frame::Mac& b) {
  uint32_t a4, b4;
  uint16_t a2, b2;
  std::memcpy(&a4, a.data(), 4);
  std::memcpy(&b4, b.data(), 4);
  std::memcpy(&a2, a.data() + 4, 2);
  std::memcpy(&b2, b.data() + 4, 2);
  return a4 == b4 && a2 == b2;
}

void set_len(rte_mbuf* m, size_t len) {
  m->data_len = static_cast<uint16_t>(len);
  m->pkt_len = static_cast<uint32_t>(len);
}
}  // namespace

Status dpdk_eal_init(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::vector<std::string> copy = args;
  if (copy.empty()) copy.push_back("ina-aggregator");
  for (std::string& s : copy) argv.push_back(s.data());
  argv.push_back(nullptr);
  const int rc = rte_eal_init(static_cast<int>(copy.size()), argv.data());
  if (rc < 0) {
    return Status(StatusCode::kUnavailable,
                  std::string("dpdk: the EAL cannot start: ") + rte_strerror(rte_errno));
  }
  if (static_cast<size_t>(rc) + 1 != copy.size()) {
    return invalid_argument("dpdk: EAL arguments not understood, starting at '" +
                            copy[static_cast<size_t>(rc) + 1] + "'");
  }
  return ok_status();
}

void dpdk_eal_cleanup() { rte_eal_cleanup(); }

Result<std::unique_ptr<DpdkAggregator>> DpdkAggregator::create(const DpdkOptions& opts,
                                                               const std::vector<JobConfig>& jobs) {
  if (jobs.empty() && opts.max_payload_bytes == 0) {
    return invalid_argument(
        "dpdk: at least one job is required (or max_payload_bytes, for jobs from set_jobs)");
  }
  for (const JobConfig& j : jobs) {
    // A leaf forwards partials to its parent (Reply::Target::kParent): the DPDK loop has no
    // route to a parent aggregator (ARP, next hop), so a leaf job is served by --backend udp.
    if (j.is_leaf()) {
      return invalid_argument("dpdk: job " + std::to_string(j.job) +
                              " is a tree leaf (role leaf, parent " + j.tree.parent +
                              "); leaf jobs need --backend udp");
    }
  }
  if (opts.ip == 0) return invalid_argument("dpdk: --ip (our IPv4 address, a.b.c.d) is required");
  if (opts.burst < 1 || opts.burst > kMaxBurst) {
    return invalid_argument("dpdk: burst must be in 1.." + std::to_string(kMaxBurst));
  }
  std::unique_ptr<DpdkAggregator> a(new DpdkAggregator());
  a->opts_ = opts;
  const unsigned inst = g_instance.fetch_add(1);

  // The port: by name, else by number.
  uint16_t port = 0;
  if (!opts.port.empty()) {
    if (rte_eth_dev_get_port_by_name(opts.port.c_str(), &port) != 0) {
      char* end = nullptr;
      const unsigned long v = std::strtoul(opts.port.c_str(), &end, 10);
      if (end == opts.port.c_str() || *end != '\0' || v > UINT16_MAX) {
        return invalid_argument("dpdk: port '" + opts.port +
                                "' is neither a DPDK port name nor a port number (ports: " +
                                std::to_string(rte_eth_dev_count_avail()) + ")");
      }
      port = static_cast<uint16_t>(v);
    }
  }
  if (!rte_eth_dev_is_valid_port(port)) {
    return invalid_argument("dpdk: no DPDK port " + std::to_string(port) + " (" +
                            std::to_string(rte_eth_dev_count_avail()) +
                            " available; add one with EAL --vdev or -a)");
  }
  a->port_ = port;

  std::vector<unsigned> workers;
  unsigned lc;
  RTE_LCORE_FOREACH_WORKER(lc) {
    if (opts.lcores == 0 || workers.size() < opts.lcores) workers.push_back(lc);
  }
  if (workers.empty()) {
    return invalid_argument(
        "dpdk: no worker lcore: give the EAL at least two lcores (e.g. -l 0-1); the main lcore "
        "prints counters, the workers run the data plane");
  }
  const unsigned n = static_cast<unsigned>(workers.size());

  rte_eth_dev_info info{};
  int rc = rte_eth_dev_info_get(port, &info);
  if (rc != 0) return dpdk_error("rte_eth_dev_info_get", rc);
  const bool memif = info.driver_name != nullptr && std::strcmp(info.driver_name, "net_memif") == 0;

  // Largest frame: headers + the largest packet of any job (control replies are smaller), or
  // of the largest block set_jobs may bring.
  // (DATA, RESULT and control packets; a tree root's PARTIAL words are larger, see DpdkOptions.)
  // Jobs from set_jobs: their control replies for worlds up to 65535 ranks are sent from fresh
  // mbufs when they outgrow the block (send path), as in v1.
  size_t max_packet = opts.max_payload_bytes == 0
                          ? wire::control_packet_size(2)
                          : wire::max_data_packet_size(opts.max_payload_bytes, 1);
  for (const JobConfig& j : jobs) {
    max_packet = std::max(max_packet, wire::max_data_packet_size(j.slots.max_payload_bytes,
                                                                 j.slots.world_size));
  }
  a->max_packet_ = max_packet;
  const size_t max_frame = a->max_frame();
  const uint16_t data_room =
      static_cast<uint16_t>(RTE_PKTMBUF_HEADROOM + std::max<size_t>(max_frame + 4, 2048));
  const std::string pool_name = "ina_agg_" + std::to_string(inst);
  a->pool_ = rte_pktmbuf_pool_create(pool_name.c_str(), opts.mbufs, 256, 0, data_room,
                                     rte_eth_dev_socket_id(port));
  if (a->pool_ == nullptr) return dpdk_error("mbuf pool " + pool_name, rte_errno);

  // One rx queue per lcore where the port can spread frames over them (RSS offloads, or a PMD that
  // spreads by itself), else one; an explicit opts.rx_queues wins.
  const bool spreads = (info.flow_type_rss_offloads & (RTE_ETH_RSS_IP | RTE_ETH_RSS_UDP)) != 0 ||
                       spreads_without_rss(info.driver_name);
  const unsigned want_rx =
      opts.rx_queues != 0 ? std::min<unsigned>(opts.rx_queues, n) : (spreads ? n : 1);
  if (opts.configure_port) {
    if (info.max_tx_queues < n) {
      return invalid_argument("dpdk: port " + opts.port + " has " +
                              std::to_string(info.max_tx_queues) + " tx queues, fewer than the " +
                              std::to_string(n) + " worker lcores: use fewer lcores");
    }
    a->rx_queues_ = static_cast<uint16_t>(std::min<unsigned>(want_rx, info.max_rx_queues));
    rte_eth_conf conf{};
    if (a->rx_queues_ > 1) {
      const uint64_t hf = info.flow_type_rss_offloads & (RTE_ETH_RSS_IP | RTE_ETH_RSS_UDP);
      if (hf != 0) {
        conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
        conf.rx_adv_conf.rss_conf.rss_hf = hf;
      }
      // Without RSS offloads the PMD spreads frames over its queues itself (see
      // spreads_without_rss) or, asked for several queues, fills queue 0 only.
    }
    conf.rxmode.offloads =
        info.rx_offload_capa & (RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM);
    // DPDK 22.11's memif reports a 1518-byte maximum frame, yet its copy path spreads any frame
    // over as many ring buffers as it needs and never checks an MTU: larger blocks work there with
    // the default MTU (ina-dpdk-bench --mode memif at 1024 elements, 4170-byte frames).
    if (max_frame > RTE_ETHER_MAX_LEN && !memif) {
      conf.rxmode.mtu = static_cast<uint32_t>(max_frame - RTE_ETHER_HDR_LEN);
      if (info.max_mtu < conf.rxmode.mtu) {
        return invalid_argument("dpdk: blocks of this size need an MTU of " +
                                std::to_string(conf.rxmode.mtu) + "; the port allows " +
                                std::to_string(info.max_mtu) + ": use smaller --block-elems");
      }
    }
    rc = rte_eth_dev_configure(port, a->rx_queues_, static_cast<uint16_t>(n), &conf);
    if (rc != 0) return dpdk_error("rte_eth_dev_configure", rc);
    uint16_t rxd = opts.rx_desc, txd = opts.tx_desc;
    rc = rte_eth_dev_adjust_nb_rx_tx_desc(port, &rxd, &txd);
    if (rc != 0) return dpdk_error("rte_eth_dev_adjust_nb_rx_tx_desc", rc);
    for (uint16_t q = 0; q < a->rx_queues_; ++q) {
      rc = rte_eth_rx_queue_setup(port, q, rxd, rte_eth_dev_socket_id(port), nullptr, a->pool_);
      if (rc != 0) return dpdk_error("rte_eth_rx_queue_setup", rc);
    }
    for (uint16_t q = 0; q < n; ++q) {
      rc = rte_eth_tx_queue_setup(port, q, txd, rte_eth_dev_socket_id(port), nullptr);
      if (rc != 0) return dpdk_error("rte_eth_tx_queue_setup", rc);
    }
    rc = rte_eth_dev_start(port);
    if (rc != 0) return dpdk_error("rte_eth_dev_start", rc);
    a->port_started_ = true;
  } else {
    if (info.nb_tx_queues < n) {
      return invalid_argument("dpdk: port has " + std::to_string(info.nb_tx_queues) +
                              " tx queues configured, fewer than the " + std::to_string(n) +
                              " worker lcores");
    }
    // The caller chose the queues: every configured rx queue is polled (up to one per lcore).
    const unsigned polled = opts.rx_queues != 0 ? want_rx : n;
    a->rx_queues_ = static_cast<uint16_t>(std::min<unsigned>(polled, info.nb_rx_queues));
  }

  // A burst of frames can each complete a slot whose result goes to every rank; send() flushes
  // the tx array when it is full, so large worlds only cap it.
  size_t max_world = 1;
  for (const JobConfig& j : jobs) max_world = std::max<size_t>(max_world, j.slots.world_size);
  const size_t tx_cap =
      std::clamp<size_t>(size_t{opts.burst} * (max_world + 1), 2 * kMaxBurst, 65536);

  // memif carries only the queue pairs its peer connects (libina's DPDK transport: one), taken to
  // be the rx queues polled: an lcore beyond them has no tx queue the peer reads, so its replies go
  // to lcore 0 through a ring and out on queue 0.
  const unsigned tx_lcores = memif ? std::max<unsigned>(a->rx_queues_, 1) : n;
  a->tx_rings_.assign(n, nullptr);
  for (unsigned i = tx_lcores; i < n; ++i) {
    const std::string name = "ina_t" + std::to_string(inst) + "_" + std::to_string(i);
    // Room for a whole tx array (RING_F_EXACT_SZ: capacity tx_cap).
    rte_ring* r = rte_ring_create(name.c_str(), static_cast<unsigned>(tx_cap), rte_socket_id(),
                                  RING_F_SP_ENQ | RING_F_SC_DEQ | RING_F_EXACT_SZ);
    if (r == nullptr) return dpdk_error("tx handoff ring " + name, rte_errno);
    a->tx_rings_[i] = r;
  }
  if (tx_lcores < n) {
    INA_INFO(kComponent, "net_memif: %u worker lcores, %u queue pair(s); the replies of lcores %u.."
             "%u go out through lcore 0's queue", n, tx_lcores, tx_lcores, n - 1);
  }

  a->local_.ip = opts.ip;
  a->local_.udp_port = opts.udp_port;
  if (opts.mac_set) {
    a->local_.mac = opts.mac;
  } else {
    rte_ether_addr ea{};
    rc = rte_eth_macaddr_get(port, &ea);
    if (rc != 0) return dpdk_error("rte_eth_macaddr_get", rc);
    std::memcpy(a->local_.mac.data(), ea.addr_bytes, 6);
  }

  // Handoff rings, one per ordered pair of lcores.
  a->rings_.assign(size_t{n} * n, nullptr);
  if (n > 1) {
    for (unsigned s = 0; s < n; ++s) {
      for (unsigned d = 0; d < n; ++d) {
        if (s == d) continue;
        const std::string name =
            "ina_h" + std::to_string(inst) + "_" + std::to_string(s) + "_" + std::to_string(d);
        rte_ring* r = rte_ring_create(name.c_str(), opts.handoff_ring, rte_socket_id(),
                                      RING_F_SP_ENQ | RING_F_SC_DEQ);
        if (r == nullptr) return dpdk_error("handoff ring " + name, rte_errno);
        a->rings_[size_t{s} * n + d] = r;
      }
    }
  }

  for (unsigned i = 0; i < n; ++i) {
    auto l = std::make_unique<Lcore>();
    l->self = a.get();
    l->idx = i;
    l->lcore_id = workers[i];
    l->has_rxq = i < a->rx_queues_;
    l->queue = static_cast<uint16_t>(i);
    l->engine = std::make_unique<Engine>();
    l->engine->set_slot_capacity(opts.slot_capacity);
    l->apply_jobs(jobs);
    if (!l->job_errors.empty()) {
      const auto& [job, err] = *l->job_errors.begin();
      return invalid_argument("dpdk: job " + std::to_string(job) + ": " + err);
    }
    l->in.assign(n, nullptr);
    l->out.assign(n, nullptr);
    for (unsigned o = 0; o < n; ++o) {
      l->in[o] = a->rings_[size_t{o} * n + i];
      l->out[o] = a->rings_[size_t{i} * n + o];
    }
    l->tx_out = a->tx_rings_[i];
    if (i == 0) {
      for (rte_ring* r : a->tx_rings_) {
        if (r != nullptr) l->tx_in.push_back(r);
      }
    }
    l->stage.assign(n, {});
    for (auto& s : l->stage) s.reserve(kMaxBurst);
    l->tx.assign(tx_cap, nullptr);
    a->lcores_.push_back(std::move(l));
  }
  a->board_ = std::make_unique<SnapshotBoard>(n, "lcores");
  for (auto& l : a->lcores_) a->board_->put(l->idx, l->take_snapshot());
  a->board_->publish(now_ns(CLOCK_MONOTONIC), /*log_changes=*/false);  // main() reports the jobs
  return a;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

std::string spread_lcores(unsigned count) {
  const std::vector<int> cpus = allowed_cpus();
  std::string map;
  for (unsigned l = 0; l < count; ++l) {
    if (l) map += ",";
    map += std::to_string(l) + "@" + std::to_string(cpus[l % cpus.size()]);
  }
  return map;
}

DpdkAggregator::~DpdkAggregator() {
  stop();
  std::vector<rte_ring*> all = rings_;
  all.insert(all.end(), tx_rings_.begin(), tx_rings_.end());
  for (rte_ring* r : all) {
    if (r == nullptr) continue;
    rte_mbuf* m;
    while (rte_ring_dequeue(r, reinterpret_cast<void**>(&m)) == 0) rte_pktmbuf_free(m);
    rte_ring_free(r);
  }
  if (opts_.configure_port && pool_ != nullptr) {
    // Our port: stopped and closed, its queues release their mbufs, then the pool goes.
    if (port_started_) (void)rte_eth_dev_stop(port_);
    (void)rte_eth_dev_close(port_);
    rte_mempool_free(pool_);
  }
  // A port the caller configured may still hold mbufs of the pool in its queues: the pool stays
  // until the EAL is released.
}

Status DpdkAggregator::start() {
  if (running_) return Status(StatusCode::kFailedPrecondition, "dpdk: already running");
  stop_.store(false);
  for (auto& l : lcores_) {
    const int rc = rte_eal_remote_launch(launch, l.get(), l->lcore_id);
    if (rc != 0) {
      stop_.store(true);
      for (auto& o : lcores_) {
        if (o.get() == l.get()) break;
        rte_eal_wait_lcore(o->lcore_id);
      }
      return dpdk_error("rte_eal_remote_launch on lcore " + std::to_string(l->lcore_id), rc);
    }
  }
  running_ = true;
  return ok_status();
}

void DpdkAggregator::stop() {
  if (!running_) return;
  stop_.store(true, std::memory_order_relaxed);
  for (auto& l : lcores_) rte_eal_wait_lcore(l->lcore_id);
  running_ = false;
  // A request posted after an lcore's last pass is handled here, so service() completes it.
  for (auto& l : lcores_) {
    l->answer_mail();
  }
  if (port_started_) {
    (void)rte_eth_dev_stop(port_);
    port_started_ = false;
  }
}

void DpdkAggregator::Lcore::loop() {
  DpdkAggregator& a = *self;
  const uint16_t burst = a.opts_.burst;
  const unsigned n = static_cast<unsigned>(a.lcores_.size());
  rte_mbuf* pkts[kMaxBurst];
  uint64_t last_dropped = 0;
  const uint64_t cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID), wall0 = now_ns(CLOCK_MONOTONIC);
  // busy_tsc without a TSC read per idle poll (24 ns each on some VMs, most of an idle loop):
  // a busy iteration starts where the previous busy one ended, or after its rx burst when the
  // previous iteration was idle (that burst's rx time is then not counted).
  uint64_t busy_from = 0;  // 0: the previous iteration was idle
  while (!a.stop_.load(std::memory_order_relaxed)) {
    answer_mail();
    now = 0;
    uint16_t got = 0;
    if (has_rxq) {
      got = rte_eth_rx_burst(a.port_, queue, pkts, burst);
      if (got != 0 && busy_from == 0) busy_from = rte_rdtsc();
      // The mbufs and frames were written by another core (the PMD's or a peer's): the mbuf
      // headers of the whole burst first, then each frame's headers and payload a few frames
      // ahead of its processing, so that their cache misses overlap.
      for (uint16_t i = 0; i < got; ++i) rte_prefetch0(pkts[i]);
      for (uint16_t i = 0; i < got && i < kPrefetchAhead; ++i) prefetch_frame(pkts[i]);
      for (uint16_t i = 0; i < got; ++i) {
        if (i + kPrefetchAhead < got) prefetch_frame(pkts[i + kPrefetchAhead]);
        on_frame(pkts[i], false);
      }
      c.rx += got;
      if (n > 1) flush_stage();
    }
    for (unsigned s = 0; s < n; ++s) {
      if (in[s] == nullptr) continue;
      const unsigned k = rte_ring_dequeue_burst(in[s], reinterpret_cast<void**>(pkts), burst,
                                                nullptr);
      for (unsigned i = 0; i < k; ++i) rte_prefetch0(pkts[i]);
      for (unsigned i = 0; i < k && i < kPrefetchAhead; ++i) prefetch_frame(pkts[i]);
      for (unsigned i = 0; i < k; ++i) {
        if (i + kPrefetchAhead < k) prefetch_frame(pkts[i + kPrefetchAhead]);
        on_frame(pkts[i], true);
      }
      c.handoff_received += k;
      got = static_cast<uint16_t>(got + k);
    }
    for (rte_ring* r : tx_in) {
      // Replies of lcores without a tx queue the peer reads, sent with ours.
      const size_t room = std::min<size_t>(tx.size() - tx_n, kMaxBurst);
      const unsigned k = rte_ring_dequeue_burst(r, reinterpret_cast<void**>(&tx[tx_n]),
                                                static_cast<unsigned>(room), nullptr);
      tx_n += k;
      got = static_cast<uint16_t>(got + k);
    }
    if (tx_n != 0) flush_tx();
    ++c.polls;
    if (got == 0) {
      ++c.idle_polls;
      busy_from = 0;
    } else {
      const uint64_t tsc = rte_rdtsc();
      if (busy_from != 0) c.busy_tsc += tsc - busy_from;
      busy_from = tsc;
      pub.rx.store(c.rx, std::memory_order_relaxed);
      pub.tx.store(c.tx, std::memory_order_relaxed);
      pub.completed.store(engine->counters().completed, std::memory_order_relaxed);
      const uint64_t dropped = fc.dropped() + engine->counters().malformed + c.tx_dropped +
                               c.handoff_dropped + c.multi_segment;
      if (dropped != last_dropped) {
        pub.dropped.store(dropped, std::memory_order_relaxed);
        last_dropped = dropped;
      }
      pub.handed_off.store(c.handed_off, std::memory_order_relaxed);
    }
  }
  // Frames staged or queued for tx are sent; frames other lcores may still hand over are freed
  // by the destructor.
  flush_tx();
  if (n_recycled > 0) rte_pktmbuf_free_bulk(recycled.data(), n_recycled);
  n_recycled = 0;
  c.cpu_ns += now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
  c.wall_ns += now_ns(CLOCK_MONOTONIC) - wall0;
}

// `verified`: handed over by another lcore, which classified it and checked its checksums.
void DpdkAggregator::Lcore::on_frame(rte_mbuf* m, bool verified) {
  DpdkAggregator& a = *self;
  if (m->nb_segs != 1) [[unlikely]] {
    ++c.multi_segment;
    rte_pktmbuf_free(m);
    return;
  }
  uint8_t* data = rte_pktmbuf_mtod(m, uint8_t*);
  frame::Parsed p;
  const frame::RxOffload off =
      verified ? frame::RxOffload{frame::HwCheck::kGood, frame::HwCheck::kGood}
               : frame::rx_offload(m->ol_flags);
  const frame::Verdict v =
      frame::classify(std::span<const uint8_t>(data, m->data_len), a.local_, off, &p);
  if (!verified) fc.add(v);
  switch (v) {
    case frame::Verdict::kIna:
      break;
    case frame::Verdict::kArpRequest:
      set_len(m, frame::arp_reply(data, p, a.local_));
      send(m);
      return;
    case frame::Verdict::kIcmpEcho:
      if (rte_mbuf_refcnt_read(m) != 1 || RTE_MBUF_CLONED(m)) [[unlikely]] {
        rte_pktmbuf_free(m);  // never write into a shared buffer
        return;
      }
      set_len(m, frame::icmp_echo_reply(data, p, a.local_));
      send(m);
      return;
    default:
      rte_pktmbuf_free(m);
      return;
  }
  const std::span<const uint8_t> ina = p.ina;
  const bool hello =
      ina.size() >= wire::kHeaderSize && (ina[wire::kOffFlags] & wire::kFlagHello) != 0;
  const unsigned n = static_cast<unsigned>(a.lcores_.size());
  if (n > 1 && !verified && ina.size() >= wire::kHeaderSize) {
    if (hello) {
      // Every lcore runs the join barrier: each gets a copy (rare: once per rank and incarnation).
      for (unsigned d = 0; d < n; ++d) {
        if (d == idx) continue;
        rte_mbuf* cp = rte_pktmbuf_copy(m, a.pool_, 0, UINT32_MAX);
        if (cp == nullptr) {
          ++c.no_mbuf;
          continue;
        }
        if (rte_ring_enqueue(out[d], cp) != 0) {
          ++c.handoff_dropped;
          rte_pktmbuf_free(cp);
        } else {
          ++c.handed_off;
        }
      }
    } else {
      const uint16_t slot = wire::get_u16(ina.data() + wire::kOffSlot) & wire::kMaxSlot;
      const unsigned owner = slot % n;
      if (owner != idx) {
        stage[owner].push_back(m);
        if (stage[owner].size() == stage[owner].capacity()) flush_stage();
        return;
      }
    }
  }
  process_ina(m, p, hello, hello && verified);
}

void DpdkAggregator::Lcore::process_ina(rte_mbuf* m, const frame::Parsed& p, bool hello,
                                        bool hello_copy) {
  DpdkAggregator& a = *self;
  int32_t rank = -1;
  JobId job = 0;
  if (a.opts_.telemetry && now == 0) now = now_ns(CLOCK_MONOTONIC);
  const Reply r = engine->on_packet(p.ina, now, &rank, &job, hello_copy);
  std::vector<Peer>* peers = nullptr;
  if (rank >= 0) {
    peers = book.find(job);
    if (peers != nullptr) {
      Peer& pe = (*peers)[static_cast<size_t>(rank)];
      if (!pe.known || pe.ep.ip != p.src_ip || pe.ep.port != p.src_port ||
          !same_mac(pe.ep.mac, p.src_mac)) [[unlikely]] {
        pe.known = true;
        pe.ep = frame::Endpoint{p.src_mac, p.src_ip, p.src_port};
        pe.hdr = frame::UdpHeaderTemplate(
            frame::Endpoint{a.local_.mac, a.local_.ip, a.local_.udp_port}, pe.ep);
      }
    }
  }
  // Only lcore 0 answers HELLOs (every lcore saw them).
  if (r.target == Reply::Target::kNone || (hello && idx != 0)) {
    recycle(m);
    return;
  }
  const size_t len = r.packet_size();
  const size_t flen = frame::kUdpHeadroom + len;
  if (rte_mbuf_refcnt_read(m) != 1 || RTE_MBUF_CLONED(m) ||
      flen > static_cast<size_t>(m->buf_len - m->data_off)) [[unlikely]] {
    // Never write into a shared buffer; a reply larger than the room left needs a fresh mbuf.
    rte_mbuf* fresh = rte_pktmbuf_alloc(a.pool_);
    if (fresh == nullptr || flen > rte_pktmbuf_tailroom(fresh)) {
      if (fresh == nullptr) ++c.no_mbuf; else ++c.reply_too_big;
      rte_pktmbuf_free(fresh);
      rte_pktmbuf_free(m);
      return;
    }
    rte_pktmbuf_free(m);
    m = fresh;
  }
  uint8_t* data = rte_pktmbuf_mtod(m, uint8_t*);
  uint8_t* dg = data + frame::kUdpHeadroom;
  wire::encode_header(r.hdr, dg);
  // The payload is copied and summed for the UDP checksum in one pass (frame.h); then the tag is
  // sealed over dg[0, len) and the header, tag included, summed. One sealed frame serves a
  // multicast: the tag does not cover the addresses.
  const uint32_t payload_sum =
      r.payload_bytes() > 0
          ? frame::copy_sum16(dg + wire::kHeaderSize, r.payload, r.payload_bytes())
          : 0;
  wire::seal(std::span<uint8_t>(dg, len), r.key);
  const uint32_t sum = frame::sum16(dg, wire::kHeaderSize, payload_sum);

  if (r.target == Reply::Target::kSender) {
    set_len(m, frame::udp_reply(data, p, a.local_, len, sum, ip_id++));
    send(m);
    return;
  }
  // To every rank whose address is known; the received mbuf goes to the last one.
  if (peers == nullptr) peers = book.find(r.hdr.job);
  int last = -1;
  if (peers != nullptr) {
    for (size_t k = peers->size(); k-- > 0;) {
      if ((*peers)[k].known) {
        last = static_cast<int>(k);
        break;
      }
    }
  }
  if (last < 0) {
    c.unroutable += peers != nullptr ? peers->size() : 1;
    rte_pktmbuf_free(m);
    return;
  }
  if (a.opts_.indirect_multicast) {
    // m becomes the datagram alone; each rank gets a header mbuf chained to a clone of it (the
    // last rank to m itself).
    set_len(m, flen);
    rte_pktmbuf_adj(m, static_cast<uint16_t>(frame::kUdpHeadroom));
    for (int k = 0; k <= last; ++k) {
      const Peer& pe = (*peers)[static_cast<size_t>(k)];
      if (!pe.known) {
        ++c.unroutable;
        continue;
      }
      rte_mbuf* h = reply_mbuf();
      rte_mbuf* seg = k == last ? m : rte_pktmbuf_clone(m, a.pool_);
      if (h == nullptr || seg == nullptr) [[unlikely]] {
        ++c.no_mbuf;
        rte_pktmbuf_free(h);
        if (seg != m) rte_pktmbuf_free(seg);
        if (k == last) rte_pktmbuf_free(m);
        continue;
      }
      set_len(h, pe.hdr.write(rte_pktmbuf_mtod(h, uint8_t*), len, sum, ip_id++) - len);
      if (rte_pktmbuf_chain(h, seg) != 0) [[unlikely]] {
        ++c.reply_too_big;
        rte_pktmbuf_free(h);
        if (seg != m) rte_pktmbuf_free(seg);
        if (k == last) rte_pktmbuf_free(m);
        continue;
      }
      send(h);
    }
    return;
  }
  for (int k = 0; k < last; ++k) {
    const Peer& pe = (*peers)[static_cast<size_t>(k)];
    if (!pe.known) {
      ++c.unroutable;
      continue;
    }
    rte_mbuf* cp = reply_mbuf();
    if (cp == nullptr) [[unlikely]] {
      ++c.no_mbuf;
      continue;
    }
    uint8_t* cd = rte_pktmbuf_mtod(cp, uint8_t*);
    rte_memcpy(cd + frame::kUdpHeadroom, dg, len);
    set_len(cp, pe.hdr.write(cd, len, sum, ip_id++));
    send(cp);
  }
  set_len(m, (*peers)[static_cast<size_t>(last)].hdr.write(data, len, sum, ip_id++));
  send(m);
}

void DpdkAggregator::Lcore::recycle(rte_mbuf* m) {
  // Only a plain single-segment mbuf of our own, large enough for any reply.
  if (n_recycled < kRecycle && rte_mbuf_refcnt_read(m) == 1 && RTE_MBUF_DIRECT(m) &&
      m->nb_segs == 1 && m->buf_len >= RTE_PKTMBUF_HEADROOM + self->max_frame()) {
    recycled[n_recycled++] = m;
    return;
  }
  rte_pktmbuf_free(m);
}

rte_mbuf* DpdkAggregator::Lcore::reply_mbuf() {
  if (n_recycled == 0) return rte_pktmbuf_alloc(self->pool_);
  rte_mbuf* m = recycled[--n_recycled];
  // rte_pktmbuf_reset() minus its stores to the mbuf's second cache line (next, tx_offload), which
  // the receive path never touched and which is often cold (written by another core's pool
  // refill): recycle() takes only direct single-segment mbufs, whose next is already NULL and
  // nb_segs 1, and with ol_flags 0 no PMD reads tx_offload.
  m->ol_flags = 0;
  m->packet_type = 0;
  m->vlan_tci = 0;
  m->vlan_tci_outer = 0;
  m->port = RTE_MBUF_PORT_INVALID;
  rte_pktmbuf_reset_headroom(m);
  m->data_len = 0;
  m->pkt_len = 0;
  return m;
}

void DpdkAggregator::Lcore::send(rte_mbuf* m) {
  if (tx_n == tx.size()) flush_tx();
  tx[tx_n++] = m;
}

void DpdkAggregator::Lcore::flush_tx() {
  DpdkAggregator& a = *self;
  if (tx_out != nullptr) {
    const unsigned k = rte_ring_enqueue_burst(tx_out, reinterpret_cast<void* const*>(tx.data()),
                                              static_cast<unsigned>(tx_n), nullptr);
    c.tx_handed_off += k;
    for (size_t i = k; i < tx_n; ++i) {
      ++c.tx_dropped;
      rte_pktmbuf_free(tx[i]);
    }
    tx_n = 0;
    return;
  }
  size_t done = 0;
  int idle = 0;
  while (done < tx_n) {
    const uint16_t want = static_cast<uint16_t>(std::min<size_t>(tx_n - done, kMaxBurst));
    const uint16_t k = rte_eth_tx_burst(a.port_, queue, &tx[done], want);
    done += k;
    if (k == 0 && ++idle > 3) break;  // the queue is full: drop the rest
  }
  c.tx += done;
  for (size_t i = done; i < tx_n; ++i) {
    ++c.tx_dropped;
    rte_pktmbuf_free(tx[i]);
  }
  tx_n = 0;
}

void DpdkAggregator::Lcore::flush_stage() {
  for (size_t d = 0; d < stage.size(); ++d) {
    auto& s = stage[d];
    if (s.empty()) continue;
    const unsigned k = rte_ring_enqueue_burst(out[d], reinterpret_cast<void* const*>(s.data()),
                                              static_cast<unsigned>(s.size()), nullptr);
    c.handed_off += k;
    for (size_t i = k; i < s.size(); ++i) {
      ++c.handoff_dropped;
      rte_pktmbuf_free(s[i]);
    }
    s.clear();
  }
}

// The lcore's side of the mailbox (or the main lcore's while the loops do not run).
void DpdkAggregator::Lcore::handle_mail() {
  if (mail.has_jobs) apply_jobs(mail.jobs);
  mail.snap = take_snapshot();
}

void DpdkAggregator::Lcore::answer_mail() {
  const uint64_t posted = mail.posted.load(std::memory_order_acquire);
  if (posted == mail_seen) [[likely]] return;
  handle_mail();
  mail_seen = posted;
  mail.done.store(posted, std::memory_order_release);
}

// The jobs on this lcore's engine and address book (backend_shell.h), with the DPDK loop's limits.
void DpdkAggregator::Lcore::apply_jobs(const std::vector<JobConfig>& desired) {
  JobHooks h;
  h.admit = [this](const JobConfig& j) -> Status {
    if (wire::max_data_packet_size(j.slots.max_payload_bytes, 1) > self->max_packet_) {
      return invalid_argument("block of " + std::to_string(j.slots.max_payload_bytes) +
                              " bytes exceeds this aggregator's mbufs (max_payload_bytes)");
    }
    if (j.is_leaf()) {
      return invalid_argument("a tree leaf (parent " + j.tree.parent +
                              ") needs --backend udp: the DPDK loop has no route to a parent");
    }
    return ok_status();
  };
  h.removed = [this](JobId job) { book.erase(job); };
  h.added = [this](const JobConfig& j) { book.reset(j.job, j.slots.world_size); };
  job_errors = reconcile_jobs(*engine, desired, h);
}

AggregatorSnapshot DpdkAggregator::Lcore::take_snapshot() const {
  const uint64_t stall_ns =
      static_cast<uint64_t>(std::chrono::nanoseconds(self->opts_.stall_after).count());
  // Not ranked: merge_snapshots ranks the stragglers of every job from the summed telemetry.
  AggregatorSnapshot s = engine_snapshot(*engine, now_ns(CLOCK_MONOTONIC), stall_ns,
                                         /*with_ranking=*/false);
  s.tx_datagrams = c.tx;
  s.send_errors = c.tx_dropped;
  s.unroutable = c.unroutable;
  s.job_errors = job_errors;
  return s;
}

void DpdkAggregator::set_jobs(std::vector<JobConfig> jobs) {
  std::lock_guard<std::mutex> g(ctl_mu_);
  desired_ = std::move(jobs);
  ++desired_gen_;
}

AggregatorSnapshot DpdkAggregator::snapshot() const { return board_->snapshot(); }

void DpdkAggregator::service(std::chrono::milliseconds snapshot_every) {
  using Clock = std::chrono::steady_clock;
  if (round_open_) {
    for (auto& l : lcores_) {
      if (l->mail.done.load(std::memory_order_acquire) != round_) return;  // not yet
    }
    std::vector<AggregatorSnapshot> parts;
    for (auto& l : lcores_) parts.push_back(std::move(l->mail.snap));
    publish(std::move(parts));
    round_open_ = false;
  }
  std::vector<JobConfig> jobs;
  bool jobs_due = false;
  {
    std::lock_guard<std::mutex> g(ctl_mu_);
    if (desired_gen_ != delivered_gen_) {
      jobs = desired_;
      delivered_gen_ = desired_gen_;
      jobs_due = true;
    }
  }
  const auto t = Clock::now();
  const bool snap_due = snapshot_every.count() > 0 && t >= next_snapshot_;
  if (!jobs_due && !snap_due) return;
  if (snap_due) next_snapshot_ = t + snapshot_every;
  if (!running_) {
    // No loop runs: this thread owns every lcore's state.
    std::vector<AggregatorSnapshot> parts;
    for (auto& l : lcores_) {
      if (jobs_due) l->apply_jobs(jobs);
      parts.push_back(l->take_snapshot());
    }
    publish(std::move(parts));
    return;
  }
  ++round_;
  for (auto& l : lcores_) {
    l->mail.has_jobs = jobs_due;
    if (jobs_due) l->mail.jobs = jobs;
    l->mail.posted.store(round_, std::memory_order_release);
  }
  round_open_ = true;
}

void DpdkAggregator::publish(std::vector<AggregatorSnapshot> parts) {
  for (size_t i = 0; i < parts.size(); ++i) board_->put(i, std::move(parts[i]));
  board_->publish(now_ns(CLOCK_MONOTONIC));
}

uint64_t DpdkAggregator::rx_frames(unsigned i) const {
  return lcores_.at(i)->pub.rx.load(std::memory_order_relaxed);
}

std::string DpdkAggregator::format_lcore_counters() const {
  std::string s;
  char line[200];
  for (const auto& l : lcores_) {
    std::snprintf(line, sizeof line,
                  "lcore %u (q%u%s): rx %" PRIu64 " tx %" PRIu64 " completed %" PRIu64
                  " handed_off %" PRIu64 " dropped %" PRIu64 "\n",
                  l->lcore_id, unsigned{l->queue}, l->has_rxq ? "" : " tx only",
                  l->pub.rx.load(std::memory_order_relaxed),
                  l->pub.tx.load(std::memory_order_relaxed),
                  l->pub.completed.load(std::memory_order_relaxed),
                  l->pub.handed_off.load(std::memory_order_relaxed),
                  l->pub.dropped.load(std::memory_order_relaxed));
    s += line;
  }
  return s;
}

const Engine& DpdkAggregator::engine(unsigned i) const { return *lcores_.at(i)->engine; }
const frame::Counters& DpdkAggregator::frame_counters(unsigned i) const {
  return lcores_.at(i)->fc;
}
const DpdkLoopCounters& DpdkAggregator::loop_counters(unsigned i) const {
  return lcores_.at(i)->c;
}

frame::Counters DpdkAggregator::frame_totals() const {
  frame::Counters t;
  for (const auto& l : lcores_) {
    for (size_t i = 0; i < t.by_verdict.size(); ++i) t.by_verdict[i] += l->fc.by_verdict[i];
  }
  return t;
}

EngineCounters DpdkAggregator::engine_totals() const {
  EngineCounters t;
  for (const auto& l : lcores_) {
    add_counters(t, l->engine->counters());
  }
  return t;
}

DpdkLoopCounters DpdkAggregator::loop_totals() const {
  DpdkLoopCounters t;
  for (const auto& l : lcores_) {
    const DpdkLoopCounters& c = l->c;
    t.rx += c.rx;
    t.tx += c.tx;
    t.tx_dropped += c.tx_dropped;
    t.handed_off += c.handed_off;
    t.handoff_received += c.handoff_received;
    t.handoff_dropped += c.handoff_dropped;
    t.tx_handed_off += c.tx_handed_off;
    t.no_mbuf += c.no_mbuf;
    t.multi_segment += c.multi_segment;
    t.unroutable += c.unroutable;
    t.reply_too_big += c.reply_too_big;
    t.polls += c.polls;
    t.idle_polls += c.idle_polls;
    t.busy_tsc += c.busy_tsc;
  }
  return t;
}

std::string DpdkAggregator::format_counters() const {
  const DpdkLoopCounters lt = loop_totals();
  const frame::Counters ft = frame_totals();
  CounterTable t(/*omit_zero=*/true);
  t.section("totals (all lcores; zero counters omitted):");
  t.row("rx_frames", lt.rx);
  t.row("tx_frames", lt.tx);
  t.row("tx_dropped", lt.tx_dropped);
  t.row("handed_off", lt.handed_off);
  t.row("handoff_dropped", lt.handoff_dropped);
  t.row("tx_handed_off", lt.tx_handed_off);
  t.row("no_mbuf", lt.no_mbuf);
  t.row("multi_segment", lt.multi_segment);
  t.row("unroutable", lt.unroutable);
  t.row("reply_too_big", lt.reply_too_big);
  t.section("frames by verdict:");
  for (size_t i = 0; i < ft.by_verdict.size(); ++i) {
    t.row(std::string(frame::verdict_name(static_cast<frame::Verdict>(i))), ft.by_verdict[i]);
  }
  // The engines' counters summed over lcores (a HELLO is counted by the lcore that received it,
  // not by the others its copies reach).
  std::vector<AggregatorSnapshot> parts;
  for (const auto& l : lcores_) parts.push_back(l->take_snapshot());
  const AggregatorSnapshot all = merge_snapshots(parts);
  t.engine(all.engine, "engine (all lcores):");
  t.section("per lcore:");
  char line[200];
  for (const auto& l : lcores_) {
    const EngineCounters& le = l->engine->counters();
    std::snprintf(line, sizeof line,
                  "  lcore %u: rx %" PRIu64 " tx %" PRIu64 " ina %" PRIu64 " completed %" PRIu64
                  " handed_off %" PRIu64 " received_handoff %" PRIu64,
                  l->lcore_id, l->c.rx, l->c.tx, le.packets_in, le.completed, l->c.handed_off,
                  l->c.handoff_received);
    t.line(line);
  }
  // A rank's address as any lcore learned it.
  t.ranks(all, [this](JobId job, size_t r) -> std::string {
    for (const auto& l : lcores_) {
      const std::vector<Peer>* p = std::as_const(l->book).find(job);
      if (p == nullptr || r >= p->size() || !(*p)[r].known) continue;
      const frame::Endpoint& ep = (*p)[r].ep;
      char b[32];
      std::snprintf(b, sizeof b, "%u.%u.%u.%u:%u", ep.ip >> 24, (ep.ip >> 16) & 0xFF,
                    (ep.ip >> 8) & 0xFF, ep.ip & 0xFF, unsigned{ep.port});
      return b;
    }
    return "-";
  });
  return t.text();
}

}  // namespace ina::agg
