// Ring AllReduce: a reduce-scatter followed by an allgather around the ring r -> r+1, both
// pipelined in chunks of chunk_bytes so that reducing one chunk overlaps receiving the next (the
// schedule is in ring.cc). Each rank sends and receives 2(P-1)/P of the buffer, the minimum for
// any AllReduce without in-network reduction, at the cost of 2(P-1) message latencies: the
// algorithm of choice for large buffers (Baidu's ring, Gloo's allreduce_ring_chunked, NCCL's ring).
// Segment i is elements [i*n/P, (i+1)*n/P); rank r ends the reduce-scatter owning segment r+1.
#include <cstdint>
#include <cstring>
#include <vector>

#include "worker/host/allreduce.h"
#include "worker/host/common.h"
#include "worker/host/ring.h"

namespace ina::host {

Status allreduce_ring(Context& ctx, const void* send, void* recv, size_t count, DType t,
                      ReduceOp op, size_t chunk_bytes) {
  INA_RETURN_IF_ERROR(check_dtype_op("allreduce", t, op));
  INA_RETURN_IF_ERROR(check_buffers("allreduce", send, recv, count));
  if (count == 0) return ok_status();
  const int p = ctx.size();
  const size_t bytes = count * dtype_size(t);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  // Out of place, the ring reads the input where it is (ring.h); overlapping buffers are copied.
  const auto a = reinterpret_cast<uintptr_t>(send), b = reinterpret_cast<uintptr_t>(recv);
  const bool disjoint = a + bytes <= b || b + bytes <= a;
  const uint8_t* src = nullptr;
  if (send != recv) {
    if (p == 1 || !disjoint)
      std::memmove(recv, send, bytes);
    else
      src = in;
  }
  std::vector<size_t> offsets(static_cast<size_t>(p) + 1);
  for (int i = 0; i <= p; ++i)
    offsets[i] = split_point(count, static_cast<size_t>(p), static_cast<size_t>(i));
  RingPhases phases;
  phases.owned = mod(ctx.rank() + 1, p);
  return ring_run(ctx, out, offsets, t, op, phases, chunk_bytes, src);
}

}  // namespace ina::host
