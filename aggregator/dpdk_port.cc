// DPDK backend (see dpdk_backend.h): setup and teardown. The EAL (init, cleanup, an lcore map over
// the CPUs this process may use), and DpdkAggregator::create in named steps: the options checked,
// the port found, the worker lcores picked, the mbuf pool sized for the largest frame, the port's
// queues (RSS, checksum offloads, MTU) configured and started, the tx handoff rings (net_memif),
// our addresses, the handoff rings between lcores and one Lcore per worker; then the destructor,
// which frees what create made.
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "aggregator/dpdk_backend.h"
#include "aggregator/dpdk_lcore.h"
#include "ina/base/log.h"
#include "ina/protocol/wire.h"

namespace ina::agg {

using dpdk::dpdk_error;
using dpdk::kComponent;
using dpdk::kMaxBurst;
using dpdk::now_ns;

namespace {
std::atomic<unsigned> g_instance{0};  // unique names of pools and rings

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

// What create() can check before it touches the EAL: the jobs (or max_payload_bytes), --ip and
// the burst.
Status check_options(const DpdkOptions& opts, const std::vector<JobConfig>& jobs) {
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
  return ok_status();
}

// DpdkOptions::port: by name, else by number (empty: port 0).
Result<uint16_t> find_port(const std::string& name) {
  uint16_t port = 0;
  if (!name.empty()) {
    if (rte_eth_dev_get_port_by_name(name.c_str(), &port) != 0) {
      char* end = nullptr;
      const unsigned long v = std::strtoul(name.c_str(), &end, 10);
      if (end == name.c_str() || *end != '\0' || v > UINT16_MAX) {
        return invalid_argument("dpdk: port '" + name +
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
  return port;
}

// DpdkOptions::lcores: the first `want` worker lcores (0: every one); at least one.
Result<std::vector<unsigned>> worker_lcores(unsigned want) {
  std::vector<unsigned> workers;
  unsigned lc;
  RTE_LCORE_FOREACH_WORKER(lc) {
    if (want == 0 || workers.size() < want) workers.push_back(lc);
  }
  if (workers.empty()) {
    return invalid_argument(
        "dpdk: no worker lcore: give the EAL at least two lcores (e.g. -l 0-1); the main lcore "
        "prints counters, the workers run the data plane");
  }
  return workers;
}

}  // namespace

namespace dpdk {
// Float SUM's PARTIAL words: up to wire::kMaxPartialGrowth times the block.
size_t job_packet_size(const JobConfig& j, size_t world) {
  return j.tree.role == TreeRole::kRoot
             ? wire::max_packet_size(j.slots.max_payload_bytes, world)
             : wire::max_data_packet_size(j.slots.max_payload_bytes, world);
}
}  // namespace dpdk

namespace {

// Largest packet: headers + the largest packet of any job, or of the largest block set_jobs may
// bring (DpdkOptions::max_payload_bytes, DATA-sized: a root that comes later with PARTIAL words
// needs it set to kMaxPartialGrowth times its block). Jobs from set_jobs: their control replies
// for worlds up to 65535 ranks are sent from fresh mbufs when they outgrow the block (send path),
// as in v1.
size_t max_packet_size(const DpdkOptions& opts, const std::vector<JobConfig>& jobs) {
  size_t max_packet = opts.max_payload_bytes == 0
                          ? wire::control_packet_size(2)
                          : wire::max_data_packet_size(opts.max_payload_bytes, 1);
  for (const JobConfig& j : jobs) {
    max_packet = std::max(max_packet, dpdk::job_packet_size(j, j.slots.world_size));
  }
  return max_packet;
}

// DpdkOptions::mbufs of room for a frame of `max_frame` bytes (2048 at least), on the port's
// socket.
Result<rte_mempool*> create_pool(const std::string& name, uint32_t mbufs, size_t max_frame,
                                 uint16_t port) {
  const uint16_t data_room =
      static_cast<uint16_t>(RTE_PKTMBUF_HEADROOM + std::max<size_t>(max_frame + 4, 2048));
  rte_mempool* pool =
      rte_pktmbuf_pool_create(name.c_str(), mbufs, 256, 0, data_room, rte_eth_dev_socket_id(port));
  if (pool == nullptr) return dpdk_error("mbuf pool " + name, rte_errno);
  return pool;
}

// DpdkOptions::rx_queues: one rx queue per lcore where the port can spread frames over them (RSS
// offloads, or a PMD that spreads by itself), else one; an explicit opts.rx_queues wins.
unsigned wanted_rx_queues(const rte_eth_dev_info& info, const DpdkOptions& opts, unsigned n) {
  const bool spreads = (info.flow_type_rss_offloads & (RTE_ETH_RSS_IP | RTE_ETH_RSS_UDP)) != 0 ||
                       spreads_without_rss(info.driver_name);
  return opts.rx_queues != 0 ? std::min<unsigned>(opts.rx_queues, n) : (spreads ? n : 1);
}

// The port's configuration: RSS over `rx_queues`, the checksum offloads it has, and the MTU that
// frames of `max_frame` bytes need (DpdkOptions::max_payload_bytes, the jobs' blocks).
Result<rte_eth_conf> port_conf(const rte_eth_dev_info& info, uint16_t rx_queues, size_t max_frame,
                               bool memif, bool chains) {
  rte_eth_conf conf{};
  if (chains) conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
  if (rx_queues > 1) {
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
  return conf;
}

// Configures `rx_queues` rx queues (DpdkOptions::rx_desc each, filled from `pool`) and `n` tx
// queues (tx_desc each) on the port.
Status setup_queues(uint16_t port, const rte_eth_conf& conf, uint16_t rx_queues, unsigned n,
                    const DpdkOptions& opts, rte_mempool* pool) {
  int rc = rte_eth_dev_configure(port, rx_queues, static_cast<uint16_t>(n), &conf);
  if (rc != 0) return dpdk_error("rte_eth_dev_configure", rc);
  uint16_t rxd = opts.rx_desc, txd = opts.tx_desc;
  rc = rte_eth_dev_adjust_nb_rx_tx_desc(port, &rxd, &txd);
  if (rc != 0) return dpdk_error("rte_eth_dev_adjust_nb_rx_tx_desc", rc);
  for (uint16_t q = 0; q < rx_queues; ++q) {
    rc = rte_eth_rx_queue_setup(port, q, rxd, rte_eth_dev_socket_id(port), nullptr, pool);
    if (rc != 0) return dpdk_error("rte_eth_rx_queue_setup", rc);
  }
  for (uint16_t q = 0; q < n; ++q) {
    rc = rte_eth_tx_queue_setup(port, q, txd, rte_eth_dev_socket_id(port), nullptr);
    if (rc != 0) return dpdk_error("rte_eth_tx_queue_setup", rc);
  }
  return ok_status();
}

// DpdkOptions::configure_port: configures the port for `n` worker lcores and starts it; returns
// the rx queues it has (`want_rx`, at most the port's).
Result<uint16_t> configure_port(uint16_t port, const rte_eth_dev_info& info,
                                const DpdkOptions& opts, unsigned n, unsigned want_rx,
                                size_t max_frame, bool memif, bool chains, rte_mempool* pool) {
  if (info.max_tx_queues < n) {
    return invalid_argument("dpdk: port " + opts.port + " has " +
                            std::to_string(info.max_tx_queues) + " tx queues, fewer than the " +
                            std::to_string(n) + " worker lcores: use fewer lcores");
  }
  const uint16_t rx_queues = static_cast<uint16_t>(std::min<unsigned>(want_rx, info.max_rx_queues));
  INA_ASSIGN_OR_RETURN(const rte_eth_conf conf,
                       port_conf(info, rx_queues, max_frame, memif, chains));
  INA_RETURN_IF_ERROR(setup_queues(port, conf, rx_queues, n, opts, pool));
  const int rc = rte_eth_dev_start(port);
  if (rc != 0) return dpdk_error("rte_eth_dev_start", rc);
  return rx_queues;
}

// The tx offloads the caller enabled on a port it configured (DpdkOptions::configure_port false),
// as its first tx queue reports them (none where the PMD does not say).
uint64_t port_tx_offloads(uint16_t port, const rte_eth_dev_info& info) {
  rte_eth_txq_info q{};
  if (rte_eth_tx_queue_info_get(port, 0, &q) != 0) return 0;
  return q.conf.offloads & info.tx_offload_capa;
}

// DpdkOptions::configure_port false: the rx queues to poll on the port the caller configured
// (every one, up to one per lcore, or `want_rx` when opts.rx_queues asks); it needs a tx queue
// per lcore.
Result<uint16_t> given_rx_queues(const rte_eth_dev_info& info, const DpdkOptions& opts, unsigned n,
                                 unsigned want_rx) {
  if (info.nb_tx_queues < n) {
    return invalid_argument("dpdk: port has " + std::to_string(info.nb_tx_queues) +
                            " tx queues configured, fewer than the " + std::to_string(n) +
                            " worker lcores");
  }
  const unsigned polled = opts.rx_queues != 0 ? want_rx : n;
  return static_cast<uint16_t>(std::min<unsigned>(polled, info.nb_rx_queues));
}

// The tx array of an lcore: a burst of frames can each complete a slot whose result goes to every
// rank; send() flushes the array when it is full, so large worlds only cap it.
size_t tx_array_size(uint16_t burst, const std::vector<JobConfig>& jobs) {
  size_t max_world = 1;
  for (const JobConfig& j : jobs) max_world = std::max<size_t>(max_world, j.slots.world_size);
  return std::clamp<size_t>(size_t{burst} * (max_world + 1), 2 * kMaxBurst, 65536);
}

// memif carries only the queue pairs its peer connects (libina's DPDK transport: one), taken to
// be the rx queues polled: an lcore from `tx_lcores` on has no tx queue the peer reads, so its
// replies go to lcore 0 through a ring (of `tx_cap`, a whole tx array) and out on queue 0.
// `*rings` gets one entry per lcore (nullptr: it sends itself), kept as made for the destructor.
Status create_tx_rings(unsigned inst, unsigned n, unsigned tx_lcores, size_t tx_cap,
                       std::vector<rte_ring*>* rings) {
  rings->assign(n, nullptr);
  for (unsigned i = tx_lcores; i < n; ++i) {
    const std::string name = "ina_t" + std::to_string(inst) + "_" + std::to_string(i);
    // Room for a whole tx array (RING_F_EXACT_SZ: capacity tx_cap).
    rte_ring* r = rte_ring_create(name.c_str(), static_cast<unsigned>(tx_cap), rte_socket_id(),
                                  RING_F_SP_ENQ | RING_F_SC_DEQ | RING_F_EXACT_SZ);
    if (r == nullptr) return dpdk_error("tx handoff ring " + name, rte_errno);
    (*rings)[i] = r;
  }
  if (tx_lcores < n) {
    INA_INFO(kComponent,
             "net_memif: %u worker lcores, %u queue pair(s); the replies of lcores %u.."
             "%u go out through lcore 0's queue",
             n, tx_lcores, tx_lcores, n - 1);
  }
  return ok_status();
}

// Our addresses: DpdkOptions::ip and udp_port, and mac (else the port's own).
Result<frame::LocalConfig> local_address(uint16_t port, const DpdkOptions& opts) {
  frame::LocalConfig local;
  local.ip = opts.ip;
  local.udp_port = opts.udp_port;
  if (opts.mac_set) {
    local.mac = opts.mac;
  } else {
    rte_ether_addr ea{};
    const int rc = rte_eth_macaddr_get(port, &ea);
    if (rc != 0) return dpdk_error("rte_eth_macaddr_get", rc);
    std::memcpy(local.mac.data(), ea.addr_bytes, 6);
  }
  return local;
}

// Handoff rings (DpdkOptions::handoff_ring each), one per ordered pair of lcores: `*rings` gets
// src * n + dst (nullptr where src == dst), kept as made for the destructor.
Status create_handoff_rings(unsigned inst, unsigned n, uint32_t size,
                            std::vector<rte_ring*>* rings) {
  rings->assign(size_t{n} * n, nullptr);
  if (n == 1) return ok_status();
  for (unsigned s = 0; s < n; ++s) {
    for (unsigned d = 0; d < n; ++d) {
      if (s == d) continue;
      const std::string name =
          "ina_h" + std::to_string(inst) + "_" + std::to_string(s) + "_" + std::to_string(d);
      rte_ring* r =
          rte_ring_create(name.c_str(), size, rte_socket_id(), RING_F_SP_ENQ | RING_F_SC_DEQ);
      if (r == nullptr) return dpdk_error("handoff ring " + name, rte_errno);
      (*rings)[size_t{s} * n + d] = r;
    }
  }
  return ok_status();
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

Result<std::unique_ptr<DpdkAggregator>> DpdkAggregator::create(const DpdkOptions& opts,
                                                               const std::vector<JobConfig>& jobs) {
  INA_RETURN_IF_ERROR(check_options(opts, jobs));
  std::unique_ptr<DpdkAggregator> a(new DpdkAggregator());
  a->opts_ = opts;
  const unsigned inst = g_instance.fetch_add(1);
  INA_ASSIGN_OR_RETURN(a->port_, find_port(opts.port));
  const uint16_t port = a->port_;
  INA_ASSIGN_OR_RETURN(const std::vector<unsigned> workers, worker_lcores(opts.lcores));
  const unsigned n = static_cast<unsigned>(workers.size());

  rte_eth_dev_info info{};
  const int rc = rte_eth_dev_info_get(port, &info);
  if (rc != 0) return dpdk_error("rte_eth_dev_info_get", rc);
  const bool memif = info.driver_name != nullptr && std::strcmp(info.driver_name, "net_memif") == 0;

  a->max_packet_ = max_packet_size(opts, jobs);
  const size_t max_frame = a->max_frame();
  INA_ASSIGN_OR_RETURN(a->pool_,
                       create_pool("ina_agg_" + std::to_string(inst), opts.mbufs, max_frame, port));

  // Chains need a port that transmits them: one whose PMD has the multi-segment offload (on a port
  // the caller configured, enabled; a PMD may send only a chain's first segment without it).
  const uint64_t tx_offloads =
      opts.configure_port ? info.tx_offload_capa : port_tx_offloads(port, info);
  a->chains_ = opts.fanout == DpdkOptions::Fanout::kChains ||
               (opts.fanout == DpdkOptions::Fanout::kAuto &&
                (tx_offloads & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0);
  INA_INFO(kComponent, "%s: results to every rank as %s", info.driver_name,
           a->chains_ ? "header + shared datagram chains" : "one copy per rank");
  const unsigned want_rx = wanted_rx_queues(info, opts, n);
  if (opts.configure_port) {
    INA_ASSIGN_OR_RETURN(a->rx_queues_, configure_port(port, info, opts, n, want_rx, max_frame,
                                                       memif, a->chains_, a->pool_));
    a->port_started_ = true;
  } else {
    INA_ASSIGN_OR_RETURN(a->rx_queues_, given_rx_queues(info, opts, n, want_rx));
  }

  const size_t tx_cap = tx_array_size(opts.burst, jobs);
  const unsigned tx_lcores = memif ? std::max<unsigned>(a->rx_queues_, 1) : n;
  INA_RETURN_IF_ERROR(create_tx_rings(inst, n, tx_lcores, tx_cap, &a->tx_rings_));
  INA_ASSIGN_OR_RETURN(a->local_, local_address(port, opts));
  INA_RETURN_IF_ERROR(create_handoff_rings(inst, n, opts.handoff_ring, &a->rings_));

  for (unsigned i = 0; i < n; ++i) {
    INA_ASSIGN_OR_RETURN(std::unique_ptr<Lcore> l,
                         Lcore::make(a.get(), i, workers[i], jobs, tx_cap));
    a->lcores_.push_back(std::move(l));
  }
  a->board_ = std::make_unique<SnapshotBoard>(n, "lcores");
  for (auto& l : a->lcores_) a->board_->put(l->idx, l->take_snapshot());
  a->board_->publish(now_ns(CLOCK_MONOTONIC), /*log_changes=*/false);  // main() reports the jobs
  return a;
}

Result<std::unique_ptr<DpdkAggregator::Lcore>> DpdkAggregator::Lcore::make(
    DpdkAggregator* a, unsigned i, unsigned lcore_id, const std::vector<JobConfig>& jobs,
    size_t tx_cap) {
  const unsigned n = static_cast<unsigned>(a->tx_rings_.size());  // one per worker lcore
  auto l = std::make_unique<Lcore>();
  l->self = a;
  l->idx = i;
  l->lcore_id = lcore_id;
  l->has_rxq = i < a->rx_queues_;
  l->queue = static_cast<uint16_t>(i);
  EngineOptions eo;
  eo.check_tag = a->opts_.check_tag;
  eo.epoch_salt = a->epoch_salt_;
  l->engine = std::make_unique<Engine>(eo);
  l->engine->set_slot_capacity(a->opts_.slot_capacity);
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
  return l;
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

}  // namespace ina::agg
