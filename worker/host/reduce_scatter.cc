// ReduceScatter: the first half of ring AllReduce (ring.cc), with the segments equal to the
// output blocks and the schedule shifted so that rank r ends owning block r. The ring reduces into
// a scratch buffer, reading the input where it is, and block r is copied out at the end.
// Each rank sends and receives (P-1)/P of the input in P-1 pipelined steps.
#include "worker/host/reduce_scatter.h"

#include <cstring>
#include <vector>

#include "worker/host/common.h"
#include "worker/host/ring.h"

namespace ina::host {

Status reduce_scatter(Context& ctx, const void* send, void* recv, size_t count, DType t,
                      ReduceOp op, const ReduceScatterOptions& opts) {
  INA_RETURN_IF_ERROR(check_dtype_op("reduce_scatter", t, op));
  INA_RETURN_IF_ERROR(check_buffers("reduce_scatter", send, recv, count));
  if (count == 0) return ok_status();
  const size_t es = dtype_size(t);
  const int p = ctx.size();
  const size_t total = count * static_cast<size_t>(p);
  if (p == 1) {
    std::memmove(recv, send, count * es);
    return ok_status();
  }
  // The ring reduces into `work` and reads each input piece from `send` until it has written that
  // piece (ring.h), so the input is not copied first.
  uint8_t* work = ctx.scratch(2, total * es);
  std::vector<size_t> offsets(static_cast<size_t>(p) + 1);
  for (int i = 0; i <= p; ++i) offsets[i] = count * static_cast<size_t>(i);
  RingPhases phases;
  phases.allgather = false;
  phases.owned = ctx.rank();
  INA_RETURN_IF_ERROR(ring_run(ctx, work, offsets, t, op, phases, opts.chunk_bytes,
                               static_cast<const uint8_t*>(send)));
  std::memcpy(recv, work + offsets[ctx.rank()] * es, count * es);
  return ok_status();
}

}  // namespace ina::host
