// ina-kernel-bench: throughput of the quantize/dequantize kernels.
//
//   ina-kernel-bench cpu  [--elems N] [--seconds S]
//       The CPU kernels (ina::kernels::cpu) on each path this CPU has (reference =
//       protocol/quantize.cc, avx2), per dtype, the way the worker uses them: the buffer is
//       processed in blocks of 256 elements; quantize = scan_block + encode (or encode_wire,
//       fused big-endian packet words), dequantize = decode (or decode_wire). Beside them, memcpy
//       of the same buffer.
//   ina-kernel-bench cuda [--elems N] [--iters I]     (built with the CUDA kernels)
//       The CUDA kernels on device memory: quantize = scan_blocks + encode_blocks, dequantize =
//       decode_blocks, per dtype, beside a device-to-device cudaMemcpy of the same buffer in the
//       same run.
//
// GB/s is 1e9 bytes of the user's buffer (N elements of the dtype) per second; "traffic" adds
// every byte the step reads and writes (quantize of float32: 4 B read, 4 B written per element;
// memcpy: 2x the buffer), the figure to hold against memory bandwidth.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ina/base/half.h"
#include "ina/kernels/cpu_quant.h"
#include "ina/protocol/quantize.h"
#include "ina_config.h"

#if INA_HAVE_CUDA_KERNELS
#include <cuda_runtime_api.h>

#include "ina/kernels/cuda_probe.h"
#include "ina/kernels/cuda_quant.h"
#endif

namespace {

using ina::DType;
using ina::ReduceOp;
namespace cpu = ina::kernels::cpu;

constexpr uint32_t kWorld = 8;
constexpr size_t kBlock = 256;
constexpr DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

const char* type_name(DType t) {
  return t == DType::kFloat32 ? "float32" : (t == DType::kFloat16 ? "float16" : "bfloat16");
}

// Gaussian gradients of the dtype, as raw bytes.
std::vector<uint8_t> make_input(DType t, size_t n) {
  std::mt19937_64 rng(42);
  std::normal_distribution<float> g(0.0f, 1e-2f);
  const size_t elem = ina::dtype_size(t);
  std::vector<uint8_t> buf(n * elem);
  for (size_t i = 0; i < n; ++i) {
    const float x = g(rng);
    if (t == DType::kFloat32) {
      std::memcpy(buf.data() + i * 4, &x, 4);
    } else {
      const uint16_t h = t == DType::kFloat16 ? ina::float_to_half(x) : ina::float_to_bf16(x);
      std::memcpy(buf.data() + i * 2, &h, 2);
    }
  }
  return buf;
}

// Runs fn repeatedly for about `seconds`; returns the best seconds per call of 5 rounds.
template <typename F>
double time_best(F&& fn, double seconds) {
  using clock = std::chrono::steady_clock;
  fn();  // warm up (page faults, caches)
  size_t reps = 1;
  for (;;) {  // calibrate: one round takes about seconds / 5
    const auto t0 = clock::now();
    for (size_t r = 0; r < reps; ++r) fn();
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    if (dt > seconds / 5 || reps > (1u << 20)) break;
    reps *= 2;
  }
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = clock::now();
    for (size_t r = 0; r < reps; ++r) fn();
    const double dt = std::chrono::duration<double>(clock::now() - t0).count() / reps;
    best = dt < best ? dt : best;
  }
  return best;
}

int run_cpu(size_t n, double seconds) {
  n = (n + kBlock - 1) / kBlock * kBlock;
  std::printf("# CPU kernels: %zu elements per buffer, blocks of %zu, SUM, world %u; best of 5\n",
              n, kBlock, kWorld);
  std::printf("# GB/s = 1e9 bytes of the input buffer per second (one thread)\n");
  std::printf("# best path on this CPU: %s\n", cpu::isa_name(cpu::best_isa()));
  std::printf("%-9s %-10s %12s %12s %12s %12s %12s\n", "dtype", "path", "quantize", "quant+wire",
              "dequantize", "dequant+wire", "memcpy");
  const std::vector<cpu::Isa> paths =
      cpu::best_isa() == cpu::Isa::kAvx2
          ? std::vector<cpu::Isa>{cpu::Isa::kReference, cpu::Isa::kAvx2}
          : std::vector<cpu::Isa>{cpu::Isa::kReference};
  for (const DType t : kTypes) {
    const size_t elem = ina::dtype_size(t);
    const std::vector<uint8_t> in = make_input(t, n);
    std::vector<int32_t> q(n);
    std::vector<uint8_t> wire(n * 4), out(n * elem), copy(n * elem);
    const size_t nb = n / kBlock;
    std::vector<int16_t> exps(nb);
    const double bytes = static_cast<double>(n * elem);
    const double t_memcpy =
        time_best([&] { std::memcpy(copy.data(), in.data(), n * elem); }, seconds);
    for (const cpu::Isa isa : paths) {
      if (!cpu::force_isa(isa)) continue;
      const double t_q = time_best(
          [&] {
            for (size_t b = 0; b < nb; ++b) {
              const void* src = in.data() + b * kBlock * elem;
              const ina::quant::BlockScan s = cpu::scan_block(src, kBlock, t, ReduceOp::kSum);
              cpu::encode(src, kBlock, t, ReduceOp::kSum, s.exp, kWorld, q.data() + b * kBlock);
              exps[b] = s.exp;
            }
          },
          seconds);
      const double t_qw = time_best(
          [&] {
            for (size_t b = 0; b < nb; ++b) {
              const void* src = in.data() + b * kBlock * elem;
              const ina::quant::BlockScan s = cpu::scan_block(src, kBlock, t, ReduceOp::kSum);
              cpu::encode_wire(src, kBlock, t, ReduceOp::kSum, s.exp, kWorld,
                               wire.data() + b * kBlock * 4);
            }
          },
          seconds);
      const double t_d = time_best(
          [&] {
            for (size_t b = 0; b < nb; ++b) {
              cpu::decode(q.data() + b * kBlock, kBlock, t, ReduceOp::kSum, exps[b], kWorld,
                          out.data() + b * kBlock * elem);
            }
          },
          seconds);
      const double t_dw = time_best(
          [&] {
            for (size_t b = 0; b < nb; ++b) {
              cpu::decode_wire(wire.data() + b * kBlock * 4, kBlock, t, ReduceOp::kSum, exps[b],
                               kWorld, out.data() + b * kBlock * elem);
            }
          },
          seconds);
      std::printf("%-9s %-10s %12.2f %12.2f %12.2f %12.2f %12.2f\n", type_name(t),
                  cpu::isa_name(isa), bytes / t_q / 1e9, bytes / t_qw / 1e9, bytes / t_d / 1e9,
                  bytes / t_dw / 1e9, bytes / t_memcpy / 1e9);
    }
  }
  (void)cpu::force_isa(cpu::best_isa());
  return 0;
}

#if INA_HAVE_CUDA_KERNELS
#define CUDA_OK(call)                                                  \
  do {                                                                 \
    const cudaError_t e_ = (call);                                     \
    if (e_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_)); \
      return 1;                                                        \
    }                                                                  \
  } while (0)
#define INA_OK(call)                                                   \
  do {                                                                 \
    const ina::Status s_ = (call);                                     \
    if (!s_.ok()) {                                                    \
      std::fprintf(stderr, "%s: %s\n", #call, s_.to_string().c_str()); \
      return 1;                                                        \
    }                                                                  \
  } while (0)

int run_cuda(size_t n, int iters) {
  namespace kc = ina::kernels::cuda;
  const ina::features::Probe p = ina::features::probe_cuda();
  if (!p.usable) {
    std::printf("no usable CUDA device: %s\n", p.detail.c_str());
    return 77;
  }
  n = (n + kBlock - 1) / kBlock * kBlock;
  const size_t nb = n / kBlock;
  std::printf("# CUDA kernels on %s: %zu elements, blocks of %zu, SUM, world %u, best of %d\n",
              p.detail.c_str(), n, kBlock, kWorld, iters);
  std::printf("# GB/s = 1e9 bytes of the input buffer per second; traffic = bytes read+written\n");
  std::printf("%-9s %12s %12s %12s %12s %12s %12s\n", "dtype", "quantize", "(traffic)",
              "dequantize", "(traffic)", "d2d memcpy", "(traffic)");
  void *d_in = nullptr, *d_out = nullptr, *d_copy = nullptr;
  int32_t* d_q = nullptr;
  int16_t* d_exps = nullptr;
  uint8_t* d_nf = nullptr;
  CUDA_OK(cudaMalloc(&d_in, n * 4));
  CUDA_OK(cudaMalloc(&d_out, n * 4));
  CUDA_OK(cudaMalloc(&d_copy, n * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_q), n * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_exps), nb * 2));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d_nf), nb));
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  for (const DType t : kTypes) {
    const size_t elem = ina::dtype_size(t);
    const std::vector<uint8_t> in = make_input(t, n);
    CUDA_OK(cudaMemcpy(d_in, in.data(), n * elem, cudaMemcpyHostToDevice));
    float best_q = 1e30f, best_d = 1e30f, best_c = 1e30f;
    for (int it = 0; it < iters + 1; ++it) {  // the first round warms up
      float ms = 0;
      CUDA_OK(cudaEventRecord(a));
      INA_OK(kc::scan_blocks(d_in, n, t, ReduceOp::kSum, kBlock, d_exps, d_nf, nullptr));
      INA_OK(kc::encode_blocks(d_in, n, t, ReduceOp::kSum, kBlock, d_exps, kWorld, d_q, false,
                               nullptr));
      CUDA_OK(cudaEventRecord(b));
      CUDA_OK(cudaEventSynchronize(b));
      CUDA_OK(cudaEventElapsedTime(&ms, a, b));
      if (it > 0 && ms < best_q) best_q = ms;
      CUDA_OK(cudaEventRecord(a));
      INA_OK(kc::decode_blocks(d_q, n, t, ReduceOp::kSum, kBlock, d_exps, d_nf, kWorld, d_out,
                               false, nullptr));
      CUDA_OK(cudaEventRecord(b));
      CUDA_OK(cudaEventSynchronize(b));
      CUDA_OK(cudaEventElapsedTime(&ms, a, b));
      if (it > 0 && ms < best_d) best_d = ms;
      CUDA_OK(cudaEventRecord(a));
      CUDA_OK(cudaMemcpyAsync(d_copy, d_in, n * elem, cudaMemcpyDeviceToDevice));
      CUDA_OK(cudaEventRecord(b));
      CUDA_OK(cudaEventSynchronize(b));
      CUDA_OK(cudaEventElapsedTime(&ms, a, b));
      if (it > 0 && ms < best_c) best_c = ms;
    }
    const double bytes = static_cast<double>(n * elem);
    // quantize reads the input twice (scan, encode) and writes 4 B per element (+ exponents);
    // dequantize reads 4 B per element and writes the output; memcpy reads and writes once.
    const double q_traffic = 2 * bytes + 4.0 * n;
    const double d_traffic = 4.0 * n + bytes;
    std::printf("%-9s %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f\n", type_name(t),
                bytes / (best_q * 1e-3) / 1e9, q_traffic / (best_q * 1e-3) / 1e9,
                bytes / (best_d * 1e-3) / 1e9, d_traffic / (best_d * 1e-3) / 1e9,
                bytes / (best_c * 1e-3) / 1e9, 2 * bytes / (best_c * 1e-3) / 1e9);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(d_in);
  cudaFree(d_out);
  cudaFree(d_copy);
  cudaFree(d_q);
  cudaFree(d_exps);
  cudaFree(d_nf);
  return 0;
}
#endif

void usage() {
  std::fprintf(stderr,
               "usage: ina-kernel-bench cpu [--elems N] [--seconds S]\n"
               "       ina-kernel-bench cuda [--elems N] [--iters I]%s\n"
               "       ina-kernel-bench --version\n",
               INA_HAVE_CUDA_KERNELS ? "" : "   (not built: needs -Dcuda=enabled and nvcc)");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "--version") {
    std::printf("ina-kernel-bench %s\n", INA_VERSION);
    return 0;
  }
  size_t elems = 0;
  double seconds = 0.5;
  int iters = 20;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--elems" && i + 1 < argc) {
      elems = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::strtod(argv[++i], nullptr);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else {
      usage();
      return 2;
    }
  }
  if (iters < 1) iters = 1;
  if (mode == "cpu") return run_cpu(elems ? elems : (size_t{1} << 20), seconds);
  if (mode == "cuda") {
#if INA_HAVE_CUDA_KERNELS
    return run_cuda(elems ? elems : (size_t{64} << 20), iters);
#else
    std::printf("ina-kernel-bench was built without the CUDA kernels\n");
    return 77;
#endif
  }
  usage();
  return 2;
}
