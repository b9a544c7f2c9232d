// float8 (e4m3, e5m2) AllReduce through the Communicator, on the host mesh (processes on loopback,
// a TcpStore served by rank 0) and in-network (an aggregator on loopback).
//
//   HostPathSumIsTheExactSumRoundedOnce  3 and 4 forked ranks, host only, each host algorithm
//       (ring, halving-doubling, tree) x each fallback mode (float, exact):
//       - e4m3 SUM over random finite codes (saturating sums included) and e5m2 SUM over codes
//         of exponent field 11..30: the output is bit for bit the exact sum (in double) rounded
//         once to the type (fp8.h: e4m3 saturates). Both modes are exact for these before the
//         last rounding: float32 holds every such sum (at most 20 and 24 significant bits), and
//         exact mode's quantum 2^(E-B), E <= 9 (e4m3) or 16 (e5m2), B = 28, divides them;
//       - e5m2 SUM over every finite code (subnormals too): within the bound ina-bench states,
//         e + ulp8(|s| + e), e = max(N M 2^-B, (N - 1) 2^-24 N M), M the block's largest |x|
//         (or Inf of the sign of s where |s| + e reaches e5m2's overflow threshold 61440: a
//         float32 partial sum may round up to it);
//       - e4m3 MAX and e5m2 MIN: exact.
//   InNetworkCarriesFloat8At3Ranks  the same cases through an aggregator: the same verdicts,
//       every collective in-network.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../free_port.h"
#include "ina/ina.hpp"
#include "ina/protocol/fp8.h"
#include "ina/protocol/quantize.h"
#include "tests/integration/loopback_support.h"

namespace {

using namespace std::chrono_literals;
using ina::DType;
using ina::ReduceOp;

constexpr size_t kCount = 3001;
constexpr uint32_t kBlock = 256;

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

enum class Range { kAll, kNarrow };  // kNarrow: e5m2 exponent field 11..30

// Rank r's element i: a finite code (never NaN, never Inf).
uint8_t input_code(DType t, Range range, int r, size_t i, uint64_t seed) {
  const uint64_t h = mix(seed * 0x100000001ull + static_cast<uint64_t>(r) * 1000003u + i);
  auto c = static_cast<uint8_t>(h);
  if (t == DType::kFloat8E4M3) {
    if ((c & 0x7F) == 0x7F) c ^= 0x01;  // the NaNs -> +-448
    return c;
  }
  if (range == Range::kNarrow) {
    const auto field = static_cast<uint8_t>(11 + (h >> 8) % 20);
    return static_cast<uint8_t>((c & 0x80) | (field << 2) | (c & 0x03));
  }
  if ((c & 0x7F) >= 0x7C) c &= 0x83;  // Inf/NaN -> a subnormal
  return c;
}

double value(DType t, uint8_t c) {
  return t == DType::kFloat8E4M3 ? ina::e4m3_to_float(c) : ina::e5m2_to_float(c);
}
uint8_t round_once(DType t, double x) {
  return t == DType::kFloat8E4M3 ? ina::double_to_e4m3(x) : ina::double_to_e5m2(x);
}

// Runs one AllReduce of kCount elements and checks it; returns the number of bad elements (their
// first few described on stderr).
int check_one(ina::Communicator& comm, DType t, ReduceOp op, Range range, bool exact_expected,
              uint64_t seed, const std::string& what) {
  const int world = comm.size();
  std::vector<uint8_t> in(kCount), out(kCount, 0xAA);
  for (size_t i = 0; i < kCount; ++i) in[i] = input_code(t, range, comm.rank(), i, seed);
  const ina::Status st = comm.allreduce(in.data(), out.data(), kCount, t, op);
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what.c_str(), st.to_string().c_str());
    return 1;
  }
  int bad = 0;
  for (size_t b0 = 0; b0 < kCount; b0 += kBlock) {
    const size_t n = std::min<size_t>(kBlock, kCount - b0);
    double m = 0;
    for (size_t i = b0; i < b0 + n; ++i)
      for (int r = 0; r < world; ++r)
        m = std::max(m, std::fabs(value(t, input_code(t, range, r, i, seed))));
    for (size_t i = b0; i < b0 + n; ++i) {
      // MIN/MAX order -0 below +0 (as the in-network path does).
      auto below = [](double a, double b) {
        return a < b || (a == b && std::signbit(a) && !std::signbit(b));
      };
      double s = op == ReduceOp::kSum ? 0.0 : value(t, input_code(t, range, 0, i, seed));
      for (int r = op == ReduceOp::kSum ? 0 : 1; r < world; ++r) {
        const double x = value(t, input_code(t, range, r, i, seed));
        if (op == ReduceOp::kSum) {
          s += x;
        } else if (op == ReduceOp::kMin ? below(x, s) : below(s, x)) {
          s = x;
        }
      }
      const uint8_t want = round_once(t, s);  // s is exact: float8 values have few bits
      bool ok = out[i] == want;
      double tol = 0;
      if (!ok && !exact_expected) {
        const auto nn = static_cast<uint32_t>(world);
        const double e = std::max(ina::quant::sum_quantization_bound(m, nn),
                                  (world - 1) * std::ldexp(1.0, -24) * world * m);
        tol = e + ina::quant::output_ulp(t, std::fabs(s) + e);
        ok = std::fabs(value(t, out[i]) - s) <= tol;
        // e5m2 overflows to Inf: allowed where the reduction error can reach the threshold
        // (57344 + half its ulp = 61440).
        if (std::isinf(value(t, out[i])) && std::fabs(s) + e >= 61440.0 &&
            std::signbit(value(t, out[i])) == std::signbit(s)) {
          ok = true;
        }
      }
      if (!ok && bad++ < 3) {
        std::fprintf(stderr, "%s: element %zu is 0x%02x (%g), want 0x%02x (exact %.17g, tol %g)\n",
                     what.c_str(), i, out[i], value(t, out[i]), want, s, tol);
      }
    }
  }
  return bad;
}

void run_world(int world) {
  std::vector<uint16_t> ports;
  for (int i = 0; i < 6; ++i) {
    ports.push_back(ina::testing::free_loopback_port());
    ASSERT_NE(ports.back(), 0);
  }
  auto body = [&](int rank) -> int {
    int failures = 0;
    size_t next_port = 0;
    uint64_t seed = 1;
    for (const char* algo : {"ring", "hd", "tree"}) {
      setenv("INA_ALGO", algo, 1);
      for (const ina::FallbackMode mode : {ina::FallbackMode::kFloat, ina::FallbackMode::kExact}) {
        ina::Config cfg;
        cfg.rank = rank;
        cfg.world_size = world;
        cfg.host_only = true;
        cfg.fallback = mode;
        cfg.block_elems = kBlock;
        cfg.timeout = 5000ms;
        cfg.store = "127.0.0.1:" + std::to_string(ports[next_port++]);
        auto comm = ina::Communicator::create(cfg);
        if (!comm.ok()) {
          std::fprintf(stderr, "rank %d %s: create: %s\n", rank, algo,
                       comm.status().to_string().c_str());
          return 2;
        }
        const std::string where = "world " + std::to_string(world) + " rank " +
                                  std::to_string(rank) + " " + algo + " " +
                                  (mode == ina::FallbackMode::kFloat ? "float" : "exact");
        failures += check_one(**comm, DType::kFloat8E4M3, ReduceOp::kSum, Range::kAll, true, ++seed,
                              where + " e4m3 sum");
        failures += check_one(**comm, DType::kFloat8E5M2, ReduceOp::kSum, Range::kNarrow, true,
                              ++seed, where + " e5m2 sum (exponents 11..30)");
        failures += check_one(**comm, DType::kFloat8E5M2, ReduceOp::kSum, Range::kAll, false,
                              ++seed, where + " e5m2 sum (every finite code)");
        failures += check_one(**comm, DType::kFloat8E4M3, ReduceOp::kMax, Range::kAll, true, ++seed,
                              where + " e4m3 max");
        failures += check_one(**comm, DType::kFloat8E5M2, ReduceOp::kMin, Range::kAll, true, ++seed,
                              where + " e5m2 min");
        if ((*comm)->stats().host_collectives != 5) {
          std::fprintf(stderr, "%s: %llu host collectives, want 5\n", where.c_str(),
                       static_cast<unsigned long long>((*comm)->stats().host_collectives));
          ++failures;
        }
      }
    }
    unsetenv("INA_ALGO");
    return failures == 0 ? 0 : 4;
  };
  EXPECT_EQ(ina::testing::run_forked(
                world, body, [] { return std::string(); }, 120s),
            "");
}

TEST(Fp8Host, HostPathSumIsTheExactSumRoundedOnceAt3Ranks) { run_world(3); }
TEST(Fp8Host, HostPathSumIsTheExactSumRoundedOnceAt4Ranks) { run_world(4); }

// In-network (wire v2 carries float8 at one byte): 3 forked ranks and an aggregator, no host
// mesh; the same cases as the host path and the same verdicts (the aggregator's codec quantizes
// at B = 28 for three ranks, exact for e4m3 and for e5m2 exponents 11..30), nothing on the host.
TEST(Fp8Host, InNetworkCarriesFloat8At3Ranks) {
  constexpr int kWorld = 3;
  ina::testing::AggregatorProcess agg;
  ASSERT_EQ(agg.start(kWorld), "");
  auto body = [&](int rank) -> int {
    ina::Config cfg;
    cfg.rank = rank;
    cfg.world_size = kWorld;
    cfg.aggregator_port = agg.port;
    cfg.block_elems = kBlock;
    cfg.timeout = 5000ms;
    auto comm = ina::Communicator::create(cfg);
    if (!comm.ok()) {
      std::fprintf(stderr, "rank %d: create: %s\n", rank, comm.status().to_string().c_str());
      return 2;
    }
    const std::string where = "in-network rank " + std::to_string(rank);
    uint64_t seed = 100;
    int failures = 0;
    failures += check_one(**comm, DType::kFloat8E4M3, ReduceOp::kSum, Range::kAll, true, ++seed,
                          where + " e4m3 sum");
    failures += check_one(**comm, DType::kFloat8E5M2, ReduceOp::kSum, Range::kNarrow, true, ++seed,
                          where + " e5m2 sum (exponents 11..30)");
    failures += check_one(**comm, DType::kFloat8E5M2, ReduceOp::kSum, Range::kAll, false, ++seed,
                          where + " e5m2 sum (every finite code)");
    failures += check_one(**comm, DType::kFloat8E4M3, ReduceOp::kMax, Range::kAll, true, ++seed,
                          where + " e4m3 max");
    failures += check_one(**comm, DType::kFloat8E5M2, ReduceOp::kMin, Range::kAll, true, ++seed,
                          where + " e5m2 min");
    const ina::CommStats st = (*comm)->stats();
    if (st.host_collectives != 0 || st.collectives != 5 || st.fallbacks != 0) {
      std::fprintf(stderr, "%s: %llu collectives, %llu on the host, %llu fallbacks; want 5, 0, 0\n",
                   where.c_str(), static_cast<unsigned long long>(st.collectives),
                   static_cast<unsigned long long>(st.host_collectives),
                   static_cast<unsigned long long>(st.fallbacks));
      ++failures;
    }
    return failures == 0 ? 0 : 4;
  };
  EXPECT_EQ(ina::testing::run_forked(
                kWorld, body, [] { return std::string(); }, 60s),
            "");
}

}  // namespace
