// The AVX-512 codec table: the avx2 one with the float32 quantizer and the dequantizers replaced.
// AVX-512DQ converts between double and int64 (vcvtpd2qq, rounding to nearest even as rint
// does) and from int64 to float (vcvtqq2ps, rounded once as static_cast<float> rounds), so each
// loop is a handful of instructions per eight elements where AVX2 needs a dozen per four (the
// int64 built from two exact halves) or a scalar conversion per element.
#include "ina/kernels/codec.h"

#if defined(__x86_64__)
// GCC 12 warns inside its own AVX-512 headers (the _mm512_undefined_pd() pass-through operand
// of the unmasked forms "may be used uninitialized"): a false positive, off for this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "dispatch.h"
#include "x86_avx2.h"
#include "x86_simd.h"

namespace ina::kernels {
namespace {

#define INA_AVX512 [[gnu::target("avx2,f16c,avx512f,avx512dq,avx512vl,avx512bw")]]

// q[i] (+)= rint(clamp(x_i * scale, -limit, limit)), non-finite x_i as 0: the product is exact
// in double (scale a power of two), the clamp keeps |v| <= 2^62, and vcvtpd2qq rounds to nearest
// even: the portable loop's value, bit for bit.
template <bool kAdd>
[[gnu::target("avx2,avx512f,avx512dq,avx512vl,avx512bw"), gnu::always_inline]] inline void
quantize8(const uint8_t* src, int64_t* q, __mmask8 k, __m512d vscale, __m512d lo_lim,
          __m512d hi_lim) {
  const __m256i bits = _mm256_maskz_loadu_epi32(k, src);
  const __mmask8 finite = _mm256_cmpgt_epi32_mask(
      _mm256_set1_epi32(0x7F800000), _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)));
  const __m256 x = _mm256_maskz_mov_ps(finite, _mm256_castsi256_ps(bits));
  __m512d v = _mm512_mul_pd(_mm512_cvtps_pd(x), vscale);
  v = _mm512_min_pd(_mm512_max_pd(v, lo_lim), hi_lim);
  __m512i qi = _mm512_cvt_roundpd_epi64(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  if constexpr (kAdd) qi = _mm512_add_epi64(qi, _mm512_maskz_loadu_epi64(k, q));
  _mm512_mask_storeu_epi64(q, k, qi);
}

template <bool kAdd>
INA_AVX512 void quantize_f32_avx512(const uint8_t* src, size_t n, double scale, double limit,
                                    int64_t* q) {
  const __m512d vscale = _mm512_set1_pd(scale);
  const __m512d hi_lim = _mm512_set1_pd(limit);
  const __m512d lo_lim = _mm512_set1_pd(-limit);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    quantize8<kAdd>(src + 4 * i, q + i, 0xFF, vscale, lo_lim, hi_lim);
    quantize8<kAdd>(src + 4 * i + 32, q + i + 8, 0xFF, vscale, lo_lim, hi_lim);
  }
  for (; i + 8 <= n; i += 8) quantize8<kAdd>(src + 4 * i, q + i, 0xFF, vscale, lo_lim, hi_lim);
  if (i < n) {
    const auto k = static_cast<__mmask8>((1u << (n - i)) - 1);
    quantize8<kAdd>(src + 4 * i, q + i, k, vscale, lo_lim, hi_lim);
  }
}

void quantize_f32(const void* src, size_t n, double scale, double limit, int64_t* q, bool add) {
  const auto* p = static_cast<const uint8_t*>(src);
  if (add) {
    quantize_f32_avx512<true>(p, n, scale, limit, q);
  } else {
    quantize_f32_avx512<false>(p, n, scale, limit, q);
  }
}

// dst[i] = float(q_i) * m: vcvtqq2ps rounds to nearest even once (the portable loop's
// static_cast), the product is the same IEEE multiplication.
INA_AVX512 void dequantize_f32(const int64_t* q, size_t n, float m, void* dst) {
  auto* d = static_cast<uint8_t*>(dst);
  const __m256 vm = _mm256_set1_ps(m);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 r = _mm512_cvt_roundepi64_ps(_mm512_loadu_si512(q + i),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(reinterpret_cast<float*>(d + 4 * i), _mm256_mul_ps(r, vm));
  }
  if (i < n) {
    const auto k = static_cast<__mmask8>((1u << (n - i)) - 1);
    const __m256 r = _mm512_cvt_roundepi64_ps(_mm512_maskz_loadu_epi64(k, q + i),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_ps(reinterpret_cast<float*>(d + 4 * i), k, _mm256_mul_ps(r, vm));
  }
}
// The narrower types: dst = E(Q rounded to odd at 24 bits, times m), for every int64 Q (the AVX2
// loop takes a scalar path past 2^30). vcvtqq2ps toward zero truncates |Q| to 24 significant
// bits (exact: the float's magnitude is at most |Q| < 2^63, so it converts back exactly), and
// where that lost bits the last one is set: round_to_odd24's value. The product with m is exact
// (float32 normals; an overflow gives Inf) and narrow8 rounds once, as the portable loop does.
//
// With kBf16Ins (the avx512bf16 table, on CPUs with AVX512-BF16), bfloat16 is rounded by
// vcvtneps2bf16 instead of the integer rounding of narrow8: to nearest even as that rounding
// for every float32 but NaNs (none here: the products are finite or Inf) and subnormals (which
// the instruction reads as zero; none here either: the products are normals, Inf or zero). It is
// written as inline assembly so that one template serves both tables (a target attribute cannot
// depend on a template argument); the table is chosen only where the CPU has the instruction.
INA_AVX512 __m128i bf16_of8(__m256 v) {
  __m128i r;
  asm("vcvtneps2bf16 %1, %0" : "=v"(r) : "v"(v));
  return r;
}

// Eight sums' products before the final rounding: Q rounded to odd at 24 bits, times m (exact).
INA_AVX512 __m256 odd_times_m(__m512i q, __m256 vm) {
  const __m256 t = _mm512_cvt_roundepi64_ps(q, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask8 lost = _mm512_cmpneq_epi64_mask(_mm512_cvttps_epi64(t), q);
  const __m256i odd = _mm256_mask_or_epi32(_mm256_castps_si256(t), lost, _mm256_castps_si256(t),
                                           _mm256_set1_epi32(1));
  return _mm256_mul_ps(_mm256_castsi256_ps(odd), vm);
}

// Eight such products rounded once to type E at p.
template <class E, bool kBf16Ins>
INA_AVX512 void store_narrow8(uint8_t* p, __m256 v) {
  if constexpr (kBf16Ins && std::is_same_v<E, BF16>) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bf16_of8(v));
  } else {
    x86::store8<E, false>(p, v);
  }
}

template <class E, bool kBf16Ins>
INA_AVX512 void dequantize_narrow_avx512(const int64_t* q, size_t n, float m, uint8_t* dst) {
  constexpr size_t w = sizeof(typename E::Bits);
  const __m256 vm = _mm256_set1_ps(m);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    store_narrow8<E, kBf16Ins>(dst + w * i, odd_times_m(_mm512_loadu_si512(q + i), vm));
  }
  for (; i < n; ++i) store<E>(dst, i, E::from_float(round_to_odd24(q[i]) * m));
}

template <bool kBf16Ins>
void dequantize_narrow(Format f, const int64_t* q, size_t n, float m, void* dst) {
  with_float(f, [&]<class E>(E) {
    if constexpr (!std::is_same_v<E, F32>) {
      dequantize_narrow_avx512<E, kBf16Ins>(q, n, m, static_cast<uint8_t*>(dst));
    }
  });
}

// The float SUM's completion, fused: for 16 elements at a time, every rank's words are loaded,
// widened, quantized and added in two registers of int64 sums, which are then dequantized and
// stored: the ranks' words are read once and the result written once, and no accumulator goes
// through memory (the tile loop it replaces stores and reloads the accumulators once per rank
// and makes a separate dequantizing pass).
//
// The quantizer works in float32 where the scale allows (kFloatScale: 2^-126 <= scale <= 2^127,
// 1 <= limit <= 2^62, which holds for every honest block: scale = 2^(B-E)): x * scale in float32
// is then the exact product (scale a normal power of two) unless it overflows (|x * scale| >=
// 2^128: Inf, clamped to +-limit as the exact product is) or falls below 2^-126 (then it and the
// exact product both round to 0), the clamp to the power of two +-limit is exact, and vcvtps2qq
// rounds that value to nearest even as rint does. So each word is the portable loop's, with half
// the conversions of the double path (16 elements per vmulps against 8 per vmulpd). Otherwise
// the double path of quantize8 above, 8 elements at a time.
// Sixteen elements of type E at p widened to float32 for the quantizer: to_float's value for
// every finite code (a non-finite one only has to stay non-finite: the quantizer takes it as 0,
// so bfloat16's signalling NaNs need not be quieted here).
template <class E>
INA_AVX512 __m512 widen16(const uint8_t* p) {
  if constexpr (std::is_same_v<E, F32>) {
    return _mm512_loadu_ps(p);
  } else if constexpr (std::is_same_v<E, BF16>) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (std::is_same_v<E, F16>) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else if constexpr (std::is_same_v<E, E5M2>) {
    // An e5m2 code is the top byte of the float16 of the same value (as widen8).
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(c), 8));
  } else {
    constexpr size_t w = sizeof(typename E::Bits);
    return _mm512_insertf32x8(_mm512_castps256_ps512(x86::widen8<E>(p)), x86::widen8<E>(p + 8 * w),
                              1);
  }
}

// The non-finite lanes of v (vfpclassps: quiet or signalling NaN, +Inf, -Inf).
INA_AVX512 __mmask16 nonfinite16(__m512 v) {
  return _mm512_fpclass_ps_mask(v, 0x01 | 0x08 | 0x10 | 0x80);
}

// What the fused completion stores: the values (bfloat16 rounded by integers or, kValuesBf16,
// by vcvtneps2bf16) or the sums as fixed-point words (quantize_sum_words).
enum class Out { kValues, kValuesBf16, kWords };
template <class E, Out kOut>
constexpr size_t out_width() {
  if constexpr (kOut == Out::kWords) return std::is_same_v<E, F32> ? 8 : 4;
  return sizeof(typename E::Bits);
}

// Eight int64 sums to type E at p (dequantize_f32's and dequantize_narrow_avx512's steps), or
// as words (kWords: their low out_width<E, kOut> bytes).
template <class E, Out kOut>
INA_AVX512 void store_sum8(uint8_t* p, __m512i q, __m256 vm) {
  if constexpr (kOut == Out::kWords) {
    if constexpr (std::is_same_v<E, F32>) {
      _mm512_storeu_si512(p, q);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_maskz_cvtepi64_epi32(0xFF, q));
    }
  } else if constexpr (std::is_same_v<E, F32>) {
    const __m256 r = _mm512_cvt_roundepi64_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(reinterpret_cast<float*>(p), _mm256_mul_ps(r, vm));
  } else {
    store_narrow8<E, kOut == Out::kValuesBf16>(p, odd_times_m(q, vm));
  }
}

// The last 1..15 elements [i, n) through a zero-padded copy of each rank's tail (the vector
// loops read 16 whole elements), summed by the double path, stored through a buffer.
template <class E, Out kOut>
INA_AVX512 void sum_tail(const uint8_t* const* src, size_t ranks, size_t i, size_t n, double scale,
                         double limit, float m, uint8_t* dst) {
  constexpr size_t w = sizeof(typename E::Bits);
  alignas(64) int64_t q[16] = {};
  for (size_t r = 0; r < ranks; ++r) {
    alignas(64) uint8_t tail[16 * 4] = {};
    std::memcpy(tail, src[r] + w * i, w * (n - i));
    alignas(64) float x[16];
    _mm512_store_ps(x, widen16<E>(tail));
    quantize_f32_avx512<true>(reinterpret_cast<const uint8_t*>(x), n - i, scale, limit, q);
  }
  constexpr size_t ow = out_width<E, kOut>();
  const __m256 vm = _mm256_set1_ps(m);
  alignas(64) uint8_t out[16 * 8];
  store_sum8<E, kOut>(out, _mm512_load_si512(q), vm);
  store_sum8<E, kOut>(out + 8 * ow, _mm512_load_si512(q + 8), vm);
  std::memcpy(dst + ow * i, out, ow * (n - i));
}

template <class E, bool kFloatScale, Out kOut, bool kBounded = false>
INA_AVX512 void quantize_sum_avx512(const uint8_t* const* src, size_t ranks, size_t n, double scale,
                                    double limit, float m, uint8_t* dst) {
  constexpr size_t w = sizeof(typename E::Bits);
  // (Only the float32 path converts them: a scale beyond float32's range would not convert.)
  const __m512 fscale = _mm512_set1_ps(kFloatScale ? static_cast<float>(scale) : 0.0f);
  const __m512 fhi = _mm512_set1_ps(kFloatScale ? static_cast<float>(limit) : 0.0f);
  const __m512 flo = _mm512_set1_ps(kFloatScale ? static_cast<float>(-limit) : 0.0f);
  const __m512d dscale = _mm512_set1_pd(scale);
  const __m512d dhi = _mm512_set1_pd(limit);
  const __m512d dlo = _mm512_set1_pd(-limit);
  const __m256 vm = _mm256_set1_ps(m);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i lo = _mm512_setzero_si512();
    __m512i hi = _mm512_setzero_si512();
    for (size_t r = 0; r < ranks; ++r) {
      const __m512 x = widen16<E>(src[r] + w * i);
      if constexpr (kFloatScale) {
        __m512 v;
        if constexpr (kBounded) {
          v = _mm512_mul_ps(x, fscale);  // finite, |v| <= limit: the mask and clamp are no-ops
        } else {
          v = _mm512_maskz_mul_ps(static_cast<__mmask16>(~nonfinite16(x)), x, fscale);
          v = _mm512_min_ps(_mm512_max_ps(v, flo), fhi);
        }
        lo = _mm512_add_epi64(
            lo, _mm512_cvt_roundps_epi64(_mm512_castps512_ps256(v),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        hi = _mm512_add_epi64(
            hi, _mm512_cvt_roundps_epi64(_mm512_extractf32x8_ps(v, 1),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      } else {
        const __m512 xf = _mm512_maskz_mov_ps(static_cast<__mmask16>(~nonfinite16(x)), x);
        __m512d a = _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(xf)), dscale);
        __m512d b = _mm512_mul_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(xf, 1)), dscale);
        a = _mm512_min_pd(_mm512_max_pd(a, dlo), dhi);
        b = _mm512_min_pd(_mm512_max_pd(b, dlo), dhi);
        lo = _mm512_add_epi64(
            lo, _mm512_cvt_roundpd_epi64(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        hi = _mm512_add_epi64(
            hi, _mm512_cvt_roundpd_epi64(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
    }
    store_sum8<E, kOut>(dst + out_width<E, kOut>() * i, lo, vm);
    store_sum8<E, kOut>(dst + out_width<E, kOut>() * (i + 8), hi, vm);
  }
  if (i < n) sum_tail<E, kOut>(src, ranks, i, n, scale, limit, m, dst);
}

// The narrower types' completion in int32 lanes, sixteen at a time. Their fixed point has
// B = 30 - ceil(log2 N) bits (QUANTIZATION.md), so every rank's word is at most 2^B in
// magnitude and the sum of N ranks' at most 2^30: where ranks * limit < 2^31 no int32 sum can
// wrap and each is the int64 sum's value. The word is the float32 path's (vcvtps2dq rounds to
// nearest even as vcvtps2qq does; |v| <= limit <= 2^30 converts exactly), and the dequantizer's
// steps are dequantize_narrow's on 32-bit lanes: vcvtdq2ps toward zero keeps 24 significant
// bits, converted back to compare (exact), the last bit set where bits were lost (round to odd),
// times m, rounded once. Half the conversions of the int64 lanes per element.
template <class E, Out kOut, bool kBounded>
INA_AVX512 void quantize_sum_i32_avx512(const uint8_t* const* src, size_t ranks, size_t n,
                                        double scale, double limit, float m, uint8_t* dst) {
  constexpr size_t w = sizeof(typename E::Bits);
  const __m512 fscale = _mm512_set1_ps(static_cast<float>(scale));
  const __m512 fhi = _mm512_set1_ps(static_cast<float>(limit));
  const __m512 flo = _mm512_set1_ps(static_cast<float>(-limit));
  const __m512 vm = _mm512_set1_ps(m);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i q = _mm512_setzero_si512();
    for (size_t r = 0; r < ranks; ++r) {
      const __m512 x = widen16<E>(src[r] + w * i);
      __m512 v;
      if constexpr (kBounded) {
        v = _mm512_mul_ps(x, fscale);
      } else {
        v = _mm512_maskz_mul_ps(static_cast<__mmask16>(~nonfinite16(x)), x, fscale);
        v = _mm512_min_ps(_mm512_max_ps(v, flo), fhi);
      }
      q = _mm512_add_epi32(
          q, _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    if constexpr (kOut == Out::kWords) {
      _mm512_storeu_si512(dst + 4 * i, q);  // the int64 sums' low words (no sum wrapped)
      continue;
    }
    const __m512 t = _mm512_cvt_roundepi32_ps(q, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 lost = _mm512_cmpneq_epi32_mask(_mm512_cvttps_epi32(t), q);
    const __m512i odd = _mm512_mask_or_epi32(_mm512_castps_si512(t), lost, _mm512_castps_si512(t),
                                             _mm512_set1_epi32(1));
    const __m512 p = _mm512_mul_ps(_mm512_castsi512_ps(odd), vm);
    constexpr bool kIns = kOut == Out::kValuesBf16;
    store_narrow8<E, kIns>(dst + w * i, _mm512_castps512_ps256(p));
    store_narrow8<E, kIns>(dst + w * (i + 8), _mm512_extractf32x8_ps(p, 1));
  }
  if (i < n) sum_tail<E, kOut>(src, ranks, i, n, scale, limit, m, dst);
}

template <Out kOut>
void quantize_sum(Format f, const uint8_t* const* src, size_t ranks, size_t n, double scale,
                  double limit, float m, bool bounded, void* dst) {
  const bool float_scale = scale >= 0x1p-126 && scale <= 0x1p127 && limit >= 1.0 && limit <= 0x1p62;
  // No int32 sum of `ranks` words of magnitude <= limit can wrap (the narrower types' B).
  const bool i32 = float_scale && limit * static_cast<double>(ranks) < 0x1p31;
  with_float(f, [&]<class E>(E) {
    auto* d = static_cast<uint8_t*>(dst);
    if constexpr (!std::is_same_v<E, F32>) {
      if (i32 && bounded) {
        quantize_sum_i32_avx512<E, kOut, true>(src, ranks, n, scale, limit, m, d);
        return;
      }
      if (i32) {
        quantize_sum_i32_avx512<E, kOut, false>(src, ranks, n, scale, limit, m, d);
        return;
      }
    }
    if (float_scale && bounded) {
      quantize_sum_avx512<E, true, kOut, true>(src, ranks, n, scale, limit, m, d);
    } else if (float_scale) {
      quantize_sum_avx512<E, true, kOut>(src, ranks, n, scale, limit, m, d);
    } else {
      quantize_sum_avx512<E, false, kOut>(src, ranks, n, scale, limit, m, d);
    }
  });
}
// The same sums as words (a tree leaf's PARTIAL words): the quantizer and the sum of
// quantize_sum, no dequantizer.
void quantize_sum_words(Format f, const uint8_t* const* src, size_t ranks, size_t n, double scale,
                        double limit, void* dst) {
  quantize_sum<Out::kWords>(f, src, ranks, n, scale, limit, 1.0f, false, dst);
}
#undef INA_AVX512

const CodecKernels& avx512_table() {
  static const CodecKernels t = [] {
    CodecKernels k = avx2_table();
    k.name = "avx512";
    k.quantize_f32 = quantize_f32;
    k.dequantize_f32 = dequantize_f32;
    k.dequantize_narrow = dequantize_narrow<false>;
    k.quantize_sum = quantize_sum<Out::kValues>;
    k.quantize_sum_words = quantize_sum_words;
    return k;
  }();
  return t;
}

// The avx512 table with bfloat16 rounded by vcvtneps2bf16 (AVX512-BF16: Intel since Cooper Lake
// and Sapphire Rapids, AMD since Zen 4).
const CodecKernels& avx512bf16_table() {
  static const CodecKernels t = [] {
    CodecKernels k = avx512_table();
    k.name = "avx512bf16";
    k.dequantize_narrow = dequantize_narrow<true>;
    k.quantize_sum = quantize_sum<Out::kValuesBf16>;
    return k;
  }();
  return t;
}

}  // namespace

const CodecKernels* avx512_codec_kernels() {
  static const bool yes = avx2_codec_kernels() != nullptr && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  return yes ? &avx512_table() : nullptr;
}

const CodecKernels* avx512bf16_codec_kernels() {
  static const bool yes = avx512_codec_kernels() != nullptr && __builtin_cpu_supports("avx512bf16");
  return yes ? &avx512bf16_table() : nullptr;
}

}  // namespace ina::kernels
#else
namespace ina::kernels {
const CodecKernels* avx512_codec_kernels() { return nullptr; }
const CodecKernels* avx512bf16_codec_kernels() { return nullptr; }
}  // namespace ina::kernels
#endif
