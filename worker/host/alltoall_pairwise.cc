// Pairwise AllToAll(v) (Gloo's alltoall.cc, MPICH's pairwise exchange), the bandwidth-optimal
// schedule: in round i = 1 .. P-1 rank r sends its block for r+i to r+i while it receives the
// block from r-i, so every byte crosses the network once and no rank receives from several at
// once. Rounds are posted under a byte window (alltoall_exchange.h): small blocks all at once,
// larger ones a few rounds deep, AllToAll's rounds of over 256 KiB one at a time. Cost: P-1
// messages of b bytes per rank, about alpha ceil((P-1)/W) + (P-1)(alpha/8 + b beta) with W rounds
// in flight.
//
// AllToAllv runs the same schedule with per-peer sizes. Under skew (a hot expert receives 10-100x
// the bytes of the others) the window keeps the other links busy: rounds of small blocks go out
// behind the hot one instead of waiting for it. Zero-size pairs send nothing.
#include <string>

#include "worker/host/alltoall.h"
#include "worker/host/alltoall_exchange.h"

namespace ina::host {

Status alltoall_pairwise(Context& ctx, const uint8_t* send, uint8_t* recv, size_t block_bytes,
                         size_t window_bytes, size_t solo_round_bytes) {
  const ExchangeGroup g{ctx.size(), ctx.rank(), 0, 1};
  const size_t b = block_bytes;
  return pairwise_exchange(
      ctx, g,
      [&](int k) {
        return BlockRef{send + static_cast<size_t>(k) * b, nullptr, b};
      },
      [&](int k) {
        return BlockRef{nullptr, recv + static_cast<size_t>(k) * b, b};
      },
      window_bytes, solo_round_bytes);
}

Status alltoallv_pairwise(Context& ctx, const uint8_t* send, std::span<const size_t> send_counts,
                          std::span<const size_t> send_displs, uint8_t* recv,
                          std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                          size_t elem_bytes, size_t window_bytes, size_t solo_round_bytes) {
  const int rank = ctx.rank();
  const auto me = static_cast<size_t>(rank);
  if (send_counts[me] != recv_counts[me])
    return invalid_argument("alltoallv: rank " + std::to_string(rank) + " sends itself " +
                            std::to_string(send_counts[me]) + " elements but expects " +
                            std::to_string(recv_counts[me]));
  const ExchangeGroup g{ctx.size(), rank, 0, 1};
  const size_t es = elem_bytes;
  return pairwise_exchange(
      ctx, g,
      [&](int k) {
        const auto i = static_cast<size_t>(k);
        return BlockRef{send + send_displs[i] * es, nullptr, send_counts[i] * es};
      },
      [&](int k) {
        const auto i = static_cast<size_t>(k);
        return BlockRef{nullptr, recv + recv_displs[i] * es, recv_counts[i] * es};
      },
      window_bytes, solo_round_bytes);
}

}  // namespace ina::host
