// Double binary tree AllReduce (NCCL 2.4's construction; Sanders, Speck and Träff, "Two-tree
// algorithms for full bandwidth broadcast, reduction and scan", 2009).
//
// A single binary tree wastes half the links: leaves (half of the ranks) only send up once and
// receive once. NCCL builds two trees so that a rank that is a leaf in one is an inner node in the
// other (tree.h: the in-order btree and its mirror, or its shift by one rank for odd sizes), and
// gives each tree half of the buffer. In each tree the half is cut into chunks of chunk_bytes
// and reduced up to the root chunk by chunk (an inner node receives a chunk from each child,
// reduces the children into its own copy, and sends the result to its parent while the next
// chunks arrive), then broadcast down from the root chunk by chunk. Latency: 2 log2(P) steps plus
// the pipeline depth, for any P (no folding as in halving-doubling); bandwidth: every rank moves
// about the buffer once up and once down, shared between the two trees.
//
// Both trees run in one loop, chunk-major and tree-minor, on every rank: messages between a pair
// of ranks (which may be linked in both trees) are then posted in the same order on both ends.
// Children's chunks are received into a window of kWindow scratch chunks per (tree, child);
// broadcast chunks land in place once this rank's own sends up have completed.
//
// What a rank does in a tree where it is a leaf waits on nothing, and the loop must not make it
// wait. In the dtree almost every rank is a leaf in one tree and an inner node in the other. When
// the loop posted the leaf's chunk c+1 up only after its inner tree's chunk c had arrived from
// its children, and those children were inner nodes of the first tree waiting for that very chunk,
// each link carried one direction at a time: the tree ran at half its bound on a link-bound star
// (30-47% at N >= 4, testbed/results/REPORT.md of 2026-12-02). So a leaf posts all its chunks up
// before the loop, and in the broadcast it waits only for the trees it forwards in. The one
// exception keeps the matching rule: where a rank's parent is the same in both trees (N = 3), the
// messages to it stay in the loop's order.
#include <algorithm>
#include <cstring>
#include <vector>

#include "worker/host/allreduce.h"
#include "worker/host/common.h"
#include "worker/host/reduce.h"
#include "worker/host/tree.h"

namespace ina::host {

namespace {
constexpr size_t kWindow = 4;
}

Status allreduce_tree(Context& ctx, const void* send, void* recv, size_t count, DType t,
                      ReduceOp op, size_t chunk_bytes) {
  INA_RETURN_IF_ERROR(check_dtype_op("allreduce", t, op));
  INA_RETURN_IF_ERROR(check_buffers("allreduce", send, recv, count));
  if (count == 0) return ok_status();
  const size_t es = dtype_size(t);
  if (send != recv) std::memmove(recv, send, count * es);
  const int p = ctx.size();
  if (p == 1) return ok_status();
  auto* buf = static_cast<uint8_t*>(recv);

  TreeLinks links[2] = {dtree(p, ctx.rank(), 0), dtree(p, ctx.rank(), 1)};
  // Tree 0 reduces elements [0, half), tree 1 [half, count).
  const size_t half = count / 2;
  const size_t span_lo[2] = {0, half};
  const size_t span_n[2] = {half, count - half};
  const size_t chunk_elems = std::max<size_t>(1, chunk_bytes / es);
  const size_t k_chunks =
      std::max<size_t>(1, (std::max(span_n[0], span_n[1]) + chunk_elems - 1) / chunk_elems);
  auto chunk = [&](int tree, size_t c, size_t* lo, size_t* n) {
    const size_t a = split_point(span_n[tree], k_chunks, c);
    *lo = span_lo[tree] + a;
    *n = split_point(span_n[tree], k_chunks, c + 1) - a;
  };
  size_t max_chunk = 0;
  for (int tr = 0; tr < 2; ++tr)
    for (size_t c = 0; c < k_chunks; ++c) {
      size_t lo = 0, n = 0;
      chunk(tr, c, &lo, &n);
      max_chunk = std::max(max_chunk, n);
    }

  // scratch[tree][child] holds kWindow chunks.
  uint8_t* scratch[2][2] = {};
  std::vector<Context::Handle> recvs[2][2];
  for (int tr = 0; tr < 2; ++tr)
    for (int j = 0; j < 2; ++j)
      if (links[tr].child[j] >= 0) {
        scratch[tr][j] = ctx.scratch(2 * tr + j, kWindow * max_chunk * es);
        recvs[tr][j].assign(kWindow, 0);
      }
  auto post_child_recvs = [&](size_t c) {
    for (int tr = 0; tr < 2; ++tr)
      for (int j = 0; j < 2; ++j) {
        if (links[tr].child[j] < 0) continue;
        size_t lo = 0, n = 0;
        chunk(tr, c, &lo, &n);
        recvs[tr][j][c % kWindow] =
            ctx.irecv(links[tr].child[j], scratch[tr][j] + (c % kWindow) * max_chunk * es, n * es);
      }
  };

  auto has_children = [&](int tr) { return links[tr].child[0] >= 0 || links[tr].child[1] >= 0; };
  const bool shared_parent = links[0].parent >= 0 && links[0].parent == links[1].parent;
  // early[tr]: this rank is a leaf of tree tr, and its sends up go before the loop.
  bool early[2];
  for (int tr = 0; tr < 2; ++tr)
    early[tr] = links[tr].parent >= 0 && !has_children(tr) && !shared_parent;

  // Reduce up.
  std::vector<Context::Handle> sends;
  for (int tr = 0; tr < 2; ++tr) {
    if (!early[tr]) continue;
    for (size_t c = 0; c < k_chunks; ++c) {
      size_t lo = 0, n = 0;
      chunk(tr, c, &lo, &n);
      sends.push_back(ctx.isend(links[tr].parent, buf + lo * es, n * es));
    }
  }
  for (size_t c = 0; c < std::min(kWindow, k_chunks); ++c) post_child_recvs(c);
  for (size_t c = 0; c < k_chunks; ++c) {
    for (int tr = 0; tr < 2; ++tr) {
      if (early[tr]) continue;
      size_t lo = 0, n = 0;
      chunk(tr, c, &lo, &n);
      for (int j = 0; j < 2; ++j) {
        if (links[tr].child[j] < 0) continue;
        INA_RETURN_IF_ERROR(ctx.wait(recvs[tr][j][c % kWindow]));
        reduce_into(buf + lo * es, scratch[tr][j] + (c % kWindow) * max_chunk * es, n, t, op);
      }
      if (links[tr].parent >= 0)
        sends.push_back(ctx.isend(links[tr].parent, buf + lo * es, n * es));
    }
    if (c + kWindow < k_chunks) post_child_recvs(c + kWindow);
  }
  INA_RETURN_IF_ERROR(ctx.wait_all(sends));
  sends.clear();

  // Broadcast down.
  std::vector<Context::Handle> down[2];
  for (size_t c = 0; c < k_chunks; ++c)
    for (int tr = 0; tr < 2; ++tr) {
      if (links[tr].parent < 0) continue;
      size_t lo = 0, n = 0;
      chunk(tr, c, &lo, &n);
      down[tr].push_back(ctx.irecv(links[tr].parent, buf + lo * es, n * es));
    }
  // A tree this rank only receives in is waited for at the end, not chunk by chunk.
  for (size_t c = 0; c < k_chunks; ++c)
    for (int tr = 0; tr < 2; ++tr) {
      if (!has_children(tr)) continue;
      size_t lo = 0, n = 0;
      chunk(tr, c, &lo, &n);
      if (links[tr].parent >= 0) INA_RETURN_IF_ERROR(ctx.wait(down[tr][c]));
      for (int j = 0; j < 2; ++j)
        if (links[tr].child[j] >= 0)
          sends.push_back(ctx.isend(links[tr].child[j], buf + lo * es, n * es));
    }
  for (int tr = 0; tr < 2; ++tr)
    if (!has_children(tr)) INA_RETURN_IF_ERROR(ctx.wait_all(down[tr]));
  return ctx.wait_all(sends);
}

}  // namespace ina::host
