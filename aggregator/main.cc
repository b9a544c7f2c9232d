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
//
// This file only parses and checks the flags (CLI11), sorts them into a backend's options and
// runs it: the kernel UDP backend in udp_main.cc, the DPDK one in dpdk_main.cc.
#include <netinet/in.h>
#include <netinet/udp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "aggregator/dpdk_probe.h"
#include "aggregator/udp_main.h"
#include "ina/base/log.h"
#include "ina/protocol/wire.h"
#include "ina_config.h"
#if INA_HAVE_DPDK
#include "aggregator/dpdk_main.h"
#endif
#if INA_HAVE_CONTROLLER
#include "aggregator/agent_main.h"
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

// Every flag as parsed, before the checks sort them into a backend's options.
struct Flags {
  ina::agg::UdpOptions udp;  // the kernel UDP backend's own flags land here directly
  ina::agg::JobConfig job;
  uint32_t world = 0;
  uint32_t slots = 512;
  uint32_t block = 0;    // 0: the backend's default (main)
  std::string key_text;  // empty: no key (the zero key)
  uint32_t stats_ms = 5000;
  int64_t spin_us = 200;  // UdpOptions::spin
  std::string port_file;
  std::string log_level;
  bool no_gro = false;
  bool no_gso = false;
  bool check_config = false;
  std::string backend = "udp";
  std::string dpdk_port, dpdk_ip, dpdk_mac;
  uint16_t dpdk_burst = 32;
  uint16_t dpdk_rx_queues = 0;
  std::vector<std::string> eal_args;
  std::string parent;
  CLI::Option* parent_opt = nullptr;
  int64_t child_index = -1, rank_base = -1, local_ranks = -1, parent_world = 0;
#if INA_HAVE_CONTROLLER
  ina::agg::AgentOptions agent;
  std::string controller;
  CLI::Option* advertise_opt = nullptr;  // read by the DPDK backend only
  CLI::Option* spin_opt = nullptr;       // the UDP backend's: the DPDK one always polls
  std::string http_port_file;
  uint32_t heartbeat_ms = 200;
#endif

  // Jobs come from --controller.
  bool managed() const {
#if INA_HAVE_CONTROLLER
    return !controller.empty();
#else
    return false;
#endif
  }
};

// The job, the kernel UDP backend and the checks (--check-config, --log-level).
void add_job_and_udp_flags(CLI::App& app, Flags& f) {
  app.add_option("--bind", f.udp.bind_host, "IPv4 address or host name to bind")
      ->capture_default_str();
  app.add_option("--port", f.udp.port, "UDP port (0: any free port; see --port-file)")
      ->check(CLI::Range(int64_t{0}, int64_t{65535}))
      ->capture_default_str();
  app.add_option("--port-file", f.port_file, "write the bound port to this file once listening");
  app.add_option("--world-size", f.world, "ranks in the job (none: jobs come from --controller)")
      ->check(CLI::Range(int64_t{1}, int64_t{65535}));
  app.add_option("--slots", f.slots, "slots of the job (each with two copies)")
      ->check(CLI::Range(int64_t{1}, int64_t{ina::wire::kMaxSlot} + 1))
      ->capture_default_str();
  app.add_option("--block-elems", f.block,
                 "largest block, in 4-byte elements: a block is 4 x this many bytes (that many "
                 "float32/int32 elements per packet, twice as many 16-bit ones); each rank "
                 "lowers it to one datagram on its path (its HELLO). Default: 2048 (8 KiB) "
                 "for --backend udp, 256 (1 KiB) for dpdk")
      ->check(CLI::Range(int64_t{1}, int64_t{16368}));
  app.add_option("--job", f.job.job, "job id")
      ->check(CLI::Range(int64_t{0}, int64_t{UINT32_MAX}))
      ->capture_default_str();
  app.add_option("--key", f.key_text,
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
  app.add_option("--stats-interval-ms", f.stats_ms, "print counters this often (0: never)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}))
      ->capture_default_str();
  app.add_option("--batch", f.udp.batch, "datagrams per recvmmsg/sendmmsg")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}))
      ->capture_default_str();
  f.spin_opt = app.add_option("--spin-us", f.spin_us,
                              "udp: after sparse traffic, poll this long (yielding the CPU) "
                              "before sleeping; 0: sleep at once")
                   ->check(CLI::Range(int64_t{0}, int64_t{1000000}))
                   ->capture_default_str();
  app.add_option("--threads", f.udp.threads,
                 "udp: serving threads, one socket each (SO_REUSEPORT, steered by slot); 0: one "
                 "per CPU this process may run on")
      ->check(CLI::Range(0u, ina::agg::kMaxUdpThreads))
      ->capture_default_str();
  app.add_flag("--no-gro", f.no_gro, "do not use UDP GRO on receive");
  app.add_flag("--no-gso", f.no_gso, "do not use UDP GSO on send");
  app.add_option("--drop-percent", f.udp.drop_percent, "test hook: drop received datagrams")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--dup-percent", f.udp.dup_percent, "test hook: duplicate received datagrams")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--seed", f.udp.seed, "seed of the test hooks")->capture_default_str();
  app.add_flag("--check-config", f.check_config,
               "check the arguments (as a service's ExecStart would pass them), print what would "
               "be served and exit 0 without binding anything (non-zero on a bad argument)");
  app.add_option("--log-level", f.log_level, "error, warn, info or debug (default: INA_LOG_LEVEL)")
      ->check(CLI::IsMember({"error", "warn", "info", "debug"}));
}

void add_dpdk_flags(CLI::App& app, Flags& f) {
  app.add_option("--backend", f.backend, "udp (kernel sockets) or dpdk (EAL arguments after --)")
      ->check(CLI::IsMember({"udp", "dpdk"}))
      ->capture_default_str();
  app.add_option("--dpdk-port", f.dpdk_port,
                 "dpdk: port name (net_ring0, a PCI address) or number");
  app.add_option("--ip", f.dpdk_ip, "dpdk: our IPv4 address (answers ARP and ping for it)");
  app.add_option("--mac", f.dpdk_mac, "dpdk: our MAC address (default: the port's)");
  app.add_option("--burst", f.dpdk_burst, "dpdk: rx/tx burst size")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--rx-queues", f.dpdk_rx_queues,
                 "dpdk: rx queues, each polled by its own lcore (0: one per worker lcore, at most "
                 "the port's)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("eal", f.eal_args, "dpdk: EAL arguments, after --");
}

// --parent and --controller: "host:port" with a port in 1..65535.
CLI::Validator host_port_validator() {
  return CLI::Validator(
      [](std::string& s) {
        const size_t c = s.rfind(':');
        const int p = c == std::string::npos ? 0 : std::atoi(s.c_str() + c + 1);
        return c != std::string::npos && c > 0 && p >= 1 && p <= 65535
                   ? std::string{}
                   : "'" + s + "' is not host:port (port 1..65535)";
      },
      "HOST:PORT");
}

// --controller: one host:port or a comma-separated list of controller replicas.
CLI::Validator host_port_list_validator() {
  return CLI::Validator(
      [](std::string& s) {
        const CLI::Validator one = host_port_validator();
        size_t at = 0;
        for (;;) {
          const size_t comma = s.find(',', at);
          std::string elem = s.substr(at, comma == std::string::npos ? comma : comma - at);
          if (std::string e = one(elem); !e.empty()) return e;
          if (comma == std::string::npos) return std::string{};
          at = comma + 1;
        }
      },
      "HOST:PORT[,HOST:PORT...]");
}

// Aggregation tree leaf (one static job): see the header comment.
void add_tree_flags(CLI::App& app, Flags& f) {
  f.parent_opt =
      app.add_option("--parent", f.parent,
                     "tree leaf: the root aggregator's data plane (host:port); partial sums go "
                     "there")
          ->check(host_port_validator());
  app.add_option("--child-index", f.child_index, "tree leaf: this leaf's rank in the root's job")
      ->check(CLI::Range(int64_t{0}, int64_t{65534}));
  app.add_option("--rank-base", f.rank_base, "tree leaf: first global rank this leaf serves")
      ->check(CLI::Range(int64_t{0}, int64_t{65534}));
  app.add_option("--local-ranks", f.local_ranks,
                 "tree leaf: how many consecutive global ranks from --rank-base it serves")
      ->check(CLI::Range(int64_t{1}, int64_t{65535}));
  app.add_option("--parent-world", f.parent_world,
                 "tree leaf: the root's world size (number of leaves; default: learnt from the "
                 "root)")
      ->check(CLI::Range(int64_t{1}, int64_t{65535}));
}

#if INA_HAVE_CONTROLLER
void add_controller_flags(CLI::App& app, Flags& f) {
  app.add_option("--controller", f.controller,
                 "register with ina-controller at host:port (replicas: a comma-separated list, "
                 "tried in turn; any replica forwards to the leader)")
      ->check(host_port_list_validator());
  f.advertise_opt =
      app.add_option("--advertise", f.agent.advertise_host,
                     "address workers use to reach this aggregator (dpdk: default --ip)")
          ->capture_default_str();
  app.add_option("--slot-capacity", f.agent.slot_capacity, "slots shared by the controller's jobs")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  app.add_option("--max-fan-in", f.agent.max_fan_in, "largest world size served")
      ->check(CLI::Range(1, 65535))
      ->capture_default_str();
  app.add_option("--http-port", f.agent.http_port,
                 "Prometheus /metrics and /v1/telemetry (-1: off, 0: any)")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
  app.add_option("--http-port-file", f.http_port_file, "write the HTTP port here once listening");
  app.add_option("--heartbeat-ms", f.heartbeat_ms, "heartbeat period to the controller")
      ->check(CLI::Range(10, 60000))
      ->capture_default_str();
}
#endif

// --world-size (or --controller) and the tree leaf flags: "" when they fit (f.job.tree is then
// set for a leaf), else what is wrong.
std::string check_job_flags(Flags& f) {
  if (f.world == 0 && !f.managed()) return "--world-size is required (or --controller)";
  if (f.parent_opt->count() == 0) {
    if (f.child_index >= 0 || f.rank_base >= 0 || f.local_ranks >= 0 || f.parent_world != 0) {
      return "--child-index, --rank-base, --local-ranks and --parent-world describe a tree leaf "
             "and need --parent host:port";
    }
    return "";
  }
  if (f.world == 0) {
    return "--parent describes the --world-size job (a controller sends leaf jobs itself)";
  }
  if (f.child_index < 0 || f.rank_base < 0 || f.local_ranks < 0) {
    return "--parent needs --child-index, --rank-base and --local-ranks";
  }
  if (f.rank_base + f.local_ranks > int64_t{f.world}) {
    return "--rank-base " + std::to_string(f.rank_base) + " + --local-ranks " +
           std::to_string(f.local_ranks) + " exceeds --world-size " + std::to_string(f.world) +
           " (the leaf serves global ranks [rank_base, rank_base + local_ranks))";
  }
  if (f.parent_world != 0 && f.child_index >= f.parent_world) {
    return "--child-index " + std::to_string(f.child_index) + " must be below --parent-world " +
           std::to_string(f.parent_world) + " (the root's ranks are its leaves 0.." +
           std::to_string(f.parent_world - 1) + ")";
  }
  if (f.backend == "dpdk") {
    return "--parent: a tree leaf needs --backend udp (the DPDK loop does not route to a parent)";
  }
  f.job.tree.role = ina::agg::TreeRole::kLeaf;
  f.job.tree.parent = f.parent;
  f.job.tree.child_index = static_cast<uint32_t>(f.child_index);
  f.job.tree.rank_base = static_cast<uint32_t>(f.rank_base);
  f.job.tree.local_ranks = static_cast<uint32_t>(f.local_ranks);
  f.job.tree.parent_world = static_cast<uint32_t>(f.parent_world);
  return "";
}

// What --check-config prints last: the job, or where the jobs come from.
std::string served_text(const Flags& f) {
  return f.managed() ? "jobs from the controller" : "job " + std::to_string(f.job.job);
}

int dispatch_dpdk(Flags& f) {
  if (f.spin_opt->count() != 0) {
    std::fprintf(stderr,
                 "ina-aggregator: --spin-us is for --backend udp only (the dpdk backend always "
                 "polls)\n");
    return 1;
  }
#if INA_HAVE_DPDK
  ina::agg::DpdkCliOptions d;
  d.port = f.dpdk_port;
  d.ip = f.dpdk_ip;
  d.mac = f.dpdk_mac;
  d.udp_port = f.udp.port;
  d.burst = f.dpdk_burst;
  d.rx_queues = f.dpdk_rx_queues;
  d.stats_ms = f.stats_ms;
  d.eal_args = f.eal_args;
  if (f.world != 0) d.jobs.push_back(f.job);
#if INA_HAVE_CONTROLLER
  if (f.managed() || f.agent.http_port >= 0) {
    if (f.udp.port == 0) {
      std::fprintf(stderr,
                   "ina-aggregator: --port: the DPDK backend needs a fixed UDP port "
                   "(1..65535) to advertise\n");
      return 2;
    }
    if (f.advertise_opt->count() == 0) f.agent.advertise_host = f.dpdk_ip;
    f.agent.http_bind = "127.0.0.1";  // the HTTP endpoint is on the kernel's loopback
    if (f.managed()) {
      d.slot_capacity = f.agent.slot_capacity;
      d.max_payload_bytes = f.block * 4;
    }
    d.agent = ina::agg::AgentCliOptions{f.agent, f.http_port_file};
  }
#endif
  if (f.check_config) {
    std::printf("ina-aggregator: configuration ok: backend dpdk, port %s, ip %s, UDP port %u, %s\n",
                f.dpdk_port.c_str(), f.dpdk_ip.c_str(), unsigned{f.udp.port},
                served_text(f).c_str());
    return 0;
  }
  return ina::agg::run_dpdk_aggregator(d, g_stop);
#else
  (void)f;
  std::fprintf(stderr,
               "ina-aggregator: --backend dpdk: built without DPDK (-Ddpdk=enabled "
               "with libdpdk-dev installed)\n");
  return 1;
#endif
}

int dispatch_udp(Flags& f) {
  if (!f.eal_args.empty()) {
    std::fprintf(stderr,
                 "ina-aggregator: arguments after -- are EAL arguments, for --backend dpdk "
                 "only\n");
    return 1;
  }
  if (f.dpdk_rx_queues != 0) {
    std::fprintf(stderr, "ina-aggregator: --rx-queues is for --backend dpdk only\n");
    return 1;
  }
  ina::agg::UdpCliOptions u;
  u.udp = f.udp;
  u.port_file = f.port_file;
  if (f.world != 0) u.jobs.push_back(f.job);
#if INA_HAVE_CONTROLLER
  if (f.managed() || f.agent.http_port >= 0) {
    u.udp.snapshot_interval = std::chrono::milliseconds(100);
    f.agent.http_bind = u.udp.bind_host == "0.0.0.0" ? "127.0.0.1" : u.udp.bind_host;
    u.agent = ina::agg::AgentCliOptions{f.agent, f.http_port_file};
  }
  if (f.managed()) {
    u.udp.slot_capacity = f.agent.slot_capacity;
    u.udp.max_payload_bytes = f.block * 4;
  }
#endif
  if (f.check_config) {
    std::printf("ina-aggregator: configuration ok: backend udp, %s:%u, %u threads, %s\n",
                u.udp.bind_host.c_str(), unsigned{u.udp.port}, u.udp.threads,
                served_text(f).c_str());
    return 0;
  }
  return ina::agg::run_udp_aggregator(u, g_stop);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ina-aggregator: in-network aggregation (reduction switch) over kernel UDP"};
  app.set_version_flag("--version", version_text);
  Flags f;
  f.udp.port = ina::wire::kDefaultPort;
  add_job_and_udp_flags(app, f);
  add_dpdk_flags(app, f);
  add_tree_flags(app, f);
#if INA_HAVE_CONTROLLER
  add_controller_flags(app, f);
#endif
  CLI11_PARSE(app, argc, argv);
  // The kernel path sizes blocks up to 8 KiB: the ranks lower it to their path's datagram (1432
  // bytes on a 1500-byte MTU, 8 KiB on jumbo frames and loopback), and every packet costs the
  // same kernel and engine work whatever its size. The DPDK port's frames are sized for 1 KiB.
  if (f.block == 0) f.block = f.backend == "dpdk" ? 256 : 2048;
  if (const std::string err = check_job_flags(f); !err.empty()) {
    std::fprintf(stderr, "ina-aggregator: %s\n", err.c_str());
    return 2;
  }

  if (!f.log_level.empty()) {
    ina::log::Level l;
    if (ina::log::parse_level(f.log_level.c_str(), &l)) ina::log::set_level(l);
  }
  if (!f.key_text.empty()) (void)ina::parse_key_hex(f.key_text, &f.job.key);  // checked by --key
  f.job.slots.world_size = f.world;
  f.job.slots.num_slots = f.slots;
  f.job.slots.max_payload_bytes = f.block * 4;
  f.udp.gro = !f.no_gro;
  f.udp.gso = !f.no_gso;
  f.udp.stats_interval = std::chrono::milliseconds(f.stats_ms);
  f.udp.spin = std::chrono::microseconds(f.spin_us);

  if (!install_signal_handlers()) {
    std::fprintf(stderr, "ina-aggregator: sigaction: %s\n", std::strerror(errno));
    return 1;
  }
#if INA_HAVE_CONTROLLER
  // The agent's settings both backends share (--controller was checked as host:port).
  f.agent.block_elems = f.block;
  f.agent.heartbeat = std::chrono::milliseconds(f.heartbeat_ms);
  if (f.managed()) {
    for (size_t at = 0;;) {
      const size_t comma = f.controller.find(',', at);
      const std::string e =
          f.controller.substr(at, comma == std::string::npos ? comma : comma - at);
      const size_t c = e.rfind(':');
      f.agent.controllers.emplace_back(e.substr(0, c),
                                       static_cast<uint16_t>(std::atoi(e.c_str() + c + 1)));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
    f.agent.controller_host = f.agent.controllers[0].first;
    f.agent.controller_port = f.agent.controllers[0].second;
  }
#endif
  return f.backend == "dpdk" ? dispatch_dpdk(f) : dispatch_udp(f);
}
