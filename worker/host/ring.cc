// Ring schedule (reduce-scatter + allgather), pipelined in chunks.
//
// The buffer is cut into P segments (P = world size). Rank r sends to r+1 and receives from r-1.
// Reduce-scatter: at step s (0 <= s < P-1) rank r sends segment X-1-s and receives segment X-2-s,
// which it reduces into its own copy; X is the segment the rank owns at the end (X = r+1 for
// AllReduce, X = r for ReduceScatter). After P-1 steps segment X holds the reduction of all P
// ranks. Allgather: at step t rank r sends segment X-t and receives segment X-t-1 in place, so
// after P-1 more steps every rank holds every reduced segment. Each rank sends and receives
// 2(P-1)/P of the buffer, the bandwidth optimum, in 2(P-1) latency steps.
//
// Pipelining: every segment is cut into K pieces of at most chunk_bytes, and the schedule runs
// piece by piece. The segment a rank sends at step s+1 is the one it received at step s, so
// piece k of step s+1 is posted as soon as piece k of step s has been reduced: the reduction of
// one piece overlaps the transfer of the following ones, and steps overlap each other. Incoming
// reduce-scatter pieces land in one of two scratch buffers (alternating by step; piece k of step
// s+1 reuses the slot of piece k of step s-1, which was reduced already). Allgather pieces land in
// place; before a region is overwritten (or reduced into) the send that still reads it is waited.
// Message order per link is the same on both ends (step-major, piece-minor), which is what the
// Context's in-order matching needs.
#include "worker/host/ring.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "worker/host/common.h"
#include "worker/host/reduce.h"

namespace ina::host {

Status ring_run(Context& ctx, uint8_t* buf, std::span<const size_t> seg_offsets, DType t,
                ReduceOp op, const RingPhases& phases, size_t chunk_bytes) {
  const int p = ctx.size();
  const int rank = ctx.rank();
  if (p == 1) return ok_status();
  if (seg_offsets.size() != static_cast<size_t>(p) + 1)
    return internal_error("ring: need world size + 1 segment offsets");
  const size_t esize = dtype_size(t);
  const int left = mod(rank - 1, p);
  const int right = mod(rank + 1, p);

  struct Step {
    int send_seg;
    int recv_seg;
    bool reduce;
  };
  std::vector<Step> steps;
  const int x = phases.owned;
  if (phases.reduce_scatter)
    for (int s = 0; s < p - 1; ++s) steps.push_back({mod(x - 1 - s, p), mod(x - 2 - s, p), true});
  if (phases.allgather)
    for (int s = 0; s < p - 1; ++s) steps.push_back({mod(x - s, p), mod(x - s - 1, p), false});
  if (steps.empty()) return ok_status();

  size_t max_seg = 0;
  for (int i = 0; i < p; ++i) max_seg = std::max(max_seg, seg_offsets[i + 1] - seg_offsets[i]);
  const size_t chunk_elems = std::max<size_t>(1, chunk_bytes / esize);
  const size_t k_pieces = std::max<size_t>(1, (max_seg + chunk_elems - 1) / chunk_elems);

  auto piece = [&](int seg, size_t k, size_t* lo, size_t* len) {
    const size_t n = seg_offsets[seg + 1] - seg_offsets[seg];
    const size_t a = split_point(n, k_pieces, k);
    *lo = a;  // relative to the segment
    *len = split_point(n, k_pieces, k + 1) - a;
  };
  auto region = [&](int seg, size_t lo) { return buf + (seg_offsets[seg] + lo) * esize; };

  uint8_t* scratch[2] = {nullptr, nullptr};
  if (phases.reduce_scatter) {
    scratch[0] = ctx.scratch(0, max_seg * esize);
    scratch[1] = ctx.scratch(1, max_seg * esize);
  }
  // The last send still reading each (segment, piece) region, and every send for the final wait.
  std::vector<Context::Handle> reading(static_cast<size_t>(p) * k_pieces, 0);
  std::vector<Context::Handle> sends;
  sends.reserve(steps.size() * k_pieces);
  std::vector<Context::Handle> recvs(k_pieces, 0);

  auto post = [&](size_t s, size_t k) -> Status {
    const Step& st = steps[s];
    size_t lo = 0, len = 0;
    piece(st.send_seg, k, &lo, &len);
    const Context::Handle h = ctx.isend(right, region(st.send_seg, lo), len * esize);
    reading[static_cast<size_t>(st.send_seg) * k_pieces + k] = h;
    sends.push_back(h);
    piece(st.recv_seg, k, &lo, &len);
    if (st.reduce) {
      recvs[k] = ctx.irecv(left, scratch[s % 2] + lo * esize, len * esize);
    } else {
      INA_RETURN_IF_ERROR(ctx.wait(reading[static_cast<size_t>(st.recv_seg) * k_pieces + k]));
      recvs[k] = ctx.irecv(left, region(st.recv_seg, lo), len * esize);
    }
    return ok_status();
  };

  for (size_t k = 0; k < k_pieces; ++k) INA_RETURN_IF_ERROR(post(0, k));
  for (size_t s = 0; s < steps.size(); ++s) {
    const Step& st = steps[s];
    for (size_t k = 0; k < k_pieces; ++k) {
      INA_RETURN_IF_ERROR(ctx.wait(recvs[k]));
      if (st.reduce) {
        size_t lo = 0, len = 0;
        piece(st.recv_seg, k, &lo, &len);
        INA_RETURN_IF_ERROR(ctx.wait(reading[static_cast<size_t>(st.recv_seg) * k_pieces + k]));
        reduce_into(region(st.recv_seg, lo), scratch[s % 2] + lo * esize, len, t, op);
      }
      if (s + 1 < steps.size()) INA_RETURN_IF_ERROR(post(s + 1, k));
    }
  }
  return ctx.wait_all(sends);
}

}  // namespace ina::host
