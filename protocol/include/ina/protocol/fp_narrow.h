// Correctly rounded narrowing of a double to the binary float formats INA carries, header-only:
// float32, float16 (IEEE binary16), bfloat16, and (fp8.h) float8 e4m3 / e5m2.
//
// Why from double: the block codec's last step turns a fixed-point sum (an int64 times a power of
// two, made exact in double by rounding to odd: WIRE2.md, Conversions) into the user's type. Going
// double -> float32 -> float16 would round twice, and the second rounding can land on the wrong
// side of a tie the first one created (1 + 2^-11 + 2^-40 is 1 + 2^-10 in float16, but float32
// rounds it to the tie 1 + 2^-11, which then goes to 1.0). These functions round once.
//
// Semantics (every format): round to nearest, ties to even; correctly rounded subnormals;
// +-0 keep their sign; overflow as the format says (float32, float16, bfloat16, e5m2: +-Inf, the
// IEEE rule: |x| >= max + ulp/2 rounds to Inf; e4m3 saturates, see fp8.h); a NaN stays a NaN with
// the sign and the top payload bits kept and the quiet bit set (as half.h does from float32, so
// double_to_half(double(f)) == float_to_half(f) for every float f, NaNs included).
//
// The rounding is integer arithmetic on the double's bits plus, below the format's normal range,
// one double addition, with branch-free selects (loops over it can vectorize); like half.h it
// relies on the default rounding mode (to nearest even), which every INA process runs in, and
// gives the same results with denormals-are-zero. double_to_float is the hardware conversion
// (cvtsd2ss), correctly rounded in that mode.
#pragma once

#include <bit>
#include <cstdint>

namespace ina {
namespace fp_detail {

// A binary format narrower than double, described by its magnitude bit patterns (sign excluded).
struct Narrow {
  int mant;             // stored mantissa bits
  int emin;             // exponent of the smallest normal number (1 - bias)
  uint32_t max_finite;  // pattern of the largest finite magnitude
  uint32_t overflow;    // pattern a finite value rounding above max_finite gets (Inf or max)
  uint32_t inf;         // pattern an Inf gets
  uint32_t nan;         // pattern of the quiet NaN with a zero payload
  int sign_shift;       // position of the sign bit
};

// c ? a : b as mask arithmetic (half.h's select, 64 bits wide): both operands are computed, so
// loops over the conversions stay branch-free.
inline uint64_t select64(bool c, uint64_t a, uint64_t b) {
  return b ^ ((a ^ b) & (0 - static_cast<uint64_t>(c)));
}

// x rounded to nearest even in format f, as a bit pattern (sign included). Three candidates, one
// selected (as half.h's float_to_half does from float):
//   * normal range (|x| >= 2^emin): round the double's bits at the format's mantissa width by
//     adding half an ulp minus one plus the lowest kept bit, then re-bias the exponent field
//     (1023 -> 1 - emin); a carry out of the mantissa correctly bumps the exponent. A pattern
//     above max_finite (a finite value rounding past the largest one, or Inf) is f.overflow.
//   * subnormal range (|x| < 2^emin): adding C = 2^(emin - mant + 52), whose ulp is the
//     format's subnormal spacing 2^(emin - mant), makes the FPU round |x| to nearest even at
//     that spacing (the default rounding mode, which every INA process runs in); the low bits of
//     the sum are the subnormal mantissa (2^mant, the smallest normal, when it rounds up).
//     A double subnormal (or one a denormals-are-zero FPU reads as 0) rounds to 0 either way.
//   * NaN: the double's top mant payload bits, the quiet bit forced (so never the Inf pattern).
inline uint32_t narrow_double(double x, const Narrow& f) {
  const uint64_t b = std::bit_cast<uint64_t>(x);
  const uint64_t a = b & 0x7FFFFFFFFFFFFFFFull;
  const uint64_t sign = (b >> 63) << f.sign_shift;
  constexpr uint64_t kInf = 0x7FF0000000000000ull;
  const int sh = 52 - f.mant;
  const uint64_t rounded = (a + ((uint64_t{1} << (sh - 1)) - 1) + ((a >> sh) & 1)) >> sh;
  const uint64_t normal = rounded - (static_cast<uint64_t>(1022 + f.emin) << f.mant);
  const uint64_t c_bits = static_cast<uint64_t>(f.emin - f.mant + 52 + 1023) << 52;
  const uint64_t subnormal =
      std::bit_cast<uint64_t>(std::bit_cast<double>(a) + std::bit_cast<double>(c_bits)) - c_bits;
  const uint64_t min_normal = static_cast<uint64_t>(f.emin + 1023) << 52;
  const bool is_normal = a >= min_normal;
  const uint64_t finite = select64(is_normal, normal, subnormal);
  const uint64_t mag = select64(is_normal && normal > f.max_finite, f.overflow, finite);
  const uint64_t nan = f.nan | ((a >> sh) & ((uint64_t{1} << f.mant) - 1));
  return static_cast<uint32_t>(sign | select64(a > kInf, nan, mag));
}

inline constexpr Narrow kToFloat32{23,          -126,        0x7F7FFFFFu, 0x7F800000u,
                                   0x7F800000u, 0x7FC00000u, 31};
inline constexpr Narrow kToFloat16{10, -14, 0x7BFFu, 0x7C00u, 0x7C00u, 0x7E00u, 15};
inline constexpr Narrow kToBFloat16{7, -126, 0x7F7Fu, 0x7F80u, 0x7F80u, 0x7FC0u, 15};

}  // namespace fp_detail

// double -> float32, round to nearest even (the hardware conversion; see above).
inline float double_to_float(double x) { return static_cast<float>(x); }

// double -> float16 bits, round to nearest even, once.
inline uint16_t double_to_half(double x) {
  return static_cast<uint16_t>(fp_detail::narrow_double(x, fp_detail::kToFloat16));
}

// double -> bfloat16 bits, round to nearest even, once.
inline uint16_t double_to_bf16(double x) {
  return static_cast<uint16_t>(fp_detail::narrow_double(x, fp_detail::kToBFloat16));
}

}  // namespace ina
