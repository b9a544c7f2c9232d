// The arm64 NEON codec loops (AdvSIMD is part of every arm64 CPU: BlueField's Cortex-A72 and
// A78 cores, Graviton, Apple): the magnitude scan of every float format, the float32 quantizer
// (vcvtnq_s64_f64 rounds to nearest even and converts in one instruction), int32 SUM and
// MIN/MAX, and the float32 and int32 MIN/MAX keys. The other loops are the portable ones. Each
// gives the portable loops' bits for every input; codec_kernels_test runs under qemu-user to check
// it (test codec_kernels_arm64, tests/arm64_check.sh).
#include "ina/kernels/codec.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <algorithm>

#include "dispatch.h"

namespace ina::kernels {
namespace {

// One format's codes, 16 bytes per step: a = code & abs; nonfinite |= a >= bad; top = max(top,
// a < inf ? a : 0). Codes are at most 0x7F.., so unsigned compares are exact.
template <class E>
void scan_e(const uint8_t* p, size_t n, uint32_t bad, uint32_t* top_out, bool* nf_out) {
  using Bits = typename E::Bits;
  constexpr size_t kLanes = 16 / sizeof(Bits);
  size_t i = 0;
  uint32_t top = 0;
  bool nf = false;
  if constexpr (sizeof(Bits) == 4) {
    const uint32x4_t abs = vdupq_n_u32(E::kAbs), inf = vdupq_n_u32(E::kInf),
                     vbad = vdupq_n_u32(bad);
    uint32x4_t t = vdupq_n_u32(0), f = vdupq_n_u32(0);
    for (; i + kLanes <= n; i += kLanes) {
      const uint32x4_t a = vandq_u32(vld1q_u32(reinterpret_cast<const uint32_t*>(p + 4 * i)), abs);
      f = vorrq_u32(f, vcgeq_u32(a, vbad));
      t = vmaxq_u32(t, vandq_u32(a, vcltq_u32(a, inf)));
    }
    top = vmaxvq_u32(t);
    nf = vmaxvq_u32(f) != 0;
  } else if constexpr (sizeof(Bits) == 2) {
    const uint16x8_t abs = vdupq_n_u16(E::kAbs), inf = vdupq_n_u16(E::kInf);
    const uint16x8_t vbad = vdupq_n_u16(static_cast<uint16_t>(std::min<uint32_t>(bad, 0xFFFF)));
    uint16x8_t t = vdupq_n_u16(0), f = vdupq_n_u16(0);
    for (; i + kLanes <= n; i += kLanes) {
      const uint16x8_t a = vandq_u16(vld1q_u16(reinterpret_cast<const uint16_t*>(p + 2 * i)), abs);
      f = vorrq_u16(f, vcgeq_u16(a, vbad));
      t = vmaxq_u16(t, vandq_u16(a, vcltq_u16(a, inf)));
    }
    top = vmaxvq_u16(t);
    nf = vmaxvq_u16(f) != 0;
  } else {
    const uint8x16_t abs = vdupq_n_u8(E::kAbs), inf = vdupq_n_u8(E::kInf);
    const uint8x16_t vbad = vdupq_n_u8(static_cast<uint8_t>(std::min<uint32_t>(bad, 0xFF)));
    uint8x16_t t = vdupq_n_u8(0), f = vdupq_n_u8(0);
    for (; i + kLanes <= n; i += kLanes) {
      const uint8x16_t a = vandq_u8(vld1q_u8(p + i), abs);
      f = vorrq_u8(f, vcgeq_u8(a, vbad));
      t = vmaxq_u8(t, vandq_u8(a, vcltq_u8(a, inf)));
    }
    top = vmaxvq_u8(t);
    nf = vmaxvq_u8(f) != 0;
  }
  for (; i < n; ++i) {
    const uint32_t a = static_cast<Bits>(load<E>(p, i) & E::kAbs);
    nf |= a >= bad;
    top = std::max(top, a < E::kInf ? a : 0u);
  }
  *top_out = top;
  *nf_out = nf;
}

void scan_codes(Format f, const void* src, size_t n, uint32_t bad, uint32_t* top, bool* nf) {
  // bad is at most kInf + 1 of its format, which fits the lane (0x7F80 + 1, 0x7F + 1).
  with_float(f, [&]<class E>(E) { scan_e<E>(static_cast<const uint8_t*>(src), n, bad, top, nf); });
}

// q[i] (+)= rint(clamp(x_i * scale, -limit, limit)): the product is exact in double, the clamp
// keeps |v| <= 2^62, and vcvtnq_s64_f64 rounds to nearest even into int64.
void quantize_f32(const void* src, size_t n, double scale, double limit, int64_t* q, bool add) {
  const auto* p = static_cast<const uint8_t*>(src);
  const uint32x4_t abs = vdupq_n_u32(0x7FFFFFFFu), inf = vdupq_n_u32(0x7F800000u);
  const float64x2_t vs = vdupq_n_f64(scale), hi = vdupq_n_f64(limit), lo = vdupq_n_f64(-limit);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const uint32x4_t bits = vld1q_u32(reinterpret_cast<const uint32_t*>(p + 4 * i));
    const float32x4_t x =
        vreinterpretq_f32_u32(vandq_u32(bits, vcltq_u32(vandq_u32(bits, abs), inf)));
    float64x2_t v0 = vmulq_f64(vcvt_f64_f32(vget_low_f32(x)), vs);
    float64x2_t v1 = vmulq_f64(vcvt_high_f64_f32(x), vs);
    v0 = vminq_f64(vmaxq_f64(v0, lo), hi);
    v1 = vminq_f64(vmaxq_f64(v1, lo), hi);
    int64x2_t q0 = vcvtnq_s64_f64(v0);
    int64x2_t q1 = vcvtnq_s64_f64(v1);
    if (add) {
      q0 = vaddq_s64(q0, vld1q_s64(q + i));
      q1 = vaddq_s64(q1, vld1q_s64(q + i + 2));
    }
    vst1q_s64(q + i, q0);
    vst1q_s64(q + i + 2, q1);
  }
  if (i < n) portable_codec_kernels().quantize_f32(p + 4 * i, n - i, scale, limit, q + i, add);
}

void fold_int32(WordFold op, const void* src, size_t n, int32_t* acc) {
  const auto* p = static_cast<const uint8_t*>(src);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const int32x4_t x = vld1q_s32(reinterpret_cast<const int32_t*>(p + 4 * i));
    const int32x4_t a = vld1q_s32(acc + i);
    vst1q_s32(acc + i, op == WordFold::kAdd   ? vaddq_s32(a, x)
                       : op == WordFold::kMin ? vminq_s32(a, x)
                                              : vmaxq_s32(a, x));
  }
  if (i < n) portable_codec_kernels().fold_int32(op, p + 4 * i, n - i, acc + i);
}

// The order-preserving key of four float32 (ordered(): b ^ ((b >> 31) & 0x7FFFFFFF), which is
// its own inverse, so from_keys32 runs it too). float32 widening is the identity: a signalling
// NaN stays as it is, as in the portable loop's bit_cast.
inline int32x4_t ordered4(int32x4_t b) {
  return veorq_s32(b, vandq_s32(vshrq_n_s32(b, 31), vdupq_n_s32(0x7FFFFFFF)));
}

void keys32(Format f, KeyFold op, const void* src, size_t n, int32_t* acc) {
  if (f != Format::kF32 && f != Format::kI32) {
    portable_codec_kernels().keys32(f, op, src, n, acc);
    return;
  }
  const auto* p = static_cast<const uint8_t*>(src);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    int32x4_t k = vld1q_s32(reinterpret_cast<const int32_t*>(p + 4 * i));
    if (f == Format::kF32) k = ordered4(k);
    if (op == KeyFold::kMin) k = vminq_s32(vld1q_s32(acc + i), k);
    if (op == KeyFold::kMax) k = vmaxq_s32(vld1q_s32(acc + i), k);
    vst1q_s32(acc + i, k);
  }
  if (i < n) portable_codec_kernels().keys32(f, op, p + 4 * i, n - i, acc + i);
}

void from_keys32(Format f, const int32_t* key, size_t n, void* dst) {
  if (f != Format::kF32) {
    portable_codec_kernels().from_keys32(f, key, n, dst);
    return;
  }
  auto* d = static_cast<uint8_t*>(dst);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    vst1q_s32(reinterpret_cast<int32_t*>(d + 4 * i), ordered4(vld1q_s32(key + i)));
  }
  if (i < n) portable_codec_kernels().from_keys32(f, key + i, n - i, d + 4 * i);
}

const CodecKernels& neon_table() {
  static const CodecKernels t = [] {
    CodecKernels k = portable_codec_kernels();
    k.name = "neon";
    k.scan_codes = scan_codes;
    k.quantize_f32 = quantize_f32;
    k.fold_int32 = fold_int32;
    k.keys32 = keys32;
    k.from_keys32 = from_keys32;
    k.quantize_sum = nullptr;  // composed of the loops above (the codec's tile loop)
    return k;
  }();
  return t;
}

}  // namespace

const CodecKernels* neon_codec_kernels() { return &neon_table(); }

}  // namespace ina::kernels
#else
namespace ina::kernels {
const CodecKernels* neon_codec_kernels() { return nullptr; }
}  // namespace ina::kernels
#endif
