// The quantizer reference (quantize.h) on float8 e4m3 / e5m2 blocks: scan (exponent, NONFINITE:
// e4m3 has no Inf, its 0x7F is NaN); SUM encode/decode rounding once to the type, and exact for
// e4m3 up to 4096 ranks (its values are multiples of 2^-9 below 2^9; B = 30 - ceil(log2 N) >= 18);
// MIN/MAX exact; NaN fill; the output ulp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ina/protocol/fp8.h"
#include "ina/protocol/quantize.h"

namespace ina::quant {
namespace {

constexpr DType kFp8[] = {DType::kFloat8E4M3, DType::kFloat8E5M2};

double value(DType t, uint8_t c) {
  return t == DType::kFloat8E4M3 ? e4m3_to_float(c) : e5m2_to_float(c);
}
bool is_nan(DType t, uint8_t c) {
  return t == DType::kFloat8E4M3 ? e4m3_is_nan(c) : e5m2_is_nan(c);
}
bool is_inf(DType t, uint8_t c) { return t == DType::kFloat8E5M2 && (c & 0x7F) == 0x7C; }
uint8_t round_once(DType t, double x) {
  return t == DType::kFloat8E4M3 ? double_to_e4m3(x) : double_to_e5m2(x);
}

TEST(QuantizeFp8, ScanOfEveryCode) {
  for (const DType t : kFp8) {
    for (uint32_t c = 0; c < 256; ++c) {
      const auto b = static_cast<uint8_t>(c);
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        const BlockScan s = scan_block(&b, 1, t, op);
        EXPECT_EQ(s.nonfinite, is_nan(t, b) || (op == ReduceOp::kSum && is_inf(t, b)))
            << dtype_name(t) << " " << c;
        const double v = value(t, b);
        if (is_nan(t, b) || is_inf(t, b) || v == 0) {
          EXPECT_EQ(s.exp, kNoExponent) << dtype_name(t) << " " << c;
        } else {
          int e = 0;
          std::frexp(v, &e);
          EXPECT_EQ(s.exp, e) << dtype_name(t) << " " << c;
        }
      }
    }
  }
  // e4m3's largest finite values (exponent field 1111) are not Inf or NaN.
  const uint8_t big[3] = {0x78, 0x7E, 0xFE};
  const BlockScan s = scan_block(big, 3, DType::kFloat8E4M3, ReduceOp::kSum);
  EXPECT_FALSE(s.nonfinite);
  EXPECT_EQ(s.exp, 9);
}

// Ranks' blocks of random finite codes, summed through encode, integer addition and decode.
TEST(QuantizeFp8, SumDecodesTheQuantizedSumRoundedOnce) {
  std::mt19937 g(15);
  for (const DType t : kFp8) {
    for (const uint32_t world : {1u, 2u, 3u, 4u, 8u, 64u}) {
      constexpr size_t kN = 512;
      std::vector<std::vector<uint8_t>> in(world, std::vector<uint8_t>(kN));
      for (auto& r : in)
        for (auto& c : r) {
          do c = static_cast<uint8_t>(g());
          while (is_nan(t, c) || is_inf(t, c));
        }
      int16_t e = kNoExponent;
      for (const auto& r : in) e = max_exponent(e, scan_block(r.data(), kN, t, ReduceOp::kSum).exp);
      std::vector<int64_t> sum(kN, 0);
      std::vector<int32_t> q(kN);
      for (const auto& r : in) {
        encode(r.data(), kN, t, ReduceOp::kSum, e, world, q.data());
        for (size_t i = 0; i < kN; ++i) sum[i] += q[i];
      }
      std::vector<int32_t> s32(kN);
      for (size_t i = 0; i < kN; ++i) {
        ASSERT_LE(std::llabs(sum[i]), int64_t{1} << 30);  // never overflows int32
        s32[i] = static_cast<int32_t>(sum[i]);
      }
      std::vector<uint8_t> out(kN);
      decode(s32.data(), kN, t, ReduceOp::kSum, e, world, out.data());
      const double scale = std::ldexp(1.0, e - magnitude_bits(world));
      double m = 0;
      for (const auto& r : in)
        for (uint8_t c : r) m = std::max(m, std::fabs(value(t, c)));
      for (size_t i = 0; i < kN; ++i) {
        // Rounded once from the dequantized value (not through float32).
        ASSERT_EQ(out[i], round_once(t, static_cast<double>(s32[i]) * scale))
            << dtype_name(t) << " N " << world << " i " << i;
        double exact = 0;
        for (const auto& r : in) exact += value(t, r[i]);
        if (t == DType::kFloat8E4M3) {
          // e4m3 quantizes exactly (quantum 2^(E-B) <= 2^(9-24) divides 2^-9): the exact sum,
          // rounded once (saturating).
          ASSERT_EQ(out[i], round_once(t, exact)) << "N " << world << " i " << i;
        } else if (!std::isinf(value(t, out[i]))) {
          ASSERT_LE(std::fabs(value(t, out[i]) - exact), sum_error_bound(t, m, world, exact))
              << "N " << world << " i " << i;
        }
      }
    }
  }
}

TEST(QuantizeFp8, MinMaxAreExactAndOrderSignedZeros) {
  for (const DType t : kFp8) {
    std::vector<uint8_t> a, b;
    for (uint32_t x = 0; x < 256; ++x)
      for (uint32_t y = 0; y < 256; y += 7) {
        if (is_nan(t, static_cast<uint8_t>(x)) || is_nan(t, static_cast<uint8_t>(y))) continue;
        a.push_back(static_cast<uint8_t>(x));
        b.push_back(static_cast<uint8_t>(y));
      }
    const size_t n = a.size();
    for (const ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      std::vector<int32_t> qa(n), qb(n), r(n);
      encode(a.data(), n, t, op, kNoExponent, 2, qa.data());
      encode(b.data(), n, t, op, kNoExponent, 2, qb.data());
      for (size_t i = 0; i < n; ++i)
        r[i] = op == ReduceOp::kMin ? std::min(qa[i], qb[i]) : std::max(qa[i], qb[i]);
      std::vector<uint8_t> out(n);
      decode(r.data(), n, t, op, kNoExponent, 2, out.data());
      for (size_t i = 0; i < n; ++i) {
        const double va = value(t, a[i]), vb = value(t, b[i]);
        uint8_t want = (op == ReduceOp::kMin ? vb < va : vb > va) ? b[i] : a[i];
        if (va == vb && va == 0) want = op == ReduceOp::kMin ? (a[i] | b[i]) : (a[i] & b[i]);
        ASSERT_EQ(out[i], want) << dtype_name(t) << " " << op_name(op) << " " << int{a[i]} << " "
                                << int{b[i]};
      }
    }
  }
}

TEST(QuantizeFp8, FillNanAndOutputUlp) {
  uint8_t d[4] = {};
  fill_nan(d, 4, DType::kFloat8E4M3);
  for (uint8_t c : d) EXPECT_EQ(c, 0x7F);
  fill_nan(d, 4, DType::kFloat8E5M2);
  for (uint8_t c : d) {
    EXPECT_EQ(c, 0x7E);
    EXPECT_TRUE(std::isnan(e5m2_to_float(c)));
  }
  EXPECT_EQ(output_ulp(DType::kFloat8E4M3, 1.0), 0.125);
  EXPECT_EQ(output_ulp(DType::kFloat8E4M3, 448.0), 32.0);
  EXPECT_EQ(output_ulp(DType::kFloat8E4M3, 0.0), std::ldexp(1.0, -9));
  EXPECT_EQ(output_ulp(DType::kFloat8E5M2, 1.0), 0.25);
  EXPECT_EQ(output_ulp(DType::kFloat8E5M2, 1e-9), std::ldexp(1.0, -16));
}

}  // namespace
}  // namespace ina::quant
