// AllGather: the second half of ring AllReduce (ring.cc). Rank r copies its block into place
// and, in P-1 pipelined steps, forwards to r+1 the block it received from r-1 in the previous
// step (starting with its own). Each rank sends and receives (P-1)/P of the output.
#include "worker/host/allgather.h"

#include <cstring>
#include <vector>

#include "worker/host/common.h"
#include "worker/host/ring.h"

namespace ina::host {

Status allgather(Context& ctx, const void* send, void* recv, size_t count, DType t,
                 const AllgatherOptions& opts) {
  if (!is_valid_dtype(static_cast<uint8_t>(t))) return invalid_argument("allgather: bad dtype");
  INA_RETURN_IF_ERROR(check_buffers("allgather", send, recv, count));
  if (count == 0) return ok_status();
  const size_t es = dtype_size(t);
  const int p = ctx.size();
  auto* out = static_cast<uint8_t*>(recv);
  std::memmove(out + count * static_cast<size_t>(ctx.rank()) * es, send, count * es);
  std::vector<size_t> offsets(static_cast<size_t>(p) + 1);
  for (int i = 0; i <= p; ++i) offsets[i] = count * static_cast<size_t>(i);
  RingPhases phases;
  phases.reduce_scatter = false;
  phases.owned = ctx.rank();
  // No reduction happens: the op is never used.
  return ring_run(ctx, out, offsets, t, ReduceOp::kSum, phases, opts.chunk_bytes);
}

}  // namespace ina::host
