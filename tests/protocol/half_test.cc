// half.h: float16/bfloat16 conversions against known bit patterns, every 16-bit pattern, and an
// independent round-to-nearest-even reference built from the sorted list of representable values.
#include "ina/base/half.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace ina {
namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t b) { return std::bit_cast<float>(b); }

bool half_is_nan(uint16_t h) { return (h & 0x7FFFu) > 0x7C00u; }
bool bf16_is_nan(uint16_t b) { return (b & 0x7FFFu) > 0x7F80u; }

// The value of a non-NaN half, computed from its fields in double (independent of half.h).
double half_value(uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  if (e == 31) return sign * std::numeric_limits<double>::infinity();
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

// Correctly rounded float -> half by search: the two representable neighbours of |f|, the nearer
// one, ties to the even pattern, and IEEE overflow (|f| >= 65504 + ulp/2 = 65520 is Inf).
uint16_t reference_float_to_half(float f) {
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (uint32_t h = 0; h <= 0x7BFF; ++h) v.push_back(half_value(static_cast<uint16_t>(h)));
    return v;
  }();
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7C00;
  // values is increasing; lo = largest pattern whose value <= a.
  const size_t lo =
      static_cast<size_t>(std::upper_bound(values.begin(), values.end(), a) - values.begin()) - 1;
  if (lo == values.size() - 1) return static_cast<uint16_t>(sign | lo);  // (65504, 65520)
  const double dlo = a - values[lo];
  const double dhi = values[lo + 1] - a;
  size_t pick = dlo < dhi ? lo : (dhi < dlo ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1));
  return static_cast<uint16_t>(sign | pick);
}

// Correctly rounded float -> bfloat16 from the dropped bits (a formulation different from
// half.h's add-and-shift).
uint16_t reference_float_to_bf16(float f) {
  const uint32_t x = bits(f);
  const uint32_t hi = x >> 16;
  const uint32_t rest = x & 0xFFFF;
  const bool up = rest > 0x8000 || (rest == 0x8000 && (hi & 1));
  return static_cast<uint16_t>(hi + (up ? 1 : 0));
}

TEST(Half, KnownPatternsToFloat) {
  EXPECT_EQ(half_to_float(0x3C00), 1.0f);
  EXPECT_EQ(half_to_float(0xC000), -2.0f);
  EXPECT_EQ(half_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(half_to_float(0x0400), 0x1p-14f);         // smallest normal
  EXPECT_EQ(half_to_float(0x0001), 0x1p-24f);         // smallest subnormal
  EXPECT_EQ(half_to_float(0x03FF), 1023 * 0x1p-24f);  // largest subnormal
  EXPECT_EQ(half_to_float(0x8001), -0x1p-24f);
  EXPECT_EQ(bits(half_to_float(0x0000)), 0x00000000u);
  EXPECT_EQ(bits(half_to_float(0x8000)), 0x80000000u);  // -0 keeps its sign
  EXPECT_EQ(half_to_float(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(half_to_float(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits(half_to_float(0x7E00)), 0x7FC00000u);  // quiet NaN
  EXPECT_EQ(bits(half_to_float(0xFE00)), 0xFFC00000u);
  EXPECT_EQ(bits(half_to_float(0x7C01)), 0x7FC02000u);  // signalling NaN: quieted, payload kept
}

TEST(Half, KnownPatternsFromFloat) {
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(from_bits(bits(65520.0f) - 1)), 0x7BFF);  // just below the midpoint
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // the midpoint; 65504 is odd, so up to Inf
  EXPECT_EQ(float_to_half(1e10f), 0x7C00);
  EXPECT_EQ(float_to_half(-1e10f), 0xFC00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  // Subnormals and the ties around them.
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);  // tie between 0 and 1 unit: even
  EXPECT_EQ(float_to_half(from_bits(bits(0x1p-25f) + 1)), 0x0001);
  EXPECT_EQ(float_to_half(3 * 0x1p-25f), 0x0002);  // tie between 1 and 2 units: even
  EXPECT_EQ(float_to_half(-3 * 0x1p-25f), 0x8002);
  EXPECT_EQ(float_to_half(0x1p-14f - 0x1p-25f), 0x0400);  // tie below the smallest normal
  EXPECT_EQ(float_to_half(0x1p-40f), 0x0000);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::denorm_min()), 0x0000);
  // Ties in the normal range: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(float_to_half(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f + 0x1p-23f), 0x3C01);
  // A carry out of the mantissa bumps the exponent: 2 - 2^-12 rounds to 2.
  EXPECT_EQ(float_to_half(2.0f - 0x1p-12f), 0x4000);
  // NaN stays a quiet NaN, even when its payload sits only in the dropped bits.
  EXPECT_EQ(float_to_half(from_bits(0x7FC00000u)), 0x7E00);
  EXPECT_EQ(float_to_half(from_bits(0xFFC00000u)), 0xFE00);
  EXPECT_EQ(float_to_half(from_bits(0x7F800001u)), 0x7E00);
  EXPECT_EQ(float_to_half(from_bits(0x7FFFFFFFu)), 0x7FFF);
}

TEST(Half, EveryPatternWidensExactlyAndRoundTrips) {
  for (uint32_t i = 0; i <= 0xFFFF; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = half_to_float(h);
    if (half_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      ASSERT_EQ(bits(f) & 0x00400000u, 0x00400000u) << std::hex << i;  // quiet
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << i;
      const uint16_t back = float_to_half(f);
      ASSERT_EQ(back, h | 0x0200) << std::hex << i;  // payload kept, quiet bit set
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), half_value(h)) << std::hex << i;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << i;
    ASSERT_EQ(float_to_half(f), h) << std::hex << i;
  }
}

// Every midpoint between neighbouring halves and the floats right next to it: the places where
// rounding can go wrong.
TEST(Half, MidpointsRoundToNearestEven) {
  for (uint32_t i = 0; i < 0x7BFF; ++i) {
    const double mid =
        (half_value(static_cast<uint16_t>(i)) + half_value(static_cast<uint16_t>(i + 1))) / 2;
    const float m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid);  // midpoints are floats
    for (const float f : {m, from_bits(bits(m) - 1), from_bits(bits(m) + 1)}) {
      ASSERT_EQ(float_to_half(f), reference_float_to_half(f)) << f;
      ASSERT_EQ(float_to_half(-f), reference_float_to_half(-f)) << f;
    }
    // The tie itself goes to the even pattern.
    ASSERT_EQ(float_to_half(m), (i % 2 == 0) ? i : i + 1) << std::hex << i;
  }
}

TEST(Half, SampledFloatsMatchTheReference) {
  // A stride through all 2^32 float patterns (about 4.3 million of them), every sign and class.
  for (uint64_t x = 0; x <= 0xFFFFFFFFull; x += 997) {
    const float f = from_bits(static_cast<uint32_t>(x));
    const uint16_t got = float_to_half(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(half_is_nan(got)) << std::hex << x;
      ASSERT_EQ(got & 0x0200, 0x0200) << std::hex << x;
      continue;
    }
    ASSERT_EQ(got, reference_float_to_half(f)) << std::hex << x;
#ifdef __FLT16_MAX__
    // The compiler's own conversion, where it has one, agrees too.
    const _Float16 c = static_cast<_Float16>(f);
    ASSERT_EQ(got, std::bit_cast<uint16_t>(c)) << std::hex << x;
#endif
  }
}

TEST(BFloat16, KnownPatterns) {
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xC020), -2.5f);
  EXPECT_EQ(bf16_to_float(0x7F7F), from_bits(0x7F7F0000u));  // largest finite
  EXPECT_EQ(bf16_to_float(0x0001), from_bits(0x00010000u));  // smallest subnormal, 2^-133
  EXPECT_EQ(bf16_to_float(0x0001), 0x1p-133f);
  EXPECT_EQ(bf16_to_float(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits(bf16_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(bits(bf16_to_float(0x7FC0)), 0x7FC00000u);
  EXPECT_EQ(bits(bf16_to_float(0x7F81)), 0x7FC10000u);  // signalling NaN quieted

  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.5f), 0xC020);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);      // tie: even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);  // tie: even (up)
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-23f), 0x3F81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // overflows to Inf
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7F8000u)), 0x7F80);  // tie above the largest (odd)
  EXPECT_EQ(float_to_bf16(0x1p-133f), 0x0001);
  EXPECT_EQ(float_to_bf16(0x1p-134f), 0x0000);  // tie between 0 and the smallest: even
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  // NaN stays NaN: a payload only in the dropped bits would truncate to Inf and, with rounding,
  // 0x7FFFFFFF would carry into the sign.
  EXPECT_EQ(float_to_bf16(from_bits(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(float_to_bf16(from_bits(0x7FFFFFFFu)), 0x7FFF);
  EXPECT_EQ(float_to_bf16(from_bits(0xFFC00000u)), 0xFFC0);
}

TEST(BFloat16, EveryPatternWidensExactlyAndRoundTrips) {
  for (uint32_t i = 0; i <= 0xFFFF; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = bf16_to_float(b);
    if (bf16_is_nan(b)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      ASSERT_EQ(bits(f), static_cast<uint32_t>(b | 0x0040) << 16) << std::hex << i;
      ASSERT_EQ(float_to_bf16(f), b | 0x0040) << std::hex << i;
      continue;
    }
    ASSERT_EQ(bits(f), i << 16) << std::hex << i;  // bfloat16 is the top half of a float
    ASSERT_EQ(float_to_bf16(f), b) << std::hex << i;
  }
}

TEST(BFloat16, SampledFloatsMatchTheReference) {
  for (uint64_t x = 0; x <= 0xFFFFFFFFull; x += 997) {
    const float f = from_bits(static_cast<uint32_t>(x));
    const uint16_t got = float_to_bf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(bf16_is_nan(got)) << std::hex << x;
      continue;
    }
    ASSERT_EQ(got, reference_float_to_bf16(f)) << std::hex << x;
  }
  // Every tie and its neighbours.
  for (uint32_t hi = 0; hi < 0x7F80; ++hi) {
    for (const uint32_t lo : {0x7FFFu, 0x8000u, 0x8001u}) {
      const float f = from_bits(hi << 16 | lo);
      ASSERT_EQ(float_to_bf16(f), reference_float_to_bf16(f)) << std::hex << hi;
      ASSERT_EQ(float_to_bf16(-f), reference_float_to_bf16(-f)) << std::hex << hi;
    }
  }
}

}  // namespace
}  // namespace ina
