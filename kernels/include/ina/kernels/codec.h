// The block codec's vector loops (protocol/codec.h is their one caller): one implementation per
// instruction set behind one table of function pointers, as simdjson does it. The portable loops
// are always built and are the reference: every other implementation gives their bits for every
// input (codec_kernels_test holds them to it, every dtype, alignment and tail). The best one the
// CPU runs is chosen once, at the first call; tests pick another by name.
//
//   portable  plain C++ (every target)
//   avx2      x86-64 with AVX2 and F16C
//   avx512    x86-64 with AVX-512 F/DQ/VL/BW: the avx2 table with the float32 quantizer and the
//             dequantizers replaced (vcvtpd2qq and vcvtqq2ps convert int64 in one instruction),
//             and the fused float SUM completion (quantize_sum)
//   avx512bf16 the avx512 table with bfloat16's final rounding by vcvtneps2bf16 (AVX512-BF16)
//   neon      arm64 (BlueField and other SmartNIC aggregators): the magnitude scan, the float32
//             quantizer and int32 SUM and MIN/MAX; the rest portable (and no fused completion:
//             the codec composes it of the loops)
//
// Every function takes raw little-endian bytes at any alignment and any n (tails included).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace ina::kernels {

// The element formats the loops see.
enum class Format : uint8_t { kF32, kF16, kBF16, kE4M3, kE5M2, kI32 };
// What keys32() does with each key: store it, or fold it into acc with signed MIN/MAX.
enum class KeyFold : uint8_t { kStore, kMin, kMax };
// What fold_int32() does with each element: add it (modulo 2^32), or take the signed MIN/MAX.
enum class WordFold : uint8_t { kAdd, kMin, kMax };

struct CodecKernels {
  const char* name;
  // The largest finite magnitude code (sign cleared; Inf and NaN count as 0) and whether any
  // magnitude code is >= bad. Float formats only.
  void (*scan_codes)(Format f, const void* src, size_t n, uint32_t bad, uint32_t* top,
                     bool* nonfinite);
  // q[i] (+)= rint(clamp(x_i * scale, -limit, limit)) for n float32 x (non-finite x as 0), ties
  // to even; scale and limit are powers of two with limit <= 2^62.
  void (*quantize_f32)(const void* src, size_t n, double scale, double limit, int64_t* q, bool add);
  // dst[i] = float32(x_i), exact, for a 16- or 8-bit float format.
  void (*widen)(Format f, const void* src, size_t n, float* dst);
  // float32 dst[i] = float(q_i) * m (float(q_i) rounded to nearest even once; m a power of two
  // whose products with every non-zero float(q_i) are float32 normals or overflow).
  void (*dequantize_f32)(const int64_t* q, size_t n, float m, void* dst);
  // A 16- or 8-bit float format: dst[i] = (q_i rounded to odd at 24 bits) * m, rounded once.
  void (*dequantize_narrow)(Format f, const int64_t* q, size_t n, float m, void* dst);
  // A float SUM's completion in one pass: `ranks` blocks of n elements of float format f, block
  // r at src[r] (anywhere: the slot's storage, or the datagram that completed the round); Q_i = the
  // sum over the ranks of rint(clamp(x * scale, -limit, limit)) (quantize_f32's word of each
  // widened element, added in int64 with wrap-around), and dst[i] = Q_i dequantized with m
  // (dequantize_f32 for kF32, dequantize_narrow otherwise; m as they take it). The bits of widen +
  // quantize_f32 + dequantize_* run rank by rank, without the accumulators in memory. Null where a
  // table has no such loop (portable, neon): the caller composes those loops instead, which is also
  // the reference the fused ones are held to.
  // `bounded`: the caller knows every x is finite and |x * scale| <= limit (the slot table's
  // completion: E is the MAX of the ranks' own exponents and a non-finite block never gets here),
  // so a loop may skip the non-finite mask and the clamp, which change nothing then.
  void (*quantize_sum)(Format f, const uint8_t* const* src, size_t ranks, size_t n, double scale,
                       double limit, float m, bool bounded, void* dst);
  // The same sums Q_i as fixed-point words, no dequantizer (a tree leaf's PARTIAL words): Q_i
  // little-endian in 8 bytes (kF32) or its low 4 bytes (the narrower formats), at dst + i * that
  // width. Null where a table has none (the caller composes quantize_f32's rank by rank).
  void (*quantize_sum_words)(Format f, const uint8_t* const* src, size_t ranks, size_t n,
                             double scale, double limit, void* dst);
  // int32 SUM and MIN/MAX in the elements' own width: acc[i] = acc[i] + x_i modulo 2^32 (int32
  // SUM wraps by definition, QUANTIZATION.md), or the signed MIN/MAX of the two. acc is 4-byte
  // aligned; src at any alignment.
  void (*fold_int32)(WordFold op, const void* src, size_t n, int32_t* acc);
  // MIN/MAX keys (what the slot table keeps for a float MIN/MAX): key_i = the element (kI32) or
  // the order-preserving int32 image of its float32 value, stored or folded into acc;
  // from_keys32: the elements of float format f the keys stand for (exact). acc and key 4-byte
  // aligned; src and dst at any alignment.
  void (*keys32)(Format f, KeyFold op, const void* src, size_t n, int32_t* acc);
  void (*from_keys32)(Format f, const int32_t* key, size_t n, void* dst);
};

// The implementation in use (chosen at the first call: the best this CPU runs).
const CodecKernels& codec_kernels();
// Every implementation this CPU runs, best first; the portable one last.
std::span<const CodecKernels* const> codec_implementations();
// Tests: use the implementation of this name ("portable", "avx2", ...) from now on; empty: the
// best again. False (nothing changed) when this CPU does not run it.
bool set_codec_kernels_for_testing(std::string_view name);

// The implementations, for the selection (implementation.cc); each table is null where its
// instruction set is not built or not run by this CPU.
const CodecKernels& portable_codec_kernels();
const CodecKernels* avx2_codec_kernels();
const CodecKernels* avx512_codec_kernels();
const CodecKernels* avx512bf16_codec_kernels();
const CodecKernels* neon_codec_kernels();

}  // namespace ina::kernels
