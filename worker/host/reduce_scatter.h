// ReduceScatter: send holds size() blocks of `count` elements; rank r receives in `recv`
// (`count` elements) the reduction over all ranks of block r (NCCL's ncclReduceScatter).
#pragma once

#include <cstddef>

#include "ina/base/status.h"
#include "ina/protocol/types.h"
#include "worker/host/context.h"

namespace ina::host {

struct ReduceScatterOptions {
  size_t chunk_bytes = 256 << 10;  // pipelining granularity
};

Status reduce_scatter(Context& ctx, const void* send, void* recv, size_t count, DType t,
                      ReduceOp op, const ReduceScatterOptions& opts = {});

}  // namespace ina::host
