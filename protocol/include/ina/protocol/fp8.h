// float8 conversions, header-only: OCP FP8 E4M3 ("E4M3FN") and E5M2, stored as uint8_t codes.
//
//   e4m3  S.EEEE.MMM, bias 7, no Inf; NaN is S.1111.111 (0x7F, 0xFF), the only NaNs; every other
//         code is finite, the largest 0x7E = 448 = 1.75 * 2^8; smallest subnormal 2^-9.
//   e5m2  S.EEEEE.MM, bias 15, IEEE-like: Inf 0x7C / 0xFC, NaN exponent 11111 with a non-zero
//         mantissa (quiet bit: the top mantissa bit); largest finite 0x7B = 57344 = 1.75 * 2^15;
//         smallest subnormal 2^-16. An e5m2 code is the top byte of a float16 with the same value.
//
// Widening (code -> float) is exact for every code. A NaN widens to a quiet float NaN with its
// sign (e5m2: payload kept, a signalling NaN quieted, as half_to_float does).
//
// Narrowing (double or float -> code) rounds to nearest, ties to even, once (the float form widens
// to double exactly first), with correctly rounded subnormals and signed zeros, and:
//   * e4m3 SATURATES: a finite value that rounds above 448, and +-Inf, give +-448 (0x7E / 0xFE);
//     a NaN gives the NaN of its sign. This is NVIDIA's __nv_cvt_*_to_fp8(..., __NV_SATFINITE,
//     __NV_E4M3), the conversion NCCL and Transformer Engine use; e4m3 has no Inf to overflow to,
//     and mapping overflow to NaN would poison a whole sum for one large element.
//   * e5m2 overflows to +-Inf, as IEEE formats do (NVIDIA's __NV_NOSAT mode for e5m2):
//     |x| >= 57344 + 4096 = 61440 rounds to Inf (61440 itself is a tie whose even neighbour is
//     the Inf pattern); Inf stays Inf; a NaN stays a NaN (sign and top payload bit kept, quiet
//     bit set).
// So every code round-trips (narrow(widen(c)) == c) except the two signalling e5m2 NaNs 0x7D and
// 0xFD, which come back quiet (0x7F, 0xFF).
//
// The rounding is fp_narrow.h's (branch-free; the default rounding mode assumed, as half.h).
#pragma once

#include <bit>
#include <cstdint>

#include "ina/base/half.h"
#include "ina/protocol/fp_narrow.h"

namespace ina {
namespace fp_detail {
inline constexpr Narrow kToE4M3{3, -6, 0x7Eu, 0x7Eu, 0x7Eu, 0x7Fu, 7};  // overflow, Inf: 448
inline constexpr Narrow kToE5M2{2, -14, 0x7Bu, 0x7Cu, 0x7Cu, 0x7Eu, 7};
}  // namespace fp_detail

inline constexpr uint8_t kE4M3Max = 0x7E;  // 448
inline constexpr uint8_t kE4M3NaN = 0x7F;
inline constexpr uint8_t kE5M2Max = 0x7B;  // 57344
inline constexpr uint8_t kE5M2Inf = 0x7C;
inline constexpr uint8_t kE5M2NaN = 0x7E;  // the quiet NaN with a zero payload

inline constexpr bool e4m3_is_nan(uint8_t c) { return (c & 0x7F) == 0x7F; }
inline constexpr bool e5m2_is_nan(uint8_t c) { return (c & 0x7F) > 0x7C; }

// e4m3 -> float32, exact. Branch-free selects (half.h's), so loops over it vectorize.
inline float e4m3_to_float(uint8_t c) {
  const uint32_t sign = uint32_t{c & 0x80u} << 24;
  const uint32_t em = c & 0x7Fu;  // exponent and mantissa
  // Normal: the 3-bit mantissa to the top of float32's 23 bits, the exponent re-biased 7 -> 127.
  const uint32_t normal = (em << 20) + (120u << 23);
  // Subnormal (exponent field 0, zero included): mantissa * 2^-9, exact in float.
  const uint32_t subnormal = std::bit_cast<uint32_t>(static_cast<float>(em) * 0x1p-9f);
  using half_detail::select;
  const uint32_t mag = select(em < 0x08u, subnormal, select(em == 0x7Fu, 0x7FC00000u, normal));
  return std::bit_cast<float>(sign | mag);
}

// e5m2 -> float32, exact: the code is the top byte of the float16 of the same value.
inline float e5m2_to_float(uint8_t c) { return half_to_float(static_cast<uint16_t>(c << 8)); }

// double -> e4m3, round to nearest even, saturating (see above).
inline uint8_t double_to_e4m3(double x) {
  return static_cast<uint8_t>(fp_detail::narrow_double(x, fp_detail::kToE4M3));
}

// double -> e5m2, round to nearest even, overflow to Inf.
inline uint8_t double_to_e5m2(double x) {
  return static_cast<uint8_t>(fp_detail::narrow_double(x, fp_detail::kToE5M2));
}

// float -> e4m3 / e5m2: the float widened to double (exact), then rounded once.
inline uint8_t float_to_e4m3(float f) { return double_to_e4m3(static_cast<double>(f)); }
inline uint8_t float_to_e5m2(float f) { return double_to_e5m2(static_cast<double>(f)); }

}  // namespace ina
