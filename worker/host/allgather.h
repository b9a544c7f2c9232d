// AllGather: every rank contributes `count` elements; recv (size() * count elements) receives
// rank i's contribution at block i on every rank.
#pragma once

#include <cstddef>

#include "ina/base/status.h"
#include "ina/protocol/types.h"
#include "worker/host/context.h"

namespace ina::host {

struct AllgatherOptions {
  size_t chunk_bytes = 256 << 10;  // pipelining granularity
};

// send may alias block rank() of recv.
Status allgather(Context& ctx, const void* send, void* recv, size_t count, DType t,
                 const AllgatherOptions& opts = {});

}  // namespace ina::host
