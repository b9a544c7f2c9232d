// Suite xdp: workers over the AF_XDP transport (INA_TRANSPORT=xdp) on veth pairs against the
// kernel-UDP ina-aggregator, in two network namespaces unique to this run (always deleted):
//   ns A: bridge br0 10.78.0.1/24 with a0..aN-1, the aggregator bound to 10.78.0.1
//   ns W: w0..wN-1 (peers of a0..), no kernel address; rank k binds AF_XDP on wk queue 0 with
//         INA_LOCAL_IP 10.78.0.(10+k), resolves the aggregator by ARP and answers ARP itself.
// Each rank is a forked process; int32 SUM and float32 SUM must equal the protocol model bit for
// bit. Exits 77 with the reason when not root, or when namespaces or AF_XDP are unavailable.
#include <fcntl.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ina/ina.hpp"
#include "ina/protocol/frame.h"
#include "loopback_support.h"

namespace {

std::string g_ns_a, g_ns_w;

int sh(const std::string& cmd) {
  const int st = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

void teardown() {
  if (!g_ns_a.empty()) (void)sh("ip netns del " + g_ns_a);
  if (!g_ns_w.empty()) (void)sh("ip netns del " + g_ns_w);
}

// On SIGTERM/SIGINT (meson's timeout): delete the namespaces with fork/exec only, then exit.
char g_sig_ns[2][64];
void on_signal(int) {
  for (auto& ns : g_sig_ns) {
    if (ns[0] == '\0') continue;
    const pid_t p = fork();
    if (p == 0) {
      execlp("ip", "ip", "netns", "del", ns, static_cast<char*>(nullptr));
      _exit(127);
    }
    if (p > 0) waitpid(p, nullptr, 0);
  }
  _exit(1);
}

bool enter_ns(const std::string& ns) {
  const int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = setns(fd, CLONE_NEWNET) == 0;
  close(fd);
  return ok;
}

// Transmit checksum offload off, so frames reaching the AF_XDP socket carry full checksums (veth
// would pass the kernel's partial ones through). No ethtool binary needed.
bool tx_csum_off(const std::string& ifname) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ethtool_value ev{};
  ev.cmd = ETHTOOL_STXCSUM;
  ev.data = 0;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  ifr.ifr_data = reinterpret_cast<char*>(&ev);
  const bool ok = ioctl(fd, SIOCETHTOOL, &ifr) == 0;
  close(fd);
  return ok;
}

using ina::testing::slurp;

// Rank k's process: 0 exact, 1 wrong or failed, 77 AF_XDP unavailable (reason printed).
int run_rank(int k, int world) {
  if (!enter_ns(g_ns_w)) {
    std::printf("rank %d: cannot enter %s\n", k, g_ns_w.c_str());
    return 1;
  }
  const std::string iface = "w" + std::to_string(k);
  const std::string ip = "10.78.0." + std::to_string(10 + k);
  // What INA_TRANSPORT=xdp, INA_XDP_IFACE, INA_XDP_QUEUE and INA_LOCAL_IP give through
  // Config::from_env; no aggregator_mac: ARP finds it.
  ina::Config c;
  c.transport = ina::AggregatorTransport::kXdp;
  c.xdp_iface = iface;
  c.xdp_queue = 0;
  c.local_ip = ina::frame::parse_ipv4(ip).value();
  c.rank = k;
  c.world_size = world;
  c.aggregator_host = "10.78.0.1";
  c.aggregator_port = 47474;
  c.block_elems = 256;
  c.timeout = std::chrono::milliseconds(20000);
  auto comm = ina::Communicator::create(c);
  if (!comm.ok()) {
    const std::string m = comm.status().to_string();
    std::printf("rank %d: %s\n", k, m.c_str());
    return m.find("cannot bind an AF_XDP socket") != std::string::npos ? 77 : 1;
  }
  const std::vector<ina::testing::Case> cases = {
      {ina::DType::kInt32, ina::ReduceOp::kSum, 10007},
      {ina::DType::kFloat32, ina::ReduceOp::kSum, 30011},
  };
  int failures = 0;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const auto& cs = cases[ci];
    std::vector<std::vector<uint8_t>> in(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      ina::testing::fill_input(in[static_cast<size_t>(r)], cs, r, static_cast<int>(ci));
    }
    const std::vector<uint8_t> want = ina::testing::model_result(in, cs, 256);
    std::vector<uint8_t> out(in[static_cast<size_t>(k)].size());
    const auto t0 = std::chrono::steady_clock::now();
    const ina::Status st = (*comm)->allreduce(in[static_cast<size_t>(k)].data(), out.data(),
                                              cs.count, cs.dtype, cs.op);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const bool exact = st.ok() && out == want && (*comm)->stats().host_collectives == 0;
    if (!exact) ++failures;
    std::printf("rank %d case %zu (dtype %d, %zu elems) over xdp %s: %s in %.1f ms %s\n", k, ci,
                static_cast<int>(cs.dtype), cs.count, iface.c_str(), exact ? "exact" : "WRONG", ms,
                st.ok() ? "" : st.to_string().c_str());
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int world = argc > 1 ? std::atoi(argv[1]) : 2;
  if (world < 1 || world > 4) {
    std::printf("usage: %s WORLD (1..4)\n", argv[0]);
    return 1;
  }
  if (geteuid() != 0) {
    std::printf("SKIP: needs root (network namespaces, AF_XDP)\n");
    return 77;
  }
  const char* bin = std::getenv("INA_AGGREGATOR_BIN");
  if (bin == nullptr) {
    std::printf("FAIL: INA_AGGREGATOR_BIN is not set\n");
    return 1;
  }
  const std::string tag = std::to_string(getpid());
  const std::string ns_a = "ina_xdp_" + tag + "_a";
  const std::string ns_w = "ina_xdp_" + tag + "_w";
  if (sh("ip netns add " + ns_a) != 0) {
    std::printf("SKIP: cannot create a network namespace (ip netns add)\n");
    return 77;
  }
  g_ns_a = ns_a;
  if (sh("ip netns add " + ns_w) != 0) {
    teardown();
    std::printf("SKIP: cannot create a network namespace (ip netns add)\n");
    return 77;
  }
  g_ns_w = ns_w;
  std::atexit(teardown);
  std::snprintf(g_sig_ns[0], sizeof g_sig_ns[0], "%s", ns_a.c_str());
  std::snprintf(g_sig_ns[1], sizeof g_sig_ns[1], "%s", ns_w.c_str());
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  std::vector<std::string> setup = {
      "ip -n " + ns_a + " link set lo up",
      "ip -n " + ns_a + " link add name br0 type bridge",
      "ip -n " + ns_a + " addr add 10.78.0.1/24 dev br0",
      "ip -n " + ns_a + " link set br0 up",
  };
  for (int k = 0; k < world; ++k) {
    const std::string w = "w" + std::to_string(k);
    const std::string a = "a" + std::to_string(k);
    setup.push_back("ip -n " + ns_w + " link add name " + w + " type veth peer name " + a +
                    " netns " + ns_a);
    setup.push_back("ip -n " + ns_a + " link set " + a + " master br0");
    setup.push_back("ip -n " + ns_a + " link set " + a + " up");
    setup.push_back("ip -n " + ns_w + " link set " + w + " up");
  }
  for (const std::string& cmd : setup) {
    if (sh(cmd) != 0) {
      std::printf("SKIP: network setup failed: %s\n", cmd.c_str());
      return 77;
    }
  }
  // Checksum offload off on the aggregator's side, from a child inside ns A.
  {
    const pid_t p = fork();
    if (p == 0) {
      bool ok = enter_ns(ns_a);
      for (int k = 0; ok && k < world; ++k) ok = tx_csum_off("a" + std::to_string(k));
      ok = ok && tx_csum_off("br0");
      _exit(ok ? 0 : 1);
    }
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::printf("FAIL: cannot turn transmit checksum offload off in %s\n", ns_a.c_str());
      return 1;
    }
  }

  const std::string log = "/tmp/ina_xdp_agg_" + tag + ".log";
  const pid_t agg = fork();
  if (agg == 0) {
    if (!enter_ns(ns_a)) _exit(126);
    if (std::freopen(log.c_str(), "w", stdout) == nullptr) _exit(126);
    dup2(fileno(stdout), 2);
    const std::string w = std::to_string(world);
    execl(bin, bin, "--bind", "10.78.0.1", "--port", "47474", "--world-size", w.c_str(), "--no-gso",
          "--no-gro", "--stats-interval-ms", "0", static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (slurp(log).find("listening") == std::string::npos) {
    int st = 0;
    if (waitpid(agg, &st, WNOHANG) == agg ||
        std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
      kill(agg, SIGKILL);
      waitpid(agg, nullptr, 0);
      std::printf("FAIL: the aggregator did not start:\n%s\n", slurp(log).c_str());
      std::remove(log.c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  std::fflush(stdout);
  std::vector<pid_t> ranks;
  for (int k = 0; k < world; ++k) {
    const pid_t p = fork();
    if (p == 0) {
      const int code = run_rank(k, world);
      std::fflush(stdout);
      _exit(code);
    }
    ranks.push_back(p);
  }
  // Every rank within 50 s, else killed.
  std::vector<int> codes(ranks.size(), -1);
  size_t left = ranks.size();
  while (left > 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(50)) {
    for (size_t i = 0; i < ranks.size(); ++i) {
      int st = 0;
      if (codes[i] < 0 && waitpid(ranks[i], &st, WNOHANG) == ranks[i]) {
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (codes[i] < 0) {
      kill(ranks[i], SIGKILL);
      waitpid(ranks[i], nullptr, 0);
      std::printf("FAIL: rank %zu did not finish within 50 s\n", i);
      codes[i] = 1;
    }
  }
  kill(agg, SIGTERM);
  int agg_status = 0;
  waitpid(agg, &agg_status, 0);
  const std::string agg_log = slurp(log);
  std::remove(log.c_str());

  bool skip = false;
  bool fail = false;
  for (int c : codes) {
    skip = skip || c == 77;
    fail = fail || (c != 0 && c != 77);
  }
  if (skip) {
    std::printf("SKIP: AF_XDP unavailable (see the rank's reason above)\n");
    return 77;
  }
  if (fail) {
    std::printf("aggregator log:\n%s\nFAILED\n", agg_log.c_str());
    return 1;
  }
  std::printf("PASS\n");
  return 0;
}
