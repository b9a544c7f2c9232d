// Fixed-point quantizer reference: float32, float16, bfloat16 and float8 (e4m3, e5m2) blocks to
// int32 and back.
//
// This file is the specification; SIMD and CUDA kernels (kernels/) must produce bitwise identical
// integers and outputs.
//
// SUM of floating-point data (SwitchML's scheme):
//   * Each rank scans a block and finds its exponent e: the smallest integer with |x| < 2^e for
//     every finite x of the block (frexp). A block of zeros has kNoExponent.
//   * The aggregator takes the MAX of the ranks' exponents (carried one block ahead in the packet
//     header), so every rank quantizes block i with the same E >= its own e.
//   * With B = magnitude_bits(N) = 30 - ceil(log2 N), q = rint(x * 2^(B-E)) (round half to even),
//     so |q| <= 2^B and the sum over N ranks satisfies |sum| <= N * 2^B <= 2^30: no overflow.
//   * The result is sum * 2^(E-B), computed exactly in double, then rounded to float32 and, for the
//     16-bit types, from float32 to the output type (round to nearest even); float8 is rounded
//     once, from the double, to nearest even (e4m3 saturating at +-448: fp8.h). e4m3 values are
//     multiples of 2^-9 below 2^9, so with E <= 9 they quantize exactly when B >= 18, i.e. up
//     to 4096 ranks: the output is then the exact sum rounded once.
//   Error bound (documented in protocol/QUANTIZATION.md and asserted by the tests): for an element
//   whose exact sum over ranks is s, and M the largest |x| of the block over all ranks,
//       |out - s| <= qb + ulp_out(|s| + qb),   qb = N * 2^(E-B-1) <= N * M * 2^(-B),
//   with 2^(E-1) <= M < 2^E, where ulp_out(a) is the spacing of the output type at a (covering
//   the final rounding to float32 and then to the 16-bit type; the dequantized value lies within
//   qb of s, so its spacing is at most ulp_out(|s| + qb)). Away from cancellation the tighter
//   |out - s| <= qb + ulp_out(s) holds; see QUANTIZATION.md.
//
// MIN and MAX need no scale: floats are mapped to int32 by an order-preserving bijection of their
// float32 bit patterns (16-bit types are widened to float32 first, exactly), so MIN/MAX are exact
// for every type, including +-Inf.
//
// int32: the payload is the value itself; SUM wraps modulo 2^32 (two's complement), MIN/MAX exact.
//
// Non-finite input: a block that holds a NaN (any op) or an Inf (SUM) is flagged NONFINITE in its
// packet; the aggregator ORs the flag and every element of that block's result is NaN on every
// rank. Training loops (AMP's GradScaler) look for exactly this to skip a step; finite blocks of
// the same collective are unaffected.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ina/protocol/types.h"

namespace ina::quant {

// B = 30 - ceil(log2(world_size)); world_size >= 1.
int magnitude_bits(uint32_t world_size);

// True when the (dtype, op) pair needs a shared exponent (float SUM).
inline constexpr bool needs_exponent(DType t, ReduceOp op) {
  return t != DType::kInt32 && op == ReduceOp::kSum;
}

struct BlockScan {
  int16_t exp = kNoExponent;  // max exponent over finite non-zero elements
  bool nonfinite = false;     // NaN present, or Inf present (Inf counts only when `op` is SUM)
};

// Scans n elements of `src` (of type t).
BlockScan scan_block(const void* src, size_t n, DType t, ReduceOp op);

// Max of two exponents (kNoExponent is the identity).
inline int16_t max_exponent(int16_t a, int16_t b) { return a > b ? a : b; }

// Encodes n elements of src for the wire-level reduction `op`:
//   SUM, float types: q = rint(x * 2^(B-exp)), B = magnitude_bits(world_size); non-finite
//                     elements and exp == kNoExponent give 0.
//   MIN/MAX, float types: the order-preserving int32 image of the float32 value.
//   int32: copied.
// `exp` must be >= scan_block(...).exp of this block on this rank (it is the max over ranks).
void encode(const void* src, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            int32_t* q);

// Decodes n reduced words into dst (of type t); the inverse of encode for the reduced values.
void decode(const int32_t* q, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            void* dst);

// Writes n quiet NaNs of type t (the result of a NONFINITE block). t must be a float type.
void fill_nan(void* dst, size_t n, DType t);

// The documented bound on |out - exact| for a SUM of floats, excluding the final rounding to the
// output type: qb = N * M * 2^-B, M the block's largest |x| over all ranks.
double sum_quantization_bound(double block_max_abs, uint32_t world_size);

// Spacing of the values of float type t at magnitude a (the subnormal spacing below the smallest
// normal number).
double output_ulp(DType t, double a);

// The whole documented bound for one element of a float SUM whose exact sum is `exact`:
// qb + output_ulp(t, |exact| + qb). What tests and benchmarks check results against.
double sum_error_bound(DType t, double block_max_abs, uint32_t world_size, double exact);

// Order-preserving map between float32 bit patterns and int32 (exposed for tests and kernels).
int32_t float_to_ordered(float f);
float ordered_to_float(int32_t q);

}  // namespace ina::quant
