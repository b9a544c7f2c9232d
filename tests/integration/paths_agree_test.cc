// One job's results, bit for bit, on every path libina has: a flat job on one
// ina-aggregator, the job sharded over two, a two-level tree (root + two leaves), and the exact
// host fallback (INA_FALLBACK=exact on the TCP mesh, no aggregator). Every dtype (int32, float32,
// float16, bfloat16, float8 e4m3 and e5m2) x every op (SUM, MIN, MAX), at world sizes 1, 2, 3 and
// 8 (the tree at 8: leaves of 4; flat and sharded also at 64); each rank's output must equal
// the protocol model's (loopback_support.h: model_result, the aggregator's codec applied per
// block), so the paths equal each other. Ranks are threads of this process, each with its own
// communicator.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "../free_port.h"
#include "ina/ina.hpp"
#include "tests/integration/loopback_support.h"
#include "tests/integration/thread_ranks.h"

namespace {

using namespace std::chrono_literals;
using ina::DType;
using ina::ReduceOp;
using ina::testing::AggregatorProcess;
using ina::testing::Case;

constexpr uint32_t kBlock = 256;  // 4-byte elements per block (1 KiB payloads)

std::vector<Case> cases() {
  std::vector<Case> cs;
  // 2 full blocks and a tail for the 4-byte types (more blocks of the narrower ones' width);
  // a NaN in one float SUM case (rank 2, where the world has one).
  for (const DType t : {DType::kInt32, DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                        DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      cs.push_back({t, op, 777});
    }
  }
  cs.push_back({DType::kFloat32, ReduceOp::kSum, 300, /*nan=*/true});
  cs.push_back({DType::kBFloat16, ReduceOp::kSum, 1, false});
  return cs;
}

ina::Config base_config(int rank, int world) {
  ina::Config cfg;
  cfg.rank = rank;
  cfg.world_size = world;
  cfg.block_elems = kBlock;
  cfg.timeout = 20s;
  return cfg;
}

// Runs every case on communicators made by `config`: every rank's output equal to the model, no
// fallback to the host path.
void run_all(const char* path, int world, const std::function<ina::Config(int)>& config) {
  SCOPED_TRACE(std::string(path) + ", world " + std::to_string(world));
  ina::testing::ThreadRanks t = ina::testing::create_thread_ranks(world, config);
  for (int r = 0; r < world; ++r) {
    ASSERT_NE(t.comms[static_cast<size_t>(r)], nullptr)
        << "rank " << r << ": " << t.created[static_cast<size_t>(r)].to_string();
  }
  const std::vector<Case> cs = cases();
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    const Case& c = cs[ci];
    const ina::testing::ThreadCase tc =
        ina::testing::run_thread_case(t.comms, c, static_cast<int>(ci), kBlock);
    for (int r = 0; r < world; ++r) {
      const auto i = static_cast<size_t>(r);
      ASSERT_TRUE(tc.status[i].ok()) << "case " << ci << " (" << ina::dtype_name(c.dtype)
                                     << ") rank " << r << ": " << tc.status[i].to_string();
      EXPECT_EQ(tc.out[i], tc.want)
          << "case " << ci << ": " << ina::dtype_name(c.dtype) << " op " << static_cast<int>(c.op)
          << " count " << c.count << ", rank " << r;
    }
  }
  for (int r = 0; r < world; ++r) {
    const ina::CommStats s = t.comms[static_cast<size_t>(r)]->stats();
    EXPECT_EQ(s.fallbacks, 0u) << "rank " << r;
    EXPECT_EQ(s.collectives, cs.size()) << "rank " << r;
  }
}

class PathsAgree : public ::testing::TestWithParam<int> {};

TEST_P(PathsAgree, FlatJob) {
  const int world = GetParam();
  AggregatorProcess agg;
  ASSERT_EQ(agg.start(world), "");
  run_all("flat", world, [&](int r) {
    ina::Config c = base_config(r, world);
    c.aggregator_port = agg.port;
    return c;
  });
}

TEST_P(PathsAgree, TwoShards) {
  const int world = GetParam();
  AggregatorProcess a, b;
  ASSERT_EQ(a.start(world), "");
  ASSERT_EQ(b.start(world), "");
  run_all("two shards", world, [&](int r) {
    ina::Config c = base_config(r, world);
    c.aggregators = {{"127.0.0.1", a.port}, {"127.0.0.1", b.port}};
    return c;
  });
}

TEST_P(PathsAgree, ExactHostFallback) {
  const int world = GetParam();
  const uint16_t store = ina::testing::free_loopback_port();
  ASSERT_NE(store, 0);
  run_all("exact host fallback", world, [&](int r) {
    ina::Config c = base_config(r, world);
    c.host_only = true;
    c.fallback = ina::FallbackMode::kExact;
    c.store = "127.0.0.1:" + std::to_string(store);
    return c;
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, PathsAgree, ::testing::Values(1, 2, 3, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "World" + std::to_string(i.param);
                         });

// World 64 in-network (flat and sharded). The exact host fallback at 64 is left out: its full TCP
// mesh of 64 threads would need 64 x 63 descriptors in this one process.
TEST(PathsAgree64, FlatAndTwoShards) {
  constexpr int kWorld = 64;
  AggregatorProcess a, b;
  ASSERT_EQ(a.start(kWorld), "");
  ASSERT_EQ(b.start(kWorld), "");
  run_all("flat", kWorld, [&](int r) {
    ina::Config c = base_config(r, kWorld);
    c.aggregator_port = a.port;
    return c;
  });
  run_all("two shards", kWorld, [&](int r) {
    ina::Config c = base_config(r, kWorld);
    c.aggregators = {{"127.0.0.1", a.port}, {"127.0.0.1", b.port}};
    return c;
  });
}

// The tree: a root (world 2: the leaves) and two leaves of 4 ranks each.
TEST(PathsAgreeTree, TwoLevelTreeAt8) {
  constexpr int kWorld = 8, kPerLeaf = 4;
  AggregatorProcess root;
  AggregatorProcess leaf[2];
  ASSERT_EQ(root.start(2), "");
  for (int l = 0; l < 2; ++l) {
    AggregatorProcess::Options o;
    o.extra_args = {"--parent",       "127.0.0.1:" + std::to_string(root.port),
                    "--child-index",  std::to_string(l),
                    "--rank-base",    std::to_string(l * kPerLeaf),
                    "--local-ranks",  std::to_string(kPerLeaf),
                    "--parent-world", "2"};
    ASSERT_EQ(leaf[l].start(kWorld, o), "");
  }
  run_all("tree", kWorld, [&](int r) {
    ina::Config c = base_config(r, kWorld);
    c.aggregator_port = leaf[r / kPerLeaf].port;
    return c;
  });
}

}  // namespace
