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
template <class E>
INA_AVX512 void dequantize_narrow_avx512(const int64_t* q, size_t n, float m, uint8_t* dst) {
  constexpr size_t w = sizeof(typename E::Bits);
  const __m256 vm = _mm256_set1_ps(m);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512i qi = _mm512_loadu_si512(q + i);
    const __m256 t = _mm512_cvt_roundepi64_ps(qi, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask8 lost = _mm512_cmpneq_epi64_mask(_mm512_cvttps_epi64(t), qi);
    const __m256i odd = _mm256_mask_or_epi32(_mm256_castps_si256(t), lost, _mm256_castps_si256(t),
                                             _mm256_set1_epi32(1));
    x86::store8<E, false>(dst + w * i, _mm256_mul_ps(_mm256_castsi256_ps(odd), vm));
  }
  for (; i < n; ++i) store<E>(dst, i, E::from_float(round_to_odd24(q[i]) * m));
}

void dequantize_narrow(Format f, const int64_t* q, size_t n, float m, void* dst) {
  with_float(f, [&]<class E>(E) {
    if constexpr (!std::is_same_v<E, F32>) {
      dequantize_narrow_avx512<E>(q, n, m, static_cast<uint8_t*>(dst));
    }
  });
}
#undef INA_AVX512

const CodecKernels& avx512_table() {
  static const CodecKernels t = [] {
    CodecKernels k = avx2_table();
    k.name = "avx512";
    k.quantize_f32 = quantize_f32;
    k.dequantize_f32 = dequantize_f32;
    k.dequantize_narrow = dequantize_narrow;
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

}  // namespace ina::kernels
#else
namespace ina::kernels {
const CodecKernels* avx512_codec_kernels() { return nullptr; }
}  // namespace ina::kernels
#endif
