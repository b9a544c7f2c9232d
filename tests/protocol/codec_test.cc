// The wire v2 block codec (codec.h) against its specification: exact quantization (rint of the
// scaled value), one correct rounding of the integer sum to the user's type, the order-preserving
// MIN/MAX image, NaN fill, and the PARTIAL test vectors.
#include "ina/protocol/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ina/base/half.h"
#include "ina/protocol/fp8.h"
#include "ina/protocol/quantize.h"
#include "ina/protocol/wire.h"
#include "testdata.h"

namespace ina::codec {
namespace {

using LD = long double;  // x86: 64-bit significand, exact for every int64 times a power of two
static_assert(std::numeric_limits<LD>::digits >= 64, "the checks need an 80-bit long double");

TEST(Codec, MagnitudeBits) {
  EXPECT_EQ(magnitude_bits(DType::kFloat32, 1), 62);
  EXPECT_EQ(magnitude_bits(DType::kFloat32, 2), 61);
  EXPECT_EQ(magnitude_bits(DType::kFloat32, 3), 60);
  EXPECT_EQ(magnitude_bits(DType::kFloat32, 8), 59);
  EXPECT_EQ(magnitude_bits(DType::kFloat32, 65535), 46);
  EXPECT_EQ(magnitude_bits(DType::kFloat16, 1), 30);
  EXPECT_EQ(magnitude_bits(DType::kBFloat16, 64), 24);
  EXPECT_EQ(wire::acc_bytes(DType::kFloat32), 8u);
  EXPECT_EQ(wire::acc_bytes(DType::kFloat16), 4u);
}

TEST(Codec, RoundToOdd53) {
  EXPECT_EQ(round_to_odd53(0), 0.0);
  EXPECT_EQ(round_to_odd53((int64_t{1} << 53) - 1), 0x1p53 - 1);
  EXPECT_EQ(round_to_odd53((int64_t{1} << 53) + 1), 0x1p53 + 2);
  EXPECT_EQ(round_to_odd53((int64_t{1} << 54) + 4), 0x1p54 + 4);      // exact
  EXPECT_EQ(round_to_odd53(-(int64_t{1} << 54) - 1), -(0x1p54 + 4));  // spacing 4 there
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100000; ++i) {
    const int64_t q = static_cast<int64_t>(rng()) >> (rng() % 40);
    const double r = round_to_odd53(q);
    const LD diff = std::fabs(static_cast<LD>(r) - static_cast<LD>(q));
    int e = 0;
    std::frexp(r, &e);
    if (diff == 0) continue;
    // Inexact: within one ulp of q, toward zero's neighbour made odd.
    EXPECT_LT(diff, std::ldexp(1.0L, e - 53)) << q;
    const auto m = static_cast<int64_t>(std::ldexp(std::fabs(r), 53 - e));
    EXPECT_EQ(m & 1, 1) << q;
  }
}

// The nearest value of type t to v, ties to even, found by search over the neighbours of
// the candidate `got` (exact comparisons in long double).
template <class ToF, class Next>
void expect_nearest(LD v, float got, ToF, Next next_up, Next next_down, const char* what) {
  const LD d0 = std::fabs(static_cast<LD>(got) - v);
  const LD du = std::fabs(static_cast<LD>(next_up) - v);
  const LD dd = std::fabs(static_cast<LD>(next_down) - v);
  EXPECT_LE(d0, du) << what << " v=" << static_cast<double>(v) << " got " << got;
  EXPECT_LE(d0, dd) << what << " v=" << static_cast<double>(v) << " got " << got;
}

TEST(Codec, DequantizeRoundsOnceCorrectlyFloat32) {
  std::mt19937_64 rng(2);
  for (int i = 0; i < 200000; ++i) {
    int64_t q = static_cast<int64_t>(rng()) >> (1 + rng() % 62);
    if (i % 3 == 0) q |= 1;  // sticky bits below the float's precision
    const int scale = static_cast<int>(rng() % 300) - 230;
    float out;
    dequantize(&q, 1, DType::kFloat32, scale, &out);
    const LD v = std::ldexp(static_cast<LD>(q), scale);
    const float up = std::nextafter(out, std::numeric_limits<float>::infinity());
    const float down = std::nextafter(out, -std::numeric_limits<float>::infinity());
    if (std::isinf(out)) continue;
    expect_nearest(v, out, 0, up, down, "float32");
    // Ties to even.
    const LD du = std::fabs(static_cast<LD>(up) - v), d0 = std::fabs(static_cast<LD>(out) - v);
    const LD dd = std::fabs(static_cast<LD>(down) - v);
    if (du == d0 || dd == d0) {
      EXPECT_EQ(std::bit_cast<uint32_t>(out) & 1u, 0u) << q;
    }
  }
}

TEST(Codec, DequantizeRoundsOnceCorrectly16Bit) {
  std::mt19937_64 rng(3);
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
    auto to_f = [t](uint16_t b) {
      return t == DType::kFloat16 ? half_to_float(b) : bf16_to_float(b);
    };
    for (int i = 0; i < 200000; ++i) {
      const int64_t q = static_cast<int32_t>(rng()) >> (rng() % 31);
      const int scale = t == DType::kFloat16 ? static_cast<int>(rng() % 50) - 50
                                             : static_cast<int>(rng() % 250) - 160;
      uint16_t out;
      dequantize(&q, 1, t, scale, &out);
      const LD v = std::ldexp(static_cast<LD>(q), scale);
      const float f = to_f(out);
      if (std::isinf(f)) continue;
      // Neighbours by bit pattern (sign-magnitude).
      const bool neg = (out & 0x8000) != 0;
      const uint16_t mag = out & 0x7FFF;
      const float away = to_f(static_cast<uint16_t>(out + 1));
      const float toward = mag == 0 ? to_f(static_cast<uint16_t>((neg ? 0 : 0x8000) | 1))
                                    : to_f(static_cast<uint16_t>(out - 1));
      const LD d0 = std::fabs(static_cast<LD>(f) - v);
      EXPECT_LE(d0, std::fabs(static_cast<LD>(away) - v)) << int(t) << " q " << q << " s " << scale;
      EXPECT_LE(d0, std::fabs(static_cast<LD>(toward) - v))
          << int(t) << " q " << q << " s " << scale;
      if (d0 == std::fabs(static_cast<LD>(away) - v) ||
          d0 == std::fabs(static_cast<LD>(toward) - v)) {
        if (d0 != 0) {
          EXPECT_EQ(out & 1, 0) << "tie not to even: q " << q;
        }
      }
    }
  }
}

TEST(Codec, DequantizeIsNotDoubleRoundingThroughFloat32) {
  // A bfloat16 value whose float32 rounding lands exactly on a bfloat16 tie: rounding the sum to
  // float32 first (v1) and then to bfloat16 goes to even; the correct single rounding goes up.
  // v = 1 + 2^-8 + 2^-30: float32 rounds it to 1 + 2^-8 (a bfloat16 tie), bfloat16(1 + 2^-8)
  // = 1.0 (even), but v is above the tie: the nearest bfloat16 is 1 + 2^-7.
  const int64_t q = (int64_t{1} << 30) + (int64_t{1} << 22) + 1;
  uint16_t out;
  dequantize(&q, 1, DType::kBFloat16, -30, &out);
  EXPECT_EQ(out, 0x3F81);  // 1 + 2^-7
  EXPECT_EQ(float_to_bf16(static_cast<float>(std::ldexp(static_cast<double>(q), -30))), 0x3F80);
}

TEST(Codec, QuantizeIsRintOfTheScaledValue) {
  std::mt19937_64 rng(4);
  std::vector<float> x(256);
  for (const uint32_t n : {1u, 3u, 1000u}) {
    for (int rep = 0; rep < 50; ++rep) {
      float m = 0;
      for (float& v : x) {
        v = static_cast<float>(
            std::ldexp(static_cast<double>(static_cast<int32_t>(rng())), -int(rng() % 60)));
        m = std::max(m, std::fabs(v));
      }
      const Scan s = scan(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum);
      int e = 0;
      std::frexp(m, &e);
      ASSERT_EQ(s.exp, e);
      std::vector<int64_t> q(x.size());
      quantize(x.data(), x.size(), DType::kFloat32, s.exp, n, q.data());
      const int b = magnitude_bits(DType::kFloat32, n);
      for (size_t i = 0; i < x.size(); ++i) {
        const LD want = std::nearbyint(std::ldexp(static_cast<LD>(x[i]), b - s.exp));
        EXPECT_EQ(static_cast<LD>(q[i]), want) << i;
        EXPECT_LE(std::llabs(q[i]), int64_t{1} << b);
      }
      std::vector<int64_t> acc(x.size(), 5);
      quantize_add(x.data(), x.size(), DType::kFloat32, s.exp, n, acc.data());
      for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(acc[i], q[i] + 5);
    }
  }
  // Ties to even; non-finite and kNoExponent give 0.
  const float t[] = {0.5f, 1.5f, 2.5f, -0.5f, std::numeric_limits<float>::infinity(), NAN};
  int64_t q[6];
  quantize(t, 6, DType::kFloat32, /*exp=*/2, /*world=*/1 << 30, q);  // B = 62 - 30 = 32: x*2^30
  EXPECT_EQ(q[0], int64_t{1} << 29);
  quantize(t, 6, DType::kFloat32, 62, 1, q);  // B - E = 0: rint(x)
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(q[1], 2);
  EXPECT_EQ(q[2], 2);
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(q[4], 0);
  EXPECT_EQ(q[5], 0);
  quantize(t, 6, DType::kFloat32, kNoExponent, 1, q);
  for (int64_t v : q) EXPECT_EQ(v, 0);
}

// The codec's fast paths (AVX2 where the CPU has it, and the float32 shortcuts of dequantize)
// against the plain reference loops below (the specification: exact widening, rint of the exact
// product clamped to 2^B, one rounding of Q * 2^scale through double rounded to odd), over whole
// blocks of every length up to 1100 elements, so vector bodies and tails are both covered, with
// special values, subnormals, broken (too small) exponents and out-of-range accumulators.
namespace ref {
double elem(DType t, const std::vector<uint8_t>& b, size_t i) { return widen(b.data(), i, t); }
Scan scan(DType t, const std::vector<uint8_t>& b, size_t n, ReduceOp op) {
  Scan s;
  double m = 0;
  bool nan = false, inf = false;
  for (size_t i = 0; i < n; ++i) {
    const double x = std::fabs(elem(t, b, i));
    nan |= std::isnan(x);
    inf |= std::isinf(x);
    if (std::isfinite(x)) m = std::max(m, x);
  }
  s.nonfinite = nan || (inf && op == ReduceOp::kSum);
  if (m != 0) {
    int e = 0;
    std::frexp(m, &e);
    s.exp = static_cast<int16_t>(e);
  }
  return s;
}
int64_t quantize(double x, int16_t exp, int b) {
  if (exp == kNoExponent || !std::isfinite(x)) return 0;
  const LD v = std::ldexp(static_cast<LD>(x), std::clamp(b - int{exp}, -1000, 1000));
  const LD lim = std::ldexp(LD{1}, b);
  return static_cast<int64_t>(std::nearbyint(std::clamp(v, -lim, lim)));
}
}  // namespace ref

std::vector<uint8_t> random_block(DType t, size_t n, std::mt19937_64& rng) {
  const size_t w = dtype_size(t);
  std::vector<uint8_t> b(n * w);
  const int spread = static_cast<int>(rng() % 40);  // exponent range within the block
  for (size_t i = 0; i < n; ++i) {
    uint64_t bits;
    const unsigned kind = rng() % 64;
    if (kind == 0) {
      bits = rng();  // any pattern: NaNs, Infs, subnormals of every type
    } else {
      const double x = std::ldexp(static_cast<double>(static_cast<int32_t>(rng())) / 2147483648.0,
                                  -static_cast<int>(rng() % (spread + 1)) + (kind < 4 ? -140 : 0));
      switch (t) {
        case DType::kFloat32: bits = std::bit_cast<uint32_t>(static_cast<float>(x)); break;
        case DType::kFloat16: bits = float_to_half(static_cast<float>(x * 1000)); break;
        case DType::kBFloat16: bits = float_to_bf16(static_cast<float>(x)); break;
        case DType::kFloat8E4M3: bits = float_to_e4m3(static_cast<float>(x * 100)); break;
        case DType::kFloat8E5M2: bits = float_to_e5m2(static_cast<float>(x * 100)); break;
        default: bits = 0;
      }
    }
    std::memcpy(b.data() + i * w, &bits, w);  // little-endian: the low bytes
  }
  return b;
}

TEST(Codec, FastPathsMatchTheReference) {
  std::mt19937_64 rng(11);
  // int32 SUM (modulo 2^32) and MIN/MAX in int32 words, whole blocks, the source at every
  // offset 0..3 from its words.
  for (int rep = 0; rep < 200; ++rep) {
    const size_t n = 1 + rng() % 1100;
    const size_t off = static_cast<size_t>(rep) % 4;
    std::vector<int32_t> x(n);
    std::vector<uint8_t> src(4 * n + off);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<int32_t>(rng());
    std::memcpy(src.data() + off, x.data(), 4 * n);
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      std::vector<int32_t> acc(n), want(n);
      for (size_t i = 0; i < n; ++i) {
        acc[i] = static_cast<int32_t>(rng());
        want[i] =
            op == ReduceOp::kSum
                ? static_cast<int32_t>(static_cast<uint32_t>(acc[i]) + static_cast<uint32_t>(x[i]))
            : op == ReduceOp::kMin ? std::min(acc[i], x[i])
                                   : std::max(acc[i], x[i]);
      }
      fold_int32(src.data() + off, n, op, acc.data());
      ASSERT_EQ(acc, want) << "n " << n << " op " << static_cast<int>(op);
    }
  }
  const DType types[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3,
                         DType::kFloat8E5M2};
  for (const DType t : types) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    for (int rep = 0; rep < 300; ++rep) {
      const size_t n = 1 + rng() % 1100;
      const uint32_t world = 1 + static_cast<uint32_t>(rng() % 9);
      const int b = magnitude_bits(t, world);
      const std::vector<uint8_t> blk = random_block(t, n, rng);
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        const Scan got = scan(blk.data(), n, t, op);
        const Scan want = ref::scan(t, blk, n, op);
        ASSERT_EQ(got.exp, want.exp) << "n " << n;
        ASSERT_EQ(got.nonfinite, want.nonfinite) << "n " << n;
      }
      // The block's own exponent, one that is too small (a broken peer: saturation), a far too
      // large one (everything rounds to 0) and none.
      const int16_t own = ref::scan(t, blk, n, ReduceOp::kSum).exp;
      const int16_t base = own == kNoExponent ? int16_t{0} : own;
      for (const int16_t e : {own, static_cast<int16_t>(base - 1 - int(rng() % 70)),
                              static_cast<int16_t>(base + 30 + int(rng() % 100)), kNoExponent}) {
        std::vector<int64_t> q(n), acc(n, 7);
        quantize(blk.data(), n, t, e, world, q.data());
        quantize_add(blk.data(), n, t, e, world, acc.data());
        for (size_t i = 0; i < n; ++i) {
          const int64_t want = ref::quantize(ref::elem(t, blk, i), e, b);
          ASSERT_EQ(q[i], want) << "i " << i << " of " << n << " exp " << e << " x "
                                << ref::elem(t, blk, i);
          ASSERT_EQ(acc[i], want + 7) << i;
        }
      }
    }
    // dequantize: sums of in-range words, and (narrow types) words a broken peer could send.
    for (int rep = 0; rep < 300; ++rep) {
      const size_t n = 1 + rng() % 1100;
      const uint32_t world = 1 + static_cast<uint32_t>(rng() % 9);
      const int b = magnitude_bits(t, world);
      std::vector<int64_t> q(n);
      const bool wild = rep % 10 == 0;
      for (int64_t& v : q) {
        v = static_cast<int64_t>(rng()) >> (wild ? rng() % 3 : 63 - b + rng() % (b + 1));
        if (rng() % 8 == 0) v = 0;
        if (rng() % 4 == 0 && t != DType::kFloat32) {
          // Just above a tie of the user's type, by less than float32 resolves: the float32 of
          // Q lands on the tie, so only a rounding to odd in between keeps the final rounding
          // right (significand bits: 11 float16, 8 bfloat16, 4 e4m3, 3 e5m2).
          const int sig = t == DType::kFloat16      ? 11
                          : t == DType::kBFloat16   ? 8
                          : t == DType::kFloat8E4M3 ? 4
                                                    : 3;
          const int sh = 30 - sig;
          const int64_t m =
              (int64_t{1} << (sig - 1)) | static_cast<int64_t>(rng() % (1u << (sig - 1)));
          v = (m << sh) + (int64_t{1} << (sh - 1)) + 1;
          if (rng() % 2 == 0) v = -v;
        }
      }
      const int scale = static_cast<int>(rng() % 320) - 200;
      const size_t w = dtype_size(t);
      std::vector<uint8_t> got(n * w), want(n * w);
      dequantize(q.data(), n, t, scale, got.data());
      for (size_t i = 0; i < n; ++i) {
        // The reference: Q rounded to odd at 53 bits (exact in double), scaled, rounded once.
        const double d = std::ldexp(round_to_odd53(q[i]), scale);
        uint64_t bits = 0;
        switch (t) {
          case DType::kFloat32: bits = std::bit_cast<uint32_t>(static_cast<float>(d)); break;
          case DType::kFloat16: bits = float_to_half(round_to_odd_float(d)); break;
          case DType::kBFloat16: bits = float_to_bf16(round_to_odd_float(d)); break;
          case DType::kFloat8E4M3: bits = double_to_e4m3(d); break;
          case DType::kFloat8E5M2: bits = double_to_e5m2(d); break;
          default: break;
        }
        std::memcpy(want.data() + i * w, &bits, w);
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(0, std::memcmp(got.data() + i * w, want.data() + i * w, w))
            << "i " << i << " of " << n << " q " << q[i] << " scale " << scale;
      }
    }
  }
}

// The AVX2 loops (and the portable ones, run with set_simd_for_testing(false)) against the
// scalar codec as it was before them (codec.cc at 1e325c9, copied here), bit for bit: every
// 16-bit and 8-bit pattern through the MIN/MAX keys and the quantizer, a sweep of 6.3 million
// float32 patterns (every top 20 bits: all exponents, signs, NaN payloads, subnormals, Infs;
// below them exact, tie and just-above-tie tails) through from_keys32's narrowing, and the sums a
// dequantize can see: every finite value of each narrow type, the midpoints to its neighbours
// and one unit either side, each as sums of several widths (the int32-lane path, the wide
// words' fallback, the double path outside [-126, 127]), plus random words and scales.
namespace old {
float to_float(DType t, uint32_t b) {
  switch (t) {
    case DType::kFloat32: return std::bit_cast<float>(b);
    case DType::kFloat16: return half_to_float(static_cast<uint16_t>(b));
    case DType::kBFloat16: return bf16_to_float(static_cast<uint16_t>(b));
    case DType::kFloat8E4M3: return e4m3_to_float(static_cast<uint8_t>(b));
    case DType::kFloat8E5M2: return e5m2_to_float(static_cast<uint8_t>(b));
    default: return 0;
  }
}
uint32_t from_float(DType t, float f) {
  switch (t) {
    case DType::kFloat32: return std::bit_cast<uint32_t>(f);
    case DType::kFloat16: return float_to_half(f);
    case DType::kBFloat16: return float_to_bf16(f);
    case DType::kFloat8E4M3: return float_to_e4m3(f);
    case DType::kFloat8E5M2: return float_to_e5m2(f);
    default: return 0;
  }
}
uint32_t from_double(DType t, double d) {
  switch (t) {
    case DType::kFloat32: return std::bit_cast<uint32_t>(static_cast<float>(d));
    case DType::kFloat16: return float_to_half(round_to_odd_float(d));
    case DType::kBFloat16: return float_to_bf16(round_to_odd_float(d));
    case DType::kFloat8E4M3: return double_to_e4m3(d);
    case DType::kFloat8E5M2: return double_to_e5m2(d);
    default: return 0;
  }
}
float round_to_odd24(int64_t q) {
  const uint64_t m = q < 0 ? uint64_t{0} - static_cast<uint64_t>(q) : static_cast<uint64_t>(q);
  const int shift = std::max(0, static_cast<int>(std::bit_width(m)) - 24);
  const uint64_t hi = (m >> shift) | ((m & ((uint64_t{1} << shift) - 1)) != 0 ? 1u : 0u);
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(127 + shift) << 23);
  const float r = static_cast<float>(hi) * scale;
  return q < 0 ? -r : r;
}
uint32_t dequantize(DType t, int64_t q, int scale) {
  if (scale == kNoScale) return from_double(t, 0.0);
  if (scale >= -126 && scale <= 127) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(127 + scale) << 23);
    if (t == DType::kFloat32) return std::bit_cast<uint32_t>(static_cast<float>(q) * f);
    return from_float(t, round_to_odd24(q) * f);
  }
  return from_double(t, round_to_odd53(q) * std::ldexp(1.0, std::clamp(scale, -1000, 1000)));
}
int64_t key(DType t, uint32_t b) {
  if (t == DType::kInt32) return static_cast<int32_t>(b);
  return quant::float_to_ordered(to_float(t, b));
}
uint32_t from_key(DType t, int64_t k) {
  if (t == DType::kInt32) return static_cast<uint32_t>(k);
  return from_float(t, quant::ordered_to_float(static_cast<int32_t>(k)));
}
int64_t quantize(DType t, uint32_t b, int16_t exp, int bits) {
  if (exp == kNoExponent) return 0;
  const double scale = std::ldexp(1.0, std::clamp(bits - int{exp}, -1000, 1000));
  const double limit = std::ldexp(1.0, bits);
  const float x = to_float(t, b);
  double v = std::isfinite(x) ? static_cast<double>(x) * scale : 0.0;
  v = std::clamp(v, -limit, limit);
  const double a = std::fabs(v);
  return static_cast<int64_t>(std::copysign(a < 0x1p52 ? (a + 0x1p52) - 0x1p52 : a, v));
}
}  // namespace old

// Runs f() with the SIMD loops (where the CPU has them) and with the portable loops.
template <class F>
void both_paths(F&& f) {
  for (const bool simd : {true, false}) {
    SCOPED_TRACE(simd ? "simd" : "portable");
    set_simd_for_testing(simd);
    f();
    set_simd_for_testing(true);
  }
}

// n elements of w bytes, little-endian, one byte past an aligned start (no path may rely on
// alignment).
struct Elems {
  Elems(size_t n, size_t width) : w(width), buf(n * width + 1) {}
  uint8_t* data() { return buf.data() + 1; }
  uint32_t get(size_t i) const {
    uint32_t b = 0;
    std::memcpy(&b, buf.data() + 1 + i * w, w);
    return b;
  }
  void set(size_t i, uint32_t b) { std::memcpy(buf.data() + 1 + i * w, &b, w); }
  size_t w;
  std::vector<uint8_t> buf;
};

const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3,
                             DType::kFloat8E5M2};

// The float SUM completion in one call (quantize_sum: the fused kernel where the CPU has it,
// the tile loop otherwise, and the portable loops) against quantize, quantize_add rank by rank
// and dequantize: every dtype, 1..9 ranks at an odd stride, the ranks' own exponent, a too small
// one (saturation), a large one, none, and subnormal-only blocks (a scale beyond float32's).
TEST(Codec, QuantizeSumIsTheRankByRankLoop) {
  std::mt19937_64 rng(34);
  const DType types[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3,
                         DType::kFloat8E5M2};
  for (const bool simd : {true, false}) {
    set_simd_for_testing(simd);
    for (const DType t : types) {
      SCOPED_TRACE(std::string(dtype_name(t)) + (simd ? " simd" : " portable"));
      const size_t w = dtype_size(t);
      for (int rep = 0; rep < 150; ++rep) {
        const size_t n = rng() % 1100;
        const uint32_t world = 1 + static_cast<uint32_t>(rng() % 9);
        const size_t stride = n * w + rng() % 40;
        const bool tiny = rep % 10 == 0;   // float32: subnormals only
        const bool finite = rep % 2 == 1;  // non-finite elements replaced by zeros
        std::vector<uint8_t> raw(world * stride + 1);
        int16_t own = kNoExponent;
        bool any_nonfinite = false;
        for (uint32_t r = 0; r < world; ++r) {
          std::vector<uint8_t> blk = random_block(t, n, rng);
          if (tiny && t == DType::kFloat32) {
            for (size_t i = 0; i < n; ++i) blk[4 * i + 3] &= 0x80, blk[4 * i + 2] &= 0x7F;
          }
          for (size_t i = 0; finite && i < n; ++i) {
            if (scan(blk.data() + i * w, 1, t, ReduceOp::kSum).nonfinite) {
              std::memset(blk.data() + i * w, 0, w);
            }
          }
          if (n > 0) std::memcpy(raw.data() + 1 + r * stride, blk.data(), blk.size());
          const Scan sc = scan(blk.data(), n, t, ReduceOp::kSum);
          own = max_exponent(own, sc.exp);
          any_nonfinite = any_nonfinite || sc.nonfinite;
        }
        const int16_t base = own == kNoExponent ? int16_t{0} : own;
        for (const int16_t e : {own, static_cast<int16_t>(base - 1 - int(rng() % 70)),
                                static_cast<int16_t>(base + 30 + int(rng() % 100)), kNoExponent}) {
          std::vector<int64_t> q(n);
          if (world > 0) quantize(raw.data() + 1, n, t, e, world, q.data());
          for (uint32_t r = 1; r < world; ++r) {
            quantize_add(raw.data() + 1 + r * stride, n, t, e, world, q.data());
          }
          std::vector<uint8_t> want(n * w + 3, 0x5A), got(n * w + 3, 0x5A);
          dequantize(q.data(), n, t, scale_exponent(t, e, world), want.data() + 3);
          std::vector<const uint8_t*> src(world);
          for (uint32_t r = 0; r < world; ++r) src[r] = raw.data() + 1 + r * stride;
          quantize_sum(src.data(), world, n, t, e, world, got.data() + 3);
          ASSERT_EQ(got, want) << "n " << n << " world " << world << " exp " << e;
          if (!any_nonfinite && e == own) {
            // What the slot table's completion knows (bounded): the same bits.
            std::fill(got.begin(), got.end(), uint8_t{0x5A});
            quantize_sum(src.data(), world, n, t, e, world, got.data() + 3, true);
            ASSERT_EQ(got, want) << "bounded: n " << n << " world " << world << " exp " << e;
          }
          // The sums as a tree leaf's PARTIAL words.
          const size_t ww = wire::acc_bytes(t);
          std::vector<uint8_t> want_w(n * ww + 3, 0x5A), got_w(n * ww + 3, 0x5A);
          store_acc(q.data(), n, t, want_w.data() + 3);
          quantize_sum_words(src.data(), world, n, t, e, world, got_w.data() + 3);
          ASSERT_EQ(got_w, want_w) << "words: n " << n << " world " << world << " exp " << e;
        }
      }
    }
  }
  set_simd_for_testing(true);
}

TEST(CodecExhaustive, EveryPatternKeysAndQuantizesAsTheScalarCode) {
  std::mt19937_64 rng(21);
  for (const DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat8E5M2,
                        DType::kInt32, DType::kFloat32}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const size_t w = dtype_size(t);
    // Every pattern of the narrow types twice, in order and then shuffled (so that each sits at
    // more than one lane position); int32 and float32 take random patterns here (float32's keys
    // are in the sweep below).
    const size_t patterns = w == 1 ? 256 : w == 2 ? 65536 : 65536;
    const size_t n = 2 * patterns + 5;  // a tail after the vector bodies
    std::vector<uint32_t> pat(n);
    for (size_t i = 0; i < n; ++i) {
      pat[i] = w == 4 ? static_cast<uint32_t>(rng()) : static_cast<uint32_t>(i % patterns);
    }
    std::shuffle(pat.begin() + patterns, pat.end(), rng);
    Elems in(n, w);
    for (size_t i = 0; i < n; ++i) in.set(i, pat[i]);
    std::vector<int64_t> acc0(n);
    // Below 2^61 in magnitude: a word is at most 2^62 (magnitude_bits), so acc0 + word fits in
    // int64 as the accumulators' no-overflow argument promises (the expectation below adds them).
    for (int64_t& a : acc0) a = static_cast<int64_t>(rng()) >> (2 + rng() % 40);
    // The MIN/MAX accumulators: any int32 word.
    std::vector<int32_t> key0(n);
    for (int32_t& a : key0) a = static_cast<int32_t>(rng());
    both_paths([&] {
      std::vector<int32_t> k(n);
      keys32(in.data(), n, t, k.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(k[i], old::key(t, in.get(i))) << "keys32, pattern 0x" << std::hex << in.get(i);
      }
      for (const ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
        std::vector<int32_t> acc = key0;
        keys_minmax32(in.data(), n, t, op, acc.data());
        for (size_t i = 0; i < n; ++i) {
          const int64_t want = op == ReduceOp::kMax
                                   ? std::max<int64_t>(key0[i], old::key(t, in.get(i)))
                                   : std::min<int64_t>(key0[i], old::key(t, in.get(i)));
          ASSERT_EQ(acc[i], want) << "keys_minmax32, pattern 0x" << std::hex << in.get(i);
        }
      }
      // And back: every key (NaNs' included) to the same element the scalar code gives.
      Elems back(n, w);
      from_keys32(k.data(), n, t, back.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(back.get(i), old::from_key(t, k[i])) << "from_keys32, key " << k[i];
      }
      if (t == DType::kInt32) {
        // int32's own reduction (the slot table's): SUM modulo 2^32, MIN and MAX of the words.
        for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
          std::vector<int32_t> acc = key0;
          fold_int32(in.data(), n, op, acc.data());
          for (size_t i = 0; i < n; ++i) {
            const auto x = static_cast<int32_t>(in.get(i));
            const int32_t want =
                op == ReduceOp::kSum
                    ? static_cast<int32_t>(static_cast<uint32_t>(key0[i]) + in.get(i))
                : op == ReduceOp::kMin ? std::min(key0[i], x)
                                       : std::max(key0[i], x);
            ASSERT_EQ(acc[i], want)
                << "fold_int32 op " << static_cast<int>(op) << ", 0x" << std::hex << in.get(i);
          }
        }
        return;
      }
      // quantize: the block's own exponent, a broken (too small) one, a large one and a few
      // around each type's range, with every world size class.
      const int16_t own = scan(in.data(), n, t, ReduceOp::kSum).exp;
      for (const int16_t e : {own, static_cast<int16_t>(own - 20), int16_t{-140}, int16_t{-20},
                              int16_t{-3}, int16_t{0}, int16_t{9}, int16_t{17}, int16_t{129}}) {
        for (const uint32_t world : {1u, 8u, 1000u}) {
          const int b = magnitude_bits(t, world);
          std::vector<int64_t> q(n), acc = acc0;
          quantize(in.data(), n, t, e, world, q.data());
          quantize_add(in.data(), n, t, e, world, acc.data());
          for (size_t i = 0; i < n; ++i) {
            const int64_t want = old::quantize(t, in.get(i), e, b);
            ASSERT_EQ(q[i], want) << "quantize, pattern 0x" << std::hex << in.get(i) << std::dec
                                  << " exp " << e << " world " << world;
            ASSERT_EQ(acc[i], acc0[i] + want) << "quantize_add " << i;
          }
        }
      }
    });
  }
}

TEST(CodecExhaustive, FloatSweepNarrowsAsTheScalarCode) {
  // Every top 20 bits of a float32 (sign, exponent, 11 mantissa bits) with low 12 bits that make
  // it exact, a tie or just off one at every narrow type's rounding position (13 float16, 16
  // bfloat16, 20 e4m3, 21 e5m2; the bits below the position come from the top 20 otherwise).
  const uint32_t lows[] = {0x000, 0x001, 0x7FF, 0x800, 0x801, 0xFFF};
  const size_t n = (size_t{1} << 20) * std::size(lows);
  std::vector<int32_t> k(n);
  for (size_t i = 0; i < n; ++i) {
    const auto bits = static_cast<uint32_t>(((i / std::size(lows)) << 12) | lows[i % 6]);
    k[i] = quant::float_to_ordered(std::bit_cast<float>(bits));
  }
  for (const DType t : kFloatTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const size_t w = dtype_size(t);
    std::vector<uint32_t> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = old::from_key(t, k[i]);
    both_paths([&] {
      Elems out(n, w);
      from_keys32(k.data(), n, t, out.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(out.get(i), want[i])
            << "float 0x" << std::hex << std::bit_cast<uint32_t>(quant::ordered_to_float(k[i]));
      }
      if (t == DType::kFloat32) {
        // float32 keys of the same patterns (every top 20 bits).
        Elems f(n, 4);
        for (size_t i = 0; i < n; ++i) f.set(i, static_cast<uint32_t>(want[i]));
        std::vector<int32_t> back(n);
        keys32(f.data(), n, t, back.data());
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], k[i]) << i;
      }
    });
  }
}

TEST(CodecExhaustive, DequantizeSweepAsTheScalarCode) {
  std::mt19937_64 rng(22);
  for (const DType t : kFloatTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const size_t w = dtype_size(t);
    std::vector<int64_t> q;
    std::vector<int> sc;
    auto add = [&](int64_t v, int scale) {
      q.push_back(v);
      sc.push_back(scale);
    };
    if (t != DType::kFloat32) {
      // Every finite positive value p of the type and the midpoint to the next one (for the
      // largest, the midpoint to where the next binade would start: the overflow threshold),
      // written as Q * 2^scale with Q of L bits; Q - 1, Q, Q + 1 and their negatives.
      const uint32_t top = w == 1 ? 0x7F : 0x7FFF;
      for (uint32_t p = 0; p < top; ++p) {
        const double v = old::to_float(t, p);
        const double next = old::to_float(t, p + 1);
        if (!std::isfinite(v)) break;
        const double up = std::isfinite(next) ? next : 2 * v - old::to_float(t, p - 1);
        for (const double x : {v, (v + up) / 2}) {
          if (x == 0) continue;
          int e = 0;
          std::frexp(x, &e);
          for (const int bits : {13, 20, 24, 25, 29, 30, 31, 33, 45, 52, 55, 62}) {
            const int scale = e - bits;  // x * 2^-scale has `bits` integer bits, an integer
            const auto m = static_cast<int64_t>(std::ldexp(x, -scale));
            for (const int64_t d : {int64_t{-1}, int64_t{0}, int64_t{1}}) {
              add(m + d, scale);
              add(-(m + d), scale);
            }
          }
        }
      }
    }
    // Random words of every width and random (in part out-of-range) scales, zeros, the
    // extremes.
    for (int i = 0; i < 400000; ++i) {
      const int64_t v = static_cast<int64_t>(rng()) >> (rng() % 64);
      const int scale =
          i % 1000 == 0 ? static_cast<int>(rng()) : static_cast<int>(rng() % 400) - 200;
      add(i % 50 == 0 ? 0 : v, scale);
    }
    for (const int64_t v :
         {INT64_MIN, INT64_MAX, int64_t{1} << 30, -(int64_t{1} << 30), (int64_t{1} << 30) - 1,
          1 - (int64_t{1} << 30), int64_t{INT32_MIN}, int64_t{INT32_MAX}, int64_t{INT32_MIN} + 1,
          (int64_t{1} << 31) - 64, int64_t{1} << 51, -(int64_t{1} << 51), int64_t{1} << 32}) {
      for (const int scale : {-126, -127, 127, 128, 0, -30, kNoScale}) add(v, scale);
    }
    // Blocks of one scale (dequantize takes one per call) and random length, the words of a
    // scale with |Q| < 2^30 (the int32-lane path) first and the wider ones after them, so that
    // most groups of eight take one path and some mix the two.
    auto narrow = [&](size_t i) { return q[i] > -(int64_t{1} << 30) && q[i] < (int64_t{1} << 30); };
    std::vector<size_t> order(q.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return sc[a] != sc[b] ? sc[a] < sc[b] : narrow(a) > narrow(b);
    });
    both_paths([&] {
      size_t i = 0;
      while (i < order.size()) {
        const int scale = sc[order[i]];
        size_t j = i;
        while (j < order.size() && j - i < 1 + rng() % 1100 && sc[order[j]] == scale) ++j;
        std::vector<int64_t> words;
        for (size_t k = i; k < j; ++k) words.push_back(q[order[k]]);
        Elems out(words.size(), w);
        dequantize(words.data(), words.size(), t, scale, out.data());
        for (size_t k = 0; k < words.size(); ++k) {
          ASSERT_EQ(out.get(k), old::dequantize(t, words[k], scale))
              << "q " << words[k] << " scale " << scale;
        }
        i = j;
      }
    });
  }
}

TEST(Codec, ScanFlags) {
  const float inf = std::numeric_limits<float>::infinity();
  const float a[] = {1.0f, -3.0f, inf};
  EXPECT_TRUE(scan(a, 3, DType::kFloat32, ReduceOp::kSum).nonfinite);
  EXPECT_FALSE(scan(a, 3, DType::kFloat32, ReduceOp::kMax).nonfinite);
  EXPECT_EQ(scan(a, 3, DType::kFloat32, ReduceOp::kSum).exp, 2);
  const float n[] = {1.0f, NAN};
  EXPECT_TRUE(scan(n, 2, DType::kFloat32, ReduceOp::kMin).nonfinite);
  const uint16_t h[] = {0x0001, 0x8000};  // 2^-24, -0
  EXPECT_EQ(scan(h, 2, DType::kFloat16, ReduceOp::kSum).exp, -23);
  const uint16_t z[] = {0x0000, 0x8000};
  EXPECT_EQ(scan(z, 2, DType::kBFloat16, ReduceOp::kSum).exp, kNoExponent);
  EXPECT_EQ(scale_exponent(DType::kFloat32, kNoExponent, 4), kNoScale);
  EXPECT_EQ(scale_exponent(DType::kFloat32, -3, 4), -63);
}

TEST(Codec, KeysRoundTripEvery16BitPattern) {
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
    for (uint32_t b = 0; b < 0x10000; ++b) {
      const auto x = static_cast<uint16_t>(b);
      const float f = t == DType::kFloat16 ? half_to_float(x) : bf16_to_float(x);
      if (std::isnan(f)) continue;
      int32_t k;
      keys32(&x, 1, t, &k);
      uint16_t back;
      from_keys32(&k, 1, t, &back);
      EXPECT_EQ(back, x) << std::hex << b;
    }
  }
  const float v[] = {-std::numeric_limits<float>::infinity(), -2.5f, -0.0f, 0.0f, 1.0f};
  int32_t k[5];
  keys32(v, 5, DType::kFloat32, k);
  for (int i = 0; i + 1 < 5; ++i) EXPECT_LT(k[i], k[i + 1]);
  int32_t acc[5] = {k[4], k[4], k[4], k[4], k[4]};
  keys_minmax32(v, 5, DType::kFloat32, ReduceOp::kMin, acc);
  float out[5];
  from_keys32(acc, 5, DType::kFloat32, out);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(v[i]));
}

TEST(Codec, Int32SumWraps) {
  const int32_t a[] = {INT32_MAX, INT32_MIN, -1};
  int32_t acc[3] = {0, 0, 0};
  fold_int32(a, 3, ReduceOp::kSum, acc);
  fold_int32(a, 3, ReduceOp::kSum, acc);
  EXPECT_EQ(acc[0], -2);
  EXPECT_EQ(acc[1], 0);
  EXPECT_EQ(acc[2], -2);
}

TEST(Codec, FillNanGivesQuietNans) {
  float f[2];
  fill_nan(f, 2, DType::kFloat32);
  EXPECT_EQ(std::bit_cast<uint32_t>(f[1]), 0x7FC00000u);
  uint16_t h[2];
  fill_nan(h, 2, DType::kFloat16);
  EXPECT_EQ(h[0], 0x7E00);
  fill_nan(h, 2, DType::kBFloat16);
  EXPECT_EQ(h[1], 0x7FC0);
}

TEST(Codec, AccWordsRoundTrip) {
  const int64_t acc[] = {-(int64_t{1} << 62), 5, -7};
  for (const DType t : {DType::kFloat32, DType::kFloat16}) {
    std::vector<uint8_t> b(3 * wire::acc_bytes(t));
    store_acc(acc, 3, t, b.data());
    int64_t back[3] = {1, 1, 1};
    add_acc(b.data(), 3, t, back);
    EXPECT_EQ(back[1], 6);
    EXPECT_EQ(back[2], -6);
    if (t == DType::kFloat32) {
      EXPECT_EQ(back[0], -(int64_t{1} << 62) + 1);
    }
  }
}

// The PARTIAL vectors' words are this codec's output (protocol/testdata/gen_vectors.py wrote
// them into vectors.hex).
TEST(Codec, MatchesThePartialTestVectors) {
  {
    const std::vector<uint8_t> pkt = ::ina::testing::load_vector("partial_f32_sum");
    wire::PacketView view;
    ASSERT_EQ(wire::decode(pkt, &view), wire::DecodeError::kOk);
    const float x[] = {0.1f, -0.001f};
    int64_t q[2];
    quantize(x, 2, DType::kFloat32, -3, 4, q);
    EXPECT_EQ(view.hdr.exp, scale_exponent(DType::kFloat32, -3, 4));
    std::vector<uint8_t> words(16);
    store_acc(q, 2, DType::kFloat32, words.data());
    EXPECT_TRUE(std::equal(words.begin(), words.end(), view.payload));
  }
  {
    const std::vector<uint8_t> pkt = ::ina::testing::load_vector("partial_f16_sum");
    wire::PacketView view;
    ASSERT_EQ(wire::decode(pkt, &view), wire::DecodeError::kOk);
    const uint16_t r0[] = {float_to_half(1.0f), float_to_half(-0.25f)};
    const uint16_t r1[] = {float_to_half(0.5f), float_to_half(-0.25f)};
    int64_t acc[2] = {0, 0};
    quantize_add(r0, 2, DType::kFloat16, 1, 8, acc);
    quantize_add(r1, 2, DType::kFloat16, 1, 8, acc);
    EXPECT_EQ(view.hdr.exp, scale_exponent(DType::kFloat16, 1, 8));
    std::vector<uint8_t> words(8);
    store_acc(acc, 2, DType::kFloat16, words.data());
    EXPECT_TRUE(std::equal(words.begin(), words.end(), view.payload));
    // And the root's conversion of these sums: 1.5 and -0.5.
    int64_t sum[2] = {0, 0};
    add_acc(view.payload, 2, DType::kFloat16, sum);
    uint16_t out[2];
    dequantize(sum, 2, DType::kFloat16, view.hdr.exp, out);
    EXPECT_EQ(out[0], float_to_half(1.5f));
    EXPECT_EQ(out[1], float_to_half(-0.5f));
  }
}

}  // namespace
}  // namespace ina::codec
