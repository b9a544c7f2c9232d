// The block codec (see codec.h and QUANTIZATION.md). Every loop dispatches on the dtype once per
// block and runs a template over its element traits.
#include "ina/protocol/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "ina/protocol/fp8.h"
#include "ina/protocol/half.h"
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
};
struct F16 {
  using Bits = uint16_t;
  static float to_float(Bits b) { return half_to_float(b); }
  static Bits from_double(double d) { return float_to_half(round_to_odd_float(d)); }
  static Bits from_float(float f) { return float_to_half(f); }
  static constexpr Bits kNaN = 0x7E00u;
};
struct BF16 {
  using Bits = uint16_t;
  static float to_float(Bits b) { return bf16_to_float(b); }
  static Bits from_double(double d) { return float_to_bf16(round_to_odd_float(d)); }
  static Bits from_float(float f) { return float_to_bf16(f); }
  static constexpr Bits kNaN = 0x7FC0u;
};
// float8: from_double rounds once (fp8.h); the doubles passed are exact or rounded to odd at 53
// bits, far more than the 2 extra bits that make the final rounding correct.
struct E4M3 {
  using Bits = uint8_t;
  static float to_float(Bits b) { return e4m3_to_float(b); }
  static Bits from_double(double d) { return double_to_e4m3(d); }
  static Bits from_float(float f) { return float_to_e4m3(f); }
  static constexpr Bits kNaN = kE4M3NaN;
};
struct E5M2 {
  using Bits = uint8_t;
  static float to_float(Bits b) { return e5m2_to_float(b); }
  static Bits from_double(double d) { return double_to_e5m2(d); }
  static Bits from_float(float f) { return float_to_e5m2(f); }
  static constexpr Bits kNaN = kE5M2NaN;
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
    float m = 0.0f;
    bool nan = false, inf = false;
    for (size_t i = 0; i < n; ++i) {
      const float x = std::fabs(E::to_float(load<E>(src, i)));
      nan |= std::isnan(x);
      inf |= std::isinf(x);
      if (std::isfinite(x)) m = std::max(m, x);
    }
    s.nonfinite = nan || (inf && op == ReduceOp::kSum);
    if (m != 0.0f) {
      int e = 0;
      std::frexp(m, &e);
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
    run([&](size_t i) {
      return int64_t{quant::float_to_ordered(E::to_float(load<E>(src, i)))};
    });
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
  for (size_t i = 0; i < n; ++i) acc[i] += static_cast<int32_t>(load<F32>(src, i));
}

void from_sum_int32(const int64_t* acc, size_t n, void* dst) {
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
