// The block codec (see codec.h and QUANTIZATION.md). Every loop dispatches on the dtype once per
// block; the loops over a block's elements live in kernels/ (ina/kernels/codec.h: portable,
// AVX2, AVX-512 and NEON, chosen at run time), which give the portable loops' bits for every
// input. The element traits are kernels' too (ina/kernels/elements.h), so the code here and the
// loops there read the same conversions.
#include "ina/protocol/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "ina/kernels/codec.h"
#include "ina/kernels/elements.h"

namespace ina::codec {
namespace {

using kernels::BF16;
using kernels::E4M3;
using kernels::E5M2;
using kernels::F16;
using kernels::F32;
using kernels::load;
using kernels::pow2;
using kernels::round_to_odd24;
using kernels::store;

// Calls f(E{}) with the traits of float type t; false for int32.
template <class F>
bool dispatch(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: f(F32{}); return true;
    case DType::kFloat16: f(F16{}); return true;
    case DType::kBFloat16: f(BF16{}); return true;
    case DType::kFloat8E4M3: f(E4M3{}); return true;
    case DType::kFloat8E5M2: f(E5M2{}); return true;
    case DType::kInt32: return false;
  }
  return false;
}

kernels::Format format(DType t) {
  switch (t) {
    case DType::kFloat32: return kernels::Format::kF32;
    case DType::kFloat16: return kernels::Format::kF16;
    case DType::kBFloat16: return kernels::Format::kBF16;
    case DType::kFloat8E4M3: return kernels::Format::kE4M3;
    case DType::kFloat8E5M2: return kernels::Format::kE5M2;
    case DType::kInt32: return kernels::Format::kI32;
  }
  return kernels::Format::kI32;
}

template <class E>
constexpr kernels::Format format_of() {
  if constexpr (std::is_same_v<E, F16>) return kernels::Format::kF16;
  if constexpr (std::is_same_v<E, BF16>) return kernels::Format::kBF16;
  if constexpr (std::is_same_v<E, E4M3>) return kernels::Format::kE4M3;
  if constexpr (std::is_same_v<E, E5M2>) return kernels::Format::kE5M2;
  return kernels::Format::kF32;
}

template <class E, bool kAdd>
void quantize_impl(const void* src, size_t n, int16_t exp, int b, int64_t* q) {
  if (exp == kNoExponent) {
    if (!kAdd) std::fill_n(q, n, int64_t{0});
    return;
  }
  // 2^(B-E) is exact in double for every exponent a float block can have (E >= -148, B <= 62;
  // clamped for a broken peer's exponent: the products saturate or vanish either way).
  const double scale = pow2(std::clamp(b - int{exp}, -1000, 1000));
  const double limit = pow2(b);
  const kernels::CodecKernels& k = kernels::codec_kernels();
  if constexpr (std::is_same_v<E, F32>) {
    k.quantize_f32(src, n, scale, limit, q, kAdd);
  } else {
    // Widened to float32 a chunk at a time (exact), then the float32 loop.
    constexpr size_t kChunk = 512;
    alignas(64) float buf[kChunk];
    for (size_t i = 0; i < n; i += kChunk) {
      const size_t m = std::min(kChunk, n - i);
      k.widen(format_of<E>(), static_cast<const uint8_t*>(src) + i * sizeof(typename E::Bits), m,
              buf);
      k.quantize_f32(buf, m, scale, limit, q + i, kAdd);
    }
  }
}

}  // namespace

int magnitude_bits(DType t, uint32_t world_size) {
  const uint32_t n = world_size == 0 ? 1 : world_size;
  const int lg = static_cast<int>(std::bit_width(n - 1));  // ceil(log2 N)
  return (t == DType::kFloat32 ? 62 : 30) - lg;
}

Scan scan(const void* src, size_t n, DType t, ReduceOp op) {
  uint32_t top = 0;
  bool nonfinite = false;
  if (t != DType::kInt32) {
    kernels::codec_kernels().scan_codes(format(t), src, n, nonfinite_code(t, op), &top, &nonfinite);
  }
  return scan_of_codes(t, top, nonfinite);
}

uint32_t nonfinite_code(DType t, ReduceOp op) {
  uint32_t bad = 0;
  dispatch(t, [&]<class E>(E) {
    // On the magnitude codes (sign cleared), which order like the values: SUM counts NaN and Inf
    // as non-finite, MIN/MAX NaN only.
    bad = op == ReduceOp::kSum || !E::kHasInf ? uint32_t{E::kInf} : E::kInf + 1u;
  });
  return bad;
}

Scan scan_of_codes(DType t, uint32_t top, bool nonfinite) {
  Scan s;
  dispatch(t, [&]<class E>(E) {
    using Bits = typename E::Bits;
    s.nonfinite = nonfinite;
    if (top != 0) {
      int e = 0;
      std::frexp(E::to_float(static_cast<Bits>(top)), &e);
      s.exp = static_cast<int16_t>(e);
    }
  });
  return s;
}

int scale_exponent(DType t, int16_t exp, uint32_t world_size) {
  if (exp == kNoExponent) return kNoScale;
  return int{exp} - magnitude_bits(t, world_size);
}

void quantize_add(const void* src, size_t n, DType t, int16_t exp, uint32_t world_size,
                  int64_t* acc) {
  const int b = magnitude_bits(t, world_size);
  dispatch(t, [&]<class E>(E) { quantize_impl<E, true>(src, n, exp, b, acc); });
}

void quantize(const void* src, size_t n, DType t, int16_t exp, uint32_t world_size, int64_t* q) {
  const int b = magnitude_bits(t, world_size);
  dispatch(t, [&]<class E>(E) { quantize_impl<E, false>(src, n, exp, b, q); });
}

double round_to_odd53(int64_t q) {
  const uint64_t m = q < 0 ? uint64_t{0} - static_cast<uint64_t>(q) : static_cast<uint64_t>(q);
  if (m < (uint64_t{1} << 53)) return static_cast<double>(q);
  const int shift = static_cast<int>(std::bit_width(m)) - 53;
  uint64_t hi = m >> shift;
  if ((m & ((uint64_t{1} << shift) - 1)) != 0) hi |= 1;
  const double r = std::ldexp(static_cast<double>(hi), shift);
  return q < 0 ? -r : r;
}

float round_to_odd_float(double d) { return kernels::round_to_odd_float(d); }

void dequantize(const int64_t* q, size_t n, DType t, int scale, void* dst) {
  dispatch(t, [&]<class E>(E) {
    if (scale == kNoScale) {
      for (size_t i = 0; i < n; ++i) store<E>(dst, i, E::from_double(0.0));
      return;
    }
    if (scale >= -126 && scale <= 127) {
      // Every non-zero |Q| * 2^scale is at least 2^-126: float32 normals, where scaling by a
      // power of two is exact and commutes with rounding. float32: Q converted once (correctly
      // rounded), then scaled (an overflow gives Inf, as rounding the exact value would). The
      // narrower types: Q rounded to odd at 24 bits, scaled exactly, then rounded once.
      const float f = std::bit_cast<float>(static_cast<uint32_t>(127 + scale) << 23);
      if constexpr (std::is_same_v<E, F32>) {
        kernels::codec_kernels().dequantize_f32(q, n, f, dst);
      } else {
        kernels::codec_kernels().dequantize_narrow(format(t), q, n, f, dst);
      }
      return;
    }
    // Q * 2^scale is exact in double: |scale| stays far inside the exponent range (E in
    // [-148, 129], B in [14, 62]); the clamp only guards against a broken peer.
    const double f = pow2(std::clamp(scale, -1000, 1000));
    for (size_t i = 0; i < n; ++i) store<E>(dst, i, E::from_double(round_to_odd53(q[i]) * f));
  });
}

// The portable completion's step: elements [at, at + m) of every rank's words quantized and
// summed into `tile`, stored from the first rank's (not added to zeros: no clearing pass).
void sum_tile(const uint8_t* const* src, size_t ranks, size_t at, size_t m, DType t, int16_t exp,
              uint32_t world_size, int64_t* tile) {
  const size_t esize = dtype_size(t);
  if (ranks == 0) std::fill_n(tile, m, int64_t{0});
  for (size_t r = 0; r < ranks; ++r) {
    if (r == 0) {
      quantize(src[0] + at * esize, m, t, exp, world_size, tile);
    } else {
      quantize_add(src[r] + at * esize, m, t, exp, world_size, tile);
    }
  }
}

void quantize_sum(const uint8_t* const* src, size_t ranks, size_t n, DType t, int16_t exp,
                  uint32_t world_size, void* dst, bool bounded) {
  const int scale = scale_exponent(t, exp, world_size);
  const kernels::CodecKernels& k = kernels::codec_kernels();
  if (k.quantize_sum != nullptr && scale >= -126 && scale <= 127) {
    // quantize_impl's scale and limit and dequantize's m (scale in the float32 normal range).
    const int b = magnitude_bits(t, world_size);
    k.quantize_sum(format(t), src, ranks, n, pow2(std::clamp(b - int{exp}, -1000, 1000)), pow2(b),
                   std::bit_cast<float>(static_cast<uint32_t>(127 + scale) << 23), bounded, dst);
    return;
  }
  // Tile by tile in a tile of accumulators that stays in the L1 cache from the first rank's words
  // (stored, not added to zeros: no clearing pass) through the last rank's to the result.
  constexpr size_t kTile = 512;
  alignas(64) int64_t tile[kTile];
  const size_t esize = dtype_size(t);
  for (size_t at = 0; at < n; at += kTile) {
    const size_t m = std::min(kTile, n - at);
    sum_tile(src, ranks, at, m, t, exp, world_size, tile);
    dequantize(tile, m, t, scale, static_cast<uint8_t*>(dst) + at * esize);
  }
}

void quantize_sum_words(const uint8_t* const* src, size_t ranks, size_t n, DType t, int16_t exp,
                        uint32_t world_size, uint8_t* dst) {
  const size_t width = t == DType::kFloat32 ? 8 : 4;  // wire::acc_bytes
  if (exp == kNoExponent) {  // no finite non-zero element: every word 0 (quantize_impl)
    std::fill_n(dst, n * width, uint8_t{0});
    return;
  }
  const kernels::CodecKernels& k = kernels::codec_kernels();
  const int b = magnitude_bits(t, world_size);
  if (k.quantize_sum_words != nullptr) {
    // quantize_impl's scale and limit.
    k.quantize_sum_words(format(t), src, ranks, n, pow2(std::clamp(b - int{exp}, -1000, 1000)),
                         pow2(b), dst);
    return;
  }
  constexpr size_t kTile = 512;
  alignas(64) int64_t tile[kTile];
  for (size_t at = 0; at < n; at += kTile) {
    const size_t m = std::min(kTile, n - at);
    sum_tile(src, ranks, at, m, t, exp, world_size, tile);
    store_acc(tile, m, t, dst + at * width);
  }
}

void keys32(const void* src, size_t n, DType t, int32_t* key) {
  kernels::codec_kernels().keys32(format(t), kernels::KeyFold::kStore, src, n, key);
}

void keys_minmax32(const void* src, size_t n, DType t, ReduceOp op, int32_t* acc) {
  const auto fold = op == ReduceOp::kMax ? kernels::KeyFold::kMax : kernels::KeyFold::kMin;
  kernels::codec_kernels().keys32(format(t), fold, src, n, acc);
}

void from_keys32(const int32_t* key, size_t n, DType t, void* dst) {
  if (t == DType::kInt32) {
    if (n > 0) std::memcpy(dst, key, n * 4);
    return;
  }
  kernels::codec_kernels().from_keys32(format(t), key, n, dst);
}

void fold_int32(const void* src, size_t n, ReduceOp op, int32_t* acc) {
  const auto fold = op == ReduceOp::kSum   ? kernels::WordFold::kAdd
                    : op == ReduceOp::kMax ? kernels::WordFold::kMax
                                           : kernels::WordFold::kMin;
  kernels::codec_kernels().fold_int32(fold, src, n, acc);
}

void fill_nan(void* dst, size_t n, DType t) {
  dispatch(t, [&]<class E>(E) {
    for (size_t i = 0; i < n; ++i) store<E>(dst, i, E::kNaN);
  });
}

void store_acc(const int64_t* acc, size_t n, DType t, uint8_t* dst) {
  if (t == DType::kFloat32) {
    std::memcpy(dst, acc, n * 8);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const auto w = static_cast<uint32_t>(acc[i]);
    std::memcpy(dst + 4 * i, &w, 4);
  }
}

void add_acc(const uint8_t* src, size_t n, DType t, int64_t* acc) {
  if (t == DType::kFloat32) {
    for (size_t i = 0; i < n; ++i) {
      int64_t w;
      std::memcpy(&w, src + 8 * i, 8);
      acc[i] = static_cast<int64_t>(static_cast<uint64_t>(acc[i]) + static_cast<uint64_t>(w));
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    int32_t w;
    std::memcpy(&w, src + 4 * i, 4);
    acc[i] += w;
  }
}

void set_simd_for_testing(bool enabled) {
  kernels::set_codec_kernels_for_testing(enabled ? "" : "portable");
}

double widen(const void* src, size_t i, DType t) {
  if (t == DType::kInt32) return static_cast<int32_t>(load<F32>(src, i));
  double d = 0;
  dispatch(t, [&]<class E>(E) { d = E::to_float(load<E>(src, i)); });
  return d;
}

}  // namespace ina::codec
