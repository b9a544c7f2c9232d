// Pure logic of the host collectives: selection, trees, arithmetic, file and prefix stores.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <thread>
#include <vector>

#include "ina/base/half.h"
#include "tests/host/harness.h"
#include "worker/host/reduce.h"
#include "worker/host/select.h"
#include "worker/host/store.h"
#include "worker/host/tree.h"

namespace ina::host {
namespace {

using std::chrono::milliseconds;

// The value of a Result that must be OK (a failed expectation and T{} otherwise).
template <typename T>
T val(Result<T> r) {
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : T{};
}

// ---- selection ----

TEST(HostSelect, SmallBuffersPickLogDepthLargePickRing) {
  CostModel m;
  // Small buffers: hd runs recursive doubling (log2 P2 steps, + 2 for the fold of another world),
  // fewer latencies than the tree's 2 ceil(log2 P) or the ring's 2 (P-1).
  EXPECT_EQ(val(select_allreduce(m, 8, 8, "")), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(val(select_allreduce(m, 8, 16, "")), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(val(select_allreduce(m, 8, 5, "")), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(val(select_allreduce(m, 8, 12, "")), AllreduceAlgorithm::kHalvingDoubling);
  // Mid-size buffers in other worlds: past recursive doubling, the tree avoids the fold's extra
  // steps and whole-buffer transfers (5 ranks, 64 KiB: tree 6 alpha + 2 n beta + n gamma).
  EXPECT_EQ(val(select_allreduce(m, 64u << 10, 5, "")), AllreduceAlgorithm::kTree);
  // Large buffers: the pipelined ring (bandwidth-optimal, reductions hidden).
  EXPECT_EQ(val(select_allreduce(m, 64u << 20, 8, "")), AllreduceAlgorithm::kRing);
  EXPECT_EQ(val(select_allreduce(m, 64u << 20, 5, "")), AllreduceAlgorithm::kRing);
  // Two ranks: one exchange (recursive doubling) against the ring's two steps; large buffers:
  // ring and halving-doubling are the same exchange and the tie goes to ring.
  EXPECT_EQ(val(select_allreduce(m, 8, 2, "")), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(val(select_allreduce(m, 64u << 20, 2, "")), AllreduceAlgorithm::kRing);
}

TEST(HostSelect, CrossoverMovesWithAlpha) {
  // The crossover size from hd to ring grows with the latency alpha.
  auto crossover = [](double alpha) {
    CostModel m;
    m.alpha_s = alpha;
    size_t bytes = 1;
    while (bytes < (size_t{1} << 40) &&
           val(select_allreduce(m, bytes, 8, "")) != AllreduceAlgorithm::kRing)
      bytes *= 2;
    return bytes;
  };
  const size_t low = crossover(5e-6), high = crossover(100e-6);
  EXPECT_GT(low, 1u);
  EXPECT_LT(low, high);
}

TEST(HostSelect, ParseCostModel) {
  CostModel m = val(parse_cost_model("25,0.5"));
  EXPECT_DOUBLE_EQ(m.alpha_s, 25e-6);
  EXPECT_DOUBLE_EQ(m.beta_s_per_byte, 0.5e-9);
  EXPECT_DOUBLE_EQ(m.gamma_s_per_byte, CostModel{}.gamma_s_per_byte);  // default gamma kept
  m = val(parse_cost_model("133.5,0,0.25"));
  EXPECT_DOUBLE_EQ(m.alpha_s, 133.5e-6);
  EXPECT_DOUBLE_EQ(m.beta_s_per_byte, 0);
  EXPECT_DOUBLE_EQ(m.gamma_s_per_byte, 0.25e-9);
  for (const char* bad :
       {"", "25", "25,", ",0.5", "25,0.5,", "0,0.5", "-1,0.5", "25,-0.5", "25,0.5,0.1,3", "25 ,0.5",
        "25,0.5x", "1e3,0.5", "inf,1", "nan,1", "25;0.5"}) {
    Result<CostModel> r = parse_cost_model(bad);
    ASSERT_FALSE(r.ok()) << "'" << bad << "' was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("INA_COST_MODEL"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("alpha_us,beta_ns_per_byte"), std::string::npos);
  }
}

TEST(HostSelect, SelectionOnGivenFigures) {
  // A latency-bound link (alpha 100 us, 10 GB/s, fast reduction): the log-depth algorithms win
  // up to large sizes; at 4 ranks hd costs 4 alpha + 1.5 n beta + 0.75 n gamma against the
  // ring's 6 alpha + 1.5 n beta, so ring wins once 0.75 n gamma > 2 alpha: n > 2.67 MB here.
  const CostModel lat = val(parse_cost_model("100,0.1,0.1"));
  EXPECT_EQ(val(select_allreduce(lat, 8, 4, "")), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(val(select_allreduce(lat, 2u << 20, 4, "")), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(val(select_allreduce(lat, 4u << 20, 4, "")), AllreduceAlgorithm::kRing);
  EXPECT_EQ(val(select_allreduce(lat, 8, 6, "")), AllreduceAlgorithm::kHalvingDoubling);
  // No latency at all: the ring's bandwidth term is the smallest (ties go to ring).
  CostModel bw = val(parse_cost_model("0.001,1,1"));
  EXPECT_EQ(val(select_allreduce(bw, 1u << 20, 4, "")), AllreduceAlgorithm::kRing);
  EXPECT_EQ(val(select_allreduce(bw, 1u << 20, 6, "")), AllreduceAlgorithm::kRing);
}

TEST(HostSelect, CostFormulas) {
  CostModel m;
  m.alpha_s = 1;
  m.beta_s_per_byte = 0;
  m.gamma_s_per_byte = 0;
  EXPECT_DOUBLE_EQ(m.cost(AllreduceAlgorithm::kRing, 100, 8), 14);
  // Small (recursive doubling): log2 P2 steps (+ 2 for the fold); large: 2 log2 P2 (+ 2).
  EXPECT_DOUBLE_EQ(m.cost(AllreduceAlgorithm::kHalvingDoubling, 100, 8), 3);
  EXPECT_DOUBLE_EQ(m.cost(AllreduceAlgorithm::kHalvingDoubling, 100, 5), 2 + 2);
  EXPECT_DOUBLE_EQ(m.cost(AllreduceAlgorithm::kHalvingDoubling, 1 << 20, 8), 6);
  EXPECT_DOUBLE_EQ(m.cost(AllreduceAlgorithm::kHalvingDoubling, 1 << 20, 5), 4 + 2);
  EXPECT_DOUBLE_EQ(m.cost(AllreduceAlgorithm::kTree, 100, 5), 6);
  EXPECT_DOUBLE_EQ(m.cost(AllreduceAlgorithm::kRing, 100, 1), 0);
  m.alpha_s = 0;
  m.beta_s_per_byte = 1;
  EXPECT_DOUBLE_EQ(m.cost(AllreduceAlgorithm::kRing, 100, 4), 150);
}

TEST(HostSelect, OverrideWinsAndBadOverrideIsNamed) {
  CostModel m;
  EXPECT_EQ(val(select_allreduce(m, 8, 8, "ring")), AllreduceAlgorithm::kRing);
  EXPECT_EQ(val(select_allreduce(m, 1u << 30, 8, "tree")), AllreduceAlgorithm::kTree);
  EXPECT_EQ(val(select_allreduce(m, 1u << 30, 8, "hd")), AllreduceAlgorithm::kHalvingDoubling);
  auto bad = select_allreduce(m, 8, 8, "butterfly");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("INA_ALGO"), std::string::npos);
  // INA_ALGO itself is read once, strictly, by Config (worker_config's tests).
  EXPECT_EQ(val(select_allreduce(m, 8, 8, "")), AllreduceAlgorithm::kHalvingDoubling);
}

TEST(HostSelect, AlgorithmNamesRoundTrip) {
  for (auto a :
       {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kHalvingDoubling, AllreduceAlgorithm::kTree})
    EXPECT_EQ(parse_algorithm(algorithm_name(a)), a);
}

// ---- trees ----

// Checks that `links` (one per rank) form a spanning tree with consistent parent/child links.
void expect_tree(int n, const std::vector<TreeLinks>& links) {
  int roots = 0;
  for (int r = 0; r < n; ++r) {
    const TreeLinks& l = links[r];
    if (l.parent < 0) {
      ++roots;
    } else {
      ASSERT_LT(l.parent, n);
      const TreeLinks& up = links[l.parent];
      EXPECT_TRUE(up.child[0] == r || up.child[1] == r) << "n=" << n << " rank " << r;
    }
    for (int c : l.child) {
      if (c < 0) continue;
      ASSERT_LT(c, n);
      EXPECT_EQ(links[c].parent, r) << "n=" << n << " child " << c << " of " << r;
    }
    EXPECT_FALSE(l.child[0] >= 0 && l.child[0] == l.child[1]);
  }
  EXPECT_EQ(roots, 1) << "n=" << n;
  // Every rank reaches the root (no cycles), in at most n steps.
  for (int r = 0; r < n; ++r) {
    int x = r, steps = 0;
    while (links[x].parent >= 0 && steps <= n) {
      x = links[x].parent;
      ++steps;
    }
    EXPECT_LE(steps, n);
    EXPECT_LT(steps, 2 * (static_cast<int>(std::log2(n)) + 1)) << "depth is logarithmic";
  }
}

TEST(HostTree, BtreeMatchesNcclExample) {
  // ncclGetBtree's illustration for 14 ranks: root 0 -> 8; 8 -> 4, 12; 4 -> 2, 6; 12 -> 10, 13.
  EXPECT_EQ(btree(14, 0).parent, -1);
  EXPECT_EQ(btree(14, 0).child[1], 8);
  EXPECT_EQ(btree(14, 8).child[0], 4);
  EXPECT_EQ(btree(14, 8).child[1], 12);
  EXPECT_EQ(btree(14, 12).child[0], 10);
  EXPECT_EQ(btree(14, 12).child[1], 13);
  EXPECT_EQ(btree(14, 13).parent, 12);
  EXPECT_EQ(btree(14, 5).parent, 6);
  EXPECT_EQ(btree(14, 1).child[0], -1);
}

TEST(HostTree, DoubleTreesAreSpanningTreesAndSpreadInnerNodes) {
  for (int n = 1; n <= 64; ++n) {
    for (int which = 0; which < 2; ++which) {
      std::vector<TreeLinks> links;
      for (int r = 0; r < n; ++r) links.push_back(dtree(n, r, which));
      expect_tree(n, links);
    }
    // Each rank has children in at most one of the two trees (a leaf in the other), except
    // for small odd sizes where the shifted tree cannot avoid one overlap.
    int both_inner = 0;
    for (int r = 0; r < n; ++r) {
      auto inner = [&](int which) {
        TreeLinks l = dtree(n, r, which);
        return l.child[0] >= 0 || l.child[1] >= 0;
      };
      both_inner += inner(0) && inner(1);
    }
    if (n % 2 == 0)
      EXPECT_EQ(both_inner, 0) << "n=" << n;
    else
      EXPECT_LE(both_inner, 2) << "n=" << n;
  }
}

// ---- arithmetic ----

TEST(HostReduce, Int32SumWrapsMinMaxExact) {
  std::vector<int32_t> a = {std::numeric_limits<int32_t>::max(), -5, 7};
  std::vector<int32_t> b = {1, -6, 7};
  reduce_into(a.data(), b.data(), 3, DType::kInt32, ReduceOp::kSum);
  EXPECT_EQ(a[0], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(a[1], -11);
  EXPECT_EQ(a[2], 14);
  std::vector<int32_t> c = {3, -3, 0};
  reduce_into(c.data(), b.data(), 3, DType::kInt32, ReduceOp::kMin);
  EXPECT_EQ(c, (std::vector<int32_t>{1, -6, 0}));
  reduce_into(c.data(), b.data(), 3, DType::kInt32, ReduceOp::kMax);
  EXPECT_EQ(c, (std::vector<int32_t>{1, -6, 7}));
}

TEST(HostReduce, HalfTypesAddInFloatAndRoundToNearestEven) {
  // 2048 + 1 is not a float16 (spacing 2 above 2048): the float sum 2049 rounds to even, 2048;
  // 2050 + 1 = 2051 rounds to 2052.
  uint16_t a[2] = {float_to_half(2048.f), float_to_half(2050.f)};
  uint16_t b[2] = {float_to_half(1.f), float_to_half(1.f)};
  reduce_into(a, b, 2, DType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(half_to_float(a[0]), 2048.f);
  EXPECT_EQ(half_to_float(a[1]), 2052.f);
  // bfloat16: 256 + 1 -> 256 (spacing 2), 258 + 1 -> 260.
  uint16_t c[2] = {float_to_bf16(256.f), float_to_bf16(258.f)};
  uint16_t d[2] = {float_to_bf16(1.f), float_to_bf16(1.f)};
  reduce_into(c, d, 2, DType::kBFloat16, ReduceOp::kSum);
  EXPECT_EQ(bf16_to_float(c[0]), 256.f);
  EXPECT_EQ(bf16_to_float(c[1]), 260.f);
  uint16_t e[1] = {float_to_bf16(-3.f)};
  uint16_t f[1] = {float_to_bf16(2.f)};
  reduce_into(e, f, 1, DType::kBFloat16, ReduceOp::kMax);
  EXPECT_EQ(bf16_to_float(e[0]), 2.f);
}

TEST(HostReduce, FloatMinMaxPropagateNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float a[3] = {nan, 1.f, 2.f};
  float b[3] = {0.f, nan, 1.f};
  reduce_into(a, b, 3, DType::kFloat32, ReduceOp::kMin);
  EXPECT_TRUE(std::isnan(a[0]));
  EXPECT_TRUE(std::isnan(a[1]));
  EXPECT_EQ(a[2], 1.f);
  float c[2] = {nan, 1.f};
  float d[2] = {5.f, nan};
  reduce_into(c, d, 2, DType::kFloat32, ReduceOp::kMax);
  EXPECT_TRUE(std::isnan(c[0]));
  EXPECT_TRUE(std::isnan(c[1]));
}

TEST(HostReduce, VectorLanesMatchTheElementDefinition) {
  // Lengths around the 4-lane blocks, and values that stress the lanes: NaN on either side,
  // infinities, signed zeros, int32 extremes. Every element must match the scalar definition.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float fv[] = {1.5f, -2.f, nan, 0.f, -0.f, inf, -inf, 3.25f, 7.f, -1e30f, 1e30f};
  const int32_t iv[] = {
      0,     1,   -1, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(),
      12345, -777};
  for (size_t n : {size_t{1}, size_t{3}, size_t{4}, size_t{5}, size_t{8}, size_t{13}, size_t{67}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      std::vector<float> fa(n), fb(n), fref(n);
      std::vector<int32_t> ia(n), ib(n), iref(n);
      for (size_t i = 0; i < n; ++i) {
        fa[i] = fv[(i * 3) % std::size(fv)];
        fb[i] = fv[(i * 5 + 1) % std::size(fv)];
        ia[i] = iv[(i * 3) % std::size(iv)];
        ib[i] = iv[(i * 5 + 2) % std::size(iv)];
        const float x = fa[i], y = fb[i];
        if (op == ReduceOp::kSum) {
          fref[i] = x + y;
          iref[i] =
              static_cast<int32_t>(static_cast<uint32_t>(ia[i]) + static_cast<uint32_t>(ib[i]));
        } else {
          const bool mn = op == ReduceOp::kMin;
          fref[i] = std::isnan(y)   ? y
                    : std::isnan(x) ? x
                                    : (mn ? (y < x ? y : x) : (y > x ? y : x));
          iref[i] = mn ? std::min(ia[i], ib[i]) : std::max(ia[i], ib[i]);
        }
      }
      reduce_into(fa.data(), fb.data(), n, DType::kFloat32, op);
      reduce_into(ia.data(), ib.data(), n, DType::kInt32, op);
      for (size_t i = 0; i < n; ++i) {
        if (std::isnan(fref[i])) {
          EXPECT_TRUE(std::isnan(fa[i]))
              << "n " << n << " op " << static_cast<int>(op) << " i " << i;
        } else {
          EXPECT_EQ(std::memcmp(&fa[i], &fref[i], 4), 0)
              << "n " << n << " op " << static_cast<int>(op) << " i " << i << ": " << fa[i]
              << " vs " << fref[i];
        }
        EXPECT_EQ(ia[i], iref[i]) << "n " << n << " op " << static_cast<int>(op) << " i " << i;
      }
    }
  }
}

// ---- FileStore and PrefixStore ----

TEST(HostFileStore, SetGetWaitAndMissingKeysNamed) {
  test::TempDir dir;
  auto store = FileStore::create(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  Store& s = **store;
  ASSERT_TRUE(s.set("a/b c", to_bytes("hello")).ok());
  auto v = s.get("a/b c", milliseconds(100));
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(to_string(*v), "hello");
  ASSERT_TRUE(s.set("a/b c", to_bytes("")).ok());  // overwrite, empty value
  EXPECT_EQ(to_string(val(s.get("a/b c", milliseconds(100)))), "");
  EXPECT_TRUE(s.wait({"a/b c"}, milliseconds(10)).ok());

  const auto start = std::chrono::steady_clock::now();
  Status w = s.wait({"a/b c", "missing/1", "missing/2"}, milliseconds(150));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(w.message().find("missing/1, missing/2"), std::string::npos) << w.message();
  EXPECT_EQ(w.message().find("a/b c"), std::string::npos) << w.message();
  EXPECT_GE(took, milliseconds(150));
  EXPECT_LT(took, milliseconds(2000));
  EXPECT_EQ(s.get("nope", milliseconds(20)).status().code(), StatusCode::kDeadlineExceeded);
}

TEST(HostFileStore, WaitSeesKeysSetByAnotherClientLater) {
  test::TempDir dir;
  auto a = FileStore::create(dir.path());
  auto b = FileStore::create(dir.path());
  ASSERT_TRUE(a.ok() && b.ok());
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_TRUE((*b)->set("late", to_bytes("x")).ok());
  });
  EXPECT_TRUE((*a)->wait({"late"}, milliseconds(5000)).ok());
  setter.join();
}

TEST(HostFileStore, AddIsAtomicAcrossClients) {
  test::TempDir dir;
  constexpr int kThreads = 6, kAdds = 40;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      auto s = FileStore::create(dir.path());
      ASSERT_TRUE(s.ok());
      for (int i = 0; i < kAdds; ++i) ASSERT_TRUE((*s)->add("counter", 1).ok());
    });
  for (auto& t : threads) t.join();
  auto s = FileStore::create(dir.path());
  EXPECT_EQ(val((*s)->add("counter", 0)), kThreads * kAdds);
  EXPECT_EQ(to_string(val((*s)->get("counter", milliseconds(10)))),
            std::to_string(kThreads * kAdds));
  ASSERT_TRUE((*s)->set("text", to_bytes("abc")).ok());
  EXPECT_EQ((*s)->add("text", 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(HostPrefixStore, NamespacesKeys) {
  test::TempDir dir;
  auto base = FileStore::create(dir.path());
  ASSERT_TRUE(base.ok());
  PrefixStore job1("job1", **base), job2("job2", **base);
  ASSERT_TRUE(job1.set("k", to_bytes("one")).ok());
  ASSERT_TRUE(job2.set("k", to_bytes("two")).ok());
  EXPECT_EQ(to_string(val(job1.get("k", milliseconds(10)))), "one");
  EXPECT_EQ(to_string(val(job2.get("k", milliseconds(10)))), "two");
  EXPECT_EQ(to_string(val((*base)->get("job1/k", milliseconds(10)))), "one");
  Status w = job1.wait({"k", "other"}, milliseconds(20));
  EXPECT_NE(w.message().find("job1/other"), std::string::npos) << w.message();
  EXPECT_EQ(val(job1.add("n", 5)), 5);
  EXPECT_EQ(val(job2.add("n", 1)), 1);
}

}  // namespace
}  // namespace ina::host
