#include "worker/host/reduce.h"

#include <cstdint>
#include <cstring>

#include "ina/base/half.h"
#include "ina/protocol/fp8.h"

namespace ina::host {

namespace {

// Equal operands (only -0 and +0 differ then) take the OR of their bits for MIN and the AND for
// MAX: -0 < +0, as the in-network path orders them (protocol/QUANTIZATION.md), whatever the
// order the ranks are combined in.
inline float combine(float a, float b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kMin:
    case ReduceOp::kMax: {
      if (b != b) return b;  // NaN in b propagates; NaN in a is never replaced
      if (a == b) {
        uint32_t x, y;
        std::memcpy(&x, &a, 4);
        std::memcpy(&y, &b, 4);
        x = op == ReduceOp::kMin ? (x | y) : (x & y);
        std::memcpy(&a, &x, 4);
        return a;
      }
      return (op == ReduceOp::kMin ? b < a : b > a) ? b : a;
    }
  }
  return a;
}

// 4 lanes of 32 bits (one SSE2 register, the x86-64 baseline; 16 bytes keeps the calling
// convention the same with and without AVX); loads and stores through memcpy (no alignment
// assumed).
typedef int32_t V4i __attribute__((vector_size(16)));
typedef uint32_t V4u __attribute__((vector_size(16)));
typedef float V4f __attribute__((vector_size(16)));
constexpr size_t kLanes = 4;

template <typename V>
inline V load(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V>
inline void store(void* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

template <ReduceOp kOp>
void reduce_int32(int32_t* __restrict acc, const int32_t* __restrict in, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    if constexpr (kOp == ReduceOp::kSum) {
      store(acc + i, load<V4u>(acc + i) + load<V4u>(in + i));  // wraps, as uint32
    } else {
      const V4i a = load<V4i>(acc + i);
      const V4i b = load<V4i>(in + i);
      store(acc + i, kOp == ReduceOp::kMin ? (b < a ? b : a) : (b > a ? b : a));
    }
  }
  for (; i < n; ++i) {
    if constexpr (kOp == ReduceOp::kSum) {
      acc[i] = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) + static_cast<uint32_t>(in[i]));
    } else if constexpr (kOp == ReduceOp::kMin) {
      acc[i] = in[i] < acc[i] ? in[i] : acc[i];
    } else {
      acc[i] = in[i] > acc[i] ? in[i] : acc[i];
    }
  }
}

template <ReduceOp kOp>
void reduce_f32(float* __restrict acc, const float* __restrict in, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V4f a = load<V4f>(acc + i);
    const V4f b = load<V4f>(in + i);
    if constexpr (kOp == ReduceOp::kSum) {
      store(acc + i, a + b);
    } else {
      // As combine(): the chosen one, or b where b is NaN (a NaN in a is never replaced), and
      // for equal lanes (-0, +0) the OR (MIN) or AND (MAX) of the bits.
      const V4f r = kOp == ReduceOp::kMin ? (b < a ? b : a) : (b > a ? b : a);
      const V4u ua = (V4u)a, ub = (V4u)b;  // the same bits (GCC vector casts reinterpret)
      const V4f e = (V4f)(kOp == ReduceOp::kMin ? (ua | ub) : (ua & ub));
      const V4f chosen = a == b ? e : r;
      store(acc + i, b != b ? b : chosen);
    }
  }
  for (; i < n; ++i) acc[i] = combine(acc[i], in[i], kOp);
}

template <ReduceOp kOp, float (*kWiden)(uint16_t), uint16_t (*kNarrow)(float)>
void reduce_16(uint16_t* acc, const uint16_t* in, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = kNarrow(combine(kWiden(acc[i]), kWiden(in[i]), kOp));
}

template <ReduceOp kOp, float (*kWiden)(uint8_t), uint8_t (*kNarrow)(float)>
void reduce_8(uint8_t* acc, const uint8_t* in, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = kNarrow(combine(kWiden(acc[i]), kWiden(in[i]), kOp));
}

template <ReduceOp kOp>
void reduce_typed(void* acc, const void* in, size_t n, DType t) {
  switch (t) {
    case DType::kInt32:
      reduce_int32<kOp>(static_cast<int32_t*>(acc), static_cast<const int32_t*>(in), n);
      return;
    case DType::kFloat32:
      reduce_f32<kOp>(static_cast<float*>(acc), static_cast<const float*>(in), n);
      return;
    case DType::kFloat16:
      reduce_16<kOp, half_to_float, float_to_half>(static_cast<uint16_t*>(acc),
                                                   static_cast<const uint16_t*>(in), n);
      return;
    case DType::kBFloat16:
      reduce_16<kOp, bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(acc),
                                                   static_cast<const uint16_t*>(in), n);
      return;
    case DType::kFloat8E4M3:
      reduce_8<kOp, e4m3_to_float, float_to_e4m3>(static_cast<uint8_t*>(acc),
                                                  static_cast<const uint8_t*>(in), n);
      return;
    case DType::kFloat8E5M2:
      reduce_8<kOp, e5m2_to_float, float_to_e5m2>(static_cast<uint8_t*>(acc),
                                                  static_cast<const uint8_t*>(in), n);
      return;
  }
}

}  // namespace

void reduce_into(void* acc, const void* in, size_t n, DType t, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: reduce_typed<ReduceOp::kSum>(acc, in, n, t); return;
    case ReduceOp::kMin: reduce_typed<ReduceOp::kMin>(acc, in, n, t); return;
    case ReduceOp::kMax: reduce_typed<ReduceOp::kMax>(acc, in, n, t); return;
  }
}

}  // namespace ina::host
