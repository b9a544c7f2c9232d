// CUDA quantize/dequantize kernels (semantics: kernels/include/ina/kernels/cuda_quant.h),
// bit for bit equal to the reference, protocol/quantize.cc.
//
// Why the results are identical to the CPU reference:
//   * Everything that decides a result is integer or bit manipulation (the exponent scan, the
//     NaN/Inf tests, the order-preserving map, the 16-bit conversions, the byte swap), written
//     as the same formulas as quantize.cc and half.h.
//   * The few floating-point operations are single IEEE operations with an explicit rounding
//     mode (__fmul_rn, __dmul_rn, __fadd_rn, __double2float_rn, __float2int_rn,
//     __double2int_rn): nvcc cannot contract them into FMAs, and without --use_fast_math
//     (refused below) device code neither flushes subnormals (-ftz=false) nor approximates.
//     Each one either is exact or rounds to nearest even, as the reference's do on the CPU:
//       - widening float16 uses float(m) * 2^-24 for subnormals: m < 2^10, exact;
//       - SUM encode: x * 2^k is exact in float32 when 2^k is a normal float32 and the product
//         is not below 2^-126; a product below 2^-126 is below 1/2 and rounds to 0 like the
//         reference's exact double; one that overflows to Inf is clamped to 2^B like the
//         reference's huge double. Other k use double, as the reference (exact product). The
//         clamped value is then rounded to the nearest integer, ties to even
//         (__float2int_rn / __double2int_rn), which is what the reference's 1.5*2^52 trick
//         computes for |v| <= 2^51.
//       - SUM decode: (double)q * 2^k is exact; __double2float_rn rounds once to float32 as
//         the reference's static_cast; then the 16-bit narrowing is half.h's integer formula
//         (float16 subnormals: one float addition of 0.5f, round to nearest even).
//   * Blocks and exponents: block i is elements [i*K, (i+1)*K), the unit the worker scans and
//     encodes with quant:: on the CPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ina/kernels/cuda_quant.h"
#include "ina/protocol/quantize.h"

#if defined(__USE_FAST_MATH__)
#error "quant_kernels.cu must not be built with --use_fast_math: results must equal the CPU's"
#endif

namespace ina::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // threads per CUDA block
constexpr int kWarps = kThreads / 32;
constexpr int16_t kNoExp = INT16_MIN;  // ina::kNoExponent, usable in device code

enum class Kind : int { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 3 };

Kind kind_of(DType t) {
  switch (t) {
    case DType::kFloat32: return Kind::kF32;
    case DType::kFloat16: return Kind::kF16;
    case DType::kBFloat16: return Kind::kBF16;
    case DType::kFloat8E4M3:  // refused before (check_common, fill_nan)
    case DType::kFloat8E5M2:
    case DType::kInt32: break;
  }
  return Kind::kI32;
}

// ---- half.h, on the device ----

__device__ __forceinline__ uint32_t sel(bool c, uint32_t a, uint32_t b) { return c ? a : b; }

__device__ __forceinline__ float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t em = h & 0x7FFFu;
  const uint32_t normal = (em << 13) + (112u << 23);
  const uint32_t subnormal = __float_as_uint(__fmul_rn(static_cast<float>(em), 0x1p-24f));
  const uint32_t inf_nan = 0x7F800000u | ((em & 0x3FFu) << 13) | (em > 0x7C00u ? 0x00400000u : 0u);
  const uint32_t mag = sel(em < 0x0400u, subnormal, sel(em >= 0x7C00u, inf_nan, normal));
  return __uint_as_float(sign | mag);
}

__device__ __forceinline__ uint16_t float_to_half(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  const uint32_t nan = 0x7E00u | ((a >> 13) & 0x3FFu);
  const uint32_t normal = (a - (112u << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  const uint32_t subnormal =
      __float_as_uint(__fadd_rn(__uint_as_float(a), 0.5f)) - __float_as_uint(0.5f);
  const uint32_t finite = sel(a < 0x38800000u, subnormal, normal);
  const uint32_t mag = sel(a > 0x7F800000u, nan, sel(a >= 0x477FF000u, 0x7C00u, finite));
  return static_cast<uint16_t>(sign | mag);
}

__device__ __forceinline__ float bf16_to_float(uint16_t b) {
  const bool is_nan = (b & 0x7FFFu) > 0x7F80u;
  return __uint_as_float(uint32_t{static_cast<uint16_t>(b | (is_nan ? 0x0040u : 0u))} << 16);
}

__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  const uint32_t x = __float_as_uint(f);
  const bool is_nan = (x & 0x7FFFFFFFu) > 0x7F800000u;
  const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(is_nan ? ((x >> 16) | 0x0040u) : rounded);
}

template <Kind K>
__device__ __forceinline__ float load(const void* src, size_t i) {
  if constexpr (K == Kind::kF32) {
    return static_cast<const float*>(src)[i];
  } else if constexpr (K == Kind::kF16) {
    return half_to_float(static_cast<const uint16_t*>(src)[i]);
  } else {
    return bf16_to_float(static_cast<const uint16_t*>(src)[i]);
  }
}

template <Kind K>
__device__ __forceinline__ void store(void* dst, size_t i, float v) {
  if constexpr (K == Kind::kF32) {
    static_cast<float*>(dst)[i] = v;
  } else if constexpr (K == Kind::kF16) {
    static_cast<uint16_t*>(dst)[i] = float_to_half(v);
  } else {
    static_cast<uint16_t*>(dst)[i] = float_to_bf16(v);
  }
}

template <Kind K>
__device__ __forceinline__ int32_t abs_bits(const void* src, size_t i) {
  if constexpr (K == Kind::kF32) {
    return static_cast<int32_t>(static_cast<const uint32_t*>(src)[i] & 0x7FFFFFFFu);
  } else {
    return static_cast<const uint16_t*>(src)[i] & 0x7FFF;
  }
}

// inf pattern, stored mantissa bits, bias (quantize.cc's Format).
template <Kind K>
struct Fmt;
template <>
struct Fmt<Kind::kF32> {
  static constexpr int32_t kInf = 0x7F800000;
  static constexpr int kMant = 23;
  static constexpr int kBias = 127;
};
template <>
struct Fmt<Kind::kF16> {
  static constexpr int32_t kInf = 0x7C00;
  static constexpr int kMant = 10;
  static constexpr int kBias = 15;
};
template <>
struct Fmt<Kind::kBF16> {
  static constexpr int32_t kInf = 0x7F80;
  static constexpr int kMant = 7;
  static constexpr int kBias = 127;
};

__device__ __forceinline__ int32_t to_ordered(int32_t b) { return b ^ ((b >> 31) & 0x7FFFFFFF); }

__device__ __forceinline__ uint32_t bswap(uint32_t x) { return __byte_perm(x, 0, 0x0123); }

// 2^k as a double, k clamped to [-200, 200] (quantize.cc's pow2_clamped).
__device__ __forceinline__ double pow2_clamped(int k) {
  k = k < -200 ? -200 : (k > 200 ? 200 : k);
  return __longlong_as_double(static_cast<long long>(k + 1023) << 52);
}

// ---- scan: one warp per quantization block ----

template <Kind K>
__global__ void scan_kernel(const void* __restrict__ src, size_t n, uint32_t block_elems,
                            size_t nblocks, bool sum, int16_t* __restrict__ exps,
                            uint8_t* __restrict__ nonfinite) {
  const size_t warp = (static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  if (warp >= nblocks) return;  // the whole warp leaves together
  const size_t begin = warp * block_elems;
  const size_t end = begin + block_elems < n ? begin + block_elems : n;
  constexpr int32_t inf = Fmt<K>::kInf;
  int32_t mf = 0, mn = 0, ma = 0;
  for (size_t i = begin + lane; i < end; i += 32) {
    const int32_t a = abs_bits<K>(src, i);
    mf = max(mf, a < inf ? a : 0);
    mn = max(mn, a <= inf ? a : 0);
    ma = max(ma, a);
  }
  mf = __reduce_max_sync(0xFFFFFFFFu, mf);
  mn = __reduce_max_sync(0xFFFFFFFFu, mn);
  ma = __reduce_max_sync(0xFFFFFFFFu, ma);
  if (lane != 0) return;
  int16_t e = kNoExp;
  if (mf != 0) {
    // quantize.cc's exponent_of: normal numbers from the exponent field, subnormals from the
    // mantissa's bit width (32 - clz).
    const int field = mf >> Fmt<K>::kMant;
    const uint32_t mant = static_cast<uint32_t>(mf) & ((1u << Fmt<K>::kMant) - 1);
    e = static_cast<int16_t>(field != 0 ? field - Fmt<K>::kBias + 1
                                        : (32 - __clz(static_cast<int>(mant))) + 1 - Fmt<K>::kBias -
                                              Fmt<K>::kMant);
  }
  exps[warp] = e;
  if (nonfinite != nullptr) nonfinite[warp] = (ma > inf || (sum && mn == inf)) ? 1 : 0;
}

// ---- encode: one thread per element, grid-stride ----

template <Kind K>
__device__ __forceinline__ int32_t encode_sum_one(float x, int16_t e, int b) {
  if (e == kNoExp) return 0;
  // Non-finite x contribute 0 (their block is flagged NONFINITE).
  if ((__float_as_uint(x) & 0x7F800000u) == 0x7F800000u) x = 0.0f;
  const int k = b - e;
  if (k >= -126 && k <= 127) {
    const float lim = __uint_as_float(static_cast<uint32_t>(b + 127) << 23);  // 2^B, B >= -2
    float v = __fmul_rn(x, __uint_as_float(static_cast<uint32_t>(k + 127) << 23));
    v = fminf(fmaxf(v, -lim), lim);
    return __float2int_rn(v);
  }
  const double lim = pow2_clamped(b);
  double v = __dmul_rn(static_cast<double>(x), pow2_clamped(k));
  v = fmin(fmax(v, -lim), lim);
  return __double2int_rn(v);
}

template <Kind K, bool kSum, bool kBigEndian>
__global__ void encode_kernel(const void* __restrict__ src, size_t n, uint32_t block_elems,
                              const int16_t* __restrict__ exps, int b, int32_t* __restrict__ q) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int32_t w;
    if constexpr (K == Kind::kI32) {
      w = static_cast<const int32_t*>(src)[i];
    } else if constexpr (kSum) {
      w = encode_sum_one<K>(load<K>(src, i), exps[i / block_elems], b);
    } else {
      w = to_ordered(__float_as_int(load<K>(src, i)));
    }
    if constexpr (kBigEndian) w = static_cast<int32_t>(bswap(static_cast<uint32_t>(w)));
    q[i] = w;
  }
}

// ---- decode ----

template <Kind K>
__device__ __forceinline__ void store_nan(void* dst, size_t i) {
  if constexpr (K == Kind::kF32) {
    static_cast<uint32_t*>(dst)[i] = 0x7FC00000u;
  } else if constexpr (K == Kind::kF16) {
    static_cast<uint16_t*>(dst)[i] = 0x7E00u;
  } else if constexpr (K == Kind::kBF16) {
    static_cast<uint16_t*>(dst)[i] = 0x7FC0u;
  }
}

template <Kind K, bool kSum, bool kBigEndian>
__global__ void decode_kernel(const int32_t* __restrict__ q, size_t n, uint32_t block_elems,
                              const int16_t* __restrict__ exps,
                              const uint8_t* __restrict__ nonfinite, int b,
                              void* __restrict__ dst) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int32_t w = q[i];
    if constexpr (kBigEndian) w = static_cast<int32_t>(bswap(static_cast<uint32_t>(w)));
    if constexpr (K == Kind::kI32) {
      static_cast<int32_t*>(dst)[i] = w;
    } else {
      const size_t blk = i / block_elems;
      if (nonfinite != nullptr && nonfinite[blk] != 0) {
        store_nan<K>(dst, i);
      } else if constexpr (kSum) {
        const int16_t e = exps[blk];
        // e == kNoExponent: every contribution was 0 and the scale is 0 (as the reference).
        const double scale = e == kNoExp ? 0.0 : pow2_clamped(e - b);
        store<K>(dst, i, __double2float_rn(__dmul_rn(static_cast<double>(w), scale)));
      } else {
        store<K>(dst, i, __int_as_float(to_ordered(w)));
      }
    }
  }
}

__global__ void no_exponent_kernel(size_t nblocks, int16_t* __restrict__ exps,
                                   uint8_t* __restrict__ nonfinite) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < nblocks;
       i += stride) {
    exps[i] = kNoExp;
    if (nonfinite != nullptr) nonfinite[i] = 0;
  }
}

template <Kind K>
__global__ void fill_nan_kernel(void* __restrict__ dst, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    store_nan<K>(dst, i);
  }
}

// ---- host side ----

unsigned grid_for(size_t n) {
  const size_t g = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(g < (1u << 20) ? g : (1u << 20));  // grid-stride beyond
}

Status launched(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return ok_status();
  const std::string m = std::string(what) + ": " + cudaGetErrorString(err);
  return err == cudaErrorInvalidValue ? invalid_argument(m) : unavailable(m);
}

Status check_common(DType t, ReduceOp op, uint32_t block_elems) {
  if (!is_valid_dtype(static_cast<uint8_t>(t))) return invalid_argument("cuda kernels: bad dtype");
  if (is_float8(t))
    return unimplemented("cuda kernels: no float8 kernels yet (the host path serves it)");
  if (op != ReduceOp::kSum && op != ReduceOp::kMin && op != ReduceOp::kMax) {
    return invalid_argument("cuda kernels: bad reduce op");
  }
  if (block_elems == 0) return invalid_argument("cuda kernels: block_elems must be > 0");
  return ok_status();
}

template <Kind K>
void launch_encode(const void* src, size_t n, uint32_t k, const int16_t* exps, int b, int32_t* q,
                   bool sum, bool be, cudaStream_t s) {
  const unsigned g = grid_for(n);
  if (sum) {
    if (be)
      encode_kernel<K, true, true><<<g, kThreads, 0, s>>>(src, n, k, exps, b, q);
    else
      encode_kernel<K, true, false><<<g, kThreads, 0, s>>>(src, n, k, exps, b, q);
  } else {
    if (be)
      encode_kernel<K, false, true><<<g, kThreads, 0, s>>>(src, n, k, exps, b, q);
    else
      encode_kernel<K, false, false><<<g, kThreads, 0, s>>>(src, n, k, exps, b, q);
  }
}

template <Kind K>
void launch_decode(const int32_t* q, size_t n, uint32_t k, const int16_t* exps,
                   const uint8_t* nonfinite, int b, void* dst, bool sum, bool be, cudaStream_t s) {
  const unsigned g = grid_for(n);
  if (sum) {
    if (be)
      decode_kernel<K, true, true><<<g, kThreads, 0, s>>>(q, n, k, exps, nonfinite, b, dst);
    else
      decode_kernel<K, true, false><<<g, kThreads, 0, s>>>(q, n, k, exps, nonfinite, b, dst);
  } else {
    if (be)
      decode_kernel<K, false, true><<<g, kThreads, 0, s>>>(q, n, k, exps, nonfinite, b, dst);
    else
      decode_kernel<K, false, false><<<g, kThreads, 0, s>>>(q, n, k, exps, nonfinite, b, dst);
  }
}

}  // namespace

Status scan_blocks(const void* src, size_t n, DType t, ReduceOp op, uint32_t block_elems,
                   int16_t* exps, uint8_t* nonfinite, void* stream) {
  if (Status st = check_common(t, op, block_elems); !st.ok()) return st;
  const size_t nblocks = num_blocks(n, block_elems);
  if (nblocks == 0) return ok_status();
  if (exps == nullptr) return invalid_argument("scan_blocks: exps is null");
  if ((nblocks + kWarps - 1) / kWarps > 0x7FFFFFFFu) {
    return invalid_argument("scan_blocks: too many blocks");
  }
  const bool sum = op == ReduceOp::kSum;
  const unsigned g = static_cast<unsigned>((nblocks + kWarps - 1) / kWarps);
  auto s = static_cast<cudaStream_t>(stream);
  switch (kind_of(t)) {
    case Kind::kF32:
      scan_kernel<Kind::kF32>
          <<<g, kThreads, 0, s>>>(src, n, block_elems, nblocks, sum, exps, nonfinite);
      break;
    case Kind::kF16:
      scan_kernel<Kind::kF16>
          <<<g, kThreads, 0, s>>>(src, n, block_elems, nblocks, sum, exps, nonfinite);
      break;
    case Kind::kBF16:
      scan_kernel<Kind::kBF16>
          <<<g, kThreads, 0, s>>>(src, n, block_elems, nblocks, sum, exps, nonfinite);
      break;
    case Kind::kI32:  // the reference's BlockScan{}: no exponent, never non-finite
      no_exponent_kernel<<<grid_for(nblocks), kThreads, 0, s>>>(nblocks, exps, nonfinite);
      break;
  }
  return launched("scan_blocks");
}

Status encode_blocks(const void* src, size_t n, DType t, ReduceOp op, uint32_t block_elems,
                     const int16_t* exps, uint32_t world_size, int32_t* q, bool big_endian,
                     void* stream) {
  if (Status st = check_common(t, op, block_elems); !st.ok()) return st;
  if (n == 0) return ok_status();
  const bool sum = quant::needs_exponent(t, op);
  if (sum && exps == nullptr)
    return invalid_argument("encode_blocks: exps is null for a float SUM");
  const int b = quant::magnitude_bits(world_size);
  auto s = static_cast<cudaStream_t>(stream);
  switch (kind_of(t)) {
    case Kind::kF32:
      launch_encode<Kind::kF32>(src, n, block_elems, exps, b, q, sum, big_endian, s);
      break;
    case Kind::kF16:
      launch_encode<Kind::kF16>(src, n, block_elems, exps, b, q, sum, big_endian, s);
      break;
    case Kind::kBF16:
      launch_encode<Kind::kBF16>(src, n, block_elems, exps, b, q, sum, big_endian, s);
      break;
    case Kind::kI32:
      launch_encode<Kind::kI32>(src, n, block_elems, exps, b, q, false, big_endian, s);
      break;
  }
  return launched("encode_blocks");
}

Status decode_blocks(const int32_t* q, size_t n, DType t, ReduceOp op, uint32_t block_elems,
                     const int16_t* exps, const uint8_t* nonfinite, uint32_t world_size, void* dst,
                     bool big_endian, void* stream) {
  if (Status st = check_common(t, op, block_elems); !st.ok()) return st;
  if (n == 0) return ok_status();
  const bool sum = quant::needs_exponent(t, op);
  if (sum && exps == nullptr)
    return invalid_argument("decode_blocks: exps is null for a float SUM");
  const int b = quant::magnitude_bits(world_size);
  auto s = static_cast<cudaStream_t>(stream);
  switch (kind_of(t)) {
    case Kind::kF32:
      launch_decode<Kind::kF32>(q, n, block_elems, exps, nonfinite, b, dst, sum, big_endian, s);
      break;
    case Kind::kF16:
      launch_decode<Kind::kF16>(q, n, block_elems, exps, nonfinite, b, dst, sum, big_endian, s);
      break;
    case Kind::kBF16:
      launch_decode<Kind::kBF16>(q, n, block_elems, exps, nonfinite, b, dst, sum, big_endian, s);
      break;
    case Kind::kI32:
      launch_decode<Kind::kI32>(q, n, block_elems, exps, nonfinite, b, dst, false, big_endian, s);
      break;
  }
  return launched("decode_blocks");
}

Status fill_nan(void* dst, size_t n, DType t, void* stream) {
  if (!is_valid_dtype(static_cast<uint8_t>(t))) return invalid_argument("fill_nan: bad dtype");
  if (is_float8(t)) return unimplemented("fill_nan: no float8 kernels yet");
  if (n == 0 || t == DType::kInt32) return ok_status();
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned g = grid_for(n);
  switch (kind_of(t)) {
    case Kind::kF32: fill_nan_kernel<Kind::kF32><<<g, kThreads, 0, s>>>(dst, n); break;
    case Kind::kF16: fill_nan_kernel<Kind::kF16><<<g, kThreads, 0, s>>>(dst, n); break;
    case Kind::kBF16: fill_nan_kernel<Kind::kBF16><<<g, kThreads, 0, s>>>(dst, n); break;
    case Kind::kI32: break;
  }
  return launched("fill_nan");
}

}  // namespace ina::kernels::cuda
