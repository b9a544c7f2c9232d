// A two-level aggregation tree of real processes on loopback: one root ina-aggregator
// (world 2: its ranks are the leaves) and two leaf ina-aggregators with the static leaf options
// (--parent, --child-index, --rank-base, --local-ranks), and 8 forked worker processes, each with
// its own libina communicator talking to its leaf (ranks 0..3 to leaf 0, 4..7 to leaf 1). Every
// result must equal the protocol model bitwise (the same model a flat 8-rank run is held to), with
// and without the aggregators' --drop-percent/--dup-percent hooks; the aggregators' counters must
// show the tree at work (partials forwarded, results from the parent, re-forwards under loss).
// And a rank that stops: the workers at both leaves get an error naming it within their deadline.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ina/ina.hpp"
#include "tests/integration/loopback_support.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ina::testing::AggregatorProcess;
using ina::testing::Case;

constexpr int kWorld = 8;
constexpr int kPerLeaf = 4;
constexpr uint32_t kBlock = 256;

std::vector<Case> cases() {
  return {{ina::DType::kFloat32, ina::ReduceOp::kSum, 100003},
          {ina::DType::kInt32, ina::ReduceOp::kSum, 65537},
          {ina::DType::kFloat32, ina::ReduceOp::kSum, 257, /*nan=*/true},
          {ina::DType::kBFloat16, ina::ReduceOp::kMax, 4099},
          {ina::DType::kFloat16, ina::ReduceOp::kMin, 1},
          {ina::DType::kInt32, ina::ReduceOp::kMin, 1000}};
}

// Rank `rank` of the job, served by its leaf aggregator on 127.0.0.1:leaf_port.
ina::Config rank_config(int rank, uint16_t leaf_port, std::chrono::milliseconds timeout) {
  ina::Config cfg;
  cfg.rank = rank;
  cfg.world_size = kWorld;
  cfg.aggregator_host = "127.0.0.1";
  cfg.aggregator_port = leaf_port;
  cfg.block_elems = kBlock;
  cfg.timeout = timeout;
  cfg.retransmit = 2000us;
  return cfg;
}

// Runs in a forked child; returns the exit code. Failures go to stderr.
int worker_main(int rank, uint16_t leaf_port) {
  const ina::Config cfg = rank_config(rank, leaf_port, 30s);
  auto comm = ina::Communicator::create(cfg);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: create: %s\n", rank, comm.status().to_string().c_str());
    return 2;
  }
  const std::vector<Case> cs = cases();
  int failures = 0;
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    const Case& c = cs[ci];
    std::vector<std::vector<uint8_t>> inputs(kWorld);
    for (int r = 0; r < kWorld; ++r)
      ina::testing::fill_input(inputs[r], c, r, static_cast<int>(ci));
    std::vector<uint8_t> out(inputs[rank].size());
    const ina::Status s =
        (*comm)->allreduce(inputs[rank].data(), out.data(), c.count, c.dtype, c.op);
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: case %zu: %s\n", rank, ci, s.to_string().c_str());
      return 3;
    }
    const std::vector<uint8_t> want = ina::testing::model_result(inputs, c, kBlock);
    if (out != want) {
      size_t i = 0;
      while (i < out.size() && out[i] == want[i]) ++i;
      std::fprintf(stderr, "rank %d: case %zu (%s %s count %zu): byte %zu differs from the model\n",
                   rank, ci, std::string(ina::dtype_name(c.dtype)).c_str(),
                   std::string(ina::op_name(c.op)).c_str(), c.count, i);
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

std::vector<int> run_workers(const std::vector<uint16_t>& leaf_ports, std::chrono::seconds limit) {
  return ina::testing::fork_ranks(
      kWorld, [&](int r) { return worker_main(r, leaf_ports[static_cast<size_t>(r / kPerLeaf)]); },
      limit);
}

// A counter row ("  name   value") of ina-aggregator's exit report; -1 when absent.
long long counter(const std::string& report, const std::string& name) {
  std::istringstream in(report);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string n;
    long long v;
    if (ls >> n >> v && n == name) return v;
  }
  return -1;
}

using ina::testing::slurp;

std::string temp_path(const char* what) {
  char tmpl[64];
  std::snprintf(tmpl, sizeof tmpl, "/tmp/ina-tree-%s-XXXXXX", what);
  const int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  return tmpl;
}

void run_tree(double drop_percent, double dup_percent) {
  AggregatorProcess root;
  AggregatorProcess leaf[2];
  AggregatorProcess::Options ro;
  ro.drop_percent = drop_percent;
  ro.dup_percent = dup_percent;
  ro.stdout_path = temp_path("root");
  ASSERT_EQ(root.start(2, ro), "");  // the root's ranks are the two leaves
  std::string out_path[2];
  std::vector<uint16_t> ports;
  for (int c = 0; c < 2; ++c) {
    AggregatorProcess::Options lo = ro;
    out_path[c] = temp_path("leaf");
    lo.stdout_path = out_path[c];
    lo.extra_args = {"--parent",      "127.0.0.1:" + std::to_string(root.port),
                     "--child-index", std::to_string(c),
                     "--rank-base",   std::to_string(c * kPerLeaf),
                     "--local-ranks", std::to_string(kPerLeaf)};
    if (c == 1) lo.extra_args.insert(lo.extra_args.end(), {"--parent-world", "2"});
    ASSERT_EQ(leaf[c].start(kWorld, lo), "");
    ports.push_back(leaf[c].port);
  }
  const std::vector<int> codes = run_workers(ports, 240s);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " failed (see stderr)";
  for (int c = 0; c < 2; ++c) EXPECT_EQ(leaf[c].stop(), 0) << "leaf " << c << " exit";
  EXPECT_EQ(root.stop(), 0) << "root exit";

  const std::string root_report = slurp(ro.stdout_path);
  const long long root_completed = counter(root_report, "completed");
  EXPECT_GT(root_completed, 0) << root_report;
  for (int c = 0; c < 2; ++c) {
    const std::string rep = slurp(out_path[c]);
    SCOPED_TRACE("leaf " + std::to_string(c) + " report:\n" + rep);
    // Every round the root completed was forwarded by each leaf, and came back.
    EXPECT_GE(counter(rep, "forwarded"), root_completed);
    EXPECT_GT(counter(rep, "parent_results"), 0);
    EXPECT_GE(counter(rep, "parent_hellos"), 1);
    EXPECT_EQ(counter(rep, "malformed"), 0);
    std::printf(
        "leaf %d: forwarded %lld reforwarded %lld parent_results %lld parent_stale %lld "
        "hook_dropped %lld (root completed %lld)\n",
        c, counter(rep, "forwarded"), counter(rep, "reforwarded"), counter(rep, "parent_results"),
        counter(rep, "parent_stale"), counter(rep, "hook_dropped"), root_completed);
    if (drop_percent > 0) {
      EXPECT_GT(counter(rep, "hook_dropped"), 0);
    }
    std::remove(out_path[c].c_str());
  }
  std::remove(ro.stdout_path.c_str());
}

// Runs ina-aggregator with `args` and returns its exit status and stderr+stdout.
std::pair<int, std::string> run_cli(const std::string& args) {
  const char* bin = std::getenv("INA_AGGREGATOR_BIN");
  if (bin == nullptr) return {-1, "INA_AGGREGATOR_BIN is not set (run through meson test)"};
  const std::string cmd = std::string(bin) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f) != nullptr) out += buf;
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// Inconsistent leaf options are refused before anything is bound, naming the option.
TEST(TreeCli, InconsistentLeafOptionsAreRefused) {
  struct Bad {
    const char* args;
    const char* says;
  };
  const Bad bad[] = {
      {"--world-size 8 --child-index 1", "need --parent host:port"},
      {"--world-size 8 --parent 127.0.0.1:9", "--parent needs --child-index, --rank-base"},
      {"--world-size 8 --parent 127.0.0.1:9 --child-index 0 --rank-base 6 --local-ranks 4",
       "--rank-base 6 + --local-ranks 4 exceeds --world-size 8"},
      {"--world-size 8 --parent 127.0.0.1:9 --child-index 2 --rank-base 0 --local-ranks 4 "
       "--parent-world 2",
       "--child-index 2 must be below --parent-world 2"},
      {"--world-size 8 --parent nowhere --child-index 0 --rank-base 0 --local-ranks 4",
       "is not host:port"},
      {"--world-size 8 --backend dpdk --parent 127.0.0.1:9 --child-index 0 --rank-base 0 "
       "--local-ranks 4",
       "needs --backend udp"},
  };
  for (const Bad& b : bad) {
    const auto [code, out] = run_cli(b.args);
    EXPECT_NE(code, 0) << b.args;
    EXPECT_NE(out.find(b.says), std::string::npos) << b.args << "\n" << out;
  }
}

// A worker of the stopped-rank test: joins, then rank `stopped` never calls allreduce (the parent
// kills it); every other rank runs one allreduce with a short deadline and writes
// "<elapsed ms>\n<status>" to `out`. Returns 0 when the allreduce failed as it should.
constexpr auto kShortDeadline = 3000ms;
int stopped_worker_main(int rank, int stopped, uint16_t leaf_port, const std::string& out) {
  const ina::Config cfg = rank_config(rank, leaf_port, kShortDeadline);
  auto comm = ina::Communicator::create(cfg);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: create: %s\n", rank, comm.status().to_string().c_str());
    return 2;
  }
  if (rank == stopped) {
    std::this_thread::sleep_for(60s);  // stopped: killed by the test
    return 0;
  }
  std::vector<int32_t> in(1000, rank + 1), res(1000);
  const auto t0 = Clock::now();
  const ina::Status s =
      (*comm)->allreduce(in.data(), res.data(), in.size(), ina::DType::kInt32, ina::ReduceOp::kSum);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  std::ofstream(out) << ms << "\n" << s.to_string();
  return s.ok() ? 1 : 0;
}

// Rank 6 (behind leaf 1) stops after joining: the ranks at leaf 1 get an error naming rank 6
// (their leaf's bitmap), and the ranks at leaf 0, whose rounds are complete at their leaf and
// wait at the root, get the root's report turned into global ranks by leaf 0: "ranks 4-7
// (behind tree leaf 1; ... balanced rule ...)". Both within their deadline.
TEST(Tree, AStoppedRankIsNamedAtBothLeavesWithinTheDeadline) {
  constexpr int kStopped = 6;
  AggregatorProcess root;
  AggregatorProcess leaf[2];
  AggregatorProcess::Options ro;
  ro.stdout_path = temp_path("root");
  ASSERT_EQ(root.start(2, ro), "");
  std::string rep_path[2];
  for (int c = 0; c < 2; ++c) {
    AggregatorProcess::Options lo;
    rep_path[c] = temp_path("leaf");
    lo.stdout_path = rep_path[c];
    lo.extra_args = {"--parent",       "127.0.0.1:" + std::to_string(root.port),
                     "--child-index",  std::to_string(c),
                     "--rank-base",    std::to_string(c * kPerLeaf),
                     "--local-ranks",  std::to_string(kPerLeaf),
                     "--parent-world", "2"};
    ASSERT_EQ(leaf[c].start(kWorld, lo), "");
  }
  std::vector<std::string> out(kWorld);
  std::vector<pid_t> pids(kWorld, -1);
  std::fflush(nullptr);
  for (int r = 0; r < kWorld; ++r) {
    out[r] = temp_path("rank");
    const pid_t pid = fork();
    if (pid == 0) {
      _exit(stopped_worker_main(r, kStopped, leaf[r / kPerLeaf].port, out[r]));
    }
    pids[r] = pid;
  }
  const auto deadline = Clock::now() + 60s;
  std::vector<int> codes(kWorld, -1);
  for (int r = 0; r < kWorld; ++r) {
    if (r == kStopped) continue;
    int status = 0;
    while (waitpid(pids[r], &status, WNOHANG) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    if (Clock::now() >= deadline) break;
    codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    pids[r] = -1;
  }
  for (pid_t p : pids) {
    if (p > 0) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  }
  for (int c = 0; c < 2; ++c) EXPECT_EQ(leaf[c].stop(), 0) << "leaf " << c << " exit";
  EXPECT_EQ(root.stop(), 0) << "root exit";

  for (int r = 0; r < kWorld; ++r) {
    if (r == kStopped) continue;
    const std::string got = slurp(out[r]);
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + got);
    EXPECT_EQ(codes[r], 0);
    const long long ms = std::atoll(got.c_str());
    // Within its deadline (plus scheduling slack on a loaded machine), not a hang.
    EXPECT_GE(ms, kShortDeadline.count() - 50);
    EXPECT_LE(ms, kShortDeadline.count() + 2000);
    EXPECT_NE(got.find("DEADLINE_EXCEEDED"), std::string::npos);
    if (r / kPerLeaf == 1) {
      EXPECT_NE(got.find("rank 6 did not contribute"), std::string::npos);
    } else {
      EXPECT_NE(got.find("ranks 4-7 (behind tree leaf 1; the root names leaves only"),
                std::string::npos);
      EXPECT_NE(got.find("did not contribute (aggregator bitmap)"), std::string::npos);
    }
    std::printf("rank %d after %lld ms: %s\n", r, ms, got.substr(got.find('\n') + 1).c_str());
    std::remove(out[r].c_str());
  }
  std::remove(out[kStopped].c_str());
  const std::string rep0 = slurp(rep_path[0]);
  EXPECT_GT(counter(rep0, "parent_missing"), 0) << rep0;
  for (int c = 0; c < 2; ++c) std::remove(rep_path[c].c_str());
  std::remove(ro.stdout_path.c_str());
}

TEST(Tree, TwoLeavesAndARootEightRanksExact) { run_tree(0, 0); }

TEST(Tree, LossAndDuplicatesAtEveryAggregatorStillExact) { run_tree(2.0, 1.0); }

}  // namespace
