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
// The rounding is integer arithmetic on the double's bits: independent of the FPU's rounding
// mode and of denormals-are-zero. double_to_float is the exception: the hardware conversion
// (cvtsd2ss), correctly rounded in the default rounding mode, which every INA process runs in.
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

// |x| (the bits of a finite double, sign cleared) rounded to nearest even in format f, as a
// magnitude pattern. The result's quantum is 2^(max(e, emin) - mant), e = floor(log2 |x|); n =
// |x| / quantum rounded to an integer; the pattern is ((max(e, emin) - emin) << mant) + n, which
// is also right when n carries to 2^(mant+1) (the next binade) and for subnormals (n < 2^mant).
inline uint32_t round_magnitude(uint64_t a, const Narrow& f) {
  const int field = static_cast<int>(a >> 52);
  const uint64_t sig = (a & ((uint64_t{1} << 52) - 1)) | (field != 0 ? uint64_t{1} << 52 : 0);
  const int ed = (field != 0 ? field : 1) - 1023;  // |x| = sig * 2^(ed - 52)
  const int e = ed < f.emin ? f.emin : ed;
  int shift = (e - f.mant) - (ed - 52);  // bits of sig below the quantum: >= 52 - mant > 0
  // sig < 2^53: with 54 or more bits dropped the value is below half a quantum and rounds to 0,
  // as it does with any larger shift; the cap keeps the shifts defined.
  if (shift > 60) shift = 60;
  const uint64_t n0 = sig >> shift;
  const uint64_t rem = sig & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  const uint64_t n = n0 + ((rem > half || (rem == half && (n0 & 1) != 0)) ? 1 : 0);
  const uint64_t pattern = (static_cast<uint64_t>(e - f.emin) << f.mant) + n;
  return pattern > f.max_finite ? f.overflow : static_cast<uint32_t>(pattern);
}

// The whole conversion: sign, NaN (payload: the double's top mant bits, quiet bit forced), Inf.
inline uint32_t narrow_double(double x, const Narrow& f) {
  const uint64_t b = std::bit_cast<uint64_t>(x);
  const uint32_t sign = static_cast<uint32_t>(b >> 63) << f.sign_shift;
  const uint64_t a = b & 0x7FFFFFFFFFFFFFFFull;
  constexpr uint64_t kInf = 0x7FF0000000000000ull;
  if (a > kInf) {
    const uint32_t payload = static_cast<uint32_t>(a >> (52 - f.mant)) & ((1u << f.mant) - 1);
    return sign | f.nan | payload;
  }
  if (a == kInf) return sign | f.inf;
  return sign | round_magnitude(a, f);
}

inline constexpr Narrow kToFloat32{23, -126, 0x7F7FFFFFu, 0x7F800000u, 0x7F800000u, 0x7FC00000u, 31};
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
