// The ring schedule shared by ring AllReduce, ReduceScatter and AllGather (internal).
// See ring.cc for the algorithm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ina/base/status.h"
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
//
// `src`: where this rank's input is, if not already in `buf` (nullptr: it is). It must not
// overlap `buf`. The ring then reads each piece from `src` until it has written that piece of
// `buf` (a reduction, or a received piece), so no upfront copy of the whole input is needed. Only
// with the reduce-scatter phase: every piece of `buf` the caller reads afterwards must be one the
// ring wrote (with the allgather: all of them; without it: the owned segment).
Status ring_run(Context& ctx, uint8_t* buf, std::span<const size_t> seg_offsets, DType t,
                ReduceOp op, const RingPhases& phases, size_t chunk_bytes,
                const uint8_t* src = nullptr);

}  // namespace ina::host
