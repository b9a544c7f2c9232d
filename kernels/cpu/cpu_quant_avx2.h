// Internal: the AVX2 + F16C + FMA loops behind ina::kernels::cpu (cpu_quant.h). Only call them
// after checking that the CPU supports those extensions (cpu_quant.cc does, once).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ina/protocol/quantize.h"
#include "ina/protocol/types.h"

namespace ina::kernels::cpu::avx2 {

// True when this build has the AVX2 loops (x86-64 with GCC or Clang).
bool compiled();

quant::BlockScan scan_block(const void* src, size_t n, DType t, ReduceOp op);
void encode(const void* src, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            int32_t* q);
void encode_wire(const void* src, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
                 uint8_t* dst);
void decode(const int32_t* q, size_t n, DType t, ReduceOp op, int16_t exp, uint32_t world_size,
            void* dst);
void decode_wire(const uint8_t* src, size_t n, DType t, ReduceOp op, int16_t exp,
                 uint32_t world_size, void* dst);

}  // namespace ina::kernels::cpu::avx2
