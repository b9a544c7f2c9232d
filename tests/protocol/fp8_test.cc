// fp8.h and fp_narrow.h: every float8 code widened against its fields and round-tripped; ties,
// subnormals, overflow, NaN and Inf as documented; and every narrowing (double and float -> e4m3,
// e5m2; double -> float16, bfloat16, float32) against a slow reference that searches the sorted
// representable values, on many random doubles.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "ina/base/half.h"
#include "ina/protocol/fp8.h"
#include "ina/protocol/fp_narrow.h"

namespace ina {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The value of a non-NaN code of a small format, from its fields (independent of fp8.h).
// e4m3 has no Inf: its all-ones exponent is an ordinary binade except the NaN code.
double field_value(uint32_t code, int exp_bits, int mant_bits, bool has_inf) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const uint32_t sign_bit = 1u << (exp_bits + mant_bits);
  const int e = static_cast<int>((code >> mant_bits) & ((1u << exp_bits) - 1));
  const int m = static_cast<int>(code & ((1u << mant_bits) - 1));
  const double sign = (code & sign_bit) ? -1.0 : 1.0;
  if (has_inf && e == (1 << exp_bits) - 1) return sign * kInf;
  if (e == 0) return sign * std::ldexp(m, 1 - bias - mant_bits);
  return sign * std::ldexp((1 << mant_bits) + m, e - bias - mant_bits);
}

double e4m3_value(uint8_t c) { return field_value(c, 4, 3, false); }
double e5m2_value(uint8_t c) { return field_value(c, 5, 2, true); }

// Correctly rounded |x| by search: `values` holds the finite non-negative magnitudes in pattern
// order (increasing). The two neighbours of |x|; their midpoint (exact in double: the values
// have few bits) decides; a tie takes the even pattern. Above the largest value, the next
// pattern's value is `above` (2^(emax+1): the Inf pattern, even), where `overflow` is returned.
uint32_t search_round(double a, const std::vector<double>& values, double above,
                      uint32_t overflow) {
  const size_t hi =
      static_cast<size_t>(std::lower_bound(values.begin(), values.end(), a) - values.begin());
  if (hi < values.size() && values[hi] == a) return static_cast<uint32_t>(hi);
  if (hi == values.size()) {  // beyond the largest finite value
    const double mid = values.back() / 2 + above / 2;
    if (a < mid) return static_cast<uint32_t>(values.size() - 1);
    if (a > mid) return overflow;
    // a tie: the largest finite pattern is odd in every format here, the next one even
    return overflow;
  }
  const size_t lo = hi - 1;  // a > values[0] = 0, so hi >= 1
  const double mid = values[lo] / 2 + values[hi] / 2;
  if (a < mid) return static_cast<uint32_t>(lo);
  if (a > mid) return static_cast<uint32_t>(hi);
  return static_cast<uint32_t>(lo % 2 == 0 ? lo : hi);
}

std::vector<double> magnitudes(uint32_t max_finite, double (*value)(uint32_t)) {
  std::vector<double> v;
  for (uint32_t c = 0; c <= max_finite; ++c) v.push_back(value(c));
  return v;
}

uint8_t ref_e4m3(double x) {
  static const std::vector<double> v =
      magnitudes(0x7E, [](uint32_t c) { return e4m3_value(static_cast<uint8_t>(c)); });
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7F;
  const double a = std::fabs(x);
  if (a > 448.0) return sign | 0x7E;  // saturation, Inf included
  return static_cast<uint8_t>(sign | search_round(a, v, 512.0, 0x7E));
}

uint8_t ref_e5m2(double x) {
  static const std::vector<double> v =
      magnitudes(0x7B, [](uint32_t c) { return e5m2_value(static_cast<uint8_t>(c)); });
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7E;
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | 0x7C;
  return static_cast<uint8_t>(sign | search_round(a, v, 65536.0, 0x7C));
}

uint16_t ref_half(double x) {
  static const std::vector<double> v = magnitudes(0x7BFF, [](uint32_t c) {
    return static_cast<double>(half_to_float(static_cast<uint16_t>(c)));
  });
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | 0x7C00;
  return static_cast<uint16_t>(sign | search_round(a, v, 65536.0, 0x7C00));
}

uint16_t ref_bf16(double x) {
  static const std::vector<double> v = magnitudes(0x7F7F, [](uint32_t c) {
    return static_cast<double>(bf16_to_float(static_cast<uint16_t>(c)));
  });
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | 0x7F80;
  return static_cast<uint16_t>(sign | search_round(a, v, 0x1p128, 0x7F80));
}

// float32 from double by binary search over the 2^31 magnitude patterns (too many to list).
uint32_t ref_float_bits(double x) {
  const uint32_t sign = std::signbit(x) ? 0x80000000u : 0;
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | 0x7F800000u;
  auto val = [](uint32_t p) { return static_cast<double>(std::bit_cast<float>(p)); };
  const uint32_t max = 0x7F7FFFFFu;
  if (a > val(max)) {
    const double mid = val(max) / 2 + 0x1p128 / 2;
    return sign | (a < mid ? max : 0x7F800000u);
  }
  uint32_t lo = 0, hi = max;  // invariant: val(lo) <= a <= val(hi)
  while (hi - lo > 1) {
    const uint32_t m = lo + (hi - lo) / 2;
    (val(m) <= a ? lo : hi) = m;
  }
  if (val(lo) == a) return sign | lo;
  if (val(hi) == a) return sign | hi;
  const double mid = val(lo) / 2 + val(hi) / 2;
  const uint32_t pick = a < mid ? lo : (a > mid ? hi : (lo % 2 == 0 ? lo : hi));
  return sign | pick;
}

TEST(Fp8, WideningMatchesTheFieldsForEveryCode) {
  for (uint32_t c = 0; c < 256; ++c) {
    const auto b = static_cast<uint8_t>(c);
    const float w4 = e4m3_to_float(b);
    if (e4m3_is_nan(b)) {
      EXPECT_TRUE(std::isnan(w4)) << c;
      EXPECT_EQ(std::signbit(w4), (c & 0x80) != 0) << c;
    } else {
      EXPECT_EQ(static_cast<double>(w4), e4m3_value(b)) << c;
      EXPECT_EQ(std::signbit(w4), (c & 0x80) != 0) << c;  // -0 stays -0
    }
    const float w5 = e5m2_to_float(b);
    if (e5m2_is_nan(b)) {
      EXPECT_TRUE(std::isnan(w5)) << c;
      EXPECT_EQ(std::signbit(w5), (c & 0x80) != 0) << c;
    } else {
      EXPECT_EQ(static_cast<double>(w5), e5m2_value(b)) << c;
      EXPECT_EQ(std::signbit(w5), (c & 0x80) != 0) << c;
    }
  }
  // The documented landmarks.
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);  // exponent 1111 is finite in e4m3
  EXPECT_EQ(e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_float(0x01), 0x1p-16f);
  EXPECT_EQ(e5m2_to_float(0x3C), 1.0f);
  EXPECT_EQ(e5m2_to_float(0x7C), std::numeric_limits<float>::infinity());
  EXPECT_EQ(e5m2_to_float(0xFC), -std::numeric_limits<float>::infinity());
}

TEST(Fp8, EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 256; ++c) {
    const auto b = static_cast<uint8_t>(c);
    const float w4 = e4m3_to_float(b);
    EXPECT_EQ(float_to_e4m3(w4), b) << c;  // NaNs included: 0x7F and 0xFF are the only ones
    EXPECT_EQ(double_to_e4m3(static_cast<double>(w4)), b) << c;
    const float w5 = e5m2_to_float(b);
    // The signalling NaNs 0x7D / 0xFD come back quiet; every other code exactly.
    const uint8_t want5 = (c & 0x7F) == 0x7D ? static_cast<uint8_t>(b | 0x02) : b;
    EXPECT_EQ(float_to_e5m2(w5), want5) << c;
    EXPECT_EQ(double_to_e5m2(static_cast<double>(w5)), want5) << c;
  }
}

TEST(Fp8, NaNAndInfAsDocumented) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(double_to_e4m3(nan), 0x7F);
  EXPECT_EQ(double_to_e4m3(-nan), 0xFF);
  EXPECT_EQ(float_to_e4m3(std::bit_cast<float>(0x7F800001u)), 0x7F);  // signalling, tiny payload
  EXPECT_EQ(double_to_e4m3(kInf), 0x7E);                              // saturates: e4m3 has no Inf
  EXPECT_EQ(double_to_e4m3(-kInf), 0xFE);
  EXPECT_EQ(double_to_e5m2(nan), 0x7E);
  EXPECT_EQ(double_to_e5m2(-nan), 0xFE);
  EXPECT_EQ(float_to_e5m2(std::bit_cast<float>(0x7F800001u)), 0x7E);  // never turns into Inf
  EXPECT_EQ(double_to_e5m2(kInf), 0x7C);
  EXPECT_EQ(double_to_e5m2(-kInf), 0xFC);
  // A NaN's sign and top payload bits survive in float16 and bfloat16 as in half.h.
  for (const uint32_t f : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FFFFFFFu, 0xFFA5A5A5u}) {
    const float x = std::bit_cast<float>(f);
    EXPECT_EQ(double_to_half(static_cast<double>(x)), float_to_half(x)) << std::hex << f;
    EXPECT_EQ(double_to_bf16(static_cast<double>(x)), float_to_bf16(x)) << std::hex << f;
  }
}

TEST(Fp8, OverflowSaturatesE4M3AndGoesToInfForE5M2) {
  EXPECT_EQ(double_to_e4m3(448.0), 0x7E);
  EXPECT_EQ(double_to_e4m3(464.0), 0x7E);     // the tie with 512 (not a code): 448's side
  EXPECT_EQ(double_to_e4m3(464.0001), 0x7E);  // would round to 480: saturated
  EXPECT_EQ(double_to_e4m3(1e300), 0x7E);
  EXPECT_EQ(double_to_e4m3(-1e300), 0xFE);
  EXPECT_EQ(float_to_e4m3(3.0e38f), 0x7E);
  EXPECT_EQ(double_to_e5m2(57344.0), 0x7B);
  EXPECT_EQ(double_to_e5m2(61439.99), 0x7B);
  EXPECT_EQ(double_to_e5m2(61440.0), 0x7C);  // tie: the even neighbour is Inf (IEEE)
  EXPECT_EQ(double_to_e5m2(-61440.0), 0xFC);
  EXPECT_EQ(double_to_e5m2(1e300), 0x7C);
  EXPECT_EQ(double_to_half(65519.99), 0x7BFF);
  EXPECT_EQ(double_to_half(65520.0), 0x7C00);
  EXPECT_EQ(double_to_bf16(1e300), 0x7F80);
  EXPECT_EQ(std::bit_cast<uint32_t>(double_to_float(1e300)), 0x7F800000u);
}

TEST(Fp8, TiesGoToTheEvenCode) {
  // Midpoints between every pair of adjacent finite non-negative codes, and just off them.
  for (uint32_t c = 0; c < 0x7E; ++c) {
    const double lo = e4m3_value(static_cast<uint8_t>(c));
    const double hi = e4m3_value(static_cast<uint8_t>(c + 1));
    const double mid = lo / 2 + hi / 2;
    const uint8_t even = static_cast<uint8_t>(c % 2 == 0 ? c : c + 1);
    EXPECT_EQ(double_to_e4m3(mid), even) << c;
    EXPECT_EQ(double_to_e4m3(-mid), even | 0x80) << c;
    EXPECT_EQ(double_to_e4m3(std::nextafter(mid, 0.0)), c) << c;
    EXPECT_EQ(double_to_e4m3(std::nextafter(mid, kInf)), c + 1) << c;
    EXPECT_EQ(float_to_e4m3(static_cast<float>(mid)), even) << c;  // mid is exact in float
  }
  for (uint32_t c = 0; c < 0x7B; ++c) {
    const double lo = e5m2_value(static_cast<uint8_t>(c));
    const double hi = e5m2_value(static_cast<uint8_t>(c + 1));
    const double mid = lo / 2 + hi / 2;
    const uint8_t even = static_cast<uint8_t>(c % 2 == 0 ? c : c + 1);
    EXPECT_EQ(double_to_e5m2(mid), even) << c;
    EXPECT_EQ(double_to_e5m2(std::nextafter(mid, 0.0)), c) << c;
    EXPECT_EQ(double_to_e5m2(std::nextafter(mid, kInf)), c + 1) << c;
    EXPECT_EQ(float_to_e5m2(static_cast<float>(mid)), even) << c;
  }
}

TEST(Fp8, Subnormals) {
  EXPECT_EQ(double_to_e4m3(0x1p-9), 0x01);
  EXPECT_EQ(double_to_e4m3(0x1p-10), 0x00);   // half the smallest subnormal: tie to 0 (even)
  EXPECT_EQ(double_to_e4m3(-0x1p-10), 0x80);  // -0
  EXPECT_EQ(double_to_e4m3(0x1.0000000000001p-10), 0x01);
  EXPECT_EQ(double_to_e4m3(3 * 0x1p-10), 0x02);   // 1.5 subnormal ulps: tie to 2 (even)
  EXPECT_EQ(double_to_e4m3(7.5 * 0x1p-9), 0x08);  // the largest subnormal rounds up to 2^-6
  EXPECT_EQ(double_to_e4m3(0x1p-1074), 0x00);     // a double subnormal
  EXPECT_EQ(double_to_e4m3(-0.0), 0x80);
  EXPECT_EQ(double_to_e5m2(0x1p-16), 0x01);
  EXPECT_EQ(double_to_e5m2(0x1p-17), 0x00);
  EXPECT_EQ(double_to_e5m2(0x1.8p-16), 0x02);
  EXPECT_EQ(double_to_e5m2(3.5 * 0x1p-16), 0x04);  // the largest subnormal rounds up to 2^-14
  EXPECT_EQ(double_to_e5m2(-0x1p-1074), 0x80);
  EXPECT_EQ(double_to_half(0x1p-25), 0x0000);
  EXPECT_EQ(double_to_half(0x1.0000000000001p-25), 0x0001);
  EXPECT_EQ(double_to_bf16(0x1p-133), 0x0001);  // bfloat16's smallest subnormal
  EXPECT_EQ(double_to_bf16(0x1p-134), 0x0000);  // half of it: the tie goes to 0
}

TEST(FpNarrow, RoundsOnceFromDouble) {
  // Through float32 this rounds twice: float32 makes the float16 tie 1 + 2^-11, which goes to
  // 1.0; rounded once it is 1 + 2^-10 (0x3C01).
  const double x = 1.0 + 0x1p-11 + 0x1p-40;
  EXPECT_EQ(float_to_half(static_cast<float>(x)), 0x3C00);
  EXPECT_EQ(double_to_half(x), 0x3C01);
  const double y = 1.0 + 0x1p-8 + 0x1p-40;  // the same for bfloat16
  EXPECT_EQ(float_to_bf16(static_cast<float>(y)), 0x3F80);
  EXPECT_EQ(double_to_bf16(y), 0x3F81);
  const double z = 1.0 + 0x1p-4 + 0x1p-40;  // and e4m3 (3 mantissa bits)
  EXPECT_EQ(float_to_e4m3(static_cast<float>(z)), 0x38);
  EXPECT_EQ(double_to_e4m3(z), 0x39);
}

// Random doubles around each format's range: random sign, exponent and 52-bit mantissa; exact
// midpoints of the format's neighbours; and values with few significant bits (as fixed-point
// sums have).
template <typename Gen>
double random_double(Gen& g, int emin, int emax) {
  std::uniform_int_distribution<int> kind(0, 3);
  std::uniform_int_distribution<int> ex(emin - 12, emax + 3);
  std::uniform_int_distribution<uint64_t> mant(0, (uint64_t{1} << 52) - 1);
  std::uniform_int_distribution<int> bits(1, 20);
  const double sign = (g() & 1) ? -1.0 : 1.0;
  switch (kind(g)) {
    case 0: return sign * std::ldexp(1.0 + std::ldexp(static_cast<double>(mant(g)), -52), ex(g));
    case 1: {  // few significant bits: often exact ties of the narrow format
      const int k = bits(g);
      const uint64_t m = (uint64_t{1} << k) | (mant(g) & ((uint64_t{1} << k) - 1));
      return sign * std::ldexp(static_cast<double>(m), ex(g) - k);
    }
    case 2: {  // an int64 fixed-point sum at a random scale (the codec's final step)
      std::uniform_int_distribution<int64_t> q(-(int64_t{1} << 53), int64_t{1} << 53);
      return std::ldexp(static_cast<double>(q(g)), ex(g) - 53);
    }
    default:
      return sign * std::ldexp(static_cast<double>(mant(g)), ex(g) - 52);  // may be subnormal
  }
}

TEST(FpNarrow, MatchesTheSearchReferenceOnRandomDoubles) {
  std::mt19937_64 g(20261201);
  constexpr int kN = 200000;
  for (int i = 0; i < kN; ++i) {
    const double x4 = random_double(g, -9, 8);
    ASSERT_EQ(double_to_e4m3(x4), ref_e4m3(x4)) << std::hexfloat << x4;
    const float f4 = static_cast<float>(x4);
    ASSERT_EQ(float_to_e4m3(f4), ref_e4m3(f4)) << std::hexfloat << f4;
    const double x5 = random_double(g, -16, 15);
    ASSERT_EQ(double_to_e5m2(x5), ref_e5m2(x5)) << std::hexfloat << x5;
    const float f5 = static_cast<float>(x5);
    ASSERT_EQ(float_to_e5m2(f5), ref_e5m2(f5)) << std::hexfloat << f5;
    const double xh = random_double(g, -24, 15);
    ASSERT_EQ(double_to_half(xh), ref_half(xh)) << std::hexfloat << xh;
    const double xb = random_double(g, -133, 127);
    ASSERT_EQ(double_to_bf16(xb), ref_bf16(xb)) << std::hexfloat << xb;
    const double xf = random_double(g, -149, 127);
    ASSERT_EQ(std::bit_cast<uint32_t>(double_to_float(xf)), ref_float_bits(xf))
        << std::hexfloat << xf;
    // The integer rounding agrees with the hardware one for float32 too.
    ASSERT_EQ(fp_detail::narrow_double(xf, fp_detail::kToFloat32), ref_float_bits(xf))
        << std::hexfloat << xf;
  }
}

// The subnormal path is a double addition: flush-to-zero and denormals-are-zero (as some
// processes run, e.g. with -ffast-math's crtfastmath) must not change a result.
TEST(FpNarrow, SameResultsUnderDenormalsAreZero) {
#if defined(__SSE2__)
  std::mt19937_64 g(99);
  std::vector<double> xs;
  std::vector<uint32_t> want;
  for (int i = 0; i < 20000; ++i) {
    const double x = random_double(g, -20, 8);
    xs.push_back(x);
    want.push_back(static_cast<uint32_t>(double_to_e4m3(x)) | (uint32_t{double_to_e5m2(x)} << 8) |
                   (uint32_t{double_to_half(x)} << 16));
  }
  xs.push_back(0x1p-1074);  // double subnormals
  want.push_back(0);
  xs.push_back(-0x1p-1040);
  want.push_back(0x80u | (0x80u << 8) | (0x8000u << 16));
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // FTZ | DAZ
  std::vector<uint32_t> got;
  for (const double x : xs) {
    got.push_back(static_cast<uint32_t>(double_to_e4m3(x)) | (uint32_t{double_to_e5m2(x)} << 8) |
                  (uint32_t{double_to_half(x)} << 16));
  }
  _mm_setcsr(saved);
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(got[i], want[i]) << std::hexfloat << xs[i];
#else
  GTEST_SKIP() << "no SSE control register on this target";
#endif
}

TEST(FpNarrow, AgreesWithHalfHFromFloat) {
  // From a float, rounding once from double is the same as half.h's float rounding.
  std::mt19937 g(7);
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(g()));
    ASSERT_EQ(double_to_half(static_cast<double>(f)), float_to_half(f)) << std::hexfloat << f;
    ASSERT_EQ(double_to_bf16(static_cast<double>(f)), float_to_bf16(f)) << std::hexfloat << f;
  }
}

}  // namespace
}  // namespace ina
