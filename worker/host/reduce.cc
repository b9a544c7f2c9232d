#include "worker/host/reduce.h"

#include <cstdint>
#include <cstring>

#include "ina/protocol/half.h"

namespace ina::host {

namespace {

template <typename T>
inline T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kMin: {
      T r = b < a ? b : a;
      return b != b ? b : r;  // NaN in b propagates; NaN in a fails b < a and stays
    }
    case ReduceOp::kMax: {
      T r = b > a ? b : a;
      return b != b ? b : r;
    }
  }
  return a;
}

template <ReduceOp kOp>
void reduce_int32(int32_t* acc, const int32_t* in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
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
void reduce_f32(float* acc, const float* in, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = combine(acc[i], in[i], kOp);
}

template <ReduceOp kOp, float (*kWiden)(uint16_t), uint16_t (*kNarrow)(float)>
void reduce_16(uint16_t* acc, const uint16_t* in, size_t n) {
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
