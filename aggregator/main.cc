// ina-aggregator: the software reduction switch on a kernel UDP socket.
//
//   ina-aggregator --world-size 8 [--port 47474] [--slots 512] [--block-elems 256] [--job 1]
//                  [--key <32 hex digits>] [--stats-interval-ms 5000] ...
//
//   ina-aggregator --backend dpdk --ip 10.0.0.1 [--dpdk-port net_ring0] ... -- <EAL arguments>
//
//   A leaf of a two-level aggregation tree (static configuration; the root is an ordinary
//   aggregator whose --world-size is the number of leaves):
//   ina-aggregator --world-size 8 --parent root:47474 --child-index 1 --rank-base 4 --local-ranks 4
//                  [--parent-world 2]
//
// Either backend serves the one job of --world-size, or the jobs of --controller (then
// --http-port serves /metrics and /v1/telemetry).
//
// Serves one job until SIGINT/SIGTERM, then prints its counters and exits 0.
#include <netinet/in.h>
#include <netinet/udp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "aggregator/port_file.h"
#include "aggregator/udp_backend.h"
#include "aggregator/dpdk_probe.h"
#include "ina/base/log.h"
#include "ina/protocol/wire.h"
#include "ina_config.h"
#if INA_HAVE_DPDK
#include "aggregator/dpdk_main.h"
#endif
#if INA_HAVE_CONTROLLER
#include "aggregator/control_agent.h"
#endif

namespace {

// Set by the signal handler, read by the serving loop: must be lock-free to be signal safe.
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void on_signal(int) { g_stop.store(true, std::memory_order_relaxed); }

bool install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: poll() returns EINTR and the loop sees the flag at once
  return sigaction(SIGINT, &sa, nullptr) == 0 && sigaction(SIGTERM, &sa, nullptr) == 0;
}

// Does this kernel accept a UDP socket option (UDP_GRO is set, UDP_SEGMENT is read)?
bool udp_option_available(int opt, bool set) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int v = 1;
  socklen_t len = sizeof v;
  const bool ok = set ? setsockopt(fd, SOL_UDP, opt, &v, sizeof v) == 0
                      : getsockopt(fd, SOL_UDP, opt, &v, &len) == 0;
  ::close(fd);
  return ok;
}

std::string version_text() {
  std::string s = "ina-aggregator " INA_VERSION "\n";
  s += "  " + ina::features::describe("dpdk", ina::features::probe_dpdk()) + "\n";
  s += std::string("  udp gro: ") +
       (udp_option_available(UDP_GRO, true) ? "available" : "not available") + "\n";
  s += std::string("  udp gso: ") +
       (udp_option_available(UDP_SEGMENT, false) ? "available" : "not available");
  return s;
}

using ina::agg::write_port_file;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ina-aggregator: in-network aggregation (reduction switch) over kernel UDP"};
  app.set_version_flag("--version", version_text);

  ina::agg::UdpOptions opts;
  opts.port = ina::wire::kDefaultPort;
  ina::agg::JobConfig job;
  uint32_t world = 0;
  uint32_t slots = 512;
  uint32_t block = 256;
  std::string key_text;  // empty: no key (the zero key)
  uint32_t stats_ms = 5000;
  std::string port_file;
  std::string log_level;
  bool no_gro = false;
  bool no_gso = false;
  std::string backend = "udp";
  std::string dpdk_port, dpdk_ip, dpdk_mac;
  uint16_t dpdk_burst = 32;
  uint16_t dpdk_rx_queues = 0;
  std::vector<std::string> eal_args;
  std::string parent;
  int64_t child_index = -1, rank_base = -1, local_ranks = -1, parent_world = 0;

  app.add_option("--bind", opts.bind_host, "IPv4 address or host name to bind")
      ->capture_default_str();
  app.add_option("--port", opts.port, "UDP port (0: any free port; see --port-file)")
      ->check(CLI::Range(int64_t{0}, int64_t{65535}))
      ->capture_default_str();
  app.add_option("--port-file", port_file, "write the bound port to this file once listening");
  app.add_option("--world-size", world, "ranks in the job (none: jobs come from --controller)")
      ->check(CLI::Range(int64_t{1}, int64_t{65535}));
  app.add_option("--slots", slots, "slots of the job (each with two copies)")
      ->check(CLI::Range(int64_t{1}, int64_t{ina::wire::kMaxSlot} + 1))
      ->capture_default_str();
  app.add_option("--block-elems", block, "largest block, in 4-byte elements: a block is 4 x this many bytes (that many float32/int32 "
                 "elements per packet, twice as many 16-bit ones)")
      ->check(CLI::Range(int64_t{1}, int64_t{16368}))
      ->capture_default_str();
  app.add_option("--job", job.job, "job id")
      ->check(CLI::Range(int64_t{0}, int64_t{UINT32_MAX}))
      ->capture_default_str();
  app.add_option("--key", key_text,
                 "the job's 128-bit key, 32 hexadecimal digits (every packet's tag is checked with "
                 "it; default: none, the zero key)")
      ->check(CLI::Validator(
          [](std::string& s) {
            ina::Key128 k;
            return ina::parse_key_hex(s, &k)
                       ? std::string{}
                       : "--key: '" + s + "' is not a key: expected 32 hexadecimal digits";
          },
          "KEY"))
      ->capture_default_str();
  app.add_option("--stats-interval-ms", stats_ms, "print counters this often (0: never)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}))
      ->capture_default_str();
  app.add_option("--batch", opts.batch, "datagrams per recvmmsg/sendmmsg")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}))
      ->capture_default_str();
  app.add_option("--threads", opts.threads,
                 "udp: serving threads, one socket each (SO_REUSEPORT, steered by slot); 0: one "
                 "per CPU this process may run on")
      ->check(CLI::Range(0u, ina::agg::kMaxUdpThreads))
      ->capture_default_str();
  app.add_flag("--no-gro", no_gro, "do not use UDP GRO on receive");
  app.add_flag("--no-gso", no_gso, "do not use UDP GSO on send");
  app.add_option("--drop-percent", opts.drop_percent, "test hook: drop received datagrams")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--dup-percent", opts.dup_percent, "test hook: duplicate received datagrams")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--seed", opts.seed, "seed of the test hooks")->capture_default_str();
  bool check_config = false;
  app.add_flag("--check-config", check_config,
               "check the arguments (as a service's ExecStart would pass them), print what would "
               "be served and exit 0 without binding anything (non-zero on a bad argument)");
  app.add_option("--log-level", log_level, "error, warn, info or debug (default: INA_LOG_LEVEL)")
      ->check(CLI::IsMember({"error", "warn", "info", "debug"}));

  app.add_option("--backend", backend, "udp (kernel sockets) or dpdk (EAL arguments after --)")
      ->check(CLI::IsMember({"udp", "dpdk"}))
      ->capture_default_str();
  app.add_option("--dpdk-port", dpdk_port, "dpdk: port name (net_ring0, a PCI address) or number");
  app.add_option("--ip", dpdk_ip, "dpdk: our IPv4 address (answers ARP and ping for it)");
  app.add_option("--mac", dpdk_mac, "dpdk: our MAC address (default: the port's)");
  app.add_option("--burst", dpdk_burst, "dpdk: rx/tx burst size")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--rx-queues", dpdk_rx_queues,
                 "dpdk: rx queues, each polled by its own lcore (0: one per worker lcore, at most "
                 "the port's)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("eal", eal_args, "dpdk: EAL arguments, after --");

  // --parent and --controller: "host:port" with a port in 1..65535.
  const CLI::Validator host_port(
      [](std::string& s) {
        const size_t c = s.rfind(':');
        const int p = c == std::string::npos ? 0 : std::atoi(s.c_str() + c + 1);
        return c != std::string::npos && c > 0 && p >= 1 && p <= 65535
                   ? std::string{}
                   : "'" + s + "' is not host:port (port 1..65535)";
      },
      "HOST:PORT");
  // Aggregation tree leaf (one static job): see the header comment.
  auto* parent_opt =
      app.add_option("--parent", parent,
                     "tree leaf: the root aggregator's data plane (host:port); partial sums go "
                     "there")
          ->check(host_port);
  app.add_option("--child-index", child_index, "tree leaf: this leaf's rank in the root's job")
      ->check(CLI::Range(int64_t{0}, int64_t{65534}));
  app.add_option("--rank-base", rank_base, "tree leaf: first global rank this leaf serves")
      ->check(CLI::Range(int64_t{0}, int64_t{65534}));
  app.add_option("--local-ranks", local_ranks,
                 "tree leaf: how many consecutive global ranks from --rank-base it serves")
      ->check(CLI::Range(int64_t{1}, int64_t{65535}));
  app.add_option("--parent-world", parent_world,
                 "tree leaf: the root's world size (number of leaves; default: learnt from the "
                 "root)")
      ->check(CLI::Range(int64_t{1}, int64_t{65535}));

#if INA_HAVE_CONTROLLER
  ina::agg::AgentOptions agent;
  std::string controller;
  app.add_option("--controller", controller, "register with ina-controller at host:port")
      ->check(host_port);
  [[maybe_unused]] auto* advertise_opt =  // read by the DPDK backend only
      app.add_option("--advertise", agent.advertise_host,
                     "address workers use to reach this aggregator (dpdk: default --ip)")
          ->capture_default_str();
  app.add_option("--slot-capacity", agent.slot_capacity, "slots shared by the controller's jobs")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  app.add_option("--max-fan-in", agent.max_fan_in, "largest world size served")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  app.add_option("--http-port", agent.http_port, "Prometheus /metrics and /v1/telemetry (-1: off, 0: any)")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
  std::string http_port_file;
  app.add_option("--http-port-file", http_port_file, "write the HTTP port here once listening");
  uint32_t heartbeat_ms = 200;
  app.add_option("--heartbeat-ms", heartbeat_ms, "heartbeat period to the controller")
      ->check(CLI::Range(10, 60000))
      ->capture_default_str();
#endif
  CLI11_PARSE(app, argc, argv);
#if INA_HAVE_CONTROLLER
  const bool managed = !controller.empty();
#else
  const bool managed = false;
#endif
  if (world == 0 && !managed) {
    std::fprintf(stderr, "ina-aggregator: --world-size is required (or --controller)\n");
    return 2;
  }
  if (parent_opt->count() == 0) {
    if (child_index >= 0 || rank_base >= 0 || local_ranks >= 0 || parent_world != 0) {
      std::fprintf(stderr, "ina-aggregator: --child-index, --rank-base, --local-ranks and "
                           "--parent-world describe a tree leaf and need --parent host:port\n");
      return 2;
    }
  } else {
    std::string err;
    if (world == 0) {
      err = "--parent describes the --world-size job (a controller sends leaf jobs itself)";
    } else if (child_index < 0 || rank_base < 0 || local_ranks < 0) {
      err = "--parent needs --child-index, --rank-base and --local-ranks";
    } else if (rank_base + local_ranks > int64_t{world}) {
      err = "--rank-base " + std::to_string(rank_base) + " + --local-ranks " +
            std::to_string(local_ranks) + " exceeds --world-size " + std::to_string(world) +
            " (the leaf serves global ranks [rank_base, rank_base + local_ranks))";
    } else if (parent_world != 0 && child_index >= parent_world) {
      err = "--child-index " + std::to_string(child_index) + " must be below --parent-world " +
            std::to_string(parent_world) + " (the root's ranks are its leaves 0.." +
            std::to_string(parent_world - 1) + ")";
    } else if (backend == "dpdk") {
      err = "--parent: a tree leaf needs --backend udp (the DPDK loop does not route to a parent)";
    }
    if (!err.empty()) {
      std::fprintf(stderr, "ina-aggregator: %s\n", err.c_str());
      return 2;
    }
    job.tree.role = ina::agg::TreeRole::kLeaf;
    job.tree.parent = parent;
    job.tree.child_index = static_cast<uint32_t>(child_index);
    job.tree.rank_base = static_cast<uint32_t>(rank_base);
    job.tree.local_ranks = static_cast<uint32_t>(local_ranks);
    job.tree.parent_world = static_cast<uint32_t>(parent_world);
  }

  if (!log_level.empty()) {
    ina::log::Level l;
    if (ina::log::parse_level(log_level.c_str(), &l)) ina::log::set_level(l);
  }
  if (!key_text.empty()) (void)ina::parse_key_hex(key_text, &job.key);  // checked by --key
  job.slots.world_size = world;
  job.slots.num_slots = slots;
  job.slots.max_payload_bytes = block * 4;
  opts.gro = !no_gro;
  opts.gso = !no_gso;
  opts.stats_interval = std::chrono::milliseconds(stats_ms);

  if (!install_signal_handlers()) {
    std::fprintf(stderr, "ina-aggregator: sigaction: %s\n", std::strerror(errno));
    return 1;
  }
#if INA_HAVE_CONTROLLER
  // The agent's settings both backends share (--controller was checked as host:port).
  agent.block_elems = block;
  agent.heartbeat = std::chrono::milliseconds(heartbeat_ms);
  if (managed) {
    const size_t c = controller.rfind(':');
    agent.controller_host = controller.substr(0, c);
    agent.controller_port = static_cast<uint16_t>(std::atoi(controller.c_str() + c + 1));
  }
#endif
  if (backend == "dpdk") {
#if INA_HAVE_DPDK
    ina::agg::DpdkCliOptions d;
    d.port = dpdk_port;
    d.ip = dpdk_ip;
    d.mac = dpdk_mac;
    d.udp_port = opts.port;
    d.burst = dpdk_burst;
    d.rx_queues = dpdk_rx_queues;
    d.stats_ms = stats_ms;
    d.eal_args = eal_args;
    if (world != 0) d.jobs.push_back(job);
#if INA_HAVE_CONTROLLER
    if (managed || agent.http_port >= 0) {
      if (opts.port == 0) {
        std::fprintf(stderr, "ina-aggregator: --port: the DPDK backend needs a fixed UDP port "
                             "(1..65535) to advertise\n");
        return 2;
      }
      if (advertise_opt->count() == 0) agent.advertise_host = dpdk_ip;
      agent.http_bind = "127.0.0.1";  // the HTTP endpoint is on the kernel's loopback
      if (managed) {
        d.slot_capacity = agent.slot_capacity;
        d.max_payload_bytes = block * 4;
      }
      d.agent = agent;
      d.http_port_file = http_port_file;
    }
#endif
    if (check_config) {
      std::printf("ina-aggregator: configuration ok: backend dpdk, port %s, ip %s, UDP port %u, %s\n",
                  dpdk_port.c_str(), dpdk_ip.c_str(), unsigned{opts.port},
                  managed ? "jobs from the controller" : ("job " + std::to_string(job.job)).c_str());
      return 0;
    }
    return ina::agg::run_dpdk_aggregator(d, g_stop);
#else
    std::fprintf(stderr, "ina-aggregator: --backend dpdk: built without DPDK (-Ddpdk=enabled "
                         "with libdpdk-dev installed)\n");
    return 1;
#endif
  }
  if (!eal_args.empty()) {
    std::fprintf(stderr, "ina-aggregator: arguments after -- are EAL arguments, for --backend dpdk "
                         "only\n");
    return 1;
  }
  if (dpdk_rx_queues != 0) {
    std::fprintf(stderr, "ina-aggregator: --rx-queues is for --backend dpdk only\n");
    return 1;
  }

  std::vector<ina::agg::JobConfig> jobs;
  if (world != 0) jobs.push_back(job);
#if INA_HAVE_CONTROLLER
  if (managed || agent.http_port >= 0) {
    opts.snapshot_interval = std::chrono::milliseconds(100);
    agent.http_bind = opts.bind_host == "0.0.0.0" ? "127.0.0.1" : opts.bind_host;
  }
  if (managed) {
    opts.slot_capacity = agent.slot_capacity;
    opts.max_payload_bytes = block * 4;
  }
#endif
  if (check_config) {
    std::printf("ina-aggregator: configuration ok: backend udp, %s:%u, %u threads, %s\n",
                opts.bind_host.c_str(), unsigned{opts.port}, opts.threads,
                managed ? "jobs from the controller" : ("job " + std::to_string(job.job)).c_str());
    return 0;
  }
  auto agg = ina::agg::UdpAggregator::create(opts, jobs);
  if (!agg.ok()) {
    std::fprintf(stderr, "ina-aggregator: %s\n", agg.status().to_string().c_str());
    return 1;
  }
  ina::agg::UdpAggregator& a = **agg;
  if (!port_file.empty() && !write_port_file(port_file, a.port())) {
    std::fprintf(stderr, "ina-aggregator: cannot write --port-file %s: %s\n", port_file.c_str(),
                 std::strerror(errno));
    return 1;
  }
#if INA_HAVE_CONTROLLER
  std::unique_ptr<ina::agg::ControlAgent> control;
  if (managed || agent.http_port >= 0) {
    agent.data_port = a.port();
    auto c = ina::agg::ControlAgent::start(agent, &a);
    if (!c.ok()) {
      std::fprintf(stderr, "ina-aggregator: %s\n", c.status().to_string().c_str());
      return 1;
    }
    control = std::move(c).value();
    if (!http_port_file.empty() && control->http_port() > 0 &&
        !write_port_file(http_port_file, static_cast<uint16_t>(control->http_port()))) {
      std::fprintf(stderr, "ina-aggregator: cannot write --http-port-file %s\n",
                   http_port_file.c_str());
      return 1;
    }
  }
#endif
  if (world == 0) {
    std::printf("ina-aggregator listening on %s:%u jobs from the controller, block %u gro %s gso %s "
                "threads %u\n",
                opts.bind_host.c_str(), unsigned{a.port()}, block, a.gro_enabled() ? "on" : "off",
                a.gso_enabled() ? "on" : "off", a.threads());
  } else {
    std::printf("ina-aggregator listening on %s:%u job %u world %u slots %u block %u gro %s gso %s "
                "threads %u\n",
                opts.bind_host.c_str(), unsigned{a.port()}, unsigned{job.job}, world, slots, block,
                a.gro_enabled() ? "on" : "off", a.gso_enabled() ? "on" : "off", a.threads());
    if (job.is_leaf()) {
      std::printf("tree leaf %u of parent %s: global ranks [%u, %u)\n", job.tree.child_index,
                  job.tree.parent.c_str(), job.tree.rank_base,
                  job.tree.rank_base + job.tree.local_ranks);
    }
  }
  std::fflush(stdout);

  const ina::Status st = a.run(g_stop);
  std::printf("%s", a.format_counters().c_str());
  std::fflush(stdout);
  if (!st.ok()) {
    std::fprintf(stderr, "ina-aggregator: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
