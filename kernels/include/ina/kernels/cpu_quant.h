// CPU quantize/dequantize kernels: the API of ina::quant (protocol/quantize.h), bit for bit.
//
// Every function here returns exactly what its namesake in ina::quant returns, for every input
// (the reference is the specification; tests/kernels/cpu_quant_test.cc checks both paths
// against it). What differs is speed: on a CPU with AVX2, F16C and FMA the calls run
// hand-written 256-bit loops (kernels/cpu/cpu_quant_avx2.cc); elsewhere they run the reference
// itself. The choice is made once, at first use, with __builtin_cpu_supports, so one binary runs
// on every x86-64 CPU (and on other architectures, where only the reference path exists).
//
// Switching the worker engine over is a change of namespace: ina::quant::encode(...) becomes
// ina::kernels::cpu::encode(...). The *_wire variants fuse the byte swap into big-endian payload
// words (store_be_words / load_be_words) into the same pass.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ina/protocol/quantize.h"
#include "ina/protocol/types.h"

namespace ina::kernels::cpu {

// The version 1 wire words these kernels were written for: int32, big-endian, 4 bytes each
// (wire v2 carries raw user elements and no data path uses these kernels any more; they stay as
// the reference's fast twin for the kernel tests and benchmarks).
inline constexpr size_t kV1WordSize = 4;
inline void store_be_words(uint8_t* dst, const int32_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = __builtin_bswap32(static_cast<uint32_t>(src[i]));
    __builtin_memcpy(dst + i * kV1WordSize, &v, 4);
  }
}
inline void load_be_words(int32_t* dst, const uint8_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t v;
    __builtin_memcpy(&v, src + i * kV1WordSize, 4);
    dst[i] = static_cast<int32_t>(__builtin_bswap32(v));
  }
}

// Same semantics as ina::quant::scan_block / encode / decode / fill_nan.
quant::BlockScan scan_block(const void* src, size_t n, DType t, ReduceOp op);
void encode(const void* src, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            int32_t* q);
void decode(const int32_t* q, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            void* dst);
void fill_nan(void* dst, size_t n, DType t);

// encode(...) followed by store_be_words(dst, q, n): n big-endian 4-byte words at dst (no
// alignment required).
void encode_wire(const void* src, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
                 uint8_t* dst);
// load_be_words(q, src, n) followed by decode(q, ...).
void decode_wire(const uint8_t* src, size_t n, DType t, ReduceOp op, int16_t exp,
                 uint32_t world_size, void* dst);

// Which loops the calls above run.
enum class Isa : uint8_t {
  kReference = 0,  // protocol/quantize.cc (the compiler's baseline vectorization)
  kAvx2 = 1,       // AVX2 + F16C + FMA
};
const char* isa_name(Isa isa);
// The best path this CPU supports (what is used unless forced).
Isa best_isa();
// The path in use now.
Isa active_isa();
// Forces a path (tests, benchmarks). Returns false, and changes nothing, when the CPU cannot run
// it. Not meant to be flipped while other threads call the kernels (it is an atomic, so doing so
// is safe, merely pointless).
bool force_isa(Isa isa);

}  // namespace ina::kernels::cpu
