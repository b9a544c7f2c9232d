// The fixed-point quantizer reference (semantics: quantize.h; derivation: QUANTIZATION.md).
//
// This file is what kernels/ copies bit for bit, so every step is spelled out:
//   * 16-bit and 8-bit inputs are widened to float32 exactly (half.h, fp8.h); everything below
//     works on float32.
//   * Scan: integer max-reductions over the elements' magnitude bits; the exponent is computed
//     from the largest finite one's bits (equal to std::frexp's).
//   * SUM encode: v = x * 2^(B - exp) in double (exact: a power-of-two scale of a float32 cannot
//     round in double's range), clamped to [-2^B, 2^B], then rounded to the nearest integer, ties
//     to even (the value std::nearbyint gives in the default rounding mode). Non-finite x gives 0.
//   * SUM decode: (float)(q * 2^(exp - B)), the product exact in double, one rounding to float32,
//     then (16-bit types) one rounding from float32 to the output type, both to nearest even;
//     float8 rounds once, from the double (fp8.h).
//   * MIN/MAX: the order-preserving bijection between float32 bit patterns and int32.
//
// The per-packet loops take every decision (dtype, op, scale) before the loop; inside, every
// operation runs for every element and conditions are selects on computed values (a float
// operation inside a branch cannot be if-converted under the default -ftrapping-math), so each
// loop is a straight vector loop: GCC 12 vectorizes all of them with 16-byte vectors at -O3 or
// -O2 -fvect-cost-model=dynamic (its default -O2 model, "very cheap", skips loops of unknown
// trip count).
#include "ina/protocol/quantize.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "ina/base/half.h"
#include "ina/protocol/fp8.h"

// round_half_even below relies on IEEE double arithmetic with no excess precision and no
// reassociation; -ffast-math would fold (v + 1.5*2^52) - 1.5*2^52 into v and break rounding.
#if defined(__FAST_MATH__)
#error "quantize.cc must not be built with -ffast-math: its rounding relies on strict IEEE math"
#endif
static_assert(FLT_EVAL_METHOD == 0, "quantize.cc needs double arithmetic without excess precision");

namespace ina::quant {
namespace {

// Round to nearest integer, ties to even, for |v| <= 2^51: adding 1.5 * 2^52 moves the binary
// point to the last mantissa bit, so the addition itself rounds (to nearest even, the default
// mode); subtracting gives the rounded value back. Equal to std::nearbyint(v) in that range, but
// vectorizes on baseline x86-64 (SSE2 has no roundpd) and has no libm call.
inline double round_half_even(double v) {
  constexpr double kMagic = 0x1.8p52;
  return (v + kMagic) - kMagic;
}

// 2^k as a double, k clamped to [-200, 200] (exactly representable there). The callers scale a
// float32 (|x| < 2^128, smallest non-zero 2^-149) or an int32 (|q| <= 2^31) and clamp or round
// the result to int32 or float32; beyond +-200 the product already saturates, rounds to zero or
// overflows to Inf, exactly as it would with the unclamped scale, so the clamp changes no result
// and keeps every product exact and finite.
inline double pow2_clamped(int k) {
  k = k < -200 ? -200 : (k > 200 ? 200 : k);
  return std::bit_cast<double>(static_cast<uint64_t>(k + 1023) << 52);
}

// Float bit patterns order like sign-magnitude integers. Read as int32, non-negative floats
// already order correctly; for negative ones (sign bit set) flipping the 31 low bits reverses
// their order and keeps them below every non-negative pattern. The map is its own inverse, orders
// -Inf < ... < -0 < +0 < ... < +Inf (-0 and +0 are distinct, -0 below), and NaNs land outside the
// Infs (they are flagged NONFINITE and never decoded). (Inline here: the exported functions may
// be interposed in a shared library, so the compiler would not inline them into the loops.)
inline int32_t to_ordered(float f) {
  const int32_t b = std::bit_cast<int32_t>(f);
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}
inline float from_ordered(int32_t q) { return std::bit_cast<float>(q ^ ((q >> 31) & 0x7FFFFFFF)); }

// Element loads (16-bit types widened exactly) and stores (narrowed to nearest even), one type
// per dtype so that each loop below is instantiated, and vectorized, once per dtype.
struct LoadF32 {
  static float load(const void* src, size_t i) { return static_cast<const float*>(src)[i]; }
};
struct LoadF16 {
  static float load(const void* src, size_t i) {
    return half_to_float(static_cast<const uint16_t*>(src)[i]);
  }
};
struct LoadBF16 {
  static float load(const void* src, size_t i) {
    return bf16_to_float(static_cast<const uint16_t*>(src)[i]);
  }
};
struct LoadE4M3 {
  static float load(const void* src, size_t i) {
    return e4m3_to_float(static_cast<const uint8_t*>(src)[i]);
  }
};
struct LoadE5M2 {
  static float load(const void* src, size_t i) {
    return e5m2_to_float(static_cast<const uint8_t*>(src)[i]);
  }
};

// Stores take the decoded value as a double (exact: q * 2^k); the 32- and 16-bit types round it
// to float32 first (the v1 codec's two roundings), float8 rounds it once.
struct StoreF32 {
  static void store(void* dst, size_t i, double v) {
    static_cast<float*>(dst)[i] = static_cast<float>(v);
  }
};
struct StoreF16 {
  static void store(void* dst, size_t i, double v) {
    static_cast<uint16_t*>(dst)[i] = float_to_half(static_cast<float>(v));
  }
};
struct StoreBF16 {
  static void store(void* dst, size_t i, double v) {
    static_cast<uint16_t*>(dst)[i] = float_to_bf16(static_cast<float>(v));
  }
};
struct StoreE4M3 {
  static void store(void* dst, size_t i, double v) {
    static_cast<uint8_t*>(dst)[i] = double_to_e4m3(v);
  }
};
struct StoreE5M2 {
  static void store(void* dst, size_t i, double v) {
    static_cast<uint8_t*>(dst)[i] = double_to_e5m2(v);
  }
};

// Per-element magnitude bits of a float type: |x|'s bit pattern with the sign cleared. Patterns
// above the type's +Inf pattern are NaN; below it they are finite and order like |x|.
struct Abs16 {
  static int32_t abs_bits(const void* src, size_t i) {
    return static_cast<const uint16_t*>(src)[i] & 0x7FFF;
  }
};
// e4m3 has no Inf: its NaN pattern 0x7F is moved above the (unused) "Inf" pattern 0x7F, to 0x80,
// so that the scan below sees every other pattern as finite and a NaN as a NaN.
struct Abs8E4M3 {
  static int32_t abs_bits(const void* src, size_t i) {
    const int32_t a = static_cast<const uint8_t*>(src)[i] & 0x7F;
    return a + (a == 0x7F ? 1 : 0);
  }
};
struct Abs8 {
  static int32_t abs_bits(const void* src, size_t i) {
    return static_cast<const uint8_t*>(src)[i] & 0x7F;
  }
};
struct Abs32 {
  static int32_t abs_bits(const void* src, size_t i) {
    int32_t b;
    std::memcpy(&b, static_cast<const float*>(src) + i, sizeof b);
    return b & 0x7FFFFFFF;
  }
};

struct Format {
  int32_t inf_bits;  // pattern of +Inf
  int mant_bits;     // stored mantissa bits
  int bias;          // exponent bias
};
constexpr Format kF32{0x7F800000, 23, 127};
constexpr Format kF16{0x7C00, 10, 15};
constexpr Format kBF16{0x7F80, 7, 127};
constexpr Format kE4M3{0x7F, 3, 7};  // with Abs8E4M3: 0x7F is never seen, NaN reads 0x80
constexpr Format kE5M2{0x7C, 2, 15};

// frexp's exponent of the finite non-zero value with magnitude bits `a` (a in (0, inf_bits)),
// computed from the bits: |x| < 2^e and 2^(e-1) <= |x|. Normal: |x| = 1.m * 2^(field - bias), so
// e = field - bias + 1. Subnormal: |x| = m * 2^(1 - bias - mant_bits), so e = bit_width(m) +
// 1 - bias - mant_bits. (Integer-only: a process running with denormals-are-zero would
// otherwise see a subnormal block as zero.)
inline int exponent_of(int32_t a, const Format& f) {
  const int field = a >> f.mant_bits;
  const uint32_t mant = static_cast<uint32_t>(a) & ((1u << f.mant_bits) - 1);
  return field != 0 ? field - f.bias + 1
                    : static_cast<int>(std::bit_width(mant)) + 1 - f.bias - f.mant_bits;
}

// Three max-reductions over the magnitude bits (they vectorize; flags and early exits would
// not): the largest finite |x| gives the exponent (frexp's exponent grows with |x|), the largest
// non-NaN |x| equals the Inf pattern iff an Inf is present, and the largest of all exceeds it iff
// a NaN is present. Signed compares: SSE2 has no unsigned ones, and the patterns are < 2^31.
template <typename Abs>
BlockScan scan_float(const void* src, size_t n, const Format& f, ReduceOp op) {
  const int32_t inf_bits = f.inf_bits;
  int32_t max_finite = 0;
  int32_t max_non_nan = 0;
  int32_t max_all = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t a = Abs::abs_bits(src, i);
    const int32_t finite = a < inf_bits ? a : 0;
    const int32_t non_nan = a <= inf_bits ? a : 0;
    max_finite = max_finite > finite ? max_finite : finite;
    max_non_nan = max_non_nan > non_nan ? max_non_nan : non_nan;
    max_all = max_all > a ? max_all : a;
  }
  BlockScan s;
  s.nonfinite = max_all > inf_bits || (op == ReduceOp::kSum && max_non_nan == inf_bits);
  if (max_finite != 0) s.exp = static_cast<int16_t>(exponent_of(max_finite, f));
  return s;
}

template <typename Load>
void encode_sum(const void* src, size_t n, int16_t exp, uint32_t world_size, int32_t* q) {
  if (exp == kNoExponent) {  // every rank's block is zero (or non-finite): nothing to scale
    std::memset(q, 0, n * sizeof *q);
    return;
  }
  const int b = magnitude_bits(world_size);
  const double scale = pow2_clamped(b - exp);
  const double limit = std::ldexp(1.0, b);  // |q| <= 2^B even if exp is below this block's own
  for (size_t i = 0; i < n; ++i) {
    const float x = Load::load(src, i);
    // Non-finite elements contribute 0 (the block is flagged NONFINITE and its result is NaN
    // anyway). The multiply runs for every element and the non-finite ones are masked to +0.0
    // after it, before the conversion to int32 (undefined for NaN). A mask rather than ?: on the
    // product, which GCC would turn into a conditional multiply that does not vectorize.
    const bool finite = (std::bit_cast<int32_t>(x) & 0x7F800000) != 0x7F800000;
    const uint64_t keep = 0 - static_cast<uint64_t>(finite);
    const uint64_t scaled = std::bit_cast<uint64_t>(static_cast<double>(x) * scale);
    double v = std::bit_cast<double>(scaled & keep);  // +0.0 when not finite
    v = v > limit ? limit : v;
    v = v < -limit ? -limit : v;
    q[i] = static_cast<int32_t>(round_half_even(v));
  }
}

template <typename Load>
void encode_ordered(const void* src, size_t n, int32_t* q) {
  for (size_t i = 0; i < n; ++i) q[i] = to_ordered(Load::load(src, i));
}

template <typename Store>
void decode_sum(const int32_t* q, size_t n, int16_t exp, uint32_t world_size, void* dst) {
  // exp == kNoExponent: every contribution was 0 (see encode_sum), so the sum is +0.
  const double scale = exp == kNoExponent ? 0.0 : pow2_clamped(exp - magnitude_bits(world_size));
  for (size_t i = 0; i < n; ++i) {
    Store::store(dst, i, static_cast<double>(q[i]) * scale);
  }
}

template <typename Store>
void decode_ordered(const int32_t* q, size_t n, void* dst) {
  // The value came from a float of the output type, so the narrowing below is exact.
  for (size_t i = 0; i < n; ++i) Store::store(dst, i, from_ordered(q[i]));
}

template <typename Load>
void encode_float(const void* src, size_t n, ReduceOp op, int16_t exp, uint32_t world_size,
                  int32_t* q) {
  if (op == ReduceOp::kSum) {
    encode_sum<Load>(src, n, exp, world_size, q);
  } else {
    encode_ordered<Load>(src, n, q);
  }
}

template <typename Store>
void decode_float(const int32_t* q, size_t n, ReduceOp op, int16_t exp, uint32_t world_size,
                  void* dst) {
  if (op == ReduceOp::kSum) {
    decode_sum<Store>(q, n, exp, world_size, dst);
  } else {
    decode_ordered<Store>(q, n, dst);
  }
}

}  // namespace

int magnitude_bits(uint32_t world_size) {
  // ceil(log2 N) = bit_width(N - 1) for N >= 1; N = 0 is treated as 1.
  const uint32_t n = world_size == 0 ? 1 : world_size;
  return 30 - static_cast<int>(std::bit_width(n - 1));
}

BlockScan scan_block(const void* src, size_t n, DType t, ReduceOp op) {
  switch (t) {
    case DType::kFloat32: return scan_float<Abs32>(src, n, kF32, op);
    case DType::kFloat16: return scan_float<Abs16>(src, n, kF16, op);
    case DType::kBFloat16: return scan_float<Abs16>(src, n, kBF16, op);
    case DType::kFloat8E4M3: return scan_float<Abs8E4M3>(src, n, kE4M3, op);
    case DType::kFloat8E5M2: return scan_float<Abs8>(src, n, kE5M2, op);
    case DType::kInt32: break;
  }
  return BlockScan{};
}

void encode(const void* src, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            int32_t* q) {
  switch (t) {
    case DType::kFloat32: return encode_float<LoadF32>(src, n, op, exp, world_size, q);
    case DType::kFloat16: return encode_float<LoadF16>(src, n, op, exp, world_size, q);
    case DType::kBFloat16: return encode_float<LoadBF16>(src, n, op, exp, world_size, q);
    case DType::kFloat8E4M3: return encode_float<LoadE4M3>(src, n, op, exp, world_size, q);
    case DType::kFloat8E5M2: return encode_float<LoadE5M2>(src, n, op, exp, world_size, q);
    case DType::kInt32:
      if (n != 0) std::memcpy(q, src, n * sizeof *q);  // SUM wraps in the aggregator; MIN/MAX exact
      return;
  }
}

void decode(const int32_t* q, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            void* dst) {
  switch (t) {
    case DType::kFloat32: return decode_float<StoreF32>(q, n, op, exp, world_size, dst);
    case DType::kFloat16: return decode_float<StoreF16>(q, n, op, exp, world_size, dst);
    case DType::kBFloat16: return decode_float<StoreBF16>(q, n, op, exp, world_size, dst);
    case DType::kFloat8E4M3: return decode_float<StoreE4M3>(q, n, op, exp, world_size, dst);
    case DType::kFloat8E5M2: return decode_float<StoreE5M2>(q, n, op, exp, world_size, dst);
    case DType::kInt32:
      if (n != 0) std::memcpy(dst, q, n * sizeof *q);
      return;
  }
}

void fill_nan(void* dst, size_t n, DType t) {
  // The canonical quiet NaNs: sign clear, quiet bit only (std::numeric_limits<>::quiet_NaN()).
  switch (t) {
    case DType::kFloat32: {
      const float nan = std::bit_cast<float>(0x7FC00000u);
      float* d = static_cast<float*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = nan;
      return;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      const uint16_t nan = t == DType::kFloat16 ? 0x7E00u : 0x7FC0u;
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = nan;
      return;
    }
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
      std::memset(dst, t == DType::kFloat8E4M3 ? kE4M3NaN : kE5M2NaN, n);
      return;
    case DType::kInt32:
      return;  // int32 has no NaN and is never flagged NONFINITE; dst is left as it is
  }
}

double sum_quantization_bound(double block_max_abs, uint32_t world_size) {
  return static_cast<double>(world_size) * block_max_abs *
         std::ldexp(1.0, -magnitude_bits(world_size));
}

double output_ulp(DType t, double a) {
  int mant_bits = 23;  // explicit mantissa bits
  int min_exp = -126;  // exponent of the smallest normal number
  if (t == DType::kFloat16) {
    mant_bits = 10;
    min_exp = -14;
  } else if (t == DType::kBFloat16) {
    mant_bits = 7;
  } else if (t == DType::kFloat8E4M3) {
    mant_bits = 3;
    min_exp = -6;
  } else if (t == DType::kFloat8E5M2) {
    mant_bits = 2;
    min_exp = -14;
  }
  a = std::fabs(a);
  const int e = (a > 0 && std::isfinite(a)) ? std::max(std::ilogb(a), min_exp) : min_exp;
  return std::ldexp(1.0, e - mant_bits);
}

double sum_error_bound(DType t, double block_max_abs, uint32_t world_size, double exact) {
  const double qb = sum_quantization_bound(block_max_abs, world_size);
  return qb + output_ulp(t, std::fabs(exact) + qb);
}

int32_t float_to_ordered(float f) { return to_ordered(f); }

float ordered_to_float(int32_t q) { return from_ordered(q); }

}  // namespace ina::quant
