// What the engine's files share (inc_engine.cc: the rounds; inc_join.cc: the join barrier;
// inc_failure.cc: deadlines, aborts and their error text): small helpers of the wire and the clock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

#include "ina/protocol/key.h"
#include "ina/protocol/types.h"
#include "ina/protocol/wire.h"

namespace ina::worker {

// Datagrams read per receive call.
inline constexpr size_t kRecvBatch = 64;

// Serial-number distance: how far `seq` is past `base` (mod 2^32).
inline uint32_t seq_offset(BlockSeq seq, BlockSeq base) {
  return static_cast<uint32_t>(seq - base);
}

// The tag (WIRE.md, mac.h: POLYVAL, then SipHash-2-4) over the whole packet, sealed before it is
// sent (a retransmission re-seals, the RETRANSMIT flag being covered): HELLO under the job's key,
// DATA and aborts under the incarnation's (traffic_key_), so that the aggregator can tell them from
// an earlier incarnation's, whose block sequence started at 1 too.
inline void seal_tag(std::span<uint8_t> packet, const Key128& key) { wire::seal(packet, key); }

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace ina::worker
