// Recursive halving-doubling AllReduce (Rabenseifner's algorithm; Thakur, Rabenseifner and Gropp,
// "Optimization of Collective Communication Operations in MPICH", 2005).
//
// For a power-of-two world P2: a reduce-scatter by recursive halving, then an allgather by
// recursive doubling. In halving step d = P2/2, P2/4, ..., 1 a rank exchanges with the rank whose
// (new) index differs in bit d: the one with the bit clear keeps the lower half of its current
// window of blocks and sends the upper half, the other the reverse, and each reduces the half it
// keeps. After log2(P2) steps rank i owns block i (P2 blocks, block b = elements
// [b*n/P2, (b+1)*n/P2)) fully reduced. Doubling retraces the steps (d = 1, 2, ..., P2/2), swapping
// windows with the same partners until every rank has the whole buffer. Cost: 2 log2(P2) message
// latencies and 2(P2-1)/P2 of the buffer each way: the latency of a tree with the bandwidth of a
// ring; its reductions do not overlap the transfers, though.
//
// Other world sizes: with P2 the largest power of two <= P and r = P - P2, the first 2r ranks
// fold pairwise first: even rank 2i sends its buffer to 2i+1, which reduces it and takes part as
// new rank i; ranks >= 2r take part as new rank (rank - r). After the power-of-two part the odd
// ranks send the result back to their even partners (MPICH's scheme: 2 extra steps and one extra
// buffer each way for the folded ranks).
//
// Small buffers (at most kRecursiveDoublingMaxBytes, allreduce.h): recursive doubling instead
// (MPICH's choice for short messages). In step d = 1, 2, ..., P2/2 a rank swaps its whole buffer
// with the rank whose new index differs in bit d and both compute op(lower half's value, upper
// half's value) in that order, so both get the same bits: log2(P2) latencies instead of
// 2 log2(P2), at the price of the whole buffer per step, which is nothing for a few bytes.
#include <algorithm>
#include <cstring>
#include <vector>

#include "worker/host/allreduce.h"
#include "worker/host/common.h"
#include "worker/host/reduce.h"

namespace ina::host {

Status allreduce_halving_doubling(Context& ctx, const void* send, void* recv, size_t count, DType t,
                                  ReduceOp op) {
  INA_RETURN_IF_ERROR(check_dtype_op("allreduce", t, op));
  INA_RETURN_IF_ERROR(check_buffers("allreduce", send, recv, count));
  if (count == 0) return ok_status();
  const size_t es = dtype_size(t);
  if (send != recv) std::memmove(recv, send, count * es);
  const int p = ctx.size();
  const int rank = ctx.rank();
  if (p == 1) return ok_status();
  auto* buf = static_cast<uint8_t*>(recv);

  int p2 = 1;
  while (p2 * 2 <= p) p2 *= 2;
  const int r = p - p2;
  // Real rank of a new rank.
  auto real = [r](int nr) { return nr < r ? 2 * nr + 1 : nr + r; };

  // Scratch for the fold (the whole buffer) or the halves received while halving.
  uint8_t* tmp =
      ctx.scratch(0, std::max(rank < 2 * r || count * es <= kRecursiveDoublingMaxBytes ? count : 0,
                              count / 2 + 1) *
                         es);
  int nr = -1;  // new rank, -1 for a folded-away even rank
  if (rank < 2 * r) {
    if (rank % 2 == 0) {
      Context::Handle h = ctx.isend(rank + 1, buf, count * es);
      INA_RETURN_IF_ERROR(ctx.wait(h));
    } else {
      Context::Handle h = ctx.irecv(rank - 1, tmp, count * es);
      INA_RETURN_IF_ERROR(ctx.wait(h));
      reduce_into(buf, tmp, count, t, op);
      nr = rank / 2;
    }
  } else {
    nr = rank - r;
  }

  if (nr >= 0 && count * es <= kRecursiveDoublingMaxBytes) {
    for (int d = 1; d < p2; d *= 2) {
      const int partner = real(nr ^ d);
      INA_RETURN_IF_ERROR(ctx.sendrecv(partner, buf, count * es, partner, tmp, count * es));
      if (nr & d) {  // the partner holds the lower half's value: op(partner's, ours)
        reduce_into(tmp, buf, count, t, op);
        std::memcpy(buf, tmp, count * es);
      } else {
        reduce_into(buf, tmp, count, t, op);
      }
    }
  } else if (nr >= 0) {
    auto off = [&](int block) {
      return split_point(count, static_cast<size_t>(p2), static_cast<size_t>(block));
    };
    int lo = 0, hi = p2;  // window of blocks
    for (int d = p2 / 2; d >= 1; d /= 2) {
      const int partner = real(nr ^ d);
      const int mid = (lo + hi) / 2;
      int keep_lo = lo, keep_hi = mid, give_lo = mid, give_hi = hi;
      if (nr & d) {
        keep_lo = mid;
        keep_hi = hi;
        give_lo = lo;
        give_hi = mid;
      }
      const size_t keep_n = off(keep_hi) - off(keep_lo);
      const size_t give_n = off(give_hi) - off(give_lo);
      INA_RETURN_IF_ERROR(
          ctx.sendrecv(partner, buf + off(give_lo) * es, give_n * es, partner, tmp, keep_n * es));
      reduce_into(buf + off(keep_lo) * es, tmp, keep_n, t, op);
      lo = keep_lo;
      hi = keep_hi;
    }
    for (int d = 1; d < p2; d *= 2) {
      const int partner = real(nr ^ d);
      const int plo = (nr & d) ? lo - d : hi;
      const int phi = plo + d;
      INA_RETURN_IF_ERROR(ctx.sendrecv(partner, buf + off(lo) * es, (off(hi) - off(lo)) * es,
                                       partner, buf + off(plo) * es, (off(phi) - off(plo)) * es));
      lo = std::min(lo, plo);
      hi = std::max(hi, phi);
    }
  }

  if (rank < 2 * r) {
    if (rank % 2 == 1) {
      Context::Handle h = ctx.isend(rank - 1, buf, count * es);
      INA_RETURN_IF_ERROR(ctx.wait(h));
    } else {
      Context::Handle h = ctx.irecv(rank + 1, buf, count * es);
      INA_RETURN_IF_ERROR(ctx.wait(h));
    }
  }
  return ok_status();
}

}  // namespace ina::host
