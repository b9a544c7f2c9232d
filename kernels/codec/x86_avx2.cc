// The AVX2 (and F16C) codec loops, x86-64 only, compiled for that target function by function
// and chosen at run time (implementation.cc). Each gives the portable loops' bits for every
// input: they work eight elements at a time through widen8 / narrow8, register-level forms of
// the element traits' conversions (QUANTIZATION.md, "Implementation notes (version 2 codec)",
// says why each is exact).
#include "ina/kernels/codec.h"

#if defined(__x86_64__)
#include <cpuid.h>
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

// q[i] (+)= rint(clamp(x_i * scale, -limit, limit)) for n float32 at src, non-finite x_i as 0:
// the reference loop's value, bit for bit. The product is exact in double (scale a power of
// two; an overflow saturates in the clamp, an underflow is far below 1/2), the rounding is
// vroundpd's to nearest even, and the integer-valued double (|v| <= 2^62) becomes an int64 in two
// exact halves: hi = floor(v / 2^32), lo = v - hi * 2^32 in [0, 2^32), each moved through the
// mantissa of a double with a magic constant.
template <bool kAdd>
[[gnu::target("avx2")]] void quantize_f32_avx2(const uint8_t* src, size_t n, double scale,
                                               double limit, int64_t* q) {
  const __m128i abs_mask = _mm_set1_epi32(0x7FFFFFFF);
  const __m128i inf = _mm_set1_epi32(0x7F800000);
  const __m256d vscale = _mm256_set1_pd(scale);
  const __m256d hi_lim = _mm256_set1_pd(limit);
  const __m256d lo_lim = _mm256_set1_pd(-limit);
  const __m256d two_m32 = _mm256_set1_pd(0x1p-32);
  const __m256d two_32 = _mm256_set1_pd(0x1p32);
  const __m256d magic_u = _mm256_set1_pd(0x1p52);
  const __m256d magic_s = _mm256_set1_pd(0x1.8p52);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 4 * i));
    const __m128i finite = _mm_cmpgt_epi32(inf, _mm_and_si128(bits, abs_mask));
    const __m128 x = _mm_castsi128_ps(_mm_and_si128(bits, finite));
    __m256d v = _mm256_mul_pd(_mm256_cvtps_pd(x), vscale);
    v = _mm256_min_pd(_mm256_max_pd(v, lo_lim), hi_lim);
    v = _mm256_round_pd(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256d hi = _mm256_floor_pd(_mm256_mul_pd(v, two_m32));
    const __m256d lo = _mm256_sub_pd(v, _mm256_mul_pd(hi, two_32));
    const __m256i lo_i = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(lo, magic_u)),
                                          _mm256_castpd_si256(magic_u));
    const __m256i hi_i = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(hi, magic_s)),
                                          _mm256_castpd_si256(magic_s));
    __m256i qi = _mm256_add_epi64(_mm256_slli_epi64(hi_i, 32), lo_i);
    auto* out = reinterpret_cast<__m256i*>(q + i);
    if constexpr (kAdd) qi = _mm256_add_epi64(qi, _mm256_loadu_si256(out));
    _mm256_storeu_si256(out, qi);
  }
  for (; i < n; ++i) {
    float x;
    std::memcpy(&x, src + 4 * i, 4);
    double v = std::isfinite(x) ? static_cast<double>(x) * scale : 0.0;
    const auto qi = static_cast<int64_t>(rint_big(std::clamp(v, -limit, limit)));
    if constexpr (kAdd) {
      q[i] += qi;
    } else {
      q[i] = qi;
    }
  }
}

#define INA_SIMD [[gnu::target("avx2,f16c"), gnu::always_inline]] inline
using x86::narrow8;
using x86::store8;
using x86::widen8;

// The low 32-bit halves of the eight int64 at p, in order.
INA_SIMD __m256i low_words8(const int64_t* p) {
  const __m256 a = _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  const __m256 b = _mm256_loadu_ps(reinterpret_cast<const float*>(p + 4));
  const __m256 lo = _mm256_shuffle_ps(a, b, 0x88);  // a0 a1 b0 b1 | a2 a3 b2 b3
  return _mm256_permute4x64_epi64(_mm256_castps_si256(lo), 0xD8);
}
// The high halves, in order.
INA_SIMD __m256i high_words8(const int64_t* p) {
  const __m256 a = _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  const __m256 b = _mm256_loadu_ps(reinterpret_cast<const float*>(p + 4));
  const __m256 hi = _mm256_shuffle_ps(a, b, 0xDD);
  return _mm256_permute4x64_epi64(_mm256_castps_si256(hi), 0xD8);
}

// ordered() on eight float32 bit patterns (its own inverse: from_ordered too).
INA_SIMD __m256i ordered8(__m256i b) {
  return _mm256_xor_si256(
      b, _mm256_and_si256(_mm256_srai_epi32(b, 31), _mm256_set1_epi32(0x7FFFFFFF)));
}

// n elements of type E widened to float32 at dst (the quantizer's input).
template <class E>
[[gnu::target("avx2,f16c")]] void widen_avx2(const void* src, size_t n, float* dst) {
  const auto* p = static_cast<const uint8_t*>(src);
  constexpr size_t w = sizeof(typename E::Bits);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, widen8<E>(p + w * i));
  for (; i < n; ++i) dst[i] = E::to_float(load<E>(src, i));
}

// keys32(): the key of each element (int32: the value; floats: ordered() of the widened value),
// stored (kStore) or folded into acc with signed MIN/MAX. E is a float's traits or I32.
template <class E, KeyOp kOp>
[[gnu::target("avx2,f16c")]] void keys32_avx2(const uint8_t* src, size_t n, int32_t* acc) {
  constexpr bool kInt = std::is_same_v<E, I32>;
  constexpr size_t w = sizeof(typename E::Bits);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i k;
    if constexpr (kInt) {
      k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + w * i));
    } else {
      k = ordered8(_mm256_castps_si256(widen8<E>(src + w * i)));
    }
    auto* a = reinterpret_cast<__m256i*>(acc + i);
    if constexpr (kOp == KeyOp::kMax) k = _mm256_max_epi32(_mm256_loadu_si256(a), k);
    if constexpr (kOp == KeyOp::kMin) k = _mm256_min_epi32(_mm256_loadu_si256(a), k);
    _mm256_storeu_si256(a, k);
  }
  for (; i < n; ++i) {
    int32_t k;
    if constexpr (kInt) {
      std::memcpy(&k, src + 4 * i, 4);
    } else {
      k = ordered(E::to_float(load<E>(src, i)));
    }
    acc[i] = apply_key(kOp, acc[i], k);
  }
}
template <class E>
void keys32_avx2(const uint8_t* src, size_t n, KeyOp op, int32_t* acc) {
  switch (op) {
    case KeyOp::kStore: return keys32_avx2<E, KeyOp::kStore>(src, n, acc);
    case KeyOp::kMin: return keys32_avx2<E, KeyOp::kMin>(src, n, acc);
    case KeyOp::kMax: return keys32_avx2<E, KeyOp::kMax>(src, n, acc);
  }
}

// from_keys32(): the keys back to float32 bits (from_ordered), narrowed to E (exact: each key
// came from a value of type E).
template <class E>
[[gnu::target("avx2,f16c")]] void from_keys32_avx2(const int32_t* key, size_t n, uint8_t* dst) {
  constexpr size_t w = sizeof(typename E::Bits);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + i));
    store8<E>(dst + w * i, _mm256_castsi256_ps(ordered8(k)));
  }
  for (; i < n; ++i) store<E>(dst, i, E::from_float(from_ordered(key[i])));
}

// dequantize() of the narrower types for scale in [-126, 127] (see there): dst = E(Q rounded to
// odd at 24 bits, times f = 2^scale). Eight words at a time when all of them are in
// [-2^30, 2^30) (every honest sum: |Q| <= N * 2^B <= 2^30): |Q| converts to float (vcvtdq2ps,
// to nearest), converts back exactly (at most 2^30), and where the two differ the float moves
// toward zero (when it had moved away: its bits minus 1) and gets its last bit set: Q rounded to
// odd, round_to_odd24's value. Words outside that range take round_to_odd24 itself, eight at a
// time. Then the product with f (exact: a float32 normal; an overflow gives Inf, as in the
// portable loop) and narrow8.
template <class E>
[[gnu::target("avx2,f16c")]] void dequantize_narrow_avx2(const int64_t* q, size_t n, float f,
                                                         uint8_t* dst) {
  constexpr size_t w = sizeof(typename E::Bits);
  const __m256 vf = _mm256_set1_ps(f);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i two30 = _mm256_set1_epi32(1 << 30);
  const __m256i sign_bit = _mm256_set1_epi32(INT32_MIN);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i lo = low_words8(q + i);
    const __m256i hi = high_words8(q + i);
    // In range: the high word is the low word's sign, and lo + 2^30 does not wrap past 2^31.
    const __m256i ok = _mm256_andnot_si256(_mm256_add_epi32(lo, two30),
                                           _mm256_cmpeq_epi32(hi, _mm256_srai_epi32(lo, 31)));
    __m256 x;
    if (_mm256_movemask_ps(_mm256_castsi256_ps(ok)) == 0xFF) {
      const __m256i m = _mm256_abs_epi32(lo);
      const __m256 r = _mm256_cvtepi32_ps(m);
      const __m256i d = _mm256_sub_epi32(m, _mm256_cvttps_epi32(r));  // m - r, exact
      __m256i bits =
          _mm256_add_epi32(_mm256_castps_si256(r), _mm256_cmpgt_epi32(_mm256_setzero_si256(), d));
      bits = _mm256_or_si256(
          bits, _mm256_andnot_si256(_mm256_cmpeq_epi32(d, _mm256_setzero_si256()), one));
      bits = _mm256_or_si256(bits, _mm256_and_si256(lo, sign_bit));
      x = _mm256_mul_ps(_mm256_castsi256_ps(bits), vf);
    } else {
      alignas(32) float t[8];
      for (size_t j = 0; j < 8; ++j) t[j] = round_to_odd24(q[i + j]) * f;
      x = _mm256_load_ps(t);
    }
    store8<E, false>(dst + w * i, x);  // x is finite, or +-Inf after an overflow
  }
  for (; i < n; ++i) store<E>(dst, i, E::from_float(round_to_odd24(q[i]) * f));
}
#undef INA_SIMD

// The magnitude scan of a block's codes (see scan()): the largest finite magnitude code and
// whether any code is at or above `bad`, 32 bytes of codes per step.
template <class E>
[[gnu::target("avx2")]] void scan_codes_avx2(const uint8_t* src, size_t n, uint32_t bad,
                                             uint32_t* top_out, bool* nonfinite_out) {
  using Bits = typename E::Bits;
  constexpr size_t kLanes = 32 / sizeof(Bits);
  // Each constant's code repeated over the 32-bit lanes.
  constexpr uint32_t kRep = sizeof(Bits) == 1 ? 0x01010101u : sizeof(Bits) == 2 ? 0x00010001u : 1u;
  const __m256i abs_mask = _mm256_set1_epi32(static_cast<int32_t>(uint32_t{E::kAbs} * kRep));
  const __m256i inf = _mm256_set1_epi32(static_cast<int32_t>(uint32_t{E::kInf} * kRep));
  const __m256i bad_m1 = _mm256_set1_epi32(static_cast<int32_t>((bad - 1) * kRep));
  __m256i top = _mm256_setzero_si256();
  __m256i nf = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256i a = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + sizeof(Bits) * i)), abs_mask);
    // The magnitude codes are at most 0x7F / 0x7FFF / 0x7FFFFFFF: signed compares are exact.
    if constexpr (sizeof(Bits) == 1) {
      nf = _mm256_or_si256(nf, _mm256_cmpgt_epi8(a, bad_m1));
      top = _mm256_max_epu8(top, _mm256_and_si256(a, _mm256_cmpgt_epi8(inf, a)));
    } else if constexpr (sizeof(Bits) == 2) {
      nf = _mm256_or_si256(nf, _mm256_cmpgt_epi16(a, bad_m1));
      top = _mm256_max_epu16(top, _mm256_and_si256(a, _mm256_cmpgt_epi16(inf, a)));
    } else {
      nf = _mm256_or_si256(nf, _mm256_cmpgt_epi32(a, bad_m1));
      top = _mm256_max_epu32(top, _mm256_and_si256(a, _mm256_cmpgt_epi32(inf, a)));
    }
  }
  alignas(32) Bits lanes[kLanes];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), top);
  uint32_t t = 0;
  for (Bits l : lanes) t = std::max<uint32_t>(t, l);
  bool any = _mm256_movemask_epi8(nf) != 0;
  for (; i < n; ++i) {
    const uint32_t a = static_cast<Bits>(load<E>(src, i) & E::kAbs);
    any |= a >= bad;
    t = std::max(t, a < E::kInf ? a : 0u);
  }
  *top_out = t;
  *nonfinite_out = any;
}

void scan_codes(Format f, const void* src, size_t n, uint32_t bad, uint32_t* top, bool* nonfinite) {
  with_float(f, [&]<class E>(E) {
    scan_codes_avx2<E>(static_cast<const uint8_t*>(src), n, bad, top, nonfinite);
  });
}

void quantize_f32(const void* src, size_t n, double scale, double limit, int64_t* q, bool add) {
  const auto* p = static_cast<const uint8_t*>(src);
  if (add) {
    quantize_f32_avx2<true>(p, n, scale, limit, q);
  } else {
    quantize_f32_avx2<false>(p, n, scale, limit, q);
  }
}

void widen(Format f, const void* src, size_t n, float* dst) {
  with_float(f, [&]<class E>(E) {
    if constexpr (!std::is_same_v<E, F32>) widen_avx2<E>(src, n, dst);
  });
}

void keys32(Format f, KeyFold fold, const void* src, size_t n, int32_t* acc) {
  const auto* p = static_cast<const uint8_t*>(src);
  const KeyOp op = key_op(fold);
  if (f == Format::kI32) {
    keys32_avx2<I32>(p, n, op, acc);
    return;
  }
  with_float(f, [&]<class E>(E) { keys32_avx2<E>(p, n, op, acc); });
}

void from_keys32(Format f, const int32_t* key, size_t n, void* dst) {
  with_float(f, [&]<class E>(E) { from_keys32_avx2<E>(key, n, static_cast<uint8_t*>(dst)); });
}

void dequantize_narrow(Format f, const int64_t* q, size_t n, float m, void* dst) {
  with_float(f, [&]<class E>(E) {
    if constexpr (!std::is_same_v<E, F32>) {
      dequantize_narrow_avx2<E>(q, n, m, static_cast<uint8_t*>(dst));
    }
  });
}

// int32 SUM (wrapping) and MIN/MAX in int32: sixteen elements a step in two vectors.
template <WordFold kOp>
[[gnu::target("avx2")]] __m256i fold8(__m256i a, __m256i x) {
  if constexpr (kOp == WordFold::kAdd) return _mm256_add_epi32(a, x);
  if constexpr (kOp == WordFold::kMin) return _mm256_min_epi32(a, x);
  return _mm256_max_epi32(a, x);
}
template <WordFold kOp>
[[gnu::target("avx2")]] void fold_int32_avx2(const uint8_t* src, size_t n, int32_t* acc) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    auto* a = reinterpret_cast<__m256i*>(acc + i);
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i));
    const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i + 32));
    _mm256_storeu_si256(a, fold8<kOp>(_mm256_loadu_si256(a), x0));
    _mm256_storeu_si256(a + 1, fold8<kOp>(_mm256_loadu_si256(a + 1), x1));
  }
  for (; i + 8 <= n; i += 8) {
    auto* a = reinterpret_cast<__m256i*>(acc + i);
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i));
    _mm256_storeu_si256(a, fold8<kOp>(_mm256_loadu_si256(a), x));
  }
  if (i < n) portable_codec_kernels().fold_int32(kOp, src + 4 * i, n - i, acc + i);
}

void fold_int32(WordFold op, const void* src, size_t n, int32_t* acc) {
  const auto* p = static_cast<const uint8_t*>(src);
  switch (op) {
    case WordFold::kAdd: fold_int32_avx2<WordFold::kAdd>(p, n, acc); return;
    case WordFold::kMin: fold_int32_avx2<WordFold::kMin>(p, n, acc); return;
    case WordFold::kMax: fold_int32_avx2<WordFold::kMax>(p, n, acc); return;
  }
}

// The float SUM's completion (quantize_sum): a tile of up to 256 elements at a time, eight at a
// time summed over every rank in registers, then the tile's sums converted by the dequantizers
// above (float32: the portable loop, AVX2 having no int64 -> float conversion). Each rank's word
// is quantize_f32_avx2's integer-valued double v (|v| <= 2^62), split the same exact way into
// hi = floor(v / 2^32) (|hi| <= 2^30) and lo = v - hi * 2^32 (in [0, 2^32)); the his and the los
// are summed apart in doubles, exactly (at most 65536 ranks a group: sums below 2^47 and 2^49),
// and the group's int64 sum is (sum hi) * 2^32 + (sum lo), each half moved out through the
// mantissa once per element instead of once per rank. Groups of ranks add in int64, wrapping.
template <class E>
[[gnu::target("avx2,f16c")]] void quantize_sum_avx2(const uint8_t* const* src, size_t ranks,
                                                    size_t n, double scale, double limit, float m,
                                                    uint8_t* dst) {
  constexpr size_t w = sizeof(typename E::Bits);
  constexpr size_t kTile = 256;
  constexpr size_t kGroup = 65536;
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  const __m256d vscale = _mm256_set1_pd(scale);
  const __m256d hi_lim = _mm256_set1_pd(limit);
  const __m256d lo_lim = _mm256_set1_pd(-limit);
  const __m256d two_m32 = _mm256_set1_pd(0x1p-32);
  const __m256d two_32 = _mm256_set1_pd(0x1p32);
  const __m256d magic = _mm256_set1_pd(0x1.8p52);
  alignas(32) int64_t q[kTile];
  for (size_t at = 0; at < n; at += kTile) {
    const size_t tn = std::min(kTile, n - at);
    std::fill_n(q, (tn + 7) & ~size_t{7}, int64_t{0});
    for (size_t g = 0; g < ranks; g += kGroup) {
      const size_t gn = std::min(kGroup, ranks - g);
      for (size_t i = 0; i < tn; i += 8) {
        __m256d sh[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
        __m256d sl[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
        for (size_t r = 0; r < gn; ++r) {
          const uint8_t* p = src[g + r] + w * (at + i);
          __m256 x;
          if (i + 8 <= tn) {
            x = widen8<E>(p);
          } else {
            alignas(32) uint8_t tail[32] = {};
            std::memcpy(tail, p, w * (tn - i));
            x = widen8<E>(tail);
          }
          const __m256i bits = _mm256_castps_si256(x);
          const __m256i finite = _mm256_cmpgt_epi32(inf, _mm256_and_si256(bits, abs_mask));
          const __m256 xf = _mm256_and_ps(x, _mm256_castsi256_ps(finite));
          for (int h = 0; h < 2; ++h) {
            const __m128 half = h == 0 ? _mm256_castps256_ps128(xf) : _mm256_extractf128_ps(xf, 1);
            __m256d v = _mm256_mul_pd(_mm256_cvtps_pd(half), vscale);
            v = _mm256_min_pd(_mm256_max_pd(v, lo_lim), hi_lim);
            v = _mm256_round_pd(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m256d hi = _mm256_floor_pd(_mm256_mul_pd(v, two_m32));
            sh[h] = _mm256_add_pd(sh[h], hi);
            sl[h] = _mm256_add_pd(sl[h], _mm256_sub_pd(v, _mm256_mul_pd(hi, two_32)));
          }
        }
        for (int h = 0; h < 2; ++h) {
          const __m256i hi_i = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(sh[h], magic)),
                                                _mm256_castpd_si256(magic));
          const __m256i lo_i = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(sl[h], magic)),
                                                _mm256_castpd_si256(magic));
          const __m256i sum = _mm256_add_epi64(_mm256_slli_epi64(hi_i, 32), lo_i);
          auto* out = reinterpret_cast<__m256i*>(q + i + 4 * h);
          _mm256_store_si256(out, _mm256_add_epi64(_mm256_load_si256(out), sum));
        }
      }
    }
    uint8_t* d = dst + w * at;
    if constexpr (std::is_same_v<E, F32>) {
      for (size_t i = 0; i < tn; ++i)
        store<F32>(d, i, F32::from_float(static_cast<float>(q[i]) * m));
    } else {
      dequantize_narrow_avx2<E>(q, tn, m, d);
    }
  }
}

// The 16- and 8-bit formats where no sum can leave [-2^30, 2^30] (ranks * limit <= 2^30, which
// their B = 30 - ceil(log2 N) gives every honest round) and the scale is a float32 normal: eight
// elements at a time summed over every rank in int32 lanes, then dequantize_narrow_avx2's
// in-range steps (round to odd at 24 bits, times m, narrow8). The word is quantize_f32's: the
// product in float32 is exact unless it overflows (clamped, as the exact one is) or falls below
// 2^-126 (then both round to 0), the clamp to the power of two +-limit is exact, and vcvtps2dq
// rounds to nearest even as rint does (|v| <= 2^30).
template <class E>
[[gnu::target("avx2,f16c")]] void quantize_sum_i32_avx2(const uint8_t* const* src, size_t ranks,
                                                        size_t n, double scale, double limit,
                                                        float m, uint8_t* dst) {
  constexpr size_t w = sizeof(typename E::Bits);
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  const __m256 fscale = _mm256_set1_ps(static_cast<float>(scale));
  const __m256 fhi = _mm256_set1_ps(static_cast<float>(limit));
  const __m256 flo = _mm256_set1_ps(static_cast<float>(-limit));
  const __m256 vm = _mm256_set1_ps(m);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i sign_bit = _mm256_set1_epi32(INT32_MIN);
  for (size_t i = 0; i < n; i += 8) {
    const size_t left = std::min<size_t>(8, n - i);
    __m256i q = _mm256_setzero_si256();
    for (size_t r = 0; r < ranks; ++r) {
      __m256 x;
      if (left == 8) {
        x = widen8<E>(src[r] + w * i);
      } else {
        alignas(32) uint8_t tail[32] = {};
        std::memcpy(tail, src[r] + w * i, w * left);
        x = widen8<E>(tail);
      }
      const __m256i finite =
          _mm256_cmpgt_epi32(inf, _mm256_and_si256(_mm256_castps_si256(x), abs_mask));
      __m256 v = _mm256_mul_ps(_mm256_and_ps(x, _mm256_castsi256_ps(finite)), fscale);
      v = _mm256_min_ps(_mm256_max_ps(v, flo), fhi);
      q = _mm256_add_epi32(q, _mm256_cvtps_epi32(v));
    }
    const __m256i a = _mm256_abs_epi32(q);
    const __m256 r = _mm256_cvtepi32_ps(a);
    const __m256i d = _mm256_sub_epi32(a, _mm256_cvttps_epi32(r));  // a - r, exact
    __m256i bits =
        _mm256_add_epi32(_mm256_castps_si256(r), _mm256_cmpgt_epi32(_mm256_setzero_si256(), d));
    bits = _mm256_or_si256(bits,
                           _mm256_andnot_si256(_mm256_cmpeq_epi32(d, _mm256_setzero_si256()), one));
    bits = _mm256_or_si256(bits, _mm256_and_si256(q, sign_bit));
    const __m256 x = _mm256_mul_ps(_mm256_castsi256_ps(bits), vm);
    if (left == 8) {
      store8<E, false>(dst + w * i, x);
    } else {
      alignas(32) uint8_t out[32];
      store8<E, false>(out, x);
      std::memcpy(dst + w * i, out, w * left);
    }
  }
}

void quantize_sum(Format f, const uint8_t* const* src, size_t ranks, size_t n, double scale,
                  double limit, float m, bool /*bounded*/, void* dst) {
  const bool i32 = scale >= 0x1p-126 && scale <= 0x1p127 && limit >= 1.0 &&
                   limit * static_cast<double>(ranks) <= 0x1p30;
  with_float(f, [&]<class E>(E) {
    if constexpr (!std::is_same_v<E, F32>) {
      if (i32) {
        quantize_sum_i32_avx2<E>(src, ranks, n, scale, limit, m, static_cast<uint8_t*>(dst));
        return;
      }
    }
    quantize_sum_avx2<E>(src, ranks, n, scale, limit, m, static_cast<uint8_t*>(dst));
  });
}

// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
bool have_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

}  // namespace

// The float32 dequantizer stays portable here: AVX2 has no int64 -> float conversion that
// rounds once (avx512 has, vcvtqq2ps).
const CodecKernels& avx2_table() {
  static const CodecKernels t{
      "avx2",
      scan_codes,
      quantize_f32,
      widen,
      portable_codec_kernels().dequantize_f32,
      dequantize_narrow,
      quantize_sum,
      nullptr,  // quantize_sum_words: the codec composes quantize_f32's
      fold_int32,
      keys32,
      from_keys32,
  };
  return t;
}

const CodecKernels* avx2_codec_kernels() {
  static const bool yes = __builtin_cpu_supports("avx2") && have_f16c();
  return yes ? &avx2_table() : nullptr;
}

}  // namespace ina::kernels
#else
namespace ina::kernels {
const CodecKernels* avx2_codec_kernels() { return nullptr; }
}  // namespace ina::kernels
#endif
