// Pure logic of the CollNet plugin, apart from its I/O: which NCCL (datatype, op) pairs INA
// reduces, and how a window of an allgather / reduce-scatter splits over the ranks' slices
// (collnet_v8.h says what a window is).
#pragma once

#include <cstddef>
#include <vector>

#include "ina/protocol/types.h"
#include "integrations/nccl/collnet_v8.h"

namespace ina::nccl {

// The NCCL datatypes libina has: int32 (exact), float32, float16, bfloat16 (SUM quantized as in
// protocol/QUANTIZATION.md; MIN/MAX exact), and NCCL 2.28's fp8 (ncclFloat8e4m3, ncclFloat8e5m2:
// ina/protocol/fp8.h). Others (8/64-bit integers, unsigned, float64) are refused.
inline bool map_dtype(ncclDataType_t t, DType* out) {
  switch (t) {
    case ncclInt32: *out = DType::kInt32; return true;
    case ncclFloat32: *out = DType::kFloat32; return true;
    case ncclFloat16: *out = DType::kFloat16; return true;
    case ncclBfloat16: *out = DType::kBFloat16; return true;
    case ncclFloat8e4m3: *out = DType::kFloat8E4M3; return true;
    case ncclFloat8e5m2: *out = DType::kFloat8E5M2; return true;
    default: return false;
  }
}

// Whether the in-network path carries the mapped type (the same rule as the worker's
// ShardedEngine::supports): wire v2 carries every mapped type, float8 included, at its width.
inline bool in_network(DType /*d*/) { return true; }

// SUM, MIN, MAX; PROD and AVG (and user-defined ops) are refused.
inline bool map_op(ncclRedOp_t op, ReduceOp* out) {
  switch (op) {
    case ncclSum: *out = ReduceOp::kSum; return true;
    case ncclMin: *out = ReduceOp::kMin; return true;
    case ncclMax: *out = ReduceOp::kMax; return true;
    default: return false;
  }
}

inline bool supported(ncclDataType_t t, ncclRedOp_t op) {
  DType d;
  ReduceOp o;
  return map_dtype(t, &d) && map_op(op, &o) && in_network(d);
}

// The part of a window that lies in one rank's slice.
struct Segment {
  int owner;          // the rank whose slice holds it
  size_t window_pos;  // where it starts in the window (0 for the first segment)
  size_t bytes;
};

// Splits [window_offset, window_offset + window_bytes) at slice boundaries. The owner's pointer
// (allgather's sendData, reduce-scatter's recvData) addresses the segment's first byte: from the
// window's offset inside the slice for the first segment, from the slice's start for the others.
// Empty when the window is empty; false when it reaches past nranks * bytes_per_rank.
inline bool split_window(size_t bytes_per_rank, size_t window_offset, size_t window_bytes,
                         int nranks, std::vector<Segment>* out) {
  out->clear();
  if (window_bytes == 0) return true;
  if (bytes_per_rank == 0 || nranks <= 0) return false;
  const size_t total = bytes_per_rank * static_cast<size_t>(nranks);
  if (window_offset > total || window_bytes > total - window_offset) return false;
  size_t pos = window_offset;
  const size_t end = window_offset + window_bytes;
  while (pos < end) {
    const size_t owner = pos / bytes_per_rank;
    const size_t slice_end = (owner + 1) * bytes_per_rank;
    const size_t seg_end = slice_end < end ? slice_end : end;
    out->push_back(Segment{static_cast<int>(owner), pos - window_offset, seg_end - pos});
    pos = seg_end;
  }
  return true;
}

}  // namespace ina::nccl
