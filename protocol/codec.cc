// The block codec (see codec.h and QUANTIZATION.md). Every loop dispatches on the dtype once per
// block and runs a template over its element traits.
#include "ina/protocol/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "ina/base/half.h"
#include "ina/protocol/fp8.h"
#include "ina/protocol/quantize.h"

namespace ina::codec {
namespace {

// Element traits: bits <-> float (widening exact), double -> element (round to nearest even,
// once; callers pass values already rounded to odd where that matters), and the quiet NaN.
struct F32 {
  using Bits = uint32_t;
  static float to_float(Bits b) { return std::bit_cast<float>(b); }
  static Bits from_double(double d) { return std::bit_cast<uint32_t>(static_cast<float>(d)); }
  static Bits from_float(float f) { return std::bit_cast<uint32_t>(f); }
  static constexpr Bits kNaN = 0x7FC00000u;
  static constexpr Bits kAbs = 0x7FFFFFFFu;  // the magnitude bits of a code
  static constexpr Bits kInf = 0x7F800000u;  // the first non-finite magnitude code
  static constexpr bool kHasInf = true;
};
struct F16 {
  using Bits = uint16_t;
  static float to_float(Bits b) { return half_to_float(b); }
  static Bits from_double(double d) { return float_to_half(round_to_odd_float(d)); }
  static Bits from_float(float f) { return float_to_half(f); }
  static constexpr Bits kNaN = 0x7E00u;
  static constexpr Bits kAbs = 0x7FFFu;
  static constexpr Bits kInf = 0x7C00u;
  static constexpr bool kHasInf = true;
};
struct BF16 {
  using Bits = uint16_t;
  static float to_float(Bits b) { return bf16_to_float(b); }
  static Bits from_double(double d) { return float_to_bf16(round_to_odd_float(d)); }
  static Bits from_float(float f) { return float_to_bf16(f); }
  static constexpr Bits kNaN = 0x7FC0u;
  static constexpr Bits kAbs = 0x7FFFu;
  static constexpr Bits kInf = 0x7F80u;
  static constexpr bool kHasInf = true;
};
// float8: from_double rounds once (fp8.h); the doubles passed are exact or rounded to odd at 53
// bits, far more than the 2 extra bits that make the final rounding correct.
struct E4M3 {
  using Bits = uint8_t;
  static float to_float(Bits b) { return e4m3_to_float(b); }
  static Bits from_double(double d) { return double_to_e4m3(d); }
  static Bits from_float(float f) { return float_to_e4m3(f); }
  static constexpr Bits kNaN = kE4M3NaN;
  static constexpr Bits kAbs = 0x7Fu;
  static constexpr Bits kInf = 0x7Fu;  // no Inf: the NaN code is the only non-finite one
  static constexpr bool kHasInf = false;
};
struct E5M2 {
  using Bits = uint8_t;
  static float to_float(Bits b) { return e5m2_to_float(b); }
  static Bits from_double(double d) { return double_to_e5m2(d); }
  static Bits from_float(float f) { return float_to_e5m2(f); }
  static constexpr Bits kNaN = kE5M2NaN;
  static constexpr Bits kAbs = 0x7Fu;
  static constexpr Bits kInf = kE5M2Inf;
  static constexpr bool kHasInf = true;
};

template <class E>
typename E::Bits load(const void* src, size_t i) {
  typename E::Bits b;
  std::memcpy(&b, static_cast<const uint8_t*>(src) + i * sizeof b, sizeof b);
  return b;
}
template <class E>
void store(void* dst, size_t i, typename E::Bits b) {
  std::memcpy(static_cast<uint8_t*>(dst) + i * sizeof b, &b, sizeof b);
}

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

double pow2(int e) { return std::ldexp(1.0, e); }

// rint for |v| <= 2^62 in the default rounding mode: below 2^52 adding and subtracting 2^52
// rounds to an integer (ties to even); from 2^52 on a double is an integer already.
inline double rint_big(double v) {
  const double a = std::fabs(v);
  const double r = a < 0x1p52 ? (a + 0x1p52) - 0x1p52 : a;
  return std::copysign(r, v);
}

#if defined(__x86_64__)
// AVX2 (with F16C for float16), chosen at run time: one binary for every x86-64.
// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
bool have_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && have_f16c();
  return yes;
}

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

// n elements of type E widened (exactly) to float32 at dst.
template <class E>
[[gnu::target("avx2,f16c")]] void widen_avx2(const void* src, size_t n, float* dst) {
  const auto* p = static_cast<const uint8_t*>(src);
  size_t i = 0;
  if constexpr (std::is_same_v<E, BF16>) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
      const __m256i h = _mm256_cvtepu16_epi32(h16);
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
    }
  } else if constexpr (std::is_same_v<E, F16>) {
    // vcvtph2ps is exact for every pattern; NaN payloads may differ from half_to_float's, which
    // does not matter here (non-finite elements quantize to 0).
    for (; i + 8 <= n; i += 8) {
      const __m128i h16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h16));
    }
  }
  for (; i < n; ++i) dst[i] = E::to_float(load<E>(src, i));
}

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

// Q * 2^scale for the narrower float types, as float32 rounded to odd (so that the final
// rounding to the 16- or 8-bit type is correct): Q (|Q| < 2^51, checked by the caller) is exact
// in double, the product too; vcvtpd2ps rounds to nearest, and where that was inexact the result
// moves toward zero (when it had moved away) and gets its last bit set. Returns false, writing
// nothing, when some |Q| >= 2^51 (a broken peer's words): the caller takes the reference path.
[[gnu::target("avx2")]] bool scale_to_odd_float_avx2(const int64_t* q, size_t n, double scale,
                                                     float* dst) {
  const __m256i big = _mm256_set1_epi64x((int64_t{1} << 51) - 1);
  const __m256i nbig = _mm256_set1_epi64x(-((int64_t{1} << 51) - 1));
  __m256i out_of_range = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i));
    out_of_range = _mm256_or_si256(
        out_of_range, _mm256_or_si256(_mm256_cmpgt_epi64(v, big), _mm256_cmpgt_epi64(nbig, v)));
  }
  if (_mm256_movemask_epi8(out_of_range) != 0) return false;
  for (size_t j = i; j < n; ++j) {
    if (q[j] > (int64_t{1} << 51) - 1 || q[j] < -((int64_t{1} << 51) - 1)) return false;
  }
  const __m256i magic_i = _mm256_castpd_si256(_mm256_set1_pd(0x1.8p52));
  const __m256d magic = _mm256_set1_pd(0x1.8p52);
  const __m256d vscale = _mm256_set1_pd(scale);
  const __m256d sign = _mm256_set1_pd(-0.0);
  const __m128i one = _mm_set1_epi32(1);
  for (i = 0; i + 4 <= n; i += 4) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i));
    // int64 -> double, exact for |v| < 2^51: the integer added into 1.5 * 2^52's mantissa.
    const __m256d dq = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_add_epi64(v, magic_i)), magic);
    const __m256d d = _mm256_mul_pd(dq, vscale);
    const __m128 f = _mm256_cvtpd_ps(d);
    const __m256d back = _mm256_cvtps_pd(f);
    const __m256d inexact = _mm256_cmp_pd(back, d, _CMP_NEQ_UQ);
    const __m256d larger =
        _mm256_cmp_pd(_mm256_andnot_pd(sign, back), _mm256_andnot_pd(sign, d), _CMP_GT_OQ);
    const __m256d away = _mm256_and_pd(inexact, larger);
    // The 64-bit masks narrowed to 32 bits (the low half of each lane pair after the permute).
    const __m256i perm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const __m128i inexact32 =
        _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(inexact), perm));
    const __m128i away32 =
        _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(away), perm));
    __m128i bits = _mm_castps_si128(f);
    bits = _mm_add_epi32(bits, away32);  // away: all ones, i.e. minus 1 (toward zero)
    bits = _mm_or_si128(bits, _mm_and_si128(inexact32, one));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), bits);
  }
  for (; i < n; ++i) dst[i] = round_to_odd_float(static_cast<double>(q[i]) * scale);
  return true;
}

// int32 SUM: acc[i] += x_i (sign-extended), and the wrapped low words back.
[[gnu::target("avx2")]] void add_int32_avx2(const uint8_t* src, size_t n, int64_t* acc) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256i x =
        _mm256_cvtepi32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 4 * i)));
    auto* a = reinterpret_cast<__m256i*>(acc + i);
    _mm256_storeu_si256(a, _mm256_add_epi64(_mm256_loadu_si256(a), x));
  }
  for (; i < n; ++i) {
    int32_t x;
    std::memcpy(&x, src + 4 * i, 4);
    acc[i] += x;
  }
}
[[gnu::target("avx2")]] void from_sum_int32_avx2(const int64_t* acc, size_t n, uint8_t* dst) {
  const __m256i low = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 4 * i),
                     _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(a, low)));
  }
  for (; i < n; ++i) {
    const auto w = static_cast<uint32_t>(acc[i]);
    std::memcpy(dst + 4 * i, &w, 4);
  }
}
#else
bool have_avx2() { return false; }
#endif

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
#if defined(__x86_64__)
  if (have_avx2()) {
    if constexpr (std::is_same_v<E, F32>) {
      quantize_f32_avx2<kAdd>(static_cast<const uint8_t*>(src), n, scale, limit, q);
    } else {
      // Widened to float32 a chunk at a time (exact), then the float32 loop.
      constexpr size_t kChunk = 512;
      alignas(32) float buf[kChunk];
      for (size_t i = 0; i < n; i += kChunk) {
        const size_t m = std::min(kChunk, n - i);
        widen_avx2<E>(static_cast<const uint8_t*>(src) + i * sizeof(typename E::Bits), m, buf);
        quantize_f32_avx2<kAdd>(reinterpret_cast<const uint8_t*>(buf), m, scale, limit, q + i);
      }
    }
    return;
  }
#endif
  // The reference loop.
  for (size_t i = 0; i < n; ++i) {
    const float x = E::to_float(load<E>(src, i));
    double v = std::isfinite(x) ? static_cast<double>(x) * scale : 0.0;
    v = std::clamp(v, -limit, limit);
    const auto qi = static_cast<int64_t>(rint_big(v));
    if constexpr (kAdd) {
      q[i] += qi;
    } else {
      q[i] = qi;
    }
  }
}

// q rounded to odd at 24 significant bits, as a float (exact): with at least two bits more than
// float16's 11 the final rounding to the user's type is still correct.
inline float round_to_odd24(int64_t q) {
  const uint64_t m = q < 0 ? uint64_t{0} - static_cast<uint64_t>(q) : static_cast<uint64_t>(q);
  const int shift = std::max(0, static_cast<int>(std::bit_width(m)) - 24);
  const uint64_t hi = (m >> shift) | ((m & ((uint64_t{1} << shift) - 1)) != 0 ? 1u : 0u);
  // 2^shift (shift <= 40) as float bits: exact.
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(127 + shift) << 23);
  const float r = static_cast<float>(hi) * scale;
  return q < 0 ? -r : r;
}

}  // namespace

int magnitude_bits(DType t, uint32_t world_size) {
  const uint32_t n = world_size == 0 ? 1 : world_size;
  const int lg = static_cast<int>(std::bit_width(n - 1));  // ceil(log2 N)
  return (t == DType::kFloat32 ? 62 : 30) - lg;
}

Scan scan(const void* src, size_t n, DType t, ReduceOp op) {
  Scan s;
  dispatch(t, [&]<class E>(E) {
    // On the magnitude codes (sign cleared), which order like the values: the largest finite
    // one, and whether any is non-finite (SUM: NaN or Inf; MIN/MAX: NaN only).
    using Bits = typename E::Bits;
    const uint32_t bad = op == ReduceOp::kSum || !E::kHasInf ? uint32_t{E::kInf} : E::kInf + 1u;
    uint32_t top = 0;
    uint32_t nonfinite = 0;
#if defined(__x86_64__)
    if (have_avx2()) {
      bool nf = false;
      scan_codes_avx2<E>(static_cast<const uint8_t*>(src), n, bad, &top, &nf);
      nonfinite = nf ? 1u : 0u;
    } else
#endif
    {
      for (size_t i = 0; i < n; ++i) {
        const uint32_t a = static_cast<Bits>(load<E>(src, i) & E::kAbs);
        nonfinite |= a >= bad ? 1u : 0u;
        top = std::max(top, a < E::kInf ? a : 0u);
      }
    }
    s.nonfinite = nonfinite != 0;
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

float round_to_odd_float(double d) {
  float f = static_cast<float>(d);
  if (static_cast<double>(f) == d || std::isnan(d)) return f;
  // Inexact: the neighbour toward zero, then its last bit set (the odd one of the two
  // neighbours of d). An overflow to Inf comes back to the largest float, which is odd.
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
}

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
        for (size_t i = 0; i < n; ++i) {
          store<E>(dst, i, E::from_float(static_cast<float>(q[i]) * f));
        }
      } else {
#if defined(__x86_64__)
        constexpr size_t kChunk = 512;
        alignas(32) float buf[kChunk];
        if (have_avx2()) {
          bool done = true;
          for (size_t i = 0; i < n && done; i += kChunk) {
            const size_t m = std::min(kChunk, n - i);
            done = scale_to_odd_float_avx2(q + i, m, static_cast<double>(f), buf);
            if (done) {
              for (size_t j = 0; j < m; ++j) store<E>(dst, i + j, E::from_float(buf[j]));
            }
          }
          if (done) return;
        }
#endif
        for (size_t i = 0; i < n; ++i) store<E>(dst, i, E::from_float(round_to_odd24(q[i]) * f));
      }
      return;
    }
    // Q * 2^scale is exact in double: |scale| stays far inside the exponent range (E in
    // [-148, 129], B in [14, 62]); the clamp only guards against a broken peer.
    const double f = pow2(std::clamp(scale, -1000, 1000));
    for (size_t i = 0; i < n; ++i) store<E>(dst, i, E::from_double(round_to_odd53(q[i]) * f));
  });
}

void keys(const void* src, size_t n, DType t, int64_t* key) {
  if (t == DType::kInt32) {
    for (size_t i = 0; i < n; ++i) key[i] = static_cast<int32_t>(load<F32>(src, i));
    return;
  }
  dispatch(t, [&]<class E>(E) {
    for (size_t i = 0; i < n; ++i) key[i] = quant::float_to_ordered(E::to_float(load<E>(src, i)));
  });
}

void keys_minmax(const void* src, size_t n, DType t, ReduceOp op, int64_t* acc) {
  auto run = [&](auto key_of) {
    if (op == ReduceOp::kMax) {
      for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], key_of(i));
    } else {
      for (size_t i = 0; i < n; ++i) acc[i] = std::min(acc[i], key_of(i));
    }
  };
  if (t == DType::kInt32) {
    run([&](size_t i) { return int64_t{static_cast<int32_t>(load<F32>(src, i))}; });
    return;
  }
  dispatch(t, [&]<class E>(E) {
    run([&](size_t i) { return int64_t{quant::float_to_ordered(E::to_float(load<E>(src, i)))}; });
  });
}

void from_keys(const int64_t* key, size_t n, DType t, void* dst) {
  if (t == DType::kInt32) {
    from_sum_int32(key, n, dst);
    return;
  }
  dispatch(t, [&]<class E>(E) {
    for (size_t i = 0; i < n; ++i) {
      store<E>(dst, i, E::from_float(quant::ordered_to_float(static_cast<int32_t>(key[i]))));
    }
  });
}

void add_int32(const void* src, size_t n, int64_t* acc) {
#if defined(__x86_64__)
  if (have_avx2()) return add_int32_avx2(static_cast<const uint8_t*>(src), n, acc);
#endif
  for (size_t i = 0; i < n; ++i) acc[i] += static_cast<int32_t>(load<F32>(src, i));
}

void from_sum_int32(const int64_t* acc, size_t n, void* dst) {
#if defined(__x86_64__)
  if (have_avx2()) return from_sum_int32_avx2(acc, n, static_cast<uint8_t*>(dst));
#endif
  for (size_t i = 0; i < n; ++i) store<F32>(dst, i, static_cast<uint32_t>(acc[i]));
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

double widen(const void* src, size_t i, DType t) {
  if (t == DType::kInt32) return static_cast<int32_t>(load<F32>(src, i));
  double d = 0;
  dispatch(t, [&]<class E>(E) { d = E::to_float(load<E>(src, i)); });
  return d;
}

}  // namespace ina::codec
