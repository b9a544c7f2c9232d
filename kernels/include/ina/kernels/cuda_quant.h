// CUDA quantize/dequantize kernels on device memory, bit for bit equal to protocol/quantize.cc.
//
// A buffer of n elements is cut into blocks of `block_elems` elements (the last one may be
// short): block i covers elements [i*K, min((i+1)*K, n)), K = block_elems, so there are
// ceil(n / K) blocks. Per block:
//   scan_blocks    writes the block's exponent (quant::scan_block's exp) and its NONFINITE flag;
//   encode_blocks  writes the int32 words (quant::encode with that block's shared exponent);
//   decode_blocks  writes the outputs (quant::decode), or quiet NaNs (quant::fill_nan) for a
//                  block whose NONFINITE flag is set.
// All pointers except `stream` are device pointers (or managed memory). Per-block arrays hold
// ceil(n / K) entries. `exps` is read only for float SUM and may be null otherwise; `nonfinite`
// may be null (no block is flagged). `big_endian` makes the int32 words wire order
// (store_be_words's layout), for staging packets straight from device memory.
//
// Calls are asynchronous on `stream` (a cudaStream_t; null is the default stream). They return
// kInvalidArgument for bad arguments and kUnavailable when the launch fails (no device, no
// driver); kernel faults surface at the next synchronization, as with any CUDA call.
//
// The header needs no CUDA include, so host code of any component can call these.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ina/base/status.h"
#include "ina/protocol/types.h"

namespace ina::kernels::cuda {

inline constexpr uint32_t kDefaultBlockElems = 256;

inline constexpr size_t num_blocks(size_t n, uint32_t block_elems) {
  return block_elems == 0 ? 0 : (n + block_elems - 1) / block_elems;
}

Status scan_blocks(const void* src, size_t n, DType t, ReduceOp op, uint32_t block_elems,
                   int16_t* exps, uint8_t* nonfinite, void* stream);

Status encode_blocks(const void* src, size_t n, DType t, ReduceOp op, uint32_t block_elems,
                     const int16_t* exps, uint32_t world_size, int32_t* q, bool big_endian,
                     void* stream);

Status decode_blocks(const int32_t* q, size_t n, DType t, ReduceOp op, uint32_t block_elems,
                     const int16_t* exps, const uint8_t* nonfinite, uint32_t world_size, void* dst,
                     bool big_endian, void* stream);

// n quiet NaNs of type t (quant::fill_nan); int32 leaves dst unchanged.
Status fill_nan(void* dst, size_t n, DType t, void* stream);

}  // namespace ina::kernels::cuda
