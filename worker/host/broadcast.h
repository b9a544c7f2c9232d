// Broadcast: `count` elements of root's buf are copied into buf on every rank.
#pragma once

#include <cstddef>

#include "ina/base/status.h"
#include "ina/protocol/types.h"
#include "worker/host/context.h"

namespace ina::host {

struct BroadcastOptions {
  int root = 0;
  size_t chunk_bytes = 256 << 10;  // pipelining granularity
};

Status broadcast(Context& ctx, void* buf, size_t count, DType t, const BroadcastOptions& opts = {});

}  // namespace ina::host
