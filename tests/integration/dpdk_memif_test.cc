// Suite dpdk: workers over the DPDK transport (INA_TRANSPORT=dpdk, net_memif client) against the
// DPDK aggregator (ina-aggregator --backend dpdk, net_memif server) on one host. N ranks (argv[1],
// 2..4) run as threads of this process sharing its one DPDK port; int32 SUM and float32 SUM must
// equal the protocol model bit for bit; ARP resolves the aggregator's MAC. argv[2] (default 1):
// the aggregator's worker lcores; with more than one, the slots of lcores past the first are
// answered through lcore 0's queue (the only memif queue pair the ranks' port connects). Exits 77
// with the reason when an EAL (ours or the aggregator's) cannot start.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ina/ina.hpp"
#include "ina/protocol/frame.h"
#include "tests/check.h"
#include "tests/integration/thread_ranks.h"

namespace {

using ina::testing::g_failures;

constexpr const char* kAggIp = "10.77.0.1";
constexpr const char* kWorkerIp = "10.77.0.2";

std::string common_eal(const std::string& prefix) {
  return "--no-huge -m 256 --no-shconf --no-pci --no-telemetry --log-level=3 --file-prefix " +
         prefix;
}

// EAL arguments separated by single blanks, as a vector.
std::vector<std::string> split_blanks(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t j = s.find(' ', i);
    out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

pid_t spawn_aggregator(int world, int agg_lcores, const std::string& sock, const std::string& log) {
  const char* bin = std::getenv("INA_AGGREGATOR_BIN");
  if (bin == nullptr) return -1;
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  // Worker lcore i on CPU i % cpus, past the main lcore's CPU 0 first.
  std::string lcores = "0@0";
  for (int i = 1; i <= agg_lcores; ++i) {
    lcores += "," + std::to_string(i) + "@" + std::to_string(static_cast<unsigned>(i) % cpus);
  }
  std::vector<std::string> args = {
      bin,    "--backend", "dpdk",         "--dpdk-port",         "net_memif0",
      "--ip", kAggIp,      "--world-size", std::to_string(world), "--stats-interval-ms",
      "0",    "--"};
  std::string eal = common_eal("ina_agg_" + std::to_string(getpid())) +
                    " --vdev=net_memif0,role=server,socket=" + sock + " --lcores " + lcores;
  for (std::string& a : split_blanks(eal)) args.push_back(std::move(a));
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(fileno(stdout), 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin, argv.data());
    _exit(127);
  }
  return pid;
}

using ina::testing::slurp;

// The aggregator's exit status if it has exited, else -1.
int exited(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  const int world = argc > 1 ? std::atoi(argv[1]) : 2;
  const int agg_lcores = argc > 2 ? std::atoi(argv[2]) : 1;
  if (world < 2 || world > 4 || agg_lcores < 1 || agg_lcores > 4) {
    std::printf("usage: %s WORLD (2..4) [AGGREGATOR_WORKER_LCORES (1..4)]\n", argv[0]);
    return 1;
  }
  const std::string tag = std::to_string(getpid());
  const std::string sock = "/tmp/ina_memif_" + tag + ".sock";
  const std::string log = "/tmp/ina_memif_agg_" + tag + ".log";
  const pid_t agg = spawn_aggregator(world, agg_lcores, sock, log);
  if (agg < 0) {
    std::printf("FAIL: INA_AGGREGATOR_BIN is not set\n");
    return 1;
  }
  // Wait for the aggregator's banner (its EAL is up and the memif server listens).
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const int code = exited(agg);
    if (code == 77) {
      std::printf("SKIP: the aggregator's EAL cannot start: %s\n", slurp(log).c_str());
      return 77;
    }
    if (code >= 0) {
      std::printf("FAIL: the aggregator exited with %d:\n%s\n", code, slurp(log).c_str());
      return 1;
    }
    if (slurp(log).find("ina-aggregator (dpdk)") != std::string::npos) break;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) {
      kill(agg, SIGKILL);
      waitpid(agg, nullptr, 0);
      std::printf("FAIL: the aggregator did not start in 20 s:\n%s\n", slurp(log).c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  const std::string eal = common_eal("ina_w_" + tag) +
                          " --vdev=net_memif0,role=client,socket=" + sock + " --lcores 0@" +
                          std::to_string(cpus > 1 ? 1 : 0);
  const std::vector<std::string> eal_args = split_blanks(eal);
  const uint32_t worker_ip = ina::frame::parse_ipv4(kWorkerIp).value();

  ina::testing::ThreadRanks ranks = ina::testing::create_thread_ranks(world, [&](int r) {
    // What INA_TRANSPORT=dpdk, INA_DPDK_ARGS and INA_LOCAL_IP give through Config::from_env; no
    // aggregator_mac: ARP finds it.
    ina::Config c;
    c.transport = ina::AggregatorTransport::kDpdk;
    c.dpdk_args = eal_args;
    c.local_ip = worker_ip;
    c.rank = r;
    c.world_size = world;
    c.aggregator_host = kAggIp;
    c.aggregator_port = 47474;
    c.block_elems = 256;
    c.timeout = std::chrono::milliseconds(20000);
    return c;
  });
  int rc = 0;
  for (int r = 0; r < world; ++r) {
    const ina::Status& s = ranks.created[static_cast<size_t>(r)];
    if (s.ok()) continue;
    if (s.message().find("EAL cannot start") != std::string::npos) {
      std::printf("SKIP: %s\n", s.to_string().c_str());
      rc = 77;
    } else {
      std::printf("FAIL: rank %d: %s\n", r, s.to_string().c_str());
      rc = 1;
    }
  }

  if (rc == 0) {
    const std::vector<ina::testing::Case> cases = {
        {ina::DType::kInt32, ina::ReduceOp::kSum, 10007},
        {ina::DType::kFloat32, ina::ReduceOp::kSum, 30011},
        {ina::DType::kFloat32, ina::ReduceOp::kSum, 1},
    };
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const auto& c = cases[ci];
      const ina::testing::ThreadCase tc =
          ina::testing::run_thread_case(ranks.comms, c, static_cast<int>(ci), 256);
      for (int r = 0; r < world; ++r) {
        const auto i = static_cast<size_t>(r);
        const auto& comm = ranks.comms[i];
        CHECK(tc.status[i].ok(), "case %zu rank %d: %s", ci, r, tc.status[i].to_string().c_str());
        CHECK(tc.out[i] == tc.want, "case %zu rank %d: result differs from the protocol model", ci,
              r);
        CHECK(comm->stats().packets_received > 0, "case %zu rank %d: no packets", ci, r);
        CHECK(comm->stats().host_collectives == 0, "case %zu rank %d: ran on the host", ci, r);
      }
      std::printf("case %zu: dtype %d op %d count %zu, %d ranks over dpdk memif: %s in %.1f ms\n",
                  ci, static_cast<int>(c.dtype), static_cast<int>(c.op), c.count, world,
                  g_failures == 0 ? "exact" : "WRONG", tc.ms);
    }
  }
  // Shutdown order: the side that is polling stops its port first. The aggregator (memif server)
  // polls all the time; the workers' transport polls only inside a collective. When a client
  // disconnects first, DPDK 22.11's memif server can unmap the rings under a running rx_burst
  // (seen once in CI: the aggregator died of SIGSEGV after every case was exact). So the
  // aggregator stops (its port first, then it exits), and then the idle workers close theirs.
  kill(agg, SIGTERM);
  int status = 0;
  int waited = 0;
  while (waitpid(agg, &status, WNOHANG) == 0 && waited < 100) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ++waited;
  }
  if (waited >= 100) {
    kill(agg, SIGKILL);
    waitpid(agg, &status, 0);
    CHECK(false, "the aggregator did not exit within 5 s of SIGTERM");
  } else {
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the aggregator %s %d",
          WIFSIGNALED(status) ? "was killed by signal" : "exited with status",
          WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  }
  ranks.comms.clear();  // the last transport stops the port (its peer is gone: nothing is polling)
  const std::string agg_log = slurp(log);
  // net_memif transmits chains: every result went to the ranks as header mbufs chained to one
  // shared datagram (DpdkOptions::fanout), and the sums above were exact.
  CHECK(
      agg_log.find("results to every rank as header + shared datagram chains") != std::string::npos,
      "the aggregator did not send results as chains over net_memif");
  if (rc == 0 && agg_lcores > 1) {
    // Slots of lcores past the first were answered through lcore 0 (the totals at exit).
    CHECK(agg_log.find("tx_handed_off") != std::string::npos,
          "no reply went through lcore 0's queue with %d worker lcores", agg_lcores);
  }
  if (g_failures > 0 || rc == 1) std::printf("aggregator log:\n%s\n", agg_log.c_str());
  std::remove(log.c_str());
  std::remove(sock.c_str());
  // The EALs' runtime directories (root's location; --no-shconf still creates them).
  std::error_code ec;
  std::filesystem::remove_all("/var/run/dpdk/ina_agg_" + tag, ec);
  std::filesystem::remove_all("/var/run/dpdk/ina_w_" + tag, ec);
  if (rc != 0) return rc;
  std::printf("%s\n", g_failures == 0 ? "PASS" : "FAILED");
  return g_failures == 0 ? 0 : 1;
}
