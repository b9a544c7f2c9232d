// The block codec (see codec.h and QUANTIZATION.md). Every loop dispatches on the dtype once per
// block and runs a template over its element traits. The hot loops have AVX2 versions (chosen at
// run time, have_avx2()) that give the plain loops' bits for every input: they work eight
// elements at a time through widen8 / narrow8, register-level forms of the traits' conversions
// (QUANTIZATION.md, "Implementation notes (version 2 codec)", says why each is exact).
#include "ina/protocol/codec.h"

#include <algorithm>
#include <array>
#include <atomic>
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
  static constexpr const fp_detail::Narrow& kNarrow = fp_detail::kToE4M3;
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
  static constexpr const fp_detail::Narrow& kNarrow = fp_detail::kToE5M2;
};

// int32 where only the width matters (the MIN/MAX keys).
struct I32 {
  using Bits = uint32_t;
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

// The MIN/MAX key of a float: quant::float_to_ordered's map (QUANTIZATION.md), inline here so
// that the loops over it make no call per element.
inline int32_t ordered(float f) {
  const int32_t b = std::bit_cast<int32_t>(f);
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}
inline float from_ordered(int32_t k) { return std::bit_cast<float>(k ^ ((k >> 31) & 0x7FFFFFFF)); }

// The keys of the 256 float8 codes, ordered(E::to_float(c)), built once: the portable MIN/MAX
// loops look float8 elements up instead of decoding them.
template <class E>
const int32_t* fp8_keys() {
  static_assert(sizeof(typename E::Bits) == 1);
  static const auto table = [] {
    std::array<int32_t, 256> t{};
    for (unsigned c = 0; c < 256; ++c) t[c] = ordered(E::to_float(static_cast<uint8_t>(c)));
    return t;
  }();
  return table.data();
}

// What keys() and keys_minmax() do with each key.
enum class KeyOp { kStore, kMin, kMax };
inline int64_t apply_key(KeyOp op, int64_t acc, int64_t key) {
  return op == KeyOp::kStore ? key : op == KeyOp::kMax ? std::max(acc, key) : std::min(acc, key);
}

double pow2(int e) { return std::ldexp(1.0, e); }

// rint for |v| <= 2^62 in the default rounding mode: below 2^52 adding and subtracting 2^52
// rounds to an integer (ties to even); from 2^52 on a double is an integer already.
inline double rint_big(double v) {
  const double a = std::fabs(v);
  const double r = a < 0x1p52 ? (a + 0x1p52) - 0x1p52 : a;
  return std::copysign(r, v);
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

// Off: every loop takes its portable path (set_simd_for_testing).
std::atomic<bool> g_simd{true};

#if defined(__x86_64__)
// AVX2 (with F16C for float16), chosen at run time: one binary for every x86-64.
// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
bool have_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && have_f16c();
  return yes && g_simd.load(std::memory_order_relaxed);
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

// Eight elements at a time, in registers, for the loops below. The helpers are inlined into
// their callers (same target), so a loop keeps its values in registers between them.
#define INA_SIMD [[gnu::target("avx2,f16c"), gnu::always_inline]] inline

// Eight elements of type E at p widened (exactly) to float32: to_float's bits for every pattern.
template <class E>
INA_SIMD __m256 widen8(const uint8_t* p) {
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
INA_SIMD __m128i narrow8(__m256 v) {
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
INA_SIMD void store8(uint8_t* p, __m256 v) {
  if constexpr (std::is_same_v<E, F32>) {
    _mm256_storeu_ps(reinterpret_cast<float*>(p), v);
  } else if constexpr (sizeof(typename E::Bits) == 2) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow8<E, kNaN>(v));
  } else {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), narrow8<E, kNaN>(v));
  }
}

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

// Four int32 keys sign-extended to int64, stored at a (kStore) or folded into it.
template <KeyOp kOp>
INA_SIMD void fold4(int64_t* a, __m128i k32) {
  const __m256i k = _mm256_cvtepi32_epi64(k32);
  auto* p = reinterpret_cast<__m256i*>(a);
  if constexpr (kOp == KeyOp::kStore) {
    _mm256_storeu_si256(p, k);
  } else {
    const __m256i old = _mm256_loadu_si256(p);
    const __m256i take =
        kOp == KeyOp::kMax ? _mm256_cmpgt_epi64(k, old) : _mm256_cmpgt_epi64(old, k);
    _mm256_storeu_si256(p, _mm256_blendv_epi8(old, k, take));
  }
}

// keys() / keys_minmax(): the key of each element (int32: the value; floats: ordered() of the
// widened value), sign-extended to int64, stored (kStore) or folded into acc with signed MIN/MAX.
// E is a float's traits or I32.
template <class E, KeyOp kOp>
[[gnu::target("avx2,f16c")]] void keys_avx2(const uint8_t* src, size_t n, int64_t* acc) {
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
    fold4<kOp>(acc + i, _mm256_castsi256_si128(k));
    fold4<kOp>(acc + i + 4, _mm256_extracti128_si256(k, 1));
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
void keys_avx2(const uint8_t* src, size_t n, KeyOp op, int64_t* acc) {
  switch (op) {
    case KeyOp::kStore: return keys_avx2<E, KeyOp::kStore>(src, n, acc);
    case KeyOp::kMin: return keys_avx2<E, KeyOp::kMin>(src, n, acc);
    case KeyOp::kMax: return keys_avx2<E, KeyOp::kMax>(src, n, acc);
  }
}

// from_keys(): the keys' low words back to float32 bits (from_ordered), narrowed to E (exact:
// each key came from a value of type E).
template <class E>
[[gnu::target("avx2,f16c")]] void from_keys_avx2(const int64_t* key, size_t n, uint8_t* dst) {
  constexpr size_t w = sizeof(typename E::Bits);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    store8<E>(dst + w * i, _mm256_castsi256_ps(ordered8(low_words8(key + i))));
  }
  for (; i < n; ++i) store<E>(dst, i, E::from_float(from_ordered(static_cast<int32_t>(key[i]))));
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
        if (have_avx2()) {
          dequantize_narrow_avx2<E>(q, n, f, static_cast<uint8_t*>(dst));
          return;
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

namespace {

#if defined(__x86_64__)
// keys() and keys_minmax() with AVX2 (keys_avx2); false without it.
bool keys_fast(const void* src, size_t n, DType t, KeyOp op, int64_t* acc) {
  if (!have_avx2()) return false;
  const auto* p = static_cast<const uint8_t*>(src);
  if (t == DType::kInt32) {
    keys_avx2<I32>(p, n, op, acc);
    return true;
  }
  return dispatch(t, [&]<class E>(E) { keys_avx2<E>(p, n, op, acc); });
}
#else
bool keys_fast(const void*, size_t, DType, KeyOp, int64_t*) { return false; }
#endif

// The portable loop: acc[i] = op(acc[i], key of element i); float8 keys from a table.
void keys_portable(const void* src, size_t n, DType t, KeyOp op, int64_t* acc) {
  if (t == DType::kInt32) {
    for (size_t i = 0; i < n; ++i) {
      acc[i] = apply_key(op, acc[i], static_cast<int32_t>(load<F32>(src, i)));
    }
    return;
  }
  dispatch(t, [&]<class E>(E) {
    if constexpr (sizeof(typename E::Bits) == 1) {
      const int32_t* table = fp8_keys<E>();
      for (size_t i = 0; i < n; ++i) acc[i] = apply_key(op, acc[i], table[load<E>(src, i)]);
    } else {
      for (size_t i = 0; i < n; ++i) {
        acc[i] = apply_key(op, acc[i], ordered(E::to_float(load<E>(src, i))));
      }
    }
  });
}

}  // namespace

void keys(const void* src, size_t n, DType t, int64_t* key) {
  if (!keys_fast(src, n, t, KeyOp::kStore, key)) keys_portable(src, n, t, KeyOp::kStore, key);
}

void keys_minmax(const void* src, size_t n, DType t, ReduceOp op, int64_t* acc) {
  const KeyOp k = op == ReduceOp::kMax ? KeyOp::kMax : KeyOp::kMin;
  if (!keys_fast(src, n, t, k, acc)) keys_portable(src, n, t, k, acc);
}

void from_keys(const int64_t* key, size_t n, DType t, void* dst) {
  if (t == DType::kInt32) {
    from_sum_int32(key, n, dst);
    return;
  }
  dispatch(t, [&]<class E>(E) {
#if defined(__x86_64__)
    if (have_avx2()) {
      from_keys_avx2<E>(key, n, static_cast<uint8_t*>(dst));
      return;
    }
#endif
    for (size_t i = 0; i < n; ++i) {
      store<E>(dst, i, E::from_float(from_ordered(static_cast<int32_t>(key[i]))));
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

void set_simd_for_testing(bool enabled) { g_simd.store(enabled, std::memory_order_relaxed); }

double widen(const void* src, size_t i, DType t) {
  if (t == DType::kInt32) return static_cast<int32_t>(load<F32>(src, i));
  double d = 0;
  dispatch(t, [&]<class E>(E) { d = E::to_float(load<E>(src, i)); });
  return d;
}

}  // namespace ina::codec
