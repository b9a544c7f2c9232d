// The portable codec loops: plain C++, one element at a time, built for every target. They are
// the reference the vector implementations are held to, bit for bit.
#include <algorithm>
#include <cmath>

#include "dispatch.h"

namespace ina::kernels {
namespace {

void scan_codes(Format f, const void* src, size_t n, uint32_t bad, uint32_t* top_out,
                bool* nonfinite_out) {
  uint32_t top = 0;
  uint32_t nonfinite = 0;
  with_float(f, [&]<class E>(E) {
    using Bits = typename E::Bits;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t a = static_cast<Bits>(load<E>(src, i) & E::kAbs);
      nonfinite |= a >= bad ? 1u : 0u;
      top = std::max(top, a < E::kInf ? a : 0u);
    }
  });
  *top_out = top;
  *nonfinite_out = nonfinite != 0;
}

void quantize_f32(const void* src, size_t n, double scale, double limit, int64_t* q, bool add) {
  for (size_t i = 0; i < n; ++i) {
    const float x = F32::to_float(load<F32>(src, i));
    double v = std::isfinite(x) ? static_cast<double>(x) * scale : 0.0;
    v = std::clamp(v, -limit, limit);
    const auto qi = static_cast<int64_t>(rint_big(v));
    q[i] = add ? q[i] + qi : qi;
  }
}

void widen(Format f, const void* src, size_t n, float* dst) {
  with_float(f, [&]<class E>(E) {
    for (size_t i = 0; i < n; ++i) dst[i] = E::to_float(load<E>(src, i));
  });
}

void dequantize_f32(const int64_t* q, size_t n, float m, void* dst) {
  for (size_t i = 0; i < n; ++i) store<F32>(dst, i, F32::from_float(static_cast<float>(q[i]) * m));
}

void dequantize_narrow(Format f, const int64_t* q, size_t n, float m, void* dst) {
  with_float(f, [&]<class E>(E) {
    for (size_t i = 0; i < n; ++i) store<E>(dst, i, E::from_float(round_to_odd24(q[i]) * m));
  });
}

void fold_int32(WordFold op, const void* src, size_t n, int32_t* acc) {
  switch (op) {
    case WordFold::kAdd:
      for (size_t i = 0; i < n; ++i) {
        acc[i] = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) + load<F32>(src, i));
      }
      return;
    case WordFold::kMin:
      for (size_t i = 0; i < n; ++i) {
        acc[i] = std::min(acc[i], static_cast<int32_t>(load<F32>(src, i)));
      }
      return;
    case WordFold::kMax:
      for (size_t i = 0; i < n; ++i) {
        acc[i] = std::max(acc[i], static_cast<int32_t>(load<F32>(src, i)));
      }
      return;
  }
}

void keys32(Format f, KeyFold fold, const void* src, size_t n, int32_t* acc) {
  const KeyOp op = key_op(fold);
  const auto put = [&](size_t i, int32_t k) { acc[i] = apply_key(op, acc[i], k); };
  if (f == Format::kI32) {
    for (size_t i = 0; i < n; ++i) put(i, static_cast<int32_t>(load<F32>(src, i)));
    return;
  }
  with_float(f, [&]<class E>(E) {
    if constexpr (sizeof(typename E::Bits) == 1) {
      const int32_t* table = fp8_keys<E>();
      for (size_t i = 0; i < n; ++i) put(i, table[load<E>(src, i)]);
    } else {
      for (size_t i = 0; i < n; ++i) put(i, ordered(E::to_float(load<E>(src, i))));
    }
  });
}

void from_keys32(Format f, const int32_t* key, size_t n, void* dst) {
  with_float(f, [&]<class E>(E) {
    for (size_t i = 0; i < n; ++i) store<E>(dst, i, E::from_float(from_ordered(key[i])));
  });
}

constexpr CodecKernels kPortable{
    "portable", scan_codes, quantize_f32, widen, dequantize_f32, dequantize_narrow,
    nullptr,  // quantize_sum: the codec composes the loops above (its tile loop)
    nullptr,  // quantize_sum_words: likewise
    fold_int32, keys32,     from_keys32,
};

}  // namespace

const CodecKernels& portable_codec_kernels() { return kPortable; }

}  // namespace ina::kernels
