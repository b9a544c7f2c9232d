// The block codec of wire version 2: what the aggregator (and a tree's leaves and root) and the
// exact host fallback do to a block of user data, and nobody else re-implements.
//
//   scan         block exponent (frexp of the largest finite |x|) and the non-finite mark
//   quantize     q = rint(x * 2^(B-E)), ties to even, into int64 (the accumulator)
//   dequantize   a fixed-point sum Q at scale 2^(E-B) -> the user's type, correctly rounded once
//   keys32       MIN/MAX: an order-preserving int32 image of each element (int32: the value)
//   fill_nan     the result of a NONFINITE block
//
// B = magnitude_bits(dtype, N): 62 - ceil(log2 N) for float32 (int64 accumulators), 30 -
// ceil(log2 N) for the narrower float types (int32 accumulators, wire::acc_bytes). So |q| <= 2^B
// and any sum over at most N ranks stays within 2^62 (2^30): no overflow in any order or tree.
// QUANTIZATION.md has the reasoning and the error bound.
//
// Element types are handled by one traits struct per dtype (ina/kernels/elements.h): exact
// widening to float, rounding from double once, the NaN pattern and the magnitude codes. A new
// float width is one struct and one case in dispatch(). The loops over a block are kernels/'
// (ina/kernels/codec.h: portable, AVX2, AVX-512, NEON, chosen at run time); the plain loops are
// the reference, and codec_test and codec_kernels_test hold the others to the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ina/protocol/types.h"

namespace ina::codec {

// The scale exponent of a block without any finite non-zero element.
inline constexpr int kNoScale = INT32_MIN;

// B for a float SUM over `world_size` ranks (world_size >= 1; 0 counts as 1).
int magnitude_bits(DType t, uint32_t world_size);

// True when (dtype, op) needs the shared exponent (float SUM); the others reduce as they arrive.
inline constexpr bool needs_exponent(DType t, ReduceOp op) {
  return t != DType::kInt32 && op == ReduceOp::kSum;
}

struct Scan {
  int16_t exp = kNoExponent;  // max frexp exponent over finite non-zero elements
  bool nonfinite = false;     // a NaN (any op), or an Inf under SUM
};
// n elements of src (type t, little-endian, any alignment). int32: {kNoExponent, false}.
Scan scan(const void* src, size_t n, DType t, ReduceOp op);
inline int16_t max_exponent(int16_t a, int16_t b) { return a > b ? a : b; }
// scan() in two steps, for a caller that reads the magnitude codes itself (the receive pass of
// mac.h, packet_mac_copy, scans float32 codes while it verifies and copies a datagram): the code
// from which scan() counts an element non-finite under op (float types; int32: 0), and the Scan
// of a block whose largest finite code is `top` (0: none).
uint32_t nonfinite_code(DType t, ReduceOp op);
Scan scan_of_codes(DType t, uint32_t top, bool nonfinite);

// The exponent of one unit of the fixed-point words of a block with shared exponent E: E - B,
// or kNoScale when E is kNoExponent.
int scale_exponent(DType t, int16_t exp, uint32_t world_size);

// acc[i] += rint(x_i * 2^(B-E)) (E = `exp`, B = magnitude_bits(t, world_size)). Non-finite
// elements and exp == kNoExponent add 0; |q| is clamped to 2^B should E be below the block's own
// exponent (a broken peer), so the no-overflow argument holds whatever arrives.
void quantize_add(const void* src, size_t n, DType t, int16_t exp, uint32_t world_size,
                  int64_t* acc);
// The same, overwriting: q[i] = rint(x_i * 2^(B-E)).
void quantize(const void* src, size_t n, DType t, int16_t exp, uint32_t world_size, int64_t* q);

// dst[i] = Q_i * 2^scale in type t, rounded to nearest even once (Q rounded to odd at 53 bits,
// exact in double, then narrowed; for the 16-bit types through float32 rounded to odd). scale
// kNoScale gives +0. t must be a float type.
void dequantize(const int64_t* q, size_t n, DType t, int scale, void* dst);

// A float SUM's completion: dst = dequantize(Q, n, t, scale_exponent(t, exp, world_size)) where
// Q_i is the sum over `ranks` blocks (block r at src[r]) of quantize's word, bit
// for bit what quantize, quantize_add rank by rank and dequantize give; in one pass over the
// ranks' words where the kernels have the fused loop (ina/kernels/codec.h: quantize_sum),
// otherwise tile by tile through an L1-resident tile of accumulators.
// `bounded`: every element is finite and exp is at least each block's own exponent (what the
// slot table's completion guarantees), which lets the kernels skip steps that change nothing.
void quantize_sum(const uint8_t* const* src, size_t ranks, size_t n, DType t, int16_t exp,
                  uint32_t world_size, void* dst, bool bounded = false);
// The same sums Q as fixed-point words (what store_acc writes of quantize and quantize_add rank
// by rank, bit for bit): a tree leaf's PARTIAL words, in one pass where the kernels have it.
void quantize_sum_words(const uint8_t* const* src, size_t ranks, size_t n, DType t, int16_t exp,
                        uint32_t world_size, uint8_t* dst);

// MIN/MAX, in int32 words (what the slot table keeps). key = the element itself (int32) or the
// order-preserving int32 image of its float32 value (float types, widened exactly):
// -Inf < ... < -0 < +0 < ... < +Inf. key and acc 4-byte aligned.
void keys32(const void* src, size_t n, DType t, int32_t* key);
// acc[i] = min or max(acc[i], key_i).
void keys_minmax32(const void* src, size_t n, DType t, ReduceOp op, int32_t* acc);
// The elements of type t the keys stand for (exact).
void from_keys32(const int32_t* key, size_t n, DType t, void* dst);

// int32 SUM and MIN/MAX in int32 (what the slot table keeps: the result is the accumulator):
// acc[i] = acc[i] + x_i modulo 2^32 (op SUM), or the MIN/MAX of the two. acc 4-byte aligned.
void fold_int32(const void* src, size_t n, ReduceOp op, int32_t* acc);

// n quiet NaNs of float type t.
void fill_nan(void* dst, size_t n, DType t);

// Fixed-point words on the wire (PARTIAL): wire::acc_bytes(t) bytes each, little-endian.
void store_acc(const int64_t* acc, size_t n, DType t, uint8_t* dst);
void add_acc(const uint8_t* src, size_t n, DType t, int64_t* acc);

// Helpers exposed for tests.
double round_to_odd53(int64_t q);    // q rounded to odd at 53 significant bits (exact: q)
float round_to_odd_float(double d);  // d rounded to odd at float32 precision
double widen(const void* src, size_t i, DType t);  // element i, exactly
// false: every loop takes its portable path (the plain loops the SIMD ones are held to) until
// set back to true (the default); for tests, which compare the two.
void set_simd_for_testing(bool enabled);

}  // namespace ina::codec
