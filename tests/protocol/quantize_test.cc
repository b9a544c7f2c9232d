// The quantizer reference (quantize.h) against its own specification and against the documented
// error bound. The central test simulates the protocol for one block: every rank scans its
// values, the aggregator's MAX gives the shared exponent E, every rank encodes with E, the
// aggregator adds the int32 words, and the decoded sum is compared with the exact sum (in double)
// of the values the ranks really held.
//
// Length: one suite over one subject; its cases share the helpers above them and each one is
// independent (run one with --gtest_filter).
#include "ina/protocol/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ina/base/half.h"
#include "ina/protocol/codec.h"
#include "ina/protocol/types.h"
#include "ina/protocol/wire.h"

namespace ina::quant {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t b) { return std::bit_cast<float>(b); }

// ---- a block of one dtype, held as the bytes the user would pass ----

struct Block {
  DType t;
  std::vector<float> f32;     // kFloat32
  std::vector<uint16_t> u16;  // kFloat16, kBFloat16
  size_t size() const { return t == DType::kFloat32 ? f32.size() : u16.size(); }
  const void* data() const {
    return t == DType::kFloat32 ? static_cast<const void*>(f32.data()) : u16.data();
  }
  // The value actually held (after rounding to the dtype), exactly.
  double value(size_t i) const {
    switch (t) {
      case DType::kFloat32: return f32[i];
      case DType::kFloat16: return half_to_float(u16[i]);
      default: return bf16_to_float(u16[i]);
    }
  }
};

Block make_block(DType t, const std::vector<float>& v) {
  Block b{t, {}, {}};
  for (const float x : v) {
    if (t == DType::kFloat32) b.f32.push_back(x);
    if (t == DType::kFloat16) b.u16.push_back(float_to_half(x));
    if (t == DType::kBFloat16) b.u16.push_back(float_to_bf16(x));
  }
  return b;
}

// Decoded output buffer of n elements of type t, read back as doubles.
struct Output {
  DType t;
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  Output(DType type, size_t n)
      : t(type), f32(type == DType::kFloat32 ? n : 0), u16(type == DType::kFloat32 ? 0 : n) {}
  void* data() { return t == DType::kFloat32 ? static_cast<void*>(f32.data()) : u16.data(); }
  float value(size_t i) const {
    switch (t) {
      case DType::kFloat32: return f32[i];
      case DType::kFloat16: return half_to_float(u16[i]);
      default: return bf16_to_float(u16[i]);
    }
  }
};

// Spacing of the output type's values at |s| (subnormal spacing below the smallest normal).
double ulp_out(DType t, double s) {
  int precision = 24;         // significand bits, implicit bit included
  int min_normal_exp = -126;  // the smallest normal is 2^min_normal_exp
  if (t == DType::kFloat16) {
    precision = 11;
    min_normal_exp = -14;
  } else if (t == DType::kBFloat16) {
    precision = 8;
  }
  const double a = std::fabs(s);
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const int binade = a == 0 ? min_normal_exp : std::max(e - 1, min_normal_exp);
  return std::ldexp(1.0, binade - (precision - 1));
}

// ---- the protocol, for one block ----

struct SumOutcome {
  double max_err = 0;          // max |out - s| over the block
  double max_quant_ratio = 0;  // max |v - s| / bound, v = the exact dequantized sum (no rounding)
  double max_out_ratio = 0;    // max |out - s| / (bound + ulp_out(s))
  double block_max = 0;        // M
  double bound = 0;            // sum_quantization_bound(M, N)
  int16_t exp = kNoExponent;
  // Wire v2 (codec.h): the aggregator quantizes late with int64 (float32) or int32 words and
  // rounds once; its bound is qb2 + ulp_out(|s| + qb2) / 2 with qb2 = N M 2^-B2.
  double max_out_ratio_v2 = 0;  // max |out2 - s| / that bound
  double max_err_v2 = 0;
};

// Runs one float SUM round: ranks[r] is rank r's block. Fails the test on any overflow or bound
// violation and returns the observed errors.
SumOutcome run_sum(const std::vector<Block>& ranks) {
  const uint32_t n_ranks = static_cast<uint32_t>(ranks.size());
  const DType t = ranks[0].t;
  const size_t k = ranks[0].size();
  SumOutcome o;

  // Each rank scans; the aggregator takes the MAX (carried one block ahead in the real protocol).
  int16_t e = kNoExponent;
  for (const Block& b : ranks) {
    const BlockScan s = scan_block(b.data(), k, t, ReduceOp::kSum);
    EXPECT_FALSE(s.nonfinite);
    e = max_exponent(e, s.exp);
  }
  o.exp = e;

  // Each rank encodes with E; the aggregator adds. int64 here, to see an int32 overflow.
  const int64_t limit = int64_t{1} << 30;
  const int64_t word_limit = int64_t{1} << magnitude_bits(n_ranks);
  std::vector<int64_t> acc(k, 0);
  std::vector<int32_t> q(k);
  for (const Block& b : ranks) {
    encode(b.data(), k, t, ReduceOp::kSum, e, n_ranks, q.data());
    for (size_t i = 0; i < k; ++i) {
      EXPECT_LE(std::abs(int64_t{q[i]}), word_limit) << "element " << i;
      acc[i] += q[i];
    }
  }
  std::vector<int32_t> sum(k);
  for (size_t i = 0; i < k; ++i) {
    EXPECT_LE(std::abs(acc[i]), limit) << "int32 overflow at element " << i;
    sum[i] = static_cast<int32_t>(acc[i]);
  }

  Output out(t, k);
  decode(sum.data(), k, t, ReduceOp::kSum, e, n_ranks, out.data());

  for (const Block& b : ranks) {
    for (size_t i = 0; i < k; ++i) o.block_max = std::max(o.block_max, std::fabs(b.value(i)));
  }
  o.bound = sum_quantization_bound(o.block_max, n_ranks);
  for (size_t i = 0; i < k; ++i) {
    // The reference sum s: double additions can round (terms span up to 2^277), so they are
    // compensated (Knuth's TwoSum), which leaves an error far below the bounds tested here.
    double s = 0;
    double c = 0;
    for (const Block& b : ranks) {
      const double x = b.value(i);
      const double y = s + x;
      const double z = y - s;
      c += (s - (y - z)) + (x - z);
      s = y;
    }
    s += c;
    // The quantization alone, before any rounding to the output type: the integer sum scaled
    // back exactly (double holds 31 bits times a power of two) is within the bound itself.
    const double v = e == kNoExponent ? 0.0 : std::ldexp(sum[i], e - magnitude_bits(n_ranks));
    const double quant_err = std::fabs(v - s);
    EXPECT_LE(quant_err, o.bound) << "element " << i << ": dequantized " << v << ", exact " << s;
    // The decoded output adds the rounding to the output type.
    const double got = out.value(i);
    const double err = std::fabs(got - s);
    const double allowed = o.bound + ulp_out(t, s);
    EXPECT_LE(err, allowed) << "element " << i << ": got " << got << ", exact " << s << ", E " << e
                            << ", M " << o.block_max;
    o.max_err = std::max(o.max_err, err);
    if (o.bound > 0) o.max_quant_ratio = std::max(o.max_quant_ratio, quant_err / o.bound);
    o.max_out_ratio = std::max(o.max_out_ratio, err / allowed);
  }

  // Wire v2: the same ranks through the block codec the aggregator runs.
  EXPECT_EQ(codec::scan(ranks[0].data(), k, t, ReduceOp::kSum).exp,
            scan_block(ranks[0].data(), k, t, ReduceOp::kSum).exp);
  const int b2 = codec::magnitude_bits(t, n_ranks);
  std::vector<int64_t> acc2(k, 0);
  for (const Block& b : ranks) codec::quantize_add(b.data(), k, t, e, n_ranks, acc2.data());
  Output out2(t, k);
  const int scale = codec::scale_exponent(t, e, n_ranks);
  codec::dequantize(acc2.data(), k, t, scale, out2.data());
  const double qb2 = n_ranks * o.block_max * std::ldexp(1.0, -b2);
  const long double limit2 = std::ldexp(1.0L, t == DType::kFloat32 ? 62 : 30);
  for (size_t i = 0; i < k; ++i) {
    EXPECT_LE(std::fabs(static_cast<long double>(acc2[i])), limit2) << "overflow at " << i;
    long double s = 0;  // the exact sum (long double holds these sums closely enough)
    for (const Block& b : ranks) s += b.value(i);
    const long double v =
        e == kNoExponent ? 0.0L : std::ldexp(static_cast<long double>(acc2[i]), scale);
    EXPECT_LE(std::fabs(v - s), static_cast<long double>(qb2) * (1 + 1e-12L)) << "v2 element " << i;
    const double err = static_cast<double>(std::fabs(static_cast<long double>(out2.value(i)) - s));
    const double allowed2 = qb2 + 0.5 * ulp_out(t, static_cast<double>(std::fabs(s)) + qb2);
    EXPECT_LE(err, allowed2) << "v2 element " << i << ": got " << out2.value(i);
    // No looser than v1's bound.
    EXPECT_LE(allowed2, o.bound + ulp_out(t, static_cast<double>(s)) +
                            ulp_out(t, std::fabs(static_cast<double>(s)) + o.bound));
    o.max_err_v2 = std::max(o.max_err_v2, err);
    if (allowed2 > 0) o.max_out_ratio_v2 = std::max(o.max_out_ratio_v2, err / allowed2);
  }
  return o;
}

// Random values for one rank. Magnitudes are log-uniform in [lo, hi], signs random.
std::vector<float> log_uniform(std::mt19937_64& rng, size_t k, double lo, double hi) {
  std::uniform_real_distribution<double> u(std::log2(lo), std::log2(hi));
  std::vector<float> v(k);
  for (float& x : v) {
    x = static_cast<float>(std::exp2(u(rng)));
    if (rng() & 1) x = -x;
  }
  return v;
}

std::vector<float> normal(std::mt19937_64& rng, size_t k, double sigma) {
  std::normal_distribution<double> d(0, sigma);
  std::vector<float> v(k);
  for (float& x : v) x = static_cast<float>(d(rng));
  return v;
}

// The largest magnitude a rank may hold so that the sum over n ranks stays finite in type t.
double safe_max(DType t, uint32_t n) { return t == DType::kFloat16 ? 65504.0 / n : 1e30; }

struct Scenario {
  const char* name;
  // Builds rank r's block of k elements.
  std::vector<float> (*make)(std::mt19937_64& rng, DType t, uint32_t n, size_t k);
};

const Scenario kScenarios[] = {
    {"wide_range",
     [](std::mt19937_64& rng, DType t, uint32_t n, size_t k) {
       const double lo = t == DType::kFloat16 ? 0x1p-24 : 1e-30;
       return log_uniform(rng, k, lo, safe_max(t, n));
     }},
    {"gaussian",
     [](std::mt19937_64& rng, DType, uint32_t, size_t k) { return normal(rng, k, 1.0); }},
    {"zeros", [](std::mt19937_64&, DType, uint32_t, size_t k) { return std::vector<float>(k); }},
    {"one_huge_among_tiny",
     [](std::mt19937_64& rng, DType t, uint32_t n, size_t k) {
       std::vector<float> v = normal(rng, k, t == DType::kFloat16 ? 1e-3 : 1e-20);
       if (rng() % 4 == 0) v[rng() % k] = static_cast<float>(safe_max(t, n) * 0.75);
       return v;
     }},
    {"denormals",
     [](std::mt19937_64& rng, DType t, uint32_t, size_t k) {
       // float32 and bfloat16: below 2^-126; float16: below 2^-14.
       const double lo = t == DType::kFloat16 ? 0x1p-24 : 0x1p-149;
       const double hi = t == DType::kFloat16 ? 0x1p-15 : 0x1p-127;
       return log_uniform(rng, k, lo, hi);
     }},
    {"mixed_signs_cancelling",
     [](std::mt19937_64& rng, DType t, uint32_t n, size_t k) {
       // Every element is +-c plus a little: sums largely cancel.
       const float c = static_cast<float>(std::min(1000.0, safe_max(t, n) / 2));
       std::vector<float> v = normal(rng, k, 0.01);
       for (float& x : v) x += (rng() & 1) ? c : -c;
       return v;
     }},
};

struct SumCase {
  DType t;
  uint32_t n;
};

class SumRound : public ::testing::TestWithParam<SumCase> {};

TEST_P(SumRound, ErrorStaysWithinTheDocumentedBound) {
  const DType t = GetParam().t;
  const uint32_t n = GetParam().n;
  for (const Scenario& sc : kScenarios) {
    double worst_quant = 0;
    double worst_out = 0;
    double worst_rel = 0;
    double worst_v2 = 0;
    double worst_rel_v2 = 0;
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE(std::string(sc.name) + " seed " + std::to_string(seed));
      std::mt19937_64 rng(seed * 1000003 + n);
      const size_t k = (seed == 3) ? 37 : 256;  // also a block that is not a vector multiple
      std::vector<Block> ranks;
      for (uint32_t r = 0; r < n; ++r) ranks.push_back(make_block(t, sc.make(rng, t, n, k)));
      const SumOutcome o = run_sum(ranks);
      if (std::string(sc.name) == "zeros") {
        EXPECT_EQ(o.exp, kNoExponent);
        EXPECT_EQ(o.max_err, 0.0);
      }
      worst_quant = std::max(worst_quant, o.max_quant_ratio);
      worst_out = std::max(worst_out, o.max_out_ratio);
      if (o.block_max > 0) worst_rel = std::max(worst_rel, o.max_err / o.block_max);
      worst_v2 = std::max(worst_v2, o.max_out_ratio_v2);
      if (o.block_max > 0) worst_rel_v2 = std::max(worst_rel_v2, o.max_err_v2 / o.block_max);
    }
    // Observed errors, for the record (QUANTIZATION.md quotes them).
    std::printf(
        "[ error    ] %-8s N=%-5u %-23s quant/bound %.3f  out/(bound+ulp) %.3f  "
        "out/M %.2e  v2: out/bound2 %.3f  out/M %.2e\n",
        std::string(dtype_name(t)).c_str(), n, sc.name, worst_quant, worst_out, worst_rel, worst_v2,
        worst_rel_v2);
  }
}

std::vector<SumCase> all_sum_cases() {
  std::vector<SumCase> cases;
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const uint32_t world : {1u, 2u, 3u, 8u, 64u, 1024u}) cases.push_back({dtype, world});
  }
  return cases;
}

std::string sum_case_name(const ::testing::TestParamInfo<SumCase>& p) {
  return std::string(dtype_name(p.param.t)) + "_N" + std::to_string(p.param.n);
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndWorldSizes, SumRound, ::testing::ValuesIn(all_sum_cases()),
                         sum_case_name);

// The bound is not vacuous: for ordinary data the error is far below it, and tiny in absolute
// terms for float32.
TEST(SumBound, IsTightEnoughToMatter) {
  std::mt19937_64 rng(7);
  std::vector<Block> ranks;
  for (int r = 0; r < 8; ++r) ranks.push_back(make_block(DType::kFloat32, normal(rng, 256, 1.0)));
  const SumOutcome o = run_sum(ranks);
  EXPECT_LT(o.max_err, 1e-5 * o.block_max);
  EXPECT_LT(o.bound, 1e-6 * o.block_max);  // N * 2^-B = 8 * 2^-27
  EXPECT_GT(o.max_err, 0.0);               // and quantization did round something
  // v2: int64 words make the float32 quantization error negligible beside the final rounding.
  EXPECT_LT(o.max_err_v2, 1e-7 * o.block_max);
  EXPECT_LE(o.max_err_v2, o.max_err);
}

// ---- exact pieces of the specification ----

TEST(Quantize, MagnitudeBits) {
  EXPECT_EQ(magnitude_bits(1), 30);
  EXPECT_EQ(magnitude_bits(2), 29);
  EXPECT_EQ(magnitude_bits(3), 28);
  EXPECT_EQ(magnitude_bits(4), 28);
  EXPECT_EQ(magnitude_bits(5), 27);
  EXPECT_EQ(magnitude_bits(8), 27);
  EXPECT_EQ(magnitude_bits(64), 24);
  EXPECT_EQ(magnitude_bits(1024), 20);
  EXPECT_EQ(magnitude_bits(1025), 19);
  EXPECT_EQ(magnitude_bits(65535), 14);
  // The guarantee it exists for: N words of magnitude <= 2^B sum to at most 2^30.
  for (uint32_t n = 1; n <= 65535; ++n) {
    ASSERT_LE(uint64_t{n} << magnitude_bits(n), uint64_t{1} << 30) << n;
    ASSERT_GT(uint64_t{n} << (magnitude_bits(n) + 1), uint64_t{1} << 30) << n;  // and tight
  }
}

TEST(Quantize, SumQuantizationBound) {
  EXPECT_EQ(sum_quantization_bound(1.0, 1), std::ldexp(1.0, -30));
  EXPECT_EQ(sum_quantization_bound(3.0, 8), 8 * 3.0 * std::ldexp(1.0, -27));
  EXPECT_EQ(sum_quantization_bound(0.0, 1024), 0.0);
}

TEST(Quantize, ScanExponentIsFrexpOfTheLargest) {
  const auto exp_of = [](std::vector<float> v) {
    return scan_block(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum).exp;
  };
  EXPECT_EQ(exp_of({1.0f}), 1);  // 1 < 2^1
  EXPECT_EQ(exp_of({0.75f}), 0);
  EXPECT_EQ(exp_of({0.5f}), 0);
  EXPECT_EQ(exp_of({-3.0f, 0.1f}), 2);
  EXPECT_EQ(exp_of({0.0f, -0.0f}), kNoExponent);
  EXPECT_EQ(exp_of({}), kNoExponent);
  EXPECT_EQ(exp_of({std::numeric_limits<float>::denorm_min()}), -148);
  EXPECT_EQ(exp_of({std::numeric_limits<float>::max()}), 128);
  EXPECT_EQ(exp_of({kInf, 3.0f}), 2);  // non-finite elements do not count
  EXPECT_EQ(exp_of({std::nanf(""), 0.0f}), kNoExponent);

  const uint16_t h[] = {0x0001, 0x8000};  // float16: 2^-24 is 0.5 * 2^-23
  EXPECT_EQ(scan_block(h, 2, DType::kFloat16, ReduceOp::kSum).exp, -23);
  const uint16_t hmax[] = {0xFBFF};  // -65504
  EXPECT_EQ(scan_block(hmax, 1, DType::kFloat16, ReduceOp::kSum).exp, 16);
  const uint16_t b[] = {0x7F7F, 0x0001};  // bfloat16 max and 2^-133
  EXPECT_EQ(scan_block(b, 2, DType::kBFloat16, ReduceOp::kSum).exp, 128);
  EXPECT_EQ(scan_block(b + 1, 1, DType::kBFloat16, ReduceOp::kSum).exp, -132);

  const int32_t ints[] = {5, INT32_MIN};
  const BlockScan si = scan_block(ints, 2, DType::kInt32, ReduceOp::kSum);
  EXPECT_EQ(si.exp, kNoExponent);
  EXPECT_FALSE(si.nonfinite);
}

TEST(Quantize, ScanMatchesPerElementFrexp) {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 2000; ++iter) {
    const size_t k = 1 + rng() % 300;
    std::vector<uint32_t> raw(k);
    for (uint32_t& x : raw) x = static_cast<uint32_t>(rng());
    if (iter % 2) {  // narrower exponent spread half of the time
      for (uint32_t& x : raw) x = (x & 0x83FFFFFFu) | 0x3C000000u;
    }
    for (const DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      std::vector<uint16_t> u16(k);
      for (size_t i = 0; i < k; ++i) u16[i] = static_cast<uint16_t>(raw[i] >> (iter % 16));
      const void* src = t == DType::kFloat32 ? static_cast<const void*>(raw.data()) : u16.data();
      int16_t want_exp = kNoExponent;
      bool nan = false;
      bool inf = false;
      for (size_t i = 0; i < k; ++i) {
        const float x = t == DType::kFloat32   ? from_bits(raw[i])
                        : t == DType::kFloat16 ? half_to_float(u16[i])
                                               : bf16_to_float(u16[i]);
        nan |= std::isnan(x);
        inf |= std::isinf(x);
        if (std::isfinite(x) && x != 0) {
          int e = 0;
          std::frexp(static_cast<double>(x), &e);
          want_exp = max_exponent(want_exp, static_cast<int16_t>(e));
        }
      }
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
        const BlockScan s = scan_block(src, k, t, op);
        ASSERT_EQ(s.exp, want_exp) << dtype_name(t);
        ASSERT_EQ(s.nonfinite, nan || (op == ReduceOp::kSum && inf)) << dtype_name(t);
      }
    }
  }
}

TEST(Quantize, NonFiniteFlags) {
  const float nan = std::nanf("");
  for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
    const bool sum = op == ReduceOp::kSum;
    const std::vector<float> with_nan = {1.0f, nan, 2.0f};
    const std::vector<float> with_inf = {1.0f, -kInf, 2.0f};
    const std::vector<float> finite = {1.0f, -3.0f, 2.0f};
    for (const DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::string(op_name(op)));
      const Block bn = make_block(t, with_nan);
      const Block bi = make_block(t, with_inf);
      const Block bf = make_block(t, finite);
      EXPECT_TRUE(scan_block(bn.data(), 3, t, op).nonfinite);
      EXPECT_EQ(scan_block(bi.data(), 3, t, op).nonfinite, sum);
      EXPECT_FALSE(scan_block(bf.data(), 3, t, op).nonfinite);
    }
  }
  // float16 overflow creates an Inf: the scan sees the value the user really holds.
  const Block big = make_block(DType::kFloat16, {70000.0f});
  EXPECT_TRUE(scan_block(big.data(), 1, DType::kFloat16, ReduceOp::kSum).nonfinite);
}

TEST(Quantize, EncodeIsNearbyintOfTheScaledValue) {
  std::mt19937_64 rng(3);
  for (const uint32_t n : {1u, 3u, 1000u}) {
    const int b = magnitude_bits(n);
    for (int iter = 0; iter < 20000; ++iter) {
      const float x = from_bits(static_cast<uint32_t>(rng()));
      if (!std::isfinite(x) || x == 0) continue;
      int own = 0;
      std::frexp(static_cast<double>(x), &own);
      const int16_t e = static_cast<int16_t>(own + static_cast<int>(rng() % 40));  // E >= own
      int32_t q = 0;
      encode(&x, 1, DType::kFloat32, ReduceOp::kSum, e, n, &q);
      const double want = std::nearbyint(std::ldexp(static_cast<double>(x), b - e));
      ASSERT_EQ(q, static_cast<int32_t>(want)) << x << " E " << e;
      ASSERT_LE(std::abs(int64_t{q}), int64_t{1} << b);
    }
  }
}

TEST(Quantize, EncodeRoundsTiesToEven) {
  // N = 1: B = 30; with E = 30 the quantum is 1, so x itself is rounded to an integer.
  const float x[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 2.4999998f, 3.5f, 1e9f + 64.0f};
  const int32_t want[] = {0, 2, 2, 0, -2, -2, 2, 4, 1000000064};
  int32_t q[9];
  encode(x, 9, DType::kFloat32, ReduceOp::kSum, 30, 1, q);
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(q[i], want[i]) << x[i];
}

TEST(Quantize, EncodeSpecialCases) {
  const float x[] = {1.0f, std::nanf(""), kInf, -kInf, -0.0f, -1.0f};
  int32_t q[6];
  // Non-finite elements encode to 0 (their block is NONFINITE; the result will be NaN).
  encode(x, 6, DType::kFloat32, ReduceOp::kSum, 1, 2, q);
  EXPECT_EQ(q[0], 1 << 28);  // 1.0 * 2^(29 - 1)
  EXPECT_EQ(q[1], 0);
  EXPECT_EQ(q[2], 0);
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(q[4], 0);
  EXPECT_EQ(q[5], -(1 << 28));
  // kNoExponent: everything is 0.
  encode(x, 6, DType::kFloat32, ReduceOp::kSum, kNoExponent, 2, q);
  for (const int32_t w : q) EXPECT_EQ(w, 0);
  // A shared exponent far above the block: everything rounds to 0.
  encode(x, 6, DType::kFloat32, ReduceOp::kSum, 20000, 2, q);
  for (const int32_t w : q) EXPECT_EQ(w, 0);
  // An exponent below the block's own (a broken peer): words saturate at +-2^B, so the sum
  // still cannot overflow.
  encode(x, 6, DType::kFloat32, ReduceOp::kSum, -5, 2, q);
  EXPECT_EQ(q[0], 1 << 29);
  EXPECT_EQ(q[5], -(1 << 29));
  encode(x, 6, DType::kFloat32, ReduceOp::kSum, -20000, 2, q);
  EXPECT_EQ(q[0], 1 << 29);
  EXPECT_EQ(q[2], 0);
}

TEST(Quantize, DecodeSum) {
  const int32_t q[] = {1 << 28, -(3 << 27), 1, 0, INT32_MAX};
  float out[5];
  decode(q, 5, DType::kFloat32, ReduceOp::kSum, 1, 2, out);  // scale 2^(1 - 29)
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -1.5f);
  EXPECT_EQ(out[2], 0x1p-28f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(out[4], static_cast<float>(std::ldexp(double{INT32_MAX}, -28)));
  decode(q, 5, DType::kFloat32, ReduceOp::kSum, kNoExponent, 2, out);
  for (const float f : out) EXPECT_EQ(f, 0.0f);
  // Far out of range: overflow to Inf, underflow to 0, as the exact product would.
  decode(q, 5, DType::kFloat32, ReduceOp::kSum, 30000, 2, out);
  EXPECT_EQ(out[0], kInf);
  EXPECT_EQ(out[1], -kInf);
  EXPECT_EQ(out[3], 0.0f);
  decode(q, 5, DType::kFloat32, ReduceOp::kSum, -30000, 2, out);
  EXPECT_EQ(bits(out[0]), 0u);
  EXPECT_EQ(bits(out[1]), 0x80000000u);
  // 16-bit outputs: float32 first, then rounded to the type.
  uint16_t h[5];
  decode(q, 5, DType::kFloat16, ReduceOp::kSum, 1, 2, h);
  EXPECT_EQ(h[0], 0x3C00);
  EXPECT_EQ(h[1], 0xBE00);
  EXPECT_EQ(h[2], 0x0000);  // 2^-28 is below half of float16's smallest subnormal
  decode(q, 5, DType::kBFloat16, ReduceOp::kSum, 1, 2, h);
  EXPECT_EQ(h[0], 0x3F80);
  EXPECT_EQ(h[1], 0xBFC0);
  EXPECT_EQ(h[2], 0x3180);  // 2^-28
}

// Whole blocks and element-by-element calls agree (vector loop bodies and scalar tails compute
// the same thing), for every dtype, op and block length around the vector widths.
TEST(Quantize, BlockAndElementwiseAgree) {
  std::mt19937_64 rng(5);
  for (const DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      for (size_t k = 1; k <= 40; ++k) {
        const Block b = make_block(t, log_uniform(rng, k, 1e-4, 1e4));
        const int16_t e = scan_block(b.data(), k, t, op).exp;
        std::vector<int32_t> whole(k);
        encode(b.data(), k, t, op, e, 5, whole.data());
        Output out_whole(t, k);
        decode(whole.data(), k, t, op, e, 5, out_whole.data());
        const size_t es = dtype_size(t);
        Output out_one(t, k);
        for (size_t i = 0; i < k; ++i) {
          int32_t one = 0;
          encode(static_cast<const uint8_t*>(b.data()) + i * es, 1, t, op, e, 5, &one);
          ASSERT_EQ(one, whole[i]) << dtype_name(t) << " k " << k << " i " << i;
          decode(&one, 1, t, op, e, 5, static_cast<uint8_t*>(out_one.data()) + i * es);
          ASSERT_EQ(bits(out_one.value(i)), bits(out_whole.value(i)));
        }
      }
    }
  }
}

// ---- int32 ----

TEST(QuantizeInt32, SumWrapsModulo2To32) {
  std::mt19937_64 rng(9);
  const uint32_t n = 7;
  const size_t k = 64;
  std::vector<uint32_t> acc(k, 0);  // the aggregator adds in two's complement
  std::vector<int64_t> exact(k, 0);
  std::vector<int32_t> q(k);
  for (uint32_t r = 0; r < n; ++r) {
    std::vector<int32_t> v(k);
    for (size_t i = 0; i < k; ++i) v[i] = static_cast<int32_t>(rng());
    v[0] = INT32_MAX;
    v[1] = INT32_MIN;
    const BlockScan s = scan_block(v.data(), k, DType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(s.exp, kNoExponent);
    encode(v.data(), k, DType::kInt32, ReduceOp::kSum, s.exp, n, q.data());
    EXPECT_EQ(q, v);  // the payload is the value itself
    for (size_t i = 0; i < k; ++i) {
      acc[i] += static_cast<uint32_t>(q[i]);
      exact[i] += v[i];
    }
  }
  std::vector<int32_t> words(acc.begin(), acc.end());
  std::vector<int32_t> out(k);
  decode(words.data(), k, DType::kInt32, ReduceOp::kSum, kNoExponent, n, out.data());
  for (size_t i = 0; i < k; ++i) {
    EXPECT_EQ(out[i], static_cast<int32_t>(static_cast<uint32_t>(exact[i]))) << i;
  }
  EXPECT_NE(exact[0], int64_t{out[0]});  // 7 * INT32_MAX did wrap
}

TEST(QuantizeInt32, MinMaxExact) {
  const int32_t a[] = {INT32_MIN, -1, 0, 7, INT32_MAX};
  const int32_t b[] = {INT32_MAX, 0, -1, 7, INT32_MIN};
  for (const ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    int32_t qa[5], qb[5], out[5];
    encode(a, 5, DType::kInt32, op, kNoExponent, 2, qa);
    encode(b, 5, DType::kInt32, op, kNoExponent, 2, qb);
    int32_t red[5];
    for (int i = 0; i < 5; ++i) {
      red[i] = op == ReduceOp::kMin ? std::min(qa[i], qb[i]) : std::max(qa[i], qb[i]);
    }
    decode(red, 5, DType::kInt32, op, kNoExponent, 2, out);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(out[i], op == ReduceOp::kMin ? std::min(a[i], b[i]) : std::max(a[i], b[i]));
    }
  }
}

// ---- MIN/MAX of floats ----

TEST(QuantizeOrdered, MapIsMonotoneAndInvertible) {
  // An increasing list of floats spanning every class, -0 before +0.
  const std::vector<float> sorted = {-kInf,
                                     -std::numeric_limits<float>::max(),
                                     -1e30f,
                                     -2.0f,
                                     -1.0f,
                                     -std::numeric_limits<float>::min(),
                                     -std::numeric_limits<float>::denorm_min(),
                                     -0.0f,
                                     0.0f,
                                     std::numeric_limits<float>::denorm_min(),
                                     std::numeric_limits<float>::min(),
                                     1.0f,
                                     from_bits(bits(1.0f) + 1),
                                     1e30f,
                                     std::numeric_limits<float>::max(),
                                     kInf};
  for (size_t i = 0; i + 1 < sorted.size(); ++i) {
    EXPECT_LT(float_to_ordered(sorted[i]), float_to_ordered(sorted[i + 1])) << sorted[i];
  }
  EXPECT_EQ(float_to_ordered(0.0f), 0);
  EXPECT_EQ(float_to_ordered(-0.0f), -1);
  std::mt19937_64 rng(13);
  for (int iter = 0; iter < 100000; ++iter) {
    const uint32_t b1 = static_cast<uint32_t>(rng());
    const uint32_t b2 = static_cast<uint32_t>(rng());
    const float f1 = from_bits(b1);
    const float f2 = from_bits(b2);
    ASSERT_EQ(bits(ordered_to_float(float_to_ordered(f1))), b1);
    const int32_t q = static_cast<int32_t>(b2);
    ASSERT_EQ(float_to_ordered(ordered_to_float(q)), q);  // a bijection both ways
    if (std::isnan(f1) || std::isnan(f2) || f1 == f2) continue;
    ASSERT_EQ(f1 < f2, float_to_ordered(f1) < float_to_ordered(f2)) << f1 << " " << f2;
  }
}

TEST(QuantizeOrdered, MinMaxExactForEveryType) {
  std::mt19937_64 rng(17);
  const std::vector<float> specials = {kInf,     -kInf,     0.0f, -0.0f, 1e-40f,    -1e-40f,
                                       65504.0f, -65504.0f, 1.0f, -1.0f, 3.1415927f};
  for (const DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::string(op_name(op)));
      const uint32_t n = 5;
      const size_t k = 200;
      std::vector<Block> ranks;
      for (uint32_t r = 0; r < n; ++r) {
        std::vector<float> v = log_uniform(rng, k, 1e-6, 1e4);
        for (size_t i = 0; i < specials.size(); ++i) {
          // Specials at random positions, and -0/+0 pairs at the same element on two ranks.
          v[rng() % k] = specials[i];
        }
        v[0] = (r % 2) ? -0.0f : 0.0f;
        v[1] = (r == 2) ? kInf : 1.0f;
        v[2] = (r == 3) ? -kInf : -1.0f;
        ranks.push_back(make_block(t, v));
      }
      std::vector<int32_t> red(k);
      std::vector<int32_t> q(k);
      for (uint32_t r = 0; r < n; ++r) {
        EXPECT_FALSE(scan_block(ranks[r].data(), k, t, op).nonfinite);  // Inf is fine here
        encode(ranks[r].data(), k, t, op, kNoExponent, n, q.data());
        for (size_t i = 0; i < k; ++i) {
          red[i] = r == 0                 ? q[i]
                   : op == ReduceOp::kMin ? std::min(red[i], q[i])
                                          : std::max(red[i], q[i]);
        }
      }
      Output out(t, k);
      decode(red.data(), k, t, op, kNoExponent, n, out.data());
      for (size_t i = 0; i < k; ++i) {
        // Expected: the extreme value under the total order where -0 < +0, bit for bit.
        float want = static_cast<float>(ranks[0].value(i));
        for (uint32_t r = 1; r < n; ++r) {
          const float x = static_cast<float>(ranks[r].value(i));
          const bool zeros = x == 0 && want == 0;
          const bool less = x < want || (zeros && std::signbit(x) && !std::signbit(want));
          const bool greater = x > want || (zeros && !std::signbit(x) && std::signbit(want));
          if (op == ReduceOp::kMin ? less : greater) want = x;
        }
        ASSERT_EQ(bits(out.value(i)), bits(want)) << "element " << i;
      }
      EXPECT_EQ(bits(out.value(0)), bits(op == ReduceOp::kMin ? -0.0f : 0.0f));
      EXPECT_EQ(out.value(1), op == ReduceOp::kMax ? kInf : 1.0f);
      EXPECT_EQ(out.value(2), op == ReduceOp::kMin ? -kInf : -1.0f);
    }
  }
}

TEST(Quantize, FillNanGivesQuietNans) {
  float f[5];
  fill_nan(f, 5, DType::kFloat32);
  for (const float x : f) {
    EXPECT_TRUE(std::isnan(x));
    EXPECT_EQ(bits(x), 0x7FC00000u);
  }
  uint16_t h[5];
  fill_nan(h, 5, DType::kFloat16);
  for (const uint16_t x : h) {
    EXPECT_EQ(x, 0x7E00);
    EXPECT_TRUE(std::isnan(half_to_float(x)));
  }
  fill_nan(h, 5, DType::kBFloat16);
  for (const uint16_t x : h) {
    EXPECT_EQ(x, 0x7FC0);
    EXPECT_TRUE(std::isnan(bf16_to_float(x)));
  }
  fill_nan(f, 0, DType::kFloat32);  // n = 0 writes nothing (and does not crash)
}

TEST(ErrorBound, OutputUlpIsTheSpacingOfTheType) {
  EXPECT_EQ(output_ulp(DType::kFloat32, 1.0), std::ldexp(1.0, -23));
  EXPECT_EQ(output_ulp(DType::kFloat32, 1.5), std::ldexp(1.0, -23));
  EXPECT_EQ(output_ulp(DType::kFloat32, -2.0), std::ldexp(1.0, -22));
  EXPECT_EQ(output_ulp(DType::kFloat16, 1.0), std::ldexp(1.0, -10));
  EXPECT_EQ(output_ulp(DType::kFloat16, 65504.0), 32.0);
  EXPECT_EQ(output_ulp(DType::kBFloat16, 1.0), std::ldexp(1.0, -7));
  // Zero and subnormal magnitudes: the subnormal spacing.
  EXPECT_EQ(output_ulp(DType::kFloat32, 0.0), std::ldexp(1.0, -149));
  EXPECT_EQ(output_ulp(DType::kFloat32, 1e-40), std::ldexp(1.0, -149));
  EXPECT_EQ(output_ulp(DType::kFloat16, 0.0), std::ldexp(1.0, -24));
  EXPECT_EQ(output_ulp(DType::kBFloat16, 0.0), std::ldexp(1.0, -133));
  // The whole bound: qb + the spacing at |s| + qb.
  const double qb = sum_quantization_bound(1.0, 8);
  EXPECT_EQ(qb, 8 * std::ldexp(1.0, -27));
  EXPECT_EQ(sum_error_bound(DType::kFloat32, 1.0, 8, -3.0), qb + std::ldexp(1.0, -22));
  // Full cancellation: the spacing at qb itself (2^-24 for N = 8, M = 1), not at 0.
  EXPECT_EQ(sum_error_bound(DType::kBFloat16, 1.0, 8, 0.0), qb + std::ldexp(1.0, -24 - 7));
}

}  // namespace
}  // namespace ina::quant
