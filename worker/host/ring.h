// The ring schedule shared by ring AllReduce, ReduceScatter and AllGather (internal).
// See ring.cc for the algorithm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ina/protocol/status.h"
#include "ina/protocol/types.h"
#include "worker/host/context.h"

namespace ina::host {

struct RingPhases {
  bool reduce_scatter = true;
  bool allgather = true;
  // The segment this rank holds complete after the reduce-scatter (and starts the allgather with).
  int owned = 0;
};

// Runs the ring over `buf`, cut into size() segments: segment i is elements
// [seg_offsets[i], seg_offsets[i+1]) (seg_offsets has size()+1 entries).
Status ring_run(Context& ctx, uint8_t* buf, std::span<const size_t> seg_offsets, DType t,
                ReduceOp op, const RingPhases& phases, size_t chunk_bytes);

}  // namespace ina::host
