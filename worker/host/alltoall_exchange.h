// The pairwise exchange that the AllToAll algorithms share (internal): every member of a group of
// ranks sends one block to every other member and receives one from each.
//
// Schedule: member k of n sends to k+i and receives from k-i in round i = 1 .. n-1 (Gloo's and
// MPICH's pairwise exchange), so each round pairs every member with exactly one receiver and one
// sender: no receiver is the target of several senders at once (no incast), whatever the sizes.
// Rounds are posted while the bytes in flight stay under a window (and at least
// kAlltoallMinRounds rounds are in flight whatever their size): small blocks all go out at once
// (one latency for the whole exchange, not one per round), larger ones keep a few rounds in flight
// (every link stays busy while the oldest round drains); a round of more than solo_round_bytes
// (AllToAll: kAlltoallSoloRoundBytes) waits for every older one and goes alone (alltoall.h). Under
// skew (per-peer sizes that differ 10-100x) the window is what keeps links busy: rounds of small
// blocks are posted behind a hot one instead of waiting for it, and each wait makes progress on
// every posted message. Empty blocks are not sent at all (both sides of a pair know the size), so a
// zero-size pair costs nothing. The member's own block is copied locally while the first round is
// in flight.
#pragma once

#include <cstring>
#include <deque>
#include <string>
#include <utility>

#include "ina/base/status.h"
#include "worker/host/alltoall.h"
#include "worker/host/common.h"
#include "worker/host/context.h"

namespace ina::host {

// Member k of the group is rank base + k * stride; this rank is member `me`.
struct ExchangeGroup {
  int n = 1;
  int me = 0;
  int base = 0;
  int stride = 1;
  int rank_of(int k) const { return base + k * stride; }
};

// A block: where it is and how many bytes it holds.
struct BlockRef {
  const uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
  size_t bytes = 0;
};

// send_block(k): the block for member k; recv_block(k): where member k's block lands (its size is
// what this rank expects from k). The caller checked that the own block's sizes agree.
template <typename SendBlock, typename RecvBlock>
Status pairwise_exchange(Context& ctx, const ExchangeGroup& g, SendBlock send_block,
                         RecvBlock recv_block, size_t window_bytes,
                         size_t solo_round_bytes = kAlltoallSoloRoundBytes) {
  auto copy_own = [&] {
    const BlockRef s = send_block(g.me);
    const BlockRef r = recv_block(g.me);
    if (s.bytes > 0 && s.send != r.recv) std::memmove(r.recv, s.send, s.bytes);
  };
  if (g.n == 1) {
    copy_own();
    return ok_status();
  }
  struct Round {
    Context::Handle recv = 0, send = 0;
    size_t bytes = 0;
  };
  std::deque<Round> in_flight;
  size_t bytes_in_flight = 0;
  auto retire = [&]() -> Status {
    const Round rd = in_flight.front();
    in_flight.pop_front();
    bytes_in_flight -= rd.bytes;
    INA_RETURN_IF_ERROR(ctx.wait(rd.recv));
    return ctx.wait(rd.send);
  };
  bool own_copied = false;
  for (int i = 1; i < g.n; ++i) {
    const int to = mod(g.me + i, g.n);
    const int from = mod(g.me - i, g.n);
    const BlockRef r = recv_block(from);
    const BlockRef s = send_block(to);
    const size_t bytes = r.bytes + s.bytes;
    if (bytes == 0) continue;
    // A large round goes alone (solo_round_bytes); any round waits while the window is full,
    // once kAlltoallMinRounds rounds are in flight.
    while (!in_flight.empty() &&
           (bytes > solo_round_bytes || (static_cast<int>(in_flight.size()) >= kAlltoallMinRounds &&
                                         bytes_in_flight + bytes > window_bytes)))
      INA_RETURN_IF_ERROR(retire());
    Round rd;
    rd.bytes = bytes;
    if (r.bytes > 0) rd.recv = ctx.irecv(g.rank_of(from), r.recv, r.bytes);
    if (s.bytes > 0) rd.send = ctx.isend(g.rank_of(to), s.send, s.bytes);
    in_flight.push_back(rd);
    bytes_in_flight += bytes;
    if (!own_copied) {
      copy_own();
      own_copied = true;
    }
  }
  if (!own_copied) copy_own();
  while (!in_flight.empty()) INA_RETURN_IF_ERROR(retire());
  return ok_status();
}

}  // namespace ina::host
