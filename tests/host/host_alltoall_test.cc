// AllToAll(v) algorithms against a reference, threads as ranks over a real TCP mesh on 127.0.0.1:
//   * every algorithm (pairwise, bruck, hierarchical with every group size that divides the world,
//     and one that does not) x world sizes 1..9 x block sizes of 1, 3, 7 and 1009 bytes (odd
//     sizes: no alignment is assumed) and one of 64 KiB, with a small pairwise window so that
//     the windowed admission (rounds waiting for older ones) runs too, and a small
//     solo-round bound (larger rounds posted alone, after the older ones retired);
//   * AllToAllv with zero-size pairs (whole rows and columns empty, and everything empty) and
//     Zipf(1.2) expert loads (one hot rank receiving 10-100x the others), windows from 1 byte to
//     the default and the hot expert's rounds posted alone, at world sizes 1..9;
//   * the cost model's choice (bruck for small blocks, pairwise for large ones, hierarchical for
//     many ranks of small blocks when a group is given) and the INA_A2A_ALGO override.
// The reference: byte b of element k of the block rank i sends to rank j is a hash of (i, j, k, b),
// so a block delivered to the wrong rank, from the wrong rank or at the wrong offset is caught.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ina/ina.hpp"
#include "tests/host/harness.h"
#include "worker/host/alltoall.h"
#include "worker/host/select.h"

namespace ina::host {
namespace {

uint8_t block_byte(int from, int to, size_t at, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(from) << 40) ^
               (static_cast<uint64_t>(to) << 20) ^ at;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint8_t>(x ^ (x >> 31));
}

struct Case {
  AlltoallAlgorithm algorithm;
  int group;
  size_t window;
  size_t solo = kAlltoallSoloRoundBytes;
};

std::string describe(const Case& c, int world, size_t b) {
  return std::string(alltoall_algorithm_name(c.algorithm)) + " group " + std::to_string(c.group) +
         " window " + std::to_string(c.window) + " solo " + std::to_string(c.solo) + " world " +
         std::to_string(world) + " block " + std::to_string(b) + " B";
}

// Runs one AllToAll of blocks of b bytes (uint8 elements, so any size) and checks every byte.
void check_alltoall(Context& ctx, const Case& c, size_t b, uint64_t seed) {
  const auto p = static_cast<size_t>(ctx.size());
  std::vector<uint8_t> in(p * b), out(p * b, 0xEE);
  for (size_t j = 0; j < p; ++j)
    for (size_t k = 0; k < b; ++k)
      in[j * b + k] = block_byte(ctx.rank(), static_cast<int>(j), k, seed);
  AlltoallOptions o;
  o.algorithm = c.algorithm;
  o.group_size = c.group;
  o.window_bytes = c.window;
  o.solo_round_bytes = c.solo;
  const std::string what = describe(c, ctx.size(), b) + " rank " + std::to_string(ctx.rank());
  // int32 elements when they fit the block evenly (the dtype only sets the element size).
  const bool words = b % 4 == 0;
  Status s = alltoall(ctx, in.data(), out.data(), words ? b / 4 : b,
                      words ? DType::kInt32 : DType::kFloat8E4M3, o);
  ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
  size_t bad = 0;
  for (size_t i = 0; i < p; ++i)
    for (size_t k = 0; k < b; ++k)
      if (out[i * b + k] != block_byte(static_cast<int>(i), ctx.rank(), k, seed) && bad++ == 0)
        ADD_FAILURE() << what << ": byte " << k << " of rank " << i << "'s block is wrong";
  EXPECT_EQ(bad, 0u) << what;
  for (size_t j = 0; j < p; ++j)
    for (size_t k = 0; k < b; ++k)
      ASSERT_EQ(in[j * b + k], block_byte(ctx.rank(), static_cast<int>(j), k, seed))
          << what << ": input modified";
}

class AlltoallWorld : public ::testing::TestWithParam<int> {};

TEST_P(AlltoallWorld, EveryAlgorithmMatchesTheReference) {
  const int world = GetParam();
  std::vector<Case> cases = {
      {AlltoallAlgorithm::kPairwise, 0, kAlltoallWindowBytes},
      {AlltoallAlgorithm::kPairwise, 0, 1},  // kAlltoallMinRounds rounds at a time
      // Rounds of more than 1 KiB one at a time (1009 B and 64 KiB blocks), smaller ones together.
      {AlltoallAlgorithm::kPairwise, 0, kAlltoallWindowBytes, 1024},
      {AlltoallAlgorithm::kBruck, 0, kAlltoallWindowBytes},
      {AlltoallAlgorithm::kHierarchical, world + 1, kAlltoallWindowBytes},  // no group: flat
  };
  for (int g = 2; g < world; ++g)
    if (world % g == 0) {
      cases.push_back({AlltoallAlgorithm::kHierarchical, g, kAlltoallWindowBytes});
      cases.push_back({AlltoallAlgorithm::kHierarchical, g, 1});
    }
  test::run_ranks(world, [&](Context& ctx) {
    uint64_t seed = 1;
    for (const Case& c : cases)
      for (size_t b : {size_t{1}, size_t{3}, size_t{7}, size_t{1009}, size_t{64} << 10})
        check_alltoall(ctx, c, b, ++seed);
  });
}

// count 0 sends nothing and touches nothing, whatever the algorithm.
TEST_P(AlltoallWorld, ZeroCountIsANoOp) {
  test::run_ranks(GetParam(), [](Context& ctx) {
    for (auto a : {AlltoallAlgorithm::kPairwise, AlltoallAlgorithm::kBruck,
                   AlltoallAlgorithm::kHierarchical}) {
      AlltoallOptions o;
      o.algorithm = a;
      o.group_size = 2;
      uint8_t sentinel = 0x5A;
      ASSERT_TRUE(alltoall(ctx, &sentinel, &sentinel, 0, DType::kInt32, o).ok());
      EXPECT_EQ(sentinel, 0x5A);
    }
    // The next call works (nothing was left on the connections).
    check_alltoall(ctx, {AlltoallAlgorithm::kPairwise, 0, kAlltoallWindowBytes}, 5, 99);
  });
}

// counts[i][j]: elements rank i sends to rank j under `pattern`.
enum class Pattern { kAllZero, kZeroRowsAndColumns, kZipf, kHotReceiver };

size_t pattern_count(Pattern pt, int p, int i, int j, uint64_t seed) {
  switch (pt) {
    case Pattern::kAllZero: return 0;
    case Pattern::kZeroRowsAndColumns:
      // Rank 1 sends nothing, nobody sends to the last rank, every third pair is empty.
      if (i == 1 || j == p - 1 || (i + 2 * j) % 3 == 0) return 0;
      return 1 + static_cast<size_t>(block_byte(i, j, 0, seed) % 50);
    case Pattern::kZipf: {
      // Tokens routed to experts with Zipf(1.2) popularity: expert (rank) j's share is
      // proportional to 1/(rank of j)^1.2, the ranking rotated by the step (seed).
      const int popularity = (j + static_cast<int>(seed)) % p + 1;
      const double share = 1.0 / std::pow(popularity, 1.2);
      return static_cast<size_t>(std::floor(4000.0 * share)) + (i + j) % 3;
    }
    case Pattern::kHotReceiver:
      // Rank 0 is a hot expert: 100x the bytes of the others; some pairs empty.
      if (j == 0) return 20000;
      return (i + j) % 4 == 0 ? 0 : 200;
  }
  return 0;
}

void check_alltoallv(Context& ctx, Pattern pt, size_t window, size_t solo, uint64_t seed) {
  const int p = ctx.size();
  const int me = ctx.rank();
  const auto ps = static_cast<size_t>(p);
  const size_t es = 2;  // float16 elements: any 2-byte pattern is a valid value
  std::vector<size_t> sc(ps), sd(ps), rc(ps), rd(ps);
  size_t off = 0;
  for (size_t j = 0; j < ps; ++j) {  // send blocks in order, a one-element gap after each
    sc[j] = pattern_count(pt, p, me, static_cast<int>(j), seed);
    sd[j] = off;
    off += sc[j] + 1;
  }
  const size_t send_elems = off;
  off = 0;
  for (size_t i = ps; i-- > 0;) {  // receive blocks in reverse rank order
    rc[i] = pattern_count(pt, p, static_cast<int>(i), me, seed);
    rd[i] = off;
    off += rc[i] + 1;
  }
  const size_t recv_elems = off;
  std::vector<uint8_t> in(send_elems * es + 1), out(recv_elems * es + 1, 0xEE);
  for (size_t j = 0; j < ps; ++j)
    for (size_t k = 0; k < sc[j] * es; ++k)
      in[sd[j] * es + k] = block_byte(me, static_cast<int>(j), k, seed);
  AlltoallOptions o;
  o.window_bytes = window;
  o.solo_round_bytes = solo;
  const std::string what = "alltoallv pattern " + std::to_string(static_cast<int>(pt)) +
                           " window " + std::to_string(window) + " solo " + std::to_string(solo) +
                           " world " + std::to_string(p) + " rank " + std::to_string(me);
  Status s = alltoallv(ctx, in.data(), sc, sd, out.data(), rc, rd, DType::kFloat16, o);
  ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
  std::vector<bool> covered(recv_elems * es, false);
  size_t bad = 0;
  for (size_t i = 0; i < ps; ++i)
    for (size_t k = 0; k < rc[i] * es; ++k) {
      covered[rd[i] * es + k] = true;
      bad += out[rd[i] * es + k] != block_byte(static_cast<int>(i), me, k, seed);
    }
  for (size_t e = 0; e < recv_elems * es; ++e)
    if (!covered[e]) bad += out[e] != 0xEE;  // the gaps are untouched
  EXPECT_EQ(bad, 0u) << what;
}

TEST_P(AlltoallWorld, AlltoallvZeroPairsAndSkew) {
  test::run_ranks(GetParam(), [](Context& ctx) {
    uint64_t seed = 7;
    for (Pattern pt :
         {Pattern::kAllZero, Pattern::kZeroRowsAndColumns, Pattern::kZipf, Pattern::kHotReceiver})
      for (size_t window : {size_t{1}, size_t{16} << 10, kAlltoallWindowBytes}) {
        check_alltoallv(ctx, pt, window, kAlltoallSoloRoundBytes, ++seed);
        // The hot expert's rounds (up to 40 KB) alone, the small ones behind them.
        if (window == kAlltoallWindowBytes) check_alltoallv(ctx, pt, window, 4096, ++seed);
      }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, AlltoallWorld, ::testing::Range(1, 10),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "world" + std::to_string(i.param);
                         });

// A zero-size pair sends nothing: after an AllToAllv in which rank 0 and rank 1 exchange nothing,
// the pair's next message is the next collective's (a stray empty message would have been taken
// for it and failed the size check).
TEST(Alltoallv, ZeroPairSendsNothing) {
  test::run_ranks(2, [](Context& ctx) {
    std::vector<size_t> zero(2, 0);
    std::vector<size_t> own = {ctx.rank() == 0 ? size_t{1} : 0, ctx.rank() == 1 ? size_t{1} : 0};
    uint32_t in = 0x1234, out = 0;
    ASSERT_TRUE(alltoallv(ctx, &in, own, zero, &out, own, zero, DType::kInt32).ok());
    EXPECT_EQ(out, 0x1234u);  // the own block
    const uint32_t word = 0xC0DE0000u + static_cast<uint32_t>(ctx.rank());
    uint32_t got = 0;
    ASSERT_TRUE(ctx.sendrecv(1 - ctx.rank(), &word, 4, 1 - ctx.rank(), &got, 4).ok());
    EXPECT_EQ(got, 0xC0DE0000u + static_cast<uint32_t>(1 - ctx.rank()));
  });
}

// A mismatch of two non-zero counts is an error naming the peer.
TEST(Alltoallv, SizeMismatchNamesThePeer) {
  test::run_ranks(2, [](Context& ctx) {
    std::vector<uint32_t> in(8, 1), out(8, 0);
    std::vector<size_t> sc = {1, 2}, sd = {0, 1}, rd = {0, 1};
    // Rank 1 expects 3 elements from rank 0, which sends it 2.
    std::vector<size_t> rc = {1, ctx.rank() == 1 ? size_t{3} : size_t{2}};
    if (ctx.rank() == 1) rc = {3, 2};
    Status s = alltoallv(ctx, in.data(), sc, sd, out.data(), rc, rd, DType::kInt32);
    if (ctx.rank() == 1) {
      ASSERT_FALSE(s.ok());
      EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s.to_string();
    }
  });
}

// ---- the cost model's choice ----

CostModel loopback() {
  CostModel m;
  m.alpha_s = 25e-6;
  m.beta_s_per_byte = 0.5e-9;
  m.gamma_s_per_byte = 0.1e-9;
  return m;
}

AlltoallAlgorithm pick(const CostModel& m, size_t b, int world, int group, std::string_view o) {
  Result<AlltoallAlgorithm> a = select_alltoall(m, b, world, group, o);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  return a.ok() ? a.value() : AlltoallAlgorithm::kPairwise;
}

TEST(SelectAlltoall, SmallBlocksBruckLargeBlocksPairwise) {
  const CostModel m = loopback();
  for (int world : {4, 8, 16, 64}) {
    EXPECT_EQ(pick(m, 8, world, 0, ""), AlltoallAlgorithm::kBruck) << world;
    EXPECT_EQ(pick(m, 1 << 20, world, 0, ""), AlltoallAlgorithm::kPairwise) << world;
  }
  // Two ranks: one message either way, pairwise copies less.
  EXPECT_EQ(pick(m, 8, 2, 0, ""), AlltoallAlgorithm::kPairwise);
  EXPECT_EQ(pick(m, 8, 1, 0, ""), AlltoallAlgorithm::kPairwise);
}

TEST(SelectAlltoall, CostsGrowWithSizeAndPairwiseCrossesBruckOnce) {
  const CostModel m = loopback();
  for (int world : {3, 4, 8, 9, 32}) {
    int crossings = 0;
    bool bruck_cheaper = true;
    for (size_t b = 1; b <= (size_t{64} << 20); b *= 2) {
      const double pw = alltoall_cost(m, AlltoallAlgorithm::kPairwise, b, world, 0);
      const double br = alltoall_cost(m, AlltoallAlgorithm::kBruck, b, world, 0);
      EXPECT_GT(pw, 0);
      EXPECT_LE(pw, alltoall_cost(m, AlltoallAlgorithm::kPairwise, b * 2, world, 0));
      if ((br < pw) != bruck_cheaper) {
        ++crossings;
        bruck_cheaper = br < pw;
      }
    }
    EXPECT_LE(crossings, 1) << world;
    EXPECT_FALSE(bruck_cheaper) << world << ": pairwise must win for 64 MiB blocks";
  }
}

// The models measure_cost_model gave in the runs that refitted the AllToAll constants
// (ina-a2a-algo-bench on loopback, 2-core VM; testbed/results/alltoall-20261206b/algo.txt) pick
// what those runs measured fastest: Bruck for 1 KiB blocks at 4 and 8 ranks (1.3x), pairwise for
// 2 KiB blocks at 8 ranks and 4 KiB blocks at 4 ranks (8 KiB steps, beyond Bruck's bound).
TEST(SelectAlltoall, RefittedOnInterleavedLoopbackRuns) {
  CostModel four;
  four.alpha_s = 12.4e-6;
  four.beta_s_per_byte = 0.328e-9;
  four.gamma_s_per_byte = 0.046e-9;
  EXPECT_EQ(pick(four, 1 << 10, 4, 0, ""), AlltoallAlgorithm::kBruck);
  EXPECT_EQ(pick(four, 4 << 10, 4, 0, ""), AlltoallAlgorithm::kPairwise);
  CostModel eight;
  eight.alpha_s = 41.3e-6;
  eight.beta_s_per_byte = 0.356e-9;
  eight.gamma_s_per_byte = 0.050e-9;
  for (size_t b = 64; b <= 1024; b *= 2)
    EXPECT_EQ(pick(eight, b, 8, 0, ""), AlltoallAlgorithm::kBruck) << b;
  for (size_t b = 2048; b <= (size_t{64} << 20); b *= 2)
    EXPECT_EQ(pick(eight, b, 8, 0, ""), AlltoallAlgorithm::kPairwise) << b;
}

// A latency measured under load (alpha large, beta small) does not push large blocks to Bruck:
// one step's message is bounded by kBruckMaxStepBytes.
TEST(SelectAlltoall, BruckOnlyForSmallSteps) {
  CostModel loaded;
  loaded.alpha_s = 2e-3;
  loaded.beta_s_per_byte = 0.1e-9;
  loaded.gamma_s_per_byte = 0.01e-9;
  EXPECT_EQ(pick(loaded, 1 << 10, 8, 0, ""), AlltoallAlgorithm::kBruck);     // 4 KiB steps
  EXPECT_EQ(pick(loaded, 2 << 10, 4, 0, ""), AlltoallAlgorithm::kBruck);     // 4 KiB steps
  EXPECT_EQ(pick(loaded, 2 << 10, 8, 0, ""), AlltoallAlgorithm::kPairwise);  // 8 KiB steps
  EXPECT_EQ(pick(loaded, 4 << 10, 4, 0, ""), AlltoallAlgorithm::kPairwise);
  EXPECT_EQ(pick(loaded, 16 << 10, 4, 0, ""), AlltoallAlgorithm::kPairwise);
  EXPECT_TRUE(std::isinf(alltoall_cost(loaded, AlltoallAlgorithm::kBruck, 1 << 20, 4, 0)));
  EXPECT_EQ(pick(loaded, 1 << 20, 4, 0, "bruck"), AlltoallAlgorithm::kBruck);  // forced: runs
}

TEST(SelectAlltoall, HierarchicalOnlyWithAGroupThatDivides) {
  const CostModel m = loopback();
  EXPECT_TRUE(std::isinf(alltoall_cost(m, AlltoallAlgorithm::kHierarchical, 64, 1024, 0)));
  EXPECT_TRUE(std::isinf(alltoall_cost(m, AlltoallAlgorithm::kHierarchical, 64, 1024, 24)));
  EXPECT_TRUE(std::isinf(alltoall_cost(m, AlltoallAlgorithm::kHierarchical, 64, 8, 8)));
  // 1,024 ranks, nodes of 32: 62 messages instead of 1,023 beat the flat pairwise at 4 KiB
  // blocks, where latency still dominates.
  EXPECT_LT(alltoall_cost(m, AlltoallAlgorithm::kHierarchical, 4096, 1024, 32),
            alltoall_cost(m, AlltoallAlgorithm::kPairwise, 4096, 1024, 0));
  // 64 MiB blocks: moving every byte twice loses.
  EXPECT_EQ(pick(m, 64 << 20, 1024, 32, ""), AlltoallAlgorithm::kPairwise);
  // Beyond kHierarchicalMaxBlockBytes the model does not consider it (its formula is optimistic
  // at middle sizes: 8 ranks in nodes of 4 on loopback, 16 KiB blocks, it lost 1.8x to pairwise
  // where the model chose it), but an override still runs it.
  CostModel loaded = m;
  loaded.alpha_s = 33.3e-6;
  loaded.beta_s_per_byte = 0.273e-9;
  loaded.gamma_s_per_byte = 0.050e-9;
  EXPECT_EQ(pick(loaded, 4 << 10, 8, 4, ""), AlltoallAlgorithm::kHierarchical);
  EXPECT_EQ(pick(loaded, 16 << 10, 8, 4, ""), AlltoallAlgorithm::kPairwise);
  EXPECT_TRUE(std::isinf(alltoall_cost(loaded, AlltoallAlgorithm::kHierarchical, 8 << 10, 8, 4)));
  EXPECT_EQ(pick(loaded, 16 << 10, 8, 4, "hier"), AlltoallAlgorithm::kHierarchical);
}

TEST(SelectAlltoall, OverrideWinsAndABadOneNamesTheVariable) {
  const CostModel m = loopback();
  EXPECT_EQ(pick(m, 8, 8, 0, "pairwise"), AlltoallAlgorithm::kPairwise);
  EXPECT_EQ(pick(m, 64 << 20, 8, 0, "bruck"), AlltoallAlgorithm::kBruck);
  EXPECT_EQ(pick(m, 8, 8, 2, "hier"), AlltoallAlgorithm::kHierarchical);
  Result<AlltoallAlgorithm> bad = select_alltoall(m, 8, 8, 0, "ring");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("INA_A2A_ALGO"), std::string::npos);
  for (auto a :
       {AlltoallAlgorithm::kPairwise, AlltoallAlgorithm::kBruck, AlltoallAlgorithm::kHierarchical})
    EXPECT_EQ(parse_alltoall_algorithm(alltoall_algorithm_name(a)), a);
}

// INA_A2A_ALGO and INA_A2A_GROUP are read strictly; LOCAL_WORLD_SIZE (the launcher's) leniently.
TEST(AlltoallConfig, EnvironmentIsParsedStrictly) {
  unsetenv("LOCAL_WORLD_SIZE");
  setenv("INA_A2A_ALGO", "bruck", 1);
  setenv("INA_A2A_GROUP", "4", 1);
  Result<Config> c = Config::from_env();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->alltoall_algorithm, "bruck");
  EXPECT_EQ(c->alltoall_group, 4);
  setenv("INA_A2A_ALGO", "ring", 1);
  c = Config::from_env();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("INA_A2A_ALGO"), std::string::npos) << c.status().to_string();
  unsetenv("INA_A2A_ALGO");
  setenv("INA_A2A_GROUP", "x", 1);
  c = Config::from_env();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("INA_A2A_GROUP"), std::string::npos)
      << c.status().to_string();
  unsetenv("INA_A2A_GROUP");
  setenv("LOCAL_WORLD_SIZE", "8", 1);
  c = Config::from_env();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->alltoall_group, 8);
  setenv("LOCAL_WORLD_SIZE", "eight", 1);  // not ours to refuse: ignored
  c = Config::from_env();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->alltoall_group, 0);
  unsetenv("LOCAL_WORLD_SIZE");
}

}  // namespace
}  // namespace ina::host
