// Pairwise AllToAll(v) (Gloo's alltoall.cc, MPICH's pairwise exchange).
//
// Rank r copies its own block locally (while the first round is in flight); in round i = 1 .. P-1
// sends its block for r+i to r+i while it receives the block from r-i. Every round pairs each rank
// with exactly one sender and one receiver, so no link is oversubscribed and no rank receives from
// many at once; a few rounds are kept in flight (kInFlight) so that the latency of one round
// overlaps the next. The variable-size form is the same schedule with per-peer counts and
// displacements; zero-size blocks still exchange an (empty) message, which keeps the schedule
// identical on every rank.
#include "worker/host/alltoall.h"

#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "worker/host/common.h"

namespace ina::host {

namespace {

constexpr int kInFlight = 4;

// Runs the pairwise schedule; block_of(peer, is_send) gives {offset in elements, elements}.
template <typename BlockOf>
Status pairwise(Context& ctx, const uint8_t* send, uint8_t* recv, size_t es, BlockOf block_of) {
  const int p = ctx.size();
  const int rank = ctx.rank();
  {
    auto [so, sn] = block_of(rank, true);
    auto [ro, rn] = block_of(rank, false);
    if (sn != rn)
      return invalid_argument("alltoallv: rank " + std::to_string(rank) + " sends itself " +
                              std::to_string(sn) + " elements but expects " + std::to_string(rn));
  }
  // The rank's own block is copied after the first exchange is posted, so that the copy overlaps
  // the kernel moving the first peer's data.
  auto copy_own = [&] {
    auto [so, sn] = block_of(rank, true);
    auto [ro, rn] = block_of(rank, false);
    (void)rn;
    if (sn > 0) std::memmove(recv + ro * es, send + so * es, sn * es);
  };
  if (p == 1) copy_own();
  std::deque<Context::Handle> pending;
  for (int i = 1; i < p; ++i) {
    const int to = mod(rank + i, p);
    const int from = mod(rank - i, p);
    auto [ro, rn] = block_of(from, false);
    auto [so, sn] = block_of(to, true);
    pending.push_back(ctx.irecv(from, recv + ro * es, rn * es));
    pending.push_back(ctx.isend(to, send + so * es, sn * es));
    if (i == 1) copy_own();
    while (pending.size() > 2 * kInFlight) {
      INA_RETURN_IF_ERROR(ctx.wait(pending.front()));
      pending.pop_front();
    }
  }
  for (Context::Handle h : pending) INA_RETURN_IF_ERROR(ctx.wait(h));
  return ok_status();
}

}  // namespace

Status alltoall(Context& ctx, const void* send, void* recv, size_t count, DType t) {
  if (!is_valid_dtype(static_cast<uint8_t>(t))) return invalid_argument("alltoall: bad dtype");
  INA_RETURN_IF_ERROR(check_buffers("alltoall", send, recv, count));
  if (count == 0) return ok_status();
  return pairwise(ctx, static_cast<const uint8_t*>(send), static_cast<uint8_t*>(recv),
                  dtype_size(t), [count](int peer, bool) {
                    return std::pair<size_t, size_t>{count * static_cast<size_t>(peer), count};
                  });
}

Status alltoallv(Context& ctx, const void* send, std::span<const size_t> send_counts,
                 std::span<const size_t> send_displs, void* recv,
                 std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                 DType t) {
  if (!is_valid_dtype(static_cast<uint8_t>(t))) return invalid_argument("alltoallv: bad dtype");
  const size_t p = static_cast<size_t>(ctx.size());
  if (send_counts.size() != p || send_displs.size() != p || recv_counts.size() != p ||
      recv_displs.size() != p)
    return invalid_argument("alltoallv: counts and displacements need world size entries");
  size_t sent = 0, received = 0;
  for (size_t i = 0; i < p; ++i) {
    sent += send_counts[i];
    received += recv_counts[i];
  }
  if ((sent > 0 && send == nullptr) || (received > 0 && recv == nullptr))
    return invalid_argument("alltoallv: null buffer");
  return pairwise(ctx, static_cast<const uint8_t*>(send), static_cast<uint8_t*>(recv),
                  dtype_size(t), [&](int peer, bool is_send) {
                    const auto i = static_cast<size_t>(peer);
                    return is_send ? std::pair<size_t, size_t>{send_displs[i], send_counts[i]}
                                   : std::pair<size_t, size_t>{recv_displs[i], recv_counts[i]};
                  });
}

}  // namespace ina::host
