// The element types of the block codec, their exact conversions and the small helpers its loops
// share (header-only): one traits struct per float dtype (bits <-> float, widening exact; double
// and float -> bits rounded once; the quiet NaN; the magnitude codes), the MIN/MAX key map, and
// the integer roundings the quantizer and dequantizer rely on. protocol/codec.cc and every
// kernel implementation (kernels/codec/) use the same definitions, so the portable loops and
// the vector ones cannot drift apart. QUANTIZATION.md says why each conversion is exact.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ina/base/half.h"
#include "ina/protocol/fp8.h"

namespace ina::kernels {

// float_to_half(round_to_odd_float(d)) etc.: d rounded to odd at float32 precision first (exact
// for the doubles the codec passes); defined here so that the traits need nothing else.
inline float round_to_odd_float(double d) {
  float f = static_cast<float>(d);
  if (static_cast<double>(f) == d || std::isnan(d)) return f;
  // Inexact: the neighbour toward zero, then its last bit set (the odd one of the two
  // neighbours of d). An overflow to Inf comes back to the largest float, which is odd.
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
}

// Element traits: bits <-> float (widening exact), double -> element (round to nearest even,
// once; callers pass values already rounded to odd where that matters), and the quiet NaN.
struct F32 {
  using Bits = uint32_t;
  static float to_float(Bits b) { return std::bit_cast<float>(b); }
  static Bits from_double(double d) { return std::bit_cast<uint32_t>(static_cast<float>(d)); }
  static Bits from_float(float f) { return std::bit_cast<uint32_t>(f); }
  static constexpr Bits kNaN = 0x7FC00000u;
  static constexpr Bits kAbs = 0x7FFFFFFFu;  // the magnitude bits of a code
  static constexpr Bits kInf = 0x7F800000u;  // the first non-finite magnitude code
  static constexpr bool kHasInf = true;
};
struct F16 {
  using Bits = uint16_t;
  static float to_float(Bits b) { return half_to_float(b); }
  static Bits from_double(double d) { return float_to_half(round_to_odd_float(d)); }
  static Bits from_float(float f) { return float_to_half(f); }
  static constexpr Bits kNaN = 0x7E00u;
  static constexpr Bits kAbs = 0x7FFFu;
  static constexpr Bits kInf = 0x7C00u;
  static constexpr bool kHasInf = true;
};
struct BF16 {
  using Bits = uint16_t;
  static float to_float(Bits b) { return bf16_to_float(b); }
  static Bits from_double(double d) { return float_to_bf16(round_to_odd_float(d)); }
  static Bits from_float(float f) { return float_to_bf16(f); }
  static constexpr Bits kNaN = 0x7FC0u;
  static constexpr Bits kAbs = 0x7FFFu;
  static constexpr Bits kInf = 0x7F80u;
  static constexpr bool kHasInf = true;
};
// float8: from_double rounds once (fp8.h); the doubles passed are exact or rounded to odd at 53
// bits, far more than the 2 extra bits that make the final rounding correct.
struct E4M3 {
  using Bits = uint8_t;
  static float to_float(Bits b) { return e4m3_to_float(b); }
  static Bits from_double(double d) { return double_to_e4m3(d); }
  static Bits from_float(float f) { return float_to_e4m3(f); }
  static constexpr Bits kNaN = kE4M3NaN;
  static constexpr Bits kAbs = 0x7Fu;
  static constexpr Bits kInf = 0x7Fu;  // no Inf: the NaN code is the only non-finite one
  static constexpr bool kHasInf = false;
  static constexpr const fp_detail::Narrow& kNarrow = fp_detail::kToE4M3;
};
struct E5M2 {
  using Bits = uint8_t;
  static float to_float(Bits b) { return e5m2_to_float(b); }
  static Bits from_double(double d) { return double_to_e5m2(d); }
  static Bits from_float(float f) { return float_to_e5m2(f); }
  static constexpr Bits kNaN = kE5M2NaN;
  static constexpr Bits kAbs = 0x7Fu;
  static constexpr Bits kInf = kE5M2Inf;
  static constexpr bool kHasInf = true;
  static constexpr const fp_detail::Narrow& kNarrow = fp_detail::kToE5M2;
};

// int32 where only the width matters (the MIN/MAX keys).
struct I32 {
  using Bits = uint32_t;
};

template <class E>
typename E::Bits load(const void* src, size_t i) {
  typename E::Bits b;
  std::memcpy(&b, static_cast<const uint8_t*>(src) + i * sizeof b, sizeof b);
  return b;
}
template <class E>
void store(void* dst, size_t i, typename E::Bits b) {
  std::memcpy(static_cast<uint8_t*>(dst) + i * sizeof b, &b, sizeof b);
}

// The MIN/MAX key of a float: quant::float_to_ordered's map (QUANTIZATION.md), inline here so
// that the loops over it make no call per element.
inline int32_t ordered(float f) {
  const int32_t b = std::bit_cast<int32_t>(f);
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}
inline float from_ordered(int32_t k) { return std::bit_cast<float>(k ^ ((k >> 31) & 0x7FFFFFFF)); }

// The keys of the 256 float8 codes, ordered(E::to_float(c)), built once: the portable MIN/MAX
// loops look float8 elements up instead of decoding them.
template <class E>
const int32_t* fp8_keys() {
  static_assert(sizeof(typename E::Bits) == 1);
  static const auto table = [] {
    std::array<int32_t, 256> t{};
    for (unsigned c = 0; c < 256; ++c) t[c] = ordered(E::to_float(static_cast<uint8_t>(c)));
    return t;
  }();
  return table.data();
}

// What keys32() does with each key.
enum class KeyOp { kStore, kMin, kMax };
inline int32_t apply_key(KeyOp op, int32_t acc, int32_t key) {
  return op == KeyOp::kStore ? key : op == KeyOp::kMax ? std::max(acc, key) : std::min(acc, key);
}

inline double pow2(int e) { return std::ldexp(1.0, e); }

// rint for |v| <= 2^62 in the default rounding mode: below 2^52 adding and subtracting 2^52
// rounds to an integer (ties to even); from 2^52 on a double is an integer already.
inline double rint_big(double v) {
  const double a = std::fabs(v);
  const double r = a < 0x1p52 ? (a + 0x1p52) - 0x1p52 : a;
  return std::copysign(r, v);
}

// q rounded to odd at 24 significant bits, as a float (exact): with at least two bits more than
// float16's 11 the final rounding to the user's type is still correct.
inline float round_to_odd24(int64_t q) {
  const uint64_t m = q < 0 ? uint64_t{0} - static_cast<uint64_t>(q) : static_cast<uint64_t>(q);
  const int shift = std::max(0, static_cast<int>(std::bit_width(m)) - 24);
  const uint64_t hi = (m >> shift) | ((m & ((uint64_t{1} << shift) - 1)) != 0 ? 1u : 0u);
  // 2^shift (shift <= 40) as float bits: exact.
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(127 + shift) << 23);
  const float r = static_cast<float>(hi) * scale;
  return q < 0 ? -r : r;
}

}  // namespace ina::kernels
