// AVX2 + F16C + FMA quantize/dequantize loops, bit for bit equal to protocol/quantize.cc.
//
// The file is compiled with the baseline flags; only the functions marked INA_AVX2 (all of them
// in an anonymous namespace, so no inline function with AVX2 code can be picked by the linker
// for a caller elsewhere) use the extensions, and cpu_quant.cc calls them only after
// __builtin_cpu_supports said yes.
//
// Why each loop equals the reference (quantize.cc, QUANTIZATION.md "Implementation notes"):
//   * Scan: the same three max-reductions over magnitude bits (integer max is order
//     independent), then the reference's own bit formula for the exponent.
//   * 16-bit widening: F16C's vcvtph2ps is exact for every finite binary16 and quiets NaNs
//     keeping sign and payload, as half_to_float does; bfloat16 widening is the reference's
//     integer formula. (The tests compare every 16-bit pattern.)
//   * SUM encode: the reference computes v = (double)x * 2^k (exact), zeroes non-finite x,
//     clamps to +-2^B and rounds to nearest even. When 2^k is a normal float32 (-126 <= k <= 127)
//     the product x * 2^k in float32 is exact too unless it falls below 2^-126, and such a
//     value (exact or float-rounded) is below 1/2 and rounds to 0 either way; a product that
//     overflows to Inf in float32 (only when exp is below the block's own exponent) is clamped
//     to 2^B exactly as the huge double is. So rounding the float32 product (vroundps, to
//     nearest even) and truncating the now integral value gives the reference's integer, 8
//     lanes at a time. Other k take the double path, 4 lanes at a time, the reference's steps
//     one for one (vroundpd instead of the 1.5*2^52 trick: equal for |v| <= 2^51).
//     Non-finite x are zeroed before the multiply rather than after: 0 * 2^k rounds to 0 too.
//   * SUM decode: (double)q * 2^k exactly as the reference (vcvtdq2pd is exact, the product is
//     exact), then one rounding to float32 (vcvtpd2ps, nearest even in the default MXCSR, as the
//     scalar conversion), then the narrowing: F16C vcvtps2ph with round-to-nearest-even (equal
//     to float_to_half for all 2^32 inputs, NaNs included, per QUANTIZATION.md) or the
//     reference's bfloat16 integer formula.
//   * MIN/MAX: the same xor/shift bijection on the same widened bits.
// Tails shorter than a vector go through the reference itself.
#include "cpu_quant_avx2.h"

#include <cstring>

#include "ina/kernels/cpu_quant.h"
#include "ina/protocol/wire.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define INA_KERNELS_X86 1
#include <immintrin.h>
#else
#define INA_KERNELS_X86 0
#endif

#include <bit>

namespace ina::kernels::cpu::avx2 {

#if INA_KERNELS_X86

#define INA_AVX2 __attribute__((target("avx2,f16c,fma")))

namespace {

// ---- element loads (8 lanes widened to float32) and stores (8 lanes narrowed) ----

struct F32 {
  static constexpr DType kType = DType::kFloat32;
  static constexpr size_t kSize = 4;
  INA_AVX2 static __m256 load8(const void* p, size_t i) {
    return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  }
  INA_AVX2 static void store8(void* p, size_t i, __m256 v) {
    _mm256_storeu_ps(static_cast<float*>(p) + i, v);
  }
};

struct F16 {
  static constexpr DType kType = DType::kFloat16;
  static constexpr size_t kSize = 2;
  INA_AVX2 static __m256 load8(const void* p, size_t i) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
  }
  INA_AVX2 static void store8(void* p, size_t i, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};

struct BF16 {
  static constexpr DType kType = DType::kBFloat16;
  static constexpr size_t kSize = 2;
  // bf16_to_float: the pattern in the top half, the quiet bit forced for NaNs.
  INA_AVX2 static __m256 load8(const void* p, size_t i) {
    __m256i w = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7FFF)),
                                           _mm256_set1_epi32(0x7F80));
    w = _mm256_or_si256(w, _mm256_and_si256(nan, _mm256_set1_epi32(0x0040)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // float_to_bf16: round the low 16 bits to nearest even; NaNs keep their top bits, quieted.
  INA_AVX2 static void store8(void* p, size_t i, __m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF)),
                                           _mm256_set1_epi32(0x7F800000));
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)),
                                           _mm256_and_si256(hi, _mm256_set1_epi32(1))),
                          16);
    const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x0040));
    const __m256i h = _mm256_blendv_epi8(rounded, quiet, nan);
    // Every lane is <= 0xFFFF, so the unsigned-saturating pack is a plain narrowing; it works
    // per 128-bit half, so keep quadwords 0 and 2.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i),
                     _mm256_castsi256_si128(packed));
  }
};

// ---- int32 words in and out: host order, or big-endian wire words ----

INA_AVX2 inline __m256i bswap32(__m256i v) {
  const __m256i m = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,  //
                                     3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
  return _mm256_shuffle_epi8(v, m);
}

struct HostWords {
  using Ptr = int32_t*;
  using CPtr = const int32_t*;
  INA_AVX2 static void store8(Ptr p, size_t i, __m256i v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + i), v);
  }
  INA_AVX2 static __m256i load8(CPtr p, size_t i) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
  }
  static void store_tail(Ptr p, size_t i, const int32_t* w, size_t n) {
    if (n != 0) std::memcpy(p + i, w, n * sizeof *w);  // (p is null for an empty block)
  }
  static void load_tail(CPtr p, size_t i, int32_t* w, size_t n) {
    if (n != 0) std::memcpy(w, p + i, n * sizeof *w);
  }
};

struct WireWords {
  using Ptr = uint8_t*;
  using CPtr = const uint8_t*;
  INA_AVX2 static void store8(Ptr p, size_t i, __m256i v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + i * kV1WordSize), bswap32(v));
  }
  INA_AVX2 static __m256i load8(CPtr p, size_t i) {
    return bswap32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * kV1WordSize)));
  }
  static void store_tail(Ptr p, size_t i, const int32_t* w, size_t n) {
    store_be_words(p + i * kV1WordSize, w, n);
  }
  static void load_tail(CPtr p, size_t i, int32_t* w, size_t n) {
    load_be_words(w, p + i * kV1WordSize, n);
  }
};

// ---- scan ----

struct Format {
  int32_t inf_bits;
  int mant_bits;
  int bias;
};
constexpr Format kF32{0x7F800000, 23, 127};
constexpr Format kF16{0x7C00, 10, 15};
constexpr Format kBF16{0x7F80, 7, 127};

// quantize.cc's exponent_of, verbatim.
int exponent_of(int32_t a, const Format& f) {
  const int field = a >> f.mant_bits;
  const uint32_t mant = static_cast<uint32_t>(a) & ((1u << f.mant_bits) - 1);
  return field != 0 ? field - f.bias + 1
                    : static_cast<int>(std::bit_width(mant)) + 1 - f.bias - f.mant_bits;
}

quant::BlockScan finish_scan(int32_t max_finite, int32_t max_non_nan, int32_t max_all,
                             const Format& f, ReduceOp op) {
  quant::BlockScan s;
  s.nonfinite = max_all > f.inf_bits || (op == ReduceOp::kSum && max_non_nan == f.inf_bits);
  if (max_finite != 0) s.exp = static_cast<int16_t>(exponent_of(max_finite, f));
  return s;
}

// Scalar tail step (the reference's loop body).
inline void scan_step(int32_t a, int32_t inf_bits, int32_t& mf, int32_t& mn, int32_t& ma) {
  const int32_t finite = a < inf_bits ? a : 0;
  const int32_t non_nan = a <= inf_bits ? a : 0;
  mf = mf > finite ? mf : finite;
  mn = mn > non_nan ? mn : non_nan;
  ma = ma > a ? ma : a;
}

INA_AVX2 quant::BlockScan scan_f32(const float* src, size_t n, ReduceOp op) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(kF32.inf_bits);
  const __m256i inf1 = _mm256_set1_epi32(kF32.inf_bits + 1);
  __m256i mf = _mm256_setzero_si256();
  __m256i mn = _mm256_setzero_si256();
  __m256i ma = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i a =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)), abs_mask);
    mf = _mm256_max_epi32(mf, _mm256_and_si256(_mm256_cmpgt_epi32(inf, a), a));
    mn = _mm256_max_epi32(mn, _mm256_and_si256(_mm256_cmpgt_epi32(inf1, a), a));
    ma = _mm256_max_epi32(ma, a);
  }
  alignas(32) int32_t lf[8], ln[8], la[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lf), mf);
  _mm256_store_si256(reinterpret_cast<__m256i*>(ln), mn);
  _mm256_store_si256(reinterpret_cast<__m256i*>(la), ma);
  int32_t f = 0, nn = 0, al = 0;
  for (int k = 0; k < 8; ++k) {
    f = f > lf[k] ? f : lf[k];
    nn = nn > ln[k] ? nn : ln[k];
    al = al > la[k] ? al : la[k];
  }
  for (; i < n; ++i) {
    int32_t b;
    std::memcpy(&b, src + i, sizeof b);
    scan_step(b & 0x7FFFFFFF, kF32.inf_bits, f, nn, al);
  }
  return finish_scan(f, nn, al, kF32, op);
}

// 16-bit patterns: 16 lanes of int16 (magnitude bits fit in 15 bits, so signed compares work).
INA_AVX2 quant::BlockScan scan_16(const uint16_t* src, size_t n, const Format& fmt, ReduceOp op) {
  const __m256i abs_mask = _mm256_set1_epi16(0x7FFF);
  const __m256i inf = _mm256_set1_epi16(static_cast<int16_t>(fmt.inf_bits));
  const __m256i inf1 = _mm256_set1_epi16(static_cast<int16_t>(fmt.inf_bits + 1));
  __m256i mf = _mm256_setzero_si256();
  __m256i mn = _mm256_setzero_si256();
  __m256i ma = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)), abs_mask);
    mf = _mm256_max_epi16(mf, _mm256_and_si256(_mm256_cmpgt_epi16(inf, a), a));
    mn = _mm256_max_epi16(mn, _mm256_and_si256(_mm256_cmpgt_epi16(inf1, a), a));
    ma = _mm256_max_epi16(ma, a);
  }
  alignas(32) int16_t lf[16], ln[16], la[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lf), mf);
  _mm256_store_si256(reinterpret_cast<__m256i*>(ln), mn);
  _mm256_store_si256(reinterpret_cast<__m256i*>(la), ma);
  int32_t f = 0, nn = 0, al = 0;
  for (int k = 0; k < 16; ++k) {
    f = f > lf[k] ? f : lf[k];
    nn = nn > ln[k] ? nn : ln[k];
    al = al > la[k] ? al : la[k];
  }
  for (; i < n; ++i) scan_step(src[i] & 0x7FFF, fmt.inf_bits, f, nn, al);
  return finish_scan(f, nn, al, fmt, op);
}

// ---- encode ----

// 2^k as a double, k clamped to [-200, 200] (quantize.cc's pow2_clamped).
double pow2_clamped(int k) {
  k = k < -200 ? -200 : (k > 200 ? 200 : k);
  return std::bit_cast<double>(static_cast<uint64_t>(k + 1023) << 52);
}

// Lanes of x that are finite keep their bits; Inf and NaN become +0.0.
INA_AVX2 inline __m256 zero_nonfinite(__m256 x) {
  const __m256i a = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i finite = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7F800000), a);
  return _mm256_and_ps(x, _mm256_castsi256_ps(finite));
}

template <typename L, typename W>
INA_AVX2 void encode_sum(const void* src, size_t n, int16_t exp, uint32_t world_size,
                         typename W::Ptr out) {
  size_t i = 0;
  if (exp != kNoExponent) {
    const int b = quant::magnitude_bits(world_size);
    const int k = b - exp;
    if (k >= -126 && k <= 127) {
      const __m256 scale = _mm256_castsi256_ps(_mm256_set1_epi32((k + 127) << 23));
      const __m256 hi = _mm256_set1_ps(std::bit_cast<float>((b + 127) << 23));  // 2^B, B >= -2
      const __m256 lo = _mm256_sub_ps(_mm256_setzero_ps(), hi);
      for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(zero_nonfinite(L::load8(src, i)), scale);
        v = _mm256_max_ps(_mm256_min_ps(v, hi), lo);
        v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        W::store8(out, i, _mm256_cvttps_epi32(v));
      }
    } else {
      const __m256d scale = _mm256_set1_pd(pow2_clamped(k));
      const __m256d hi = _mm256_set1_pd(pow2_clamped(b));
      const __m256d lo = _mm256_sub_pd(_mm256_setzero_pd(), hi);
      for (; i + 8 <= n; i += 8) {
        const __m256 x = zero_nonfinite(L::load8(src, i));
        __m256d v0 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), scale);
        __m256d v1 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), scale);
        v0 = _mm256_round_pd(_mm256_max_pd(_mm256_min_pd(v0, hi), lo),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v1 = _mm256_round_pd(_mm256_max_pd(_mm256_min_pd(v1, hi), lo),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        W::store8(out, i, _mm256_set_m128i(_mm256_cvttpd_epi32(v1), _mm256_cvttpd_epi32(v0)));
      }
    }
  }
  // The tail (and the whole block when exp is kNoExponent) through the reference.
  int32_t tmp[64];
  while (i < n) {
    const size_t m = n - i < 64 ? n - i : 64;
    quant::encode(static_cast<const char*>(src) + i * L::kSize, m, L::kType, ReduceOp::kSum, exp,
                  world_size, tmp);
    W::store_tail(out, i, tmp, m);
    i += m;
  }
}

// The order-preserving map b ^ ((b >> 31) & 0x7FFFFFFF) (its own inverse).
INA_AVX2 inline __m256i ordered(__m256i b) {
  return _mm256_xor_si256(
      b, _mm256_and_si256(_mm256_srai_epi32(b, 31), _mm256_set1_epi32(0x7FFFFFFF)));
}

template <typename L, typename W>
INA_AVX2 void encode_ordered(const void* src, size_t n, ReduceOp op, typename W::Ptr out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) W::store8(out, i, ordered(_mm256_castps_si256(L::load8(src, i))));
  if (i < n) {
    int32_t tmp[8];
    quant::encode(static_cast<const char*>(src) + i * L::kSize, n - i, L::kType, op, 0, 1, tmp);
    W::store_tail(out, i, tmp, n - i);
  }
}

template <typename W>
INA_AVX2 void copy_words_in(const int32_t* src, size_t n, typename W::Ptr out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    W::store8(out, i, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  }
  W::store_tail(out, i, src + i, n - i);
}

template <typename W>
INA_AVX2 void encode_any(const void* src, size_t n, DType t, ReduceOp op, int16_t exp,
                         uint32_t world_size, typename W::Ptr out) {
  const bool sum = op == ReduceOp::kSum;
  switch (t) {
    case DType::kFloat32:
      return sum ? encode_sum<F32, W>(src, n, exp, world_size, out)
                 : encode_ordered<F32, W>(src, n, op, out);
    case DType::kFloat16:
      return sum ? encode_sum<F16, W>(src, n, exp, world_size, out)
                 : encode_ordered<F16, W>(src, n, op, out);
    case DType::kBFloat16:
      return sum ? encode_sum<BF16, W>(src, n, exp, world_size, out)
                 : encode_ordered<BF16, W>(src, n, op, out);
    case DType::kInt32: return copy_words_in<W>(static_cast<const int32_t*>(src), n, out);
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return;  // not reached: cpu_quant.cc gives float8 to the reference
  }
}

// ---- decode ----

template <typename S, typename W>
INA_AVX2 void decode_sum(typename W::CPtr in, size_t n, int16_t exp, uint32_t world_size,
                         void* dst) {
  const double s = exp == kNoExponent ? 0.0 : pow2_clamped(exp - quant::magnitude_bits(world_size));
  const __m256d scale = _mm256_set1_pd(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i q = W::load8(in, i);
    const __m256d d0 = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(q)), scale);
    const __m256d d1 = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(q, 1)), scale);
    S::store8(dst, i, _mm256_set_m128(_mm256_cvtpd_ps(d1), _mm256_cvtpd_ps(d0)));
  }
  if (i < n) {
    int32_t tmp[8];
    W::load_tail(in, i, tmp, n - i);
    quant::decode(tmp, n - i, S::kType, ReduceOp::kSum, exp, world_size,
                  static_cast<char*>(dst) + i * S::kSize);
  }
}

template <typename S, typename W>
INA_AVX2 void decode_ordered(typename W::CPtr in, size_t n, ReduceOp op, void* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) S::store8(dst, i, _mm256_castsi256_ps(ordered(W::load8(in, i))));
  if (i < n) {
    int32_t tmp[8];
    W::load_tail(in, i, tmp, n - i);
    quant::decode(tmp, n - i, S::kType, op, 0, 1, static_cast<char*>(dst) + i * S::kSize);
  }
}

template <typename W>
INA_AVX2 void copy_words_out(typename W::CPtr in, size_t n, int32_t* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), W::load8(in, i));
  }
  W::load_tail(in, i, dst + i, n - i);
}

template <typename W>
INA_AVX2 void decode_any(typename W::CPtr in, size_t n, DType t, ReduceOp op, int16_t exp,
                         uint32_t world_size, void* dst) {
  const bool sum = op == ReduceOp::kSum;
  switch (t) {
    case DType::kFloat32:
      return sum ? decode_sum<F32, W>(in, n, exp, world_size, dst)
                 : decode_ordered<F32, W>(in, n, op, dst);
    case DType::kFloat16:
      return sum ? decode_sum<F16, W>(in, n, exp, world_size, dst)
                 : decode_ordered<F16, W>(in, n, op, dst);
    case DType::kBFloat16:
      return sum ? decode_sum<BF16, W>(in, n, exp, world_size, dst)
                 : decode_ordered<BF16, W>(in, n, op, dst);
    case DType::kInt32: return copy_words_out<W>(in, n, static_cast<int32_t*>(dst));
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return;  // not reached: cpu_quant.cc gives float8 to the reference
  }
}

}  // namespace

bool compiled() { return true; }

quant::BlockScan scan_block(const void* src, size_t n, DType t, ReduceOp op) {
  switch (t) {
    case DType::kFloat32: return scan_f32(static_cast<const float*>(src), n, op);
    case DType::kFloat16: return scan_16(static_cast<const uint16_t*>(src), n, kF16, op);
    case DType::kBFloat16: return scan_16(static_cast<const uint16_t*>(src), n, kBF16, op);
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return quant::scan_block(src, n, t, op);
    case DType::kInt32: break;
  }
  return quant::BlockScan{};
}

void encode(const void* src, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            int32_t* q) {
  encode_any<HostWords>(src, n, t, op, exp, world_size, q);
}

void encode_wire(const void* src, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
                 uint8_t* dst) {
  encode_any<WireWords>(src, n, t, op, exp, world_size, dst);
}

void decode(const int32_t* q, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            void* dst) {
  decode_any<HostWords>(q, n, t, op, exp, world_size, dst);
}

void decode_wire(const uint8_t* src, size_t n, DType t, ReduceOp op, int16_t exp,
                 uint32_t world_size, void* dst) {
  decode_any<WireWords>(src, n, t, op, exp, world_size, dst);
}

#else  // not x86: no AVX2 loops; cpu_quant.cc never calls the functions below.

bool compiled() { return false; }
quant::BlockScan scan_block(const void* src, size_t n, DType t, ReduceOp op) {
  return quant::scan_block(src, n, t, op);
}
void encode(const void* src, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            int32_t* q) {
  quant::encode(src, n, t, op, exp, world_size, q);
}
void encode_wire(const void*, size_t, DType, ReduceOp, int16_t, uint32_t, uint8_t*) {}
void decode(const int32_t* q, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            void* dst) {
  quant::decode(q, n, t, op, exp, world_size, dst);
}
void decode_wire(const uint8_t*, size_t, DType, ReduceOp, int16_t, uint32_t, void*) {}

#endif

}  // namespace ina::kernels::cpu::avx2
