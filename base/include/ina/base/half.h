// float32 <-> float16 (IEEE 754 binary16) and float32 <-> bfloat16 conversions, header-only.
//
// The 16-bit values are stored as uint16_t bit patterns so that no compiler extension (_Float16,
// __bf16) is needed. Every conversion is exact IEEE semantics:
//   * widening (16 -> 32 bits) is exact for every pattern, subnormals included;
//   * narrowing (32 -> 16 bits) rounds to nearest, ties to even, overflows to +-Inf, and produces
//     correctly rounded subnormals;
//   * a NaN stays a NaN in both directions, with the quiet bit set (a signalling NaN is quieted,
//     as F16C's vcvtph2ps/vcvtps2ph and CUDA do), the sign kept and the top payload bits kept;
//     a NaN never turns into an Inf by truncation of its payload.
// The functions are branch-free selects over integer bit operations (plus one float addition for
// float16 subnormals), so loops that call them vectorize. They are the reference that the SIMD and
// CUDA kernels (kernels/) must match bit for bit; the tests check them against every 16-bit
// pattern and against an independent rounding reference.
#pragma once

#include <bit>
#include <cstdint>

namespace ina {
namespace half_detail {
// c ? a : b as mask arithmetic. Both operands are computed unconditionally: the compiler would
// otherwise move a float operation into a branch, where (with the default -ftrapping-math) it can
// no longer turn the branch back into a vector select.
inline uint32_t select(bool c, uint32_t a, uint32_t b) {
  return b ^ ((a ^ b) & (0u - static_cast<uint32_t>(c)));
}
}  // namespace half_detail

// binary16 -> binary32, exact.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t em = h & 0x7FFFu;  // exponent and mantissa
  // Normal numbers: move the 10-bit mantissa to the top of float32's 23 bits and re-bias the
  // exponent from 15 to 127 (add 112 to the exponent field).
  const uint32_t normal = (em << 13) + (112u << 23);
  // Subnormals (exponent field 0, zero included): value = mantissa * 2^-24; the mantissa has at
  // most 10 bits, so converting it to float and scaling by a power of two is exact.
  const uint32_t subnormal = std::bit_cast<uint32_t>(static_cast<float>(em) * 0x1p-24f);
  // Inf and NaN (exponent field 31): exponent all ones, payload kept, quiet bit set for NaN.
  const uint32_t inf_nan = 0x7F800000u | ((em & 0x3FFu) << 13) | (em > 0x7C00u ? 0x00400000u : 0u);
  using half_detail::select;
  const uint32_t mag = select(em < 0x0400u, subnormal, select(em >= 0x7C00u, inf_nan, normal));
  return std::bit_cast<float>(sign | mag);
}

// binary32 -> binary16, round to nearest even.
inline uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;  // |f| as bits
  // NaN: keep the top 10 payload bits, force the quiet bit (so the result cannot become Inf).
  const uint32_t nan = 0x7E00u | ((a >> 13) & 0x3FFu);
  // Normal range of binary16 ([2^-14, 65520)): re-bias the exponent (127 -> 15) and round the 13
  // dropped mantissa bits to nearest even by adding 0xFFF plus the lowest kept bit: a carry out of
  // the mantissa correctly bumps the exponent. 0x477FF000 is 65520, the midpoint between 65504
  // (the largest half) and 65536; it and everything above round to Inf (65504's mantissa is odd).
  const uint32_t normal = (a - (112u << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  // Subnormal range (|f| < 2^-14): adding 0.5f aligns the value so that float32's ulp at 0.5 is
  // 2^-24, binary16's subnormal spacing; the float addition then rounds to nearest even, and the
  // low bits of the sum are the half's mantissa (0x400, the smallest normal, when it rounds up).
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 0.5f) - std::bit_cast<uint32_t>(0.5f);
  using half_detail::select;
  const uint32_t finite = select(a < 0x38800000u, subnormal, normal);
  const uint32_t mag = select(a > 0x7F800000u, nan, select(a >= 0x477FF000u, 0x7C00u, finite));
  return static_cast<uint16_t>(sign | mag);
}

// bfloat16 -> binary32, exact (bfloat16 is the top half of a binary32).
inline float bf16_to_float(uint16_t b) {
  const bool is_nan = (b & 0x7FFFu) > 0x7F80u;
  return std::bit_cast<float>(uint32_t{static_cast<uint16_t>(b | (is_nan ? 0x0040u : 0u))} << 16);
}

// binary32 -> bfloat16, round to nearest even. Adding 0x7FFF plus the lowest kept bit rounds the
// 16 dropped bits; the carry propagates into the exponent, which also gives correct subnormals
// (uniform spacing) and overflow to Inf (above bf16's largest finite value plus half an ulp).
inline uint16_t float_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const bool is_nan = (x & 0x7FFFFFFFu) > 0x7F800000u;
  const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(is_nan ? ((x >> 16) | 0x0040u) : rounded);
}

}  // namespace ina
