// Dispatch of ina::kernels::cpu: the AVX2 loops where the CPU has them, the reference elsewhere.
#include "ina/kernels/cpu_quant.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "cpu_quant_avx2.h"
#include "ina/protocol/wire.h"

namespace ina::kernels::cpu {
namespace {

bool cpu_has_avx2() {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  // libgcc's probe also checks that the OS saves the YMM registers (XGETBV).
  return avx2::compiled() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
         __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// The path in use; chosen at first use. INA_CPU_KERNELS=reference forces the reference (for
// comparing, or a CPU whose AVX2 the operator distrusts).
std::atomic<Isa>& isa_slot() {
  static std::atomic<Isa> slot{[] {
    const char* env = std::getenv("INA_CPU_KERNELS");
    if (env != nullptr && std::strcmp(env, "reference") == 0) return Isa::kReference;
    return best_isa();
  }()};
  return slot;
}

// float8 has no AVX2 loops (yet): the reference serves it on every ISA.
inline bool use_avx2() { return isa_slot().load(std::memory_order_relaxed) == Isa::kAvx2; }

}  // namespace

const char* isa_name(Isa isa) { return isa == Isa::kAvx2 ? "avx2" : "reference"; }

Isa best_isa() {
  static const Isa best = cpu_has_avx2() ? Isa::kAvx2 : Isa::kReference;
  return best;
}

Isa active_isa() { return isa_slot().load(std::memory_order_relaxed); }

bool force_isa(Isa isa) {
  if (isa == Isa::kAvx2 && best_isa() != Isa::kAvx2) return false;
  isa_slot().store(isa, std::memory_order_relaxed);
  return true;
}

quant::BlockScan scan_block(const void* src, size_t n, DType t, ReduceOp op) {
  return use_avx2() && !is_float8(t) ? avx2::scan_block(src, n, t, op)
                                     : quant::scan_block(src, n, t, op);
}

void encode(const void* src, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            int32_t* q) {
  if (use_avx2() && !is_float8(t)) return avx2::encode(src, n, t, op, exp, world_size, q);
  quant::encode(src, n, t, op, exp, world_size, q);
}

void decode(const int32_t* q, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            void* dst) {
  if (use_avx2() && !is_float8(t)) return avx2::decode(q, n, t, op, exp, world_size, dst);
  quant::decode(q, n, t, op, exp, world_size, dst);
}

void fill_nan(void* dst, size_t n, DType t) { quant::fill_nan(dst, n, t); }

// The reference path of the fused variants: the reference in chunks through a stack buffer.
void encode_wire(const void* src, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
                 uint8_t* dst) {
  if (use_avx2() && !is_float8(t)) return avx2::encode_wire(src, n, t, op, exp, world_size, dst);
  constexpr size_t kChunk = 256;
  int32_t tmp[kChunk];
  const size_t elem = dtype_size(t);
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = n - i < kChunk ? n - i : kChunk;
    quant::encode(static_cast<const char*>(src) + i * elem, m, t, op, exp, world_size, tmp);
    store_be_words(dst + i * kV1WordSize, tmp, m);
  }
}

void decode_wire(const uint8_t* src, size_t n, DType t, ReduceOp op, int16_t exp,
                 uint32_t world_size, void* dst) {
  if (use_avx2() && !is_float8(t)) return avx2::decode_wire(src, n, t, op, exp, world_size, dst);
  constexpr size_t kChunk = 256;
  int32_t tmp[kChunk];
  const size_t elem = dtype_size(t);
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = n - i < kChunk ? n - i : kChunk;
    load_be_words(tmp, src + i * kV1WordSize, m);
    quant::decode(tmp, m, t, op, exp, world_size, static_cast<char*>(dst) + i * elem);
  }
}

}  // namespace ina::kernels::cpu
