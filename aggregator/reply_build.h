// How the engine and a leaf job's relay (leaf_relay.h) build a Reply in place: the header fields
// every reply shares, a slot copy's round, control words as the payload. Private to the
// aggregator's packet logic (engine.cc, engine_join.cc, engine_failure.cc, leaf_relay.cc); inline.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "aggregator/job.h"
#include "aggregator/slot_table.h"
#include "ina/protocol/wire.h"

namespace ina::agg {

// Bit r of a rank bitmap in uint64 words (the slot table's and the join barrier's).
inline bool test_bit(std::span<const uint64_t> bm, uint32_t r) {
  return (bm[r / 64] >> (r % 64)) & 1;
}

// A slot copy's round in a reply: its sequence, shape and result (the user's type).
inline void set_round(Reply* r, const CopyView& c) {
  r->hdr.seq = c.seq;
  r->hdr.count = c.count;
  r->hdr.dtype = c.dtype;
  r->hdr.op = c.op;
  r->hdr.elems = c.elems;
  r->hdr.root = c.root;
  r->hdr.exp = kNoExponent;
  r->payload = c.result;
}

// Header fields shared by every reply about `in`'s job and slot (the collective id echoed).
inline wire::Header reply_header(const JobConfig& cfg, const wire::Header& in, uint8_t flags) {
  wire::Header h;
  h.flags = flags;
  h.job = cfg.job;
  h.seq = in.seq;
  h.rank = 0;  // from the aggregator
  h.slot = in.slot;
  h.shadow = in.shadow;
  h.dtype = DType::kInt32;
  h.op = ReduceOp::kSum;
  h.coll = in.coll;
  h.elems = in.elems;
  h.exp = kNoExponent;
  h.root = in.root;
  h.tag = 0;  // sealed by the backend with the job's key
  return h;
}

// Control words as a reply's payload.
inline const uint8_t* bytes_of(const std::vector<int32_t>& words) {
  return reinterpret_cast<const uint8_t*>(words.data());  // little-endian: wire order (wire.h)
}

// A shape in ERROR kRoundMismatch's words (wire.h): dtype | op << 8 | root << 16.
inline int32_t mismatch_shape(DType t, ReduceOp op, uint16_t root) {
  return static_cast<int32_t>(static_cast<uint32_t>(t) | static_cast<uint32_t>(op) << 8 |
                              uint32_t{root} << 16);
}

// A poisoned round's first six words of ERROR kRoundMismatch: [reason, count, elems, shape,
// other elems, other shape]. The bitmaps follow (a flat aggregator's or a root's one, a leaf's
// two).
inline void put_mismatch_head(const CopyView& c, int32_t* w) {
  w[0] = static_cast<int32_t>(wire::ErrorReason::kRoundMismatch);
  w[1] = c.count;
  w[2] = static_cast<int32_t>(c.elems);
  w[3] = mismatch_shape(c.dtype, c.op, c.root);
  w[4] = static_cast<int32_t>(c.other_elems);
  w[5] = mismatch_shape(c.other_dtype, c.other_op, c.other_root);
}

}  // namespace ina::agg
