// One job sharded over two real `ina-aggregator` processes on loopback (static configuration:
// INA_AGGREGATOR-style list, same job id and key on both), 4 forked ranks linked with libina's
// core.
//
//   ShardedMatchesOneAggregatorBitwise  every case runs on aggregator A alone, then sharded over
//                      A and B: the outputs are byte for byte the same (float SUM included), and
//                      both equal the protocol model.
//   ShardedUnderAggregatorLoss  both aggregators drop 2% of what they receive (--drop-percent)
//                      and the ranks lose 1% each way: results still equal the model.
//   ShardAggregatorKilledMidStream  aggregator B is SIGTERMed while collective 8 is in flight:
//                      the collective is redone on the host path (exact mode), every rank agrees,
//                      every later collective runs on the host path, results equal the model.
//   ShardAggregatorBackReturnsInNetwork  B is stopped, the ranks fall back; a new B starts on the
//                      same port and the probe (joining both aggregators) brings every rank back
//                      in-network; results equal the model throughout.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../free_port.h"
#include "ina/ina.hpp"
#include "tests/integration/loopback_support.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ina::testing::AggregatorProcess;
using ina::testing::Case;
using ina::testing::fill_input;
using ina::testing::model_result;

constexpr uint32_t kBlock = 256;
constexpr int kWorld = 4;

std::vector<uint8_t> model_of(const Case& c, int ci) {
  std::vector<std::vector<uint8_t>> inputs(kWorld);
  for (int r = 0; r < kWorld; ++r) fill_input(inputs[r], c, r, ci);
  return model_result(inputs, c, kBlock);
}

std::string first_difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                             size_t es) {
  if (got.size() != want.size()) return "size differs";
  for (size_t i = 0; i * es < got.size(); ++i) {
    if (std::memcmp(&got[i * es], &want[i * es], es) != 0) {
      return "element " + std::to_string(i) + " differs";
    }
  }
  return "";
}

ina::Config worker_config(int rank, const std::vector<uint16_t>& ports, uint16_t store_port) {
  ina::Config cfg;
  cfg.rank = rank;
  cfg.world_size = kWorld;
  for (uint16_t p : ports) cfg.aggregators.push_back({"127.0.0.1", p});
  cfg.aggregator_host = "127.0.0.1";
  cfg.aggregator_port = ports[0];
  if (ports.size() == 1) cfg.aggregators.clear();
  cfg.block_elems = kBlock;
  cfg.timeout = 3000ms;
  cfg.retransmit = 1000us;
  if (store_port != 0) cfg.store = "127.0.0.1:" + std::to_string(store_port);
  return cfg;
}

// Runs case ci (in place when ci is odd) and returns the output.
ina::Status run_case(ina::Communicator& comm, const Case& c, int ci, int rank,
                     std::vector<uint8_t>* out) {
  std::vector<uint8_t> in;
  fill_input(in, c, rank, ci);
  *out = in;
  if (ci % 2 == 1) return comm.allreduce(out->data(), out->data(), c.count, c.dtype, c.op);
  return comm.allreduce(in.data(), out->data(), c.count, c.dtype, c.op);
}

const std::vector<Case>& cases() {
  using ina::DType;
  using ina::ReduceOp;
  static const std::vector<Case> c = {
      {DType::kFloat32, ReduceOp::kSum, 1000},   {DType::kFloat32, ReduceOp::kSum, 1},
      {DType::kFloat32, ReduceOp::kSum, 100003}, {DType::kInt32, ReduceOp::kSum, 100000},
      {DType::kFloat32, ReduceOp::kSum, 257},    {DType::kFloat16, ReduceOp::kSum, 3000},
      {DType::kFloat32, ReduceOp::kMax, 999},    {DType::kInt32, ReduceOp::kSum, 777},
      {DType::kFloat32, ReduceOp::kSum, 100003},  // 8: the kill test stops B during it
      {DType::kFloat32, ReduceOp::kSum, 1},      {DType::kFloat32, ReduceOp::kSum, 100003},
      {DType::kBFloat16, ReduceOp::kSum, 5000},  {DType::kFloat32, ReduceOp::kSum, 256, true},
      {DType::kInt32, ReduceOp::kSum, 65536},    {DType::kFloat32, ReduceOp::kMin, 1000},
  };
  return c;
}

constexpr int kMaxCases = 16;

struct Shared {
  std::atomic<int> phase_done;              // ranks done with the unsharded phase
  ina::testing::KillDuringCollective kill;  // at collective kKillAt
  int failures[kWorld];
  int host_path[kMaxCases][kWorld];
  uint64_t fallbacks[kWorld];
  uint64_t collectives[kWorld];
};

Shared* map_shared() {
  void* mem =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return nullptr;
  return new (mem) Shared();
}

TEST(Sharding, ShardedMatchesOneAggregatorBitwise) {
  AggregatorProcess a, b;
  ASSERT_EQ(a.start(kWorld), "");
  ASSERT_EQ(b.start(kWorld), "");
  Shared* sh = map_shared();
  ASSERT_NE(sh, nullptr);
  const auto& cs = cases();
  auto body = [&](int rank) -> int {
    // Phase 1: one aggregator (A). Outputs kept for the comparison.
    std::vector<std::vector<uint8_t>> one(cs.size());
    {
      auto comm = ina::Communicator::create(worker_config(rank, {a.port}, 0));
      if (!comm.ok()) {
        std::fprintf(stderr, "rank %d: create (A): %s\n", rank, comm.status().to_string().c_str());
        return 2;
      }
      for (size_t ci = 0; ci < cs.size(); ++ci) {
        const ina::Status s = run_case(**comm, cs[ci], static_cast<int>(ci), rank, &one[ci]);
        if (!s.ok()) {
          std::fprintf(stderr, "rank %d: A, case %zu: %s\n", rank, ci, s.to_string().c_str());
          return 3;
        }
      }
    }
    // Every rank is done with A before anyone re-joins it as shard 0.
    sh->phase_done.fetch_add(1);
    while (sh->phase_done.load() < kWorld) std::this_thread::sleep_for(100us);
    auto comm = ina::Communicator::create(worker_config(rank, {a.port, b.port}, 0));
    if (!comm.ok()) {
      std::fprintf(stderr, "rank %d: create (A,B): %s\n", rank, comm.status().to_string().c_str());
      return 4;
    }
    int failures = 0;
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      std::vector<uint8_t> out;
      const ina::Status s = run_case(**comm, cs[ci], static_cast<int>(ci), rank, &out);
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d: sharded, case %zu: %s\n", rank, ci, s.to_string().c_str());
        return 5;
      }
      const size_t es = ina::dtype_size(cs[ci].dtype);
      const std::string d1 = first_difference(out, one[ci], es);
      const std::string d2 = first_difference(out, model_of(cs[ci], static_cast<int>(ci)), es);
      if (!d1.empty() || !d2.empty()) {
        std::fprintf(stderr,
                     "rank %d: case %zu (%s %s, %zu): vs one aggregator: %s; vs model: %s\n", rank,
                     ci, std::string(ina::dtype_name(cs[ci].dtype)).c_str(),
                     std::string(ina::op_name(cs[ci].op)).c_str(), cs[ci].count,
                     d1.empty() ? "same" : d1.c_str(), d2.empty() ? "same" : d2.c_str());
        ++failures;
      }
    }
    sh->failures[rank] = failures;
    sh->collectives[rank] = (*comm)->stats().collectives;
    return failures == 0 ? 0 : 6;
  };
  const std::string err = ina::testing::run_forked(
      kWorld, body, [] { return std::string(); }, 120s);
  EXPECT_EQ(err, "");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(sh->failures[r], 0) << "rank " << r;
    EXPECT_EQ(sh->collectives[r], cs.size()) << "rank " << r;
  }
  EXPECT_EQ(a.stop(), 0);
  EXPECT_EQ(b.stop(), 0);
  munmap(sh, sizeof(Shared));
}

TEST(Sharding, ShardedUnderAggregatorLoss) {
  AggregatorProcess a, b;
  AggregatorProcess::Options lossy;
  lossy.drop_percent = 2;
  ASSERT_EQ(a.start(kWorld, lossy), "");
  ASSERT_EQ(b.start(kWorld, lossy), "");
  Shared* sh = map_shared();
  ASSERT_NE(sh, nullptr);
  const auto& cs = cases();
  auto body = [&](int rank) -> int {
    ina::Config cfg = worker_config(rank, {a.port, b.port}, 0);
    cfg.timeout = 10000ms;
    cfg.fault.drop_send_percent = 1;
    cfg.fault.drop_recv_percent = 1;
    auto comm = ina::Communicator::create(cfg);
    if (!comm.ok()) {
      std::fprintf(stderr, "rank %d: create: %s\n", rank, comm.status().to_string().c_str());
      return 2;
    }
    int failures = 0;
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      std::vector<uint8_t> out;
      const ina::Status s = run_case(**comm, cs[ci], static_cast<int>(ci), rank, &out);
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d: case %zu: %s\n", rank, ci, s.to_string().c_str());
        return 3;
      }
      const std::string d = first_difference(out, model_of(cs[ci], static_cast<int>(ci)),
                                             ina::dtype_size(cs[ci].dtype));
      if (!d.empty()) {
        std::fprintf(stderr, "rank %d: case %zu: %s from the model\n", rank, ci, d.c_str());
        ++failures;
      }
    }
    sh->failures[rank] = failures;
    sh->fallbacks[rank] = (*comm)->stats().retransmits;  // reused: retransmits
    return failures == 0 ? 0 : 4;
  };
  const std::string err = ina::testing::run_forked(
      kWorld, body, [] { return std::string(); }, 180s);
  EXPECT_EQ(err, "");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(sh->failures[r], 0) << "rank " << r;
    EXPECT_GT(sh->fallbacks[r], 0u) << "rank " << r << ": loss but no retransmission";
  }
  munmap(sh, sizeof(Shared));
}

constexpr int kKillAt = 8;

TEST(Sharding, ShardAggregatorKilledMidStream) {
  AggregatorProcess a, b;
  ASSERT_EQ(a.start(kWorld), "");
  ASSERT_EQ(b.start(kWorld), "");
  const uint16_t store_port = ina::testing::free_loopback_port();
  ASSERT_NE(store_port, 0);
  Shared* sh = map_shared();
  ASSERT_NE(sh, nullptr);
  const auto& cs = cases();
  auto body = [&](int rank) -> int {
    auto comm = ina::Communicator::create(worker_config(rank, {a.port, b.port}, store_port));
    if (!comm.ok()) {
      std::fprintf(stderr, "rank %d: create: %s\n", rank, comm.status().to_string().c_str());
      return 2;
    }
    int failures = 0;
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      sh->kill.before(ci, kKillAt);
      std::vector<uint8_t> out;
      const ina::Status s = run_case(**comm, cs[ci], static_cast<int>(ci), rank, &out);
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d: collective %zu: %s\n", rank, ci, s.to_string().c_str());
        return 3;
      }
      sh->host_path[ci][rank] = (*comm)->on_host_path() ? 1 : 0;
      const std::string d = first_difference(out, model_of(cs[ci], static_cast<int>(ci)),
                                             ina::dtype_size(cs[ci].dtype));
      if (!d.empty()) {
        std::fprintf(stderr, "rank %d: collective %zu: %s from the model\n", rank, ci, d.c_str());
        ++failures;
      }
    }
    sh->failures[rank] = failures;
    sh->fallbacks[rank] = (*comm)->stats().fallbacks;
    return failures == 0 ? 0 : 4;
  };
  auto parent = [&] {
    return sh->kill.kill(
        kWorld, kKillAt, [&] { return b.stop(); }, "aggregator B");
  };
  const auto t0 = Clock::now();
  const std::string err = ina::testing::run_forked(kWorld, body, parent, 90s);
  EXPECT_EQ(err, "");
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    for (int r = 0; r < kWorld; ++r) {
      if (ci < static_cast<size_t>(kKillAt)) {
        EXPECT_EQ(sh->host_path[ci][r], 0) << "collective " << ci << " rank " << r;
      } else if (ci > static_cast<size_t>(kKillAt)) {
        EXPECT_EQ(sh->host_path[ci][r], 1) << "collective " << ci << " rank " << r;
      }
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(sh->failures[r], 0) << "rank " << r;
    EXPECT_EQ(sh->fallbacks[r], 1u) << "rank " << r;
  }
  std::fprintf(stderr, "stream of %zu sharded collectives with aggregator B killed: %.2f s\n",
               cs.size(), std::chrono::duration<double>(Clock::now() - t0).count());
  EXPECT_EQ(a.stop(), 0);
  munmap(sh, sizeof(Shared));
}

struct Shared2 {
  std::atomic<int> ready;   // ranks done with collective 0
  std::atomic<int> killed;  // B is gone
  std::atomic<int> fallen;  // ranks on the host path
  std::atomic<int> restarted;
  std::atomic<int> back;  // ranks in-network again
  int failures[kWorld];
  uint64_t probes[kWorld];
};

TEST(Sharding, ShardAggregatorBackReturnsInNetwork) {
  AggregatorProcess a, b;
  ASSERT_EQ(a.start(kWorld), "");
  ASSERT_EQ(b.start(kWorld), "");
  const uint16_t b_port = b.port;
  const uint16_t store_port = ina::testing::free_loopback_port();
  ASSERT_NE(store_port, 0);
  void* mem =
      mmap(nullptr, sizeof(Shared2), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* sh = new (mem) Shared2();
  const Case c{ina::DType::kFloat32, ina::ReduceOp::kSum, 20000};
  auto body = [&](int rank) -> int {
    auto comm = ina::Communicator::create(worker_config(rank, {a.port, b_port}, store_port));
    if (!comm.ok()) {
      std::fprintf(stderr, "rank %d: create: %s\n", rank, comm.status().to_string().c_str());
      return 2;
    }
    int failures = 0;
    auto one = [&](int ci) -> bool {
      std::vector<uint8_t> out;
      const ina::Status s = run_case(**comm, c, ci, rank, &out);
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d: collective %d: %s\n", rank, ci, s.to_string().c_str());
        return false;
      }
      if (out != model_of(c, ci)) {
        std::fprintf(stderr, "rank %d: collective %d differs from the model\n", rank, ci);
        ++failures;
      }
      return true;
    };
    if (!one(0) || (*comm)->on_host_path()) return 3;
    sh->ready.fetch_add(1);
    while (sh->killed.load() == 0) std::this_thread::sleep_for(100us);
    int ci = 1;
    if (!one(ci++)) return 4;  // redone on the host path
    if (!(*comm)->on_host_path()) return 5;
    sh->fallen.fetch_add(1);
    while (sh->restarted.load() == 0) std::this_thread::sleep_for(100us);
    const auto deadline = Clock::now() + 30s;
    while ((*comm)->on_host_path() && Clock::now() < deadline) {
      if (!one(ci++)) return 6;
      std::this_thread::sleep_for(20ms);
    }
    if ((*comm)->on_host_path()) return 7;
    sh->back.fetch_add(1);
    if (!one(ci++)) return 8;  // in-network again, both shards
    sh->failures[rank] = failures;
    sh->probes[rank] = (*comm)->stats().probes;
    return failures == 0 ? 0 : 9;
  };
  auto parent = [&]() -> std::string {
    auto wait_for = [](std::atomic<int>& v, std::chrono::seconds limit) {
      const auto deadline = Clock::now() + limit;
      while (v.load() < kWorld && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
      return v.load() == kWorld;
    };
    if (!wait_for(sh->ready, 30s)) return "the ranks never finished collective 0; ";
    const int rc = b.stop();
    sh->killed.store(1);
    if (rc != 0) return "aggregator B exit status " + std::to_string(rc) + "; ";
    if (!wait_for(sh->fallen, 30s)) return "the ranks never fell back; ";
    AggregatorProcess::Options same;
    same.port = b_port;
    const std::string why = b.start(kWorld, same);
    sh->restarted.store(1);
    return why.empty() ? "" : "restarting B: " + why + "; ";
  };
  const std::string err = ina::testing::run_forked(kWorld, body, parent, 90s);
  EXPECT_EQ(err, "");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(sh->failures[r], 0) << "rank " << r;
    EXPECT_GE(sh->probes[r], 1u) << "rank " << r;
  }
  EXPECT_EQ(sh->back.load(), kWorld);
  munmap(mem, sizeof(Shared2));
}

}  // namespace
