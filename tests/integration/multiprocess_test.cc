// Multi-process integration on loopback: a real `ina-aggregator` process and N forked worker
// processes, each with its own libina communicator, running AllReduce over kernel UDP.
//
// Every result is checked twice:
//   * bitwise against a model of the protocol built from the quantizer reference (per block: the
//     MAX of the ranks' exponents, encode, wrap-around int32 sum, decode): the in-network result
//     must equal it exactly, whatever the loss, duplication or reordering on the way;
//   * against the double-precision sum within the documented bound (quantize.h), so the model
//     itself is held to the specification.
// Loss and duplication are injected by the test hooks of both the workers and the aggregator.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ina/base/half.h"
#include "ina/ina.hpp"
#include "ina/protocol/fp8.h"
#include "ina/protocol/quantize.h"
#include "tests/integration/loopback_support.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kBlock = 256;

using ina::testing::AggregatorProcess;
using ina::testing::Case;
using ina::testing::fill_input;
using ina::testing::model_result;

// ---- deterministic data and the reference model ----

double element_as_double(const uint8_t* p, ina::DType t) {
  switch (t) {
    case ina::DType::kInt32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case ina::DType::kFloat32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case ina::DType::kFloat16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return ina::half_to_float(x);
    }
    case ina::DType::kBFloat16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return ina::bf16_to_float(x);
    }
    case ina::DType::kFloat8E4M3: return ina::e4m3_to_float(*p);
    case ina::DType::kFloat8E5M2: return ina::e5m2_to_float(*p);
  }
  return 0;
}

// Checks `got` bitwise against the model and within the documented bound of the double reference.
// Returns a description of the first failure, or "".
std::string check_result(const std::vector<uint8_t>& got,
                         const std::vector<std::vector<uint8_t>>& inputs, const Case& c,
                         uint32_t world) {
  const size_t es = ina::dtype_size(c.dtype);
  std::vector<uint8_t> want = model_result(inputs, c, kBlock);
  for (size_t i = 0; i < c.count; ++i) {
    if (std::memcmp(&got[i * es], &want[i * es], es) != 0) {
      char msg[256];
      std::snprintf(msg, sizeof msg, "element %zu: got %.9g, protocol model says %.9g", i,
                    element_as_double(&got[i * es], c.dtype),
                    element_as_double(&want[i * es], c.dtype));
      return msg;
    }
  }
  if (c.dtype == ina::DType::kInt32) return "";  // bitwise equal to the exact wrapped sum/min/max
  for (size_t base = 0; base < c.count; base += kBlock) {
    const size_t n = std::min<size_t>(kBlock, c.count - base);
    double block_max = 0;
    for (const auto& in : inputs)
      for (size_t i = base; i < base + n; ++i)
        block_max = std::max(block_max, std::fabs(element_as_double(&in[i * es], c.dtype)));
    for (size_t i = base; i < base + n; ++i) {
      double ref = element_as_double(&inputs[0][i * es], c.dtype);
      for (size_t r = 1; r < inputs.size(); ++r) {
        double x = element_as_double(&inputs[r][i * es], c.dtype);
        ref = c.op == ina::ReduceOp::kSum   ? ref + x
              : c.op == ina::ReduceOp::kMin ? std::min(ref, x)
                                            : std::max(ref, x);
      }
      double out = element_as_double(&got[i * es], c.dtype);
      const double bound = c.op == ina::ReduceOp::kSum
                               ? ina::quant::sum_error_bound(c.dtype, block_max, world, ref)
                               : 0.0;
      if (!(std::fabs(out - ref) <= bound)) {
        char msg[256];
        std::snprintf(msg, sizeof msg, "element %zu: got %.9g, exact %.9g, bound %.3g", i, out, ref,
                      bound);
        return msg;
      }
    }
  }
  return "";
}

// ---- worker processes ----

struct WorkerPlan {
  int world = 1;
  uint16_t port = 0;
  std::vector<Case> cases;
  double drop_percent = 0;
  double dup_percent = 0;
  std::chrono::milliseconds timeout{20000};
  std::string job_key;  // INA_JOB_KEY in the worker's environment ("": unset)
};

// Runs in a forked child; returns the exit code. Failures go to stderr.
int worker_main(int rank, const WorkerPlan& plan) {
  ina::Config cfg;
  cfg.rank = rank;
  cfg.world_size = plan.world;
  cfg.aggregator_host = "127.0.0.1";
  cfg.aggregator_port = plan.port;
  cfg.block_elems = kBlock;
  cfg.timeout = plan.timeout;
  cfg.retransmit = 1000us;
  cfg.fault.drop_send_percent = plan.drop_percent;
  cfg.fault.drop_recv_percent = plan.drop_percent;
  cfg.fault.dup_send_percent = plan.dup_percent;
  cfg.fault.seed = 1234 + static_cast<uint64_t>(rank);
  if (!plan.job_key.empty()) {
    // As a launcher hands it over: INA_JOB_KEY, read by Config::from_env.
    setenv("INA_JOB_KEY", plan.job_key.c_str(), 1);
    auto env = ina::Config::from_env();
    if (!env.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, env.status().to_string().c_str());
      return 2;
    }
    cfg.job_key = env->job_key;
  }
  auto comm = ina::Communicator::create(cfg);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: create: %s\n", rank, comm.status().to_string().c_str());
    return 2;
  }
  int failures = 0;
  for (size_t ci = 0; ci < plan.cases.size(); ++ci) {
    const Case& c = plan.cases[ci];
    std::vector<std::vector<uint8_t>> inputs(plan.world);
    for (int r = 0; r < plan.world; ++r) fill_input(inputs[r], c, r, static_cast<int>(ci));
    // Alternate in-place and out-of-place calls.
    std::vector<uint8_t> out = inputs[rank];
    const bool in_place = ci % 2 == 1;
    std::vector<uint8_t> send = inputs[rank];
    ina::Status s = in_place ? (*comm)->allreduce(out.data(), out.data(), c.count, c.dtype, c.op)
                             : (*comm)->allreduce(send.data(), out.data(), c.count, c.dtype, c.op);
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: allreduce %s %s count %zu: %s\n", rank,
                   std::string(ina::dtype_name(c.dtype)).c_str(),
                   std::string(ina::op_name(c.op)).c_str(), c.count, s.to_string().c_str());
      return 3;
    }
    std::string err = check_result(out, inputs, c, static_cast<uint32_t>(plan.world));
    if (!err.empty()) {
      std::fprintf(stderr, "rank %d: allreduce %s %s count %zu%s: %s\n", rank,
                   std::string(ina::dtype_name(c.dtype)).c_str(),
                   std::string(ina::op_name(c.op)).c_str(), c.count, in_place ? " in place" : "",
                   err.c_str());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

// Forks plan.world workers, waits for all within `limit`; returns their exit codes (-1: killed).
std::vector<int> run_workers(const WorkerPlan& plan, std::chrono::seconds limit) {
  return ina::testing::fork_ranks(
      plan.world, [&](int r) { return worker_main(r, plan); }, limit);
}

std::vector<Case> standard_cases(bool with_large) {
  std::vector<Case> cases;
  const ina::DType dtypes[] = {ina::DType::kFloat32, ina::DType::kFloat16, ina::DType::kBFloat16,
                               ina::DType::kInt32};
  const ina::ReduceOp ops[] = {ina::ReduceOp::kSum, ina::ReduceOp::kMin, ina::ReduceOp::kMax};
  for (size_t count : {size_t{1}, size_t{255}, size_t{256}, size_t{257}})
    for (auto t : dtypes)
      for (auto op : ops) cases.push_back({t, op, count});
  if (with_large) {
    cases.push_back({ina::DType::kFloat32, ina::ReduceOp::kSum, 1000003});
    cases.push_back({ina::DType::kInt32, ina::ReduceOp::kSum, 1000003});
    cases.push_back({ina::DType::kBFloat16, ina::ReduceOp::kMax, 1000003});
  }
  return cases;
}

void run_allreduce_job(int world, double worker_drop, double agg_drop, double dup, bool large) {
  AggregatorProcess agg;
  AggregatorProcess::Options opts;
  opts.drop_percent = agg_drop;
  opts.dup_percent = dup;
  std::string err = agg.start(world, opts);
  ASSERT_EQ(err, "");
  WorkerPlan plan;
  plan.world = world;
  plan.port = agg.port;
  plan.cases = standard_cases(large);
  plan.drop_percent = worker_drop;
  plan.dup_percent = dup;
  auto codes = run_workers(plan, 240s);
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " failed (see stderr)";
  EXPECT_EQ(agg.stop(), 0) << "ina-aggregator did not shut down cleanly on SIGTERM";
}

class WorldSize : public ::testing::TestWithParam<int> {};

TEST_P(WorldSize, AllDtypesOpsAndCountsMatchTheModelAndTheBound) {
  run_allreduce_job(GetParam(), 0, 0, 0, /*large=*/true);
}

std::string world_name(const ::testing::TestParamInfo<int>& param) {
  return "N" + std::to_string(param.param);
}

INSTANTIATE_TEST_SUITE_P(Loopback, WorldSize, ::testing::Values(1, 2, 3, 4, 8), world_name);

// Each worker drops the percentage of the datagrams it sends and of those it receives; with
// duplicates, both the workers and the aggregator duplicate that percentage of datagrams.
TEST(Loss, OnePercentDropStillExact) { run_allreduce_job(4, 1.0, 0, 0, /*large=*/true); }

TEST(Loss, FivePercentDropAndDuplicatesStillExact) {
  run_allreduce_job(4, 5.0, 0, 2.0, /*large=*/true);
}

TEST(Loss, AggregatorSideDropStillExact) { run_allreduce_job(3, 0, 2.0, 0, /*large=*/false); }

TEST(Loss, DuplicatesOnlyStillExact) { run_allreduce_job(3, 0, 0, 5.0, /*large=*/false); }

// A worker killed in the middle of a stream of AllReduces: the survivors must return an error
// naming it, within the deadline (gloo's fork-and-kill pattern).
// The job's key on both sides (the aggregator's --key, the workers' INA_JOB_KEY): every packet
// is sealed and verified, and every collective is exact.
TEST(Auth, JobKeyOnBothSidesIsExact) {
  constexpr const char* kHex = "00112233445566778899aabbccddeeff";
  AggregatorProcess agg;
  AggregatorProcess::Options opts;
  opts.extra_args = {"--key", kHex};
  ASSERT_EQ(agg.start(3, opts), "");
  WorkerPlan plan;
  plan.world = 3;
  plan.port = agg.port;
  plan.cases = standard_cases(false);
  plan.job_key = kHex;
  auto codes = run_workers(plan, 120s);
  for (int r = 0; r < plan.world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " failed";
  EXPECT_EQ(agg.stop(), 0);
}

// Workers whose INA_JOB_KEY is not the aggregator's: their HELLOs are dropped as bad tags,
// unanswered, and joining fails within the deadline with an error that names INA_JOB_KEY.
TEST(Auth, WrongJobKeyFailsNamingTheKey) {
  AggregatorProcess agg;
  AggregatorProcess::Options opts;
  opts.extra_args = {"--key", "00112233445566778899aabbccddeeff"};
  ASSERT_EQ(agg.start(2, opts), "");
  struct Shared {
    char message[2][1024];
  };
  void* mem =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* shared = new (mem) Shared{};
  auto codes = ina::testing::fork_ranks(
      2,
      [&](int r) {
        setenv("INA_JOB_KEY", "00112233445566778899aabbccddeefe", 1);  // one bit off
        auto env = ina::Config::from_env();
        if (!env.ok()) return 2;
        ina::Config cfg;
        cfg.rank = r;
        cfg.world_size = 2;
        cfg.aggregator_port = agg.port;
        cfg.timeout = 1500ms;
        cfg.retransmit = 1000us;
        cfg.job_key = env->job_key;
        auto comm = ina::Communicator::create(cfg);
        ina::Status s = comm.ok() ? ina::ok_status() : comm.status();
        if (comm.ok()) {
          float x = 1.0f;
          s = (*comm)->allreduce(&x, &x, 1, ina::DType::kFloat32, ina::ReduceOp::kSum);
        }
        std::snprintf(shared->message[r], sizeof shared->message[r], "%s", s.to_string().c_str());
        return s.ok() ? 1 : 0;
      },
      60s);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r << ": a worker with the wrong key succeeded";
    const std::string m = shared->message[r];
    EXPECT_NE(m.find("INA_JOB_KEY"), std::string::npos) << "rank " << r << ": " << m;
  }
  munmap(mem, sizeof(Shared));
  EXPECT_EQ(agg.stop(), 0);
}

TEST(Failure, KilledWorkerIsNamedWithinTheDeadline) {
  constexpr int kWorld = 4;
  constexpr int kVictim = 2;
  constexpr auto kDeadline = 2000ms;
  AggregatorProcess agg;
  ASSERT_EQ(agg.start(kWorld), "");

  // Survivors report their error message through shared memory.
  struct Shared {
    std::atomic<int> victim_running;
    char message[kWorld][512];
    int code[kWorld];
    double seconds_to_error[kWorld];
  };
  void* mem =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* shared = new (mem) Shared{};

  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      ina::Config cfg;
      cfg.rank = r;
      cfg.world_size = kWorld;
      cfg.aggregator_port = agg.port;
      cfg.timeout = kDeadline;
      cfg.retransmit = 1000us;
      auto comm = ina::Communicator::create(cfg);
      if (!comm.ok()) _exit(2);
      std::vector<float> buf(1 << 20, 1.0f);
      for (int iter = 0;; ++iter) {
        if (r == kVictim && iter == 2) shared->victim_running.store(1);
        auto t0 = Clock::now();
        ina::Status s = (*comm)->allreduce(buf.data(), buf.data(), buf.size(), ina::DType::kFloat32,
                                           ina::ReduceOp::kSum);
        if (!s.ok()) {
          shared->seconds_to_error[r] = std::chrono::duration<double>(Clock::now() - t0).count();
          std::snprintf(shared->message[r], sizeof shared->message[r], "%s", s.to_string().c_str());
          shared->code[r] = static_cast<int>(s.code());
          _exit(0);
        }
        std::fill(buf.begin(), buf.end(), 1.0f);
        if (iter > 10000) _exit(4);
      }
    }
    pids.push_back(pid);
  }
  auto wait_start = Clock::now();
  while (shared->victim_running.load() == 0 && Clock::now() - wait_start < 60s)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(shared->victim_running.load(), 1) << "the victim never reached its third collective";
  kill(pids[kVictim], SIGKILL);
  waitpid(pids[kVictim], nullptr, 0);
  const auto killed_at = Clock::now();

  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    int status = -1;
    bool done = false;
    while (Clock::now() - killed_at < kDeadline + 8s) {
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done = true;
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    if (!done) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], nullptr, 0);
    }
    ASSERT_TRUE(done) << "rank " << r << " hung after rank " << kVictim << " was killed";
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r;
    std::string msg = shared->message[r];
    EXPECT_EQ(shared->code[r], static_cast<int>(ina::StatusCode::kDeadlineExceeded)) << msg;
    EXPECT_NE(msg.find("rank"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(kVictim)), std::string::npos) << msg;
    // The missing list must not accuse a survivor.
    for (int other = 0; other < kWorld; ++other) {
      if (other == kVictim) continue;
      EXPECT_EQ(msg.find("ranks " + std::to_string(other) + " "), std::string::npos) << msg;
    }
    EXPECT_LE(shared->seconds_to_error[r], std::chrono::duration<double>(kDeadline).count() + 2.0)
        << msg;
  }
  munmap(mem, sizeof(Shared));
  EXPECT_EQ(agg.stop(), 0);
}

}  // namespace
