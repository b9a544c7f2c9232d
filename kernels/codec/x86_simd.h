// Register-level forms of the element traits' conversions, eight elements at a time (internal,
// x86-64 only): widen8 / narrow8 / store8, shared by the AVX2 and AVX-512 tables. Each is inlined
// into its caller (which must enable at least AVX2 and F16C), so values stay in registers.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <type_traits>

#include "ina/kernels/elements.h"

namespace ina::kernels::x86 {

// Eight elements at a time, in registers, for the loops below. The helpers are inlined into
// their callers (same target), so a loop keeps its values in registers between them.
#define INA_X86_SIMD [[gnu::target("avx2,f16c"), gnu::always_inline]] inline

// Eight elements of type E at p widened (exactly) to float32: to_float's bits for every pattern.
template <class E>
INA_X86_SIMD __m256 widen8(const uint8_t* p) {
  if constexpr (std::is_same_v<E, F32>) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (std::is_same_v<E, BF16>) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    __m256i x = _mm256_slli_epi32(h, 16);
    // bf16_to_float quiets a signalling NaN.
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF)),
                                              _mm256_set1_epi32(0x7F800000));
    x = _mm256_or_si256(x, _mm256_and_si256(is_nan, _mm256_set1_epi32(0x00400000)));
    return _mm256_castsi256_ps(x);
  } else if constexpr (std::is_same_v<E, F16>) {
    // vcvtph2ps gives half_to_float's bits for every pattern, NaNs included (the quiet bit set,
    // sign and payload kept): the MIN/MAX keys depend on it, codec_test checks all 2^16.
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (std::is_same_v<E, E5M2>) {
    // An e5m2 code is the top byte of the float16 of the same value (fp8.h: e5m2_to_float).
    const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), c));
  } else {
    static_assert(std::is_same_v<E, E4M3>);
    // e4m3_to_float lane by lane: the same three candidates and selects.
    const __m256i low7 = _mm256_set1_epi32(0x7F);
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(c, 7), 31);
    const __m256i em = _mm256_and_si256(c, low7);
    const __m256i normal =
        _mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32(120 << 23));
    const __m256i subnormal =
        _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(0x1p-9f)));
    __m256i mag =
        _mm256_blendv_epi8(normal, _mm256_set1_epi32(0x7FC00000), _mm256_cmpeq_epi32(em, low7));
    mag = _mm256_blendv_epi8(mag, subnormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(8), em));
    return _mm256_castsi256_ps(_mm256_or_si256(sign, mag));
  }
}

// Eight float32 narrowed to type E (E::from_float), bit for bit for every float pattern, packed
// into the low 16 (16-bit types) or 8 (float8) bytes: float16 by vcvtps2ph, which agrees with
// half.h's float_to_half on all 2^32 inputs (half.h); bfloat16 and float8 by half.h's and
// fp_narrow.h's integer rounding lane by lane, on float32's bits (a float widened to double has
// 29 zero bits below its mantissa, so rounding at the same bit position gives the same code;
// below the normal range the constant C is added in float, whose ulp at C is the same
// subnormal spacing). Not for float32. kNaN false: the caller has no NaN to narrow.
template <class E, bool kNaN = true>
INA_X86_SIMD __m128i narrow8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  const __m256i one = _mm256_set1_epi32(1);
  if constexpr (std::is_same_v<E, F16>) {
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  } else if constexpr (std::is_same_v<E, BF16>) {
    const __m256i top = _mm256_srli_epi32(x, 16);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)),
                                           _mm256_and_si256(top, one)),
                          16);
    __m256i r = rounded;
    if constexpr (kNaN) {
      const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
      r = _mm256_blendv_epi8(rounded, _mm256_or_si256(top, _mm256_set1_epi32(0x0040)), is_nan);
    }
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  } else {
    constexpr const fp_detail::Narrow& f = E::kNarrow;
    static_assert(f.sign_shift == 7);
    constexpr int sh = 23 - f.mant;
    const __m256i c_int =
        _mm256_set1_epi32(static_cast<int32_t>((f.emin - f.mant + 23 + 127) << 23));
    const __m256i a = _mm256_and_si256(x, abs_mask);
    const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(x, 31), 7);
    const __m256i kept = _mm256_srli_epi32(a, sh);
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32((1 << (sh - 1)) - 1)),
                         _mm256_and_si256(kept, one)),
        sh);
    const __m256i normal = _mm256_sub_epi32(rounded, _mm256_set1_epi32((126 + f.emin) << f.mant));
    const __m256i subnormal = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(c_int))),
        c_int);
    const __m256i is_normal = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(((f.emin + 127) << 23) - 1));
    // Above max_finite the overflow pattern, which is max_finite or the next one (Inf): a MIN.
    static_assert(f.overflow == f.max_finite || f.overflow == f.max_finite + 1);
    const __m256i normal_or_over =
        _mm256_min_epi32(normal, _mm256_set1_epi32(static_cast<int32_t>(f.overflow)));
    __m256i mag = _mm256_blendv_epi8(subnormal, normal_or_over, is_normal);
    if constexpr (kNaN) {
      const __m256i nan =
          _mm256_or_si256(_mm256_set1_epi32(static_cast<int32_t>(f.nan)),
                          _mm256_and_si256(kept, _mm256_set1_epi32((1 << f.mant) - 1)));
      mag = _mm256_blendv_epi8(mag, nan, _mm256_cmpgt_epi32(a, inf));
    }
    const __m256i r = _mm256_or_si256(sign, mag);
    const __m128i r16 = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    return _mm_packus_epi16(r16, r16);
  }
}

// Stores eight elements of type E (narrow8's packing; float32: the eight words) at p.
template <class E, bool kNaN = true>
INA_X86_SIMD void store8(uint8_t* p, __m256 v) {
  if constexpr (std::is_same_v<E, F32>) {
    _mm256_storeu_ps(reinterpret_cast<float*>(p), v);
  } else if constexpr (sizeof(typename E::Bits) == 2) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow8<E, kNaN>(v));
  } else {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), narrow8<E, kNaN>(v));
  }
}

#undef INA_X86_SIMD

}  // namespace ina::kernels::x86
#endif
