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
// piece by piece; message g = s*K + k is piece k of step s (step-major, piece-minor, the same
// order on both ends of a link, which is what the Context's in-order matching needs). The segment
// a rank sends at step s+1 is the one it received at step s, so piece k of step s+1 is posted as
// soon as piece k of step s has been reduced: the reduction of one piece overlaps the transfer of
// the following ones, and steps overlap each other.
//
// Window: at most W = min(kWindow, K) messages are posted ahead, sends and receives alike
// (message g is posted once message g - W has been handled). Reduce-scatter pieces land in slot
// g % kWindow of a small scratch window, which therefore stays in the CPU cache between the
// receive that writes it and the reduction that reads it; and a link carries about W pieces
// rather than a whole segment queued in the socket buffers. (This schedule once received whole
// segments into segment-sized scratch and posted every first-step send at once: at 2 ranks perf
// showed it spending 3-4x the tree's CPU time in the reduction and in the kernel's copy to user
// space, both reading data that had left the cache.) Allgather pieces land in place; before a
// region is overwritten (or reduced into) the send that still reads it is waited. Every wait
// depends only on messages of lower index on some rank, so a window of any size cannot deadlock.
//
// Out of place (src != nullptr): a piece is read from src until the ring writes it in buf
// (copied next to its reduction, while the piece is in cache), instead of copying the whole input
// to buf first: that copy cost as much memory traffic as a reduce-scatter step.
#include "worker/host/ring.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "worker/host/common.h"
#include "worker/host/reduce.h"

namespace ina::host {

namespace {
constexpr size_t kWindow = 4;
}

Status ring_run(Context& ctx, uint8_t* buf, std::span<const size_t> seg_offsets, DType t,
                ReduceOp op, const RingPhases& phases, size_t chunk_bytes, const uint8_t* src) {
  const int p = ctx.size();
  const int rank = ctx.rank();
  if (p == 1) return ok_status();
  if (seg_offsets.size() != static_cast<size_t>(p) + 1)
    return internal_error("ring: need world size + 1 segment offsets");
  if (src != nullptr && !phases.reduce_scatter)
    return internal_error("ring: an out-of-place input needs the reduce-scatter phase");
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
  const size_t max_piece = (max_seg + k_pieces - 1) / k_pieces;  // >= every piece's length
  const size_t total = steps.size() * k_pieces;

  auto piece = [&](int seg, size_t k, size_t* lo, size_t* len) {
    const size_t n = seg_offsets[seg + 1] - seg_offsets[seg];
    const size_t a = split_point(n, k_pieces, k);
    *lo = a;  // relative to the segment
    *len = split_point(n, k_pieces, k + 1) - a;
  };
  auto at = [&](uint8_t* base, int seg, size_t lo) {
    return base + (seg_offsets[seg] + lo) * esize;
  };
  auto idx = [&](int seg, size_t k) { return static_cast<size_t>(seg) * k_pieces + k; };

  uint8_t* window = nullptr;
  if (phases.reduce_scatter) window = ctx.scratch(0, kWindow * max_piece * esize);
  auto slot = [&](size_t g) { return window + (g % kWindow) * max_piece * esize; };
  // Out of place: which pieces of buf the ring has written (the others are still in src).
  std::vector<uint8_t> written(src != nullptr ? static_cast<size_t>(p) * k_pieces : 0, 0);
  auto in_buf = [&](int seg, size_t k) { return src == nullptr || written[idx(seg, k)] != 0; };
  // The last send still reading each (segment, piece) region of buf, and every send.
  std::vector<Context::Handle> reading(static_cast<size_t>(p) * k_pieces, 0);
  std::vector<Context::Handle> sends;
  sends.reserve(total);
  std::vector<Context::Handle> recvs(kWindow, 0);
  // Messages posted ahead, sends and receives alike: at most the window, and at most one step (K
  // pieces), so that message g = (s+1)*K + k is posted only after piece k of step s was handled:
  // by then the piece it sends has been reduced, and every earlier use of the region it receives
  // into (the reduction into it, the send posted from it) has been issued.
  const size_t ahead = std::min(kWindow, k_pieces);

  auto post_send = [&](size_t g) {
    const size_t s = g / k_pieces, k = g % k_pieces;
    const int seg = steps[s].send_seg;
    size_t lo = 0, len = 0;
    piece(seg, k, &lo, &len);
    if (in_buf(seg, k)) {
      const Context::Handle h = ctx.isend(right, at(buf, seg, lo), len * esize);
      reading[idx(seg, k)] = h;
      sends.push_back(h);
    } else {
      sends.push_back(ctx.isend(right, at(const_cast<uint8_t*>(src), seg, lo), len * esize));
    }
  };
  auto post_recv = [&](size_t g) -> Status {
    const size_t s = g / k_pieces, k = g % k_pieces;
    const int seg = steps[s].recv_seg;
    size_t lo = 0, len = 0;
    piece(seg, k, &lo, &len);
    if (steps[s].reduce) {
      recvs[g % kWindow] = ctx.irecv(left, slot(g), len * esize);
    } else {
      INA_RETURN_IF_ERROR(ctx.wait(reading[idx(seg, k)]));
      recvs[g % kWindow] = ctx.irecv(left, at(buf, seg, lo), len * esize);
      if (src != nullptr) written[idx(seg, k)] = 1;
    }
    return ok_status();
  };

  for (size_t g = 0; g < std::min(ahead, total); ++g) {
    post_send(g);
    INA_RETURN_IF_ERROR(post_recv(g));
  }
  for (size_t g = 0; g < total; ++g) {
    const size_t s = g / k_pieces, k = g % k_pieces;
    const Step& st = steps[s];
    INA_RETURN_IF_ERROR(ctx.wait(recvs[g % kWindow]));
    if (st.reduce) {
      size_t lo = 0, len = 0;
      piece(st.recv_seg, k, &lo, &len);
      uint8_t* dst = at(buf, st.recv_seg, lo);
      if (!in_buf(st.recv_seg, k)) {
        std::memcpy(dst, at(const_cast<uint8_t*>(src), st.recv_seg, lo), len * esize);
        written[idx(st.recv_seg, k)] = 1;
      } else {
        INA_RETURN_IF_ERROR(ctx.wait(reading[idx(st.recv_seg, k)]));
      }
      reduce_into(dst, slot(g), len, t, op);
    }
    // Message g is handled: the send and the receive `ahead` further may go (the receive may use
    // g's slot). The send first: it is what the next rank waits for, and a receive posted into
    // the region it reads then waits for it.
    if (g + ahead < total) {
      post_send(g + ahead);
      INA_RETURN_IF_ERROR(post_recv(g + ahead));
    }
  }
  return ctx.wait_all(sends);
}

}  // namespace ina::host
