// Hierarchical (two-level) AllToAll: node first, then global, so that a rank exchanges
// (G-1) + (M-1) messages instead of P-1 (P = M G ranks on M nodes of G consecutive ranks each;
// at 1,024 ranks on nodes of 32: 62 messages instead of 1,023). The price: every byte is moved
// twice (once inside the node, once across) and packed twice in memory, so it pays where message
// latency dominates (small blocks, many ranks) and the flat pairwise wins for large blocks.
//
// Rank r = n G + l (node n, local index l), blocks of b bytes; write X[m][l'] for the block that
// concerns rank m G + l'.
//   1. Node phase: r packs its send blocks by the local index of their destination,
//      A[l'] = (send[m G + l'] for m = 0 .. M-1), and exchanges A[l'] with local rank l' (a
//      pairwise exchange among the node's G ranks, messages of M b bytes). It now holds, from
//      every local rank l', the M blocks that l' sends to the ranks of local index l: B[l'][m].
//   2. Global phase: r repacks them by destination node, C[m] = (B[l'][m] for l' = 0 .. G-1),
//      and exchanges C[m] with rank m G + l, the rank of the same local index on node m (a
//      pairwise exchange among M ranks, messages of G b bytes). What node m's rank sends is the
//      blocks of its node's G ranks for r, in rank order: they land straight in recv[m G .. ].
// Both phases use the windowed pairwise exchange (alltoall_exchange.h). Scratch slots 0..2 hold
// A, B and C (P b bytes each).
#include "worker/host/alltoall.h"
#include "worker/host/alltoall_exchange.h"

namespace ina::host {

Status alltoall_hierarchical(Context& ctx, const uint8_t* send, uint8_t* recv, size_t block_bytes,
                             int group_size, size_t window_bytes, size_t solo_round_bytes) {
  const int p = ctx.size();
  const int g = group_size;
  if (!alltoall_groups(p, g))
    return alltoall_pairwise(ctx, send, recv, block_bytes, window_bytes, solo_round_bytes);
  const int m_nodes = p / g;
  const int node = ctx.rank() / g;
  const int local = ctx.rank() % g;
  const size_t b = block_bytes;
  const auto gs = static_cast<size_t>(g);
  const auto ms = static_cast<size_t>(m_nodes);
  const size_t all = static_cast<size_t>(p) * b;
  uint8_t* a = ctx.scratch(0, all);   // A[l'][m] at (l' M + m) b
  uint8_t* bb = ctx.scratch(1, all);  // B[l'][m] at (l' M + m) b
  uint8_t* c = ctx.scratch(2, all);   // C[m][l'] at (m G + l') b
  for (size_t lp = 0; lp < gs; ++lp)
    for (size_t m = 0; m < ms; ++m) std::memcpy(a + (lp * ms + m) * b, send + (m * gs + lp) * b, b);
  const size_t node_msg = ms * b;
  INA_RETURN_IF_ERROR(pairwise_exchange(
      ctx, ExchangeGroup{g, local, node * g, 1},
      [&](int k) {
        return BlockRef{a + static_cast<size_t>(k) * node_msg, nullptr, node_msg};
      },
      [&](int k) {
        return BlockRef{nullptr, bb + static_cast<size_t>(k) * node_msg, node_msg};
      },
      window_bytes, solo_round_bytes));
  for (size_t m = 0; m < ms; ++m)
    for (size_t lp = 0; lp < gs; ++lp)
      std::memcpy(c + (m * gs + lp) * b, bb + (lp * ms + m) * b, b);
  const size_t global_msg = gs * b;
  return pairwise_exchange(
      ctx, ExchangeGroup{m_nodes, node, local, g},
      [&](int k) {
        return BlockRef{c + static_cast<size_t>(k) * global_msg, nullptr, global_msg};
      },
      [&](int k) {
        return BlockRef{nullptr, recv + static_cast<size_t>(k) * global_msg, global_msg};
      },
      window_bytes, solo_round_bytes);
}

}  // namespace ina::host
