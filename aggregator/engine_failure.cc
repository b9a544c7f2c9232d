// The engine's failure handling (engine.h): a worker's abort at its deadline, the rounds whose
// ranks disagree (a flat aggregator's, a root's from its leaves), and the ERROR replies that tell
// the workers which ranks are missing, late or mismatched.
#include <algorithm>
#include <string>
#include <vector>

#include "aggregator/engine.h"
#include "aggregator/engine_job.h"
#include "aggregator/reply_build.h"

namespace ina::agg {

namespace {

// A bitmap of uint64 words as `words` int32 control words: word w holds ranks 32w..32w+31 (the
// low half of uint64 word w/2 first).
void put_bitmap_words(std::span<const uint64_t> bitmap, uint32_t words, int32_t* dst) {
  for (uint32_t w = 0; w < words; ++w) {
    dst[w] = static_cast<int32_t>(static_cast<uint32_t>(bitmap[w / 2] >> (32 * (w % 2))));
  }
}

}  // namespace

// A worker's ERROR kAborted (wire.h): rank `global_rank` gives up on the round the header names
// (its deadline passed). The round is marked aborted unless it completed, so that a rank that
// comes later cannot complete it and return success where this one failed. The payload must name
// the sender itself: a rank gives up only for itself.
//
// The abort and a late rank's last DATA race to this aggregator, and only here is their order
// known, so the answer tells the sender which came first (the worker waits for it: inc_failure.cc,
// "At the deadline"): the round's result when the round completed before the abort (the late
// rank returns success, and so does the one that gave up), or these same kAborted words when the
// abort came first (every later DATA for the round gets them too, so every rank fails). A tree
// leaf answers from its own copy where it can, and otherwise passes the abort to its parent as
// its own (leaf_relay.h): the root's answer, a result or an abort, reaches every local rank.
Reply Engine::handle_abort(Job& job, const wire::PacketView& pkt, uint32_t global_rank) {
  if (!job.ready || static_cast<uint32_t>(pkt.word(1)) != global_rank) {
    ++counters_.malformed;
    return {};
  }
  const wire::Header& h = pkt.hdr;
  const auto cause = static_cast<uint32_t>(pkt.word(2));
  if (job.table->abort(h, global_rank, cause)) ++counters_.aborted_rounds;
  if (h.slot >= job.cfg.slots.num_slots) return {};
  const CopyView c = job.table->copy(h.slot, h.shadow);
  if (c.seq != h.seq) return {};  // a replay of an older round's abort: it waits for nothing
  if (c.aborted_by != CopyView::kNoAbort) return aborted_reply(job, pkt, c);
  if (!c.complete) return {};
  // The round completed before the abort arrived: its result, as to a resend.
  if (!job.relay || job.relay->has_result(copy_index(h.slot, h.shadow))) {
    ++counters_.resent_results;
    return result_reply(job, h, Reply::Target::kSender, wire::kFlagRetransmit);
  }
  // A leaf's copy complete here, waiting for the root: the root decides; or the root has given
  // up on it already, and the leaf answers as it answers a resend.
  if (job.relay->awaits_parent(copy_index(h.slot, h.shadow))) {
    return job.relay->forward_abort(h, cause);
  }
  return job.relay->on_resend(h);
}

// ERROR kAborted to pkt's sender for the aborted round of copy `c` (to a late rank's DATA, or to
// an abort): [kAborted, the rank that gave up, its cause]. A root answers a leaf with a fourth
// word, so that the leaf tells it from its own ranks' three-word aborts (on_packet) and relays it
// to them (leaf_relay.h).
Reply Engine::aborted_reply(const Job& job, const wire::PacketView& pkt, const CopyView& c) {
  scratch_[0] = static_cast<int32_t>(wire::ErrorReason::kAborted);
  scratch_[1] = static_cast<int32_t>(c.aborted_by);
  scratch_[2] = static_cast<int32_t>(c.abort_cause);
  if (job.cfg.tree.role == TreeRole::kRoot) {
    scratch_[3] = static_cast<int32_t>(wire::kTreeNoteTag);
    return error_to_sender(job, pkt, 4);
  }
  return error_to_sender(job, pkt, 3);
}

// ERROR kRoundMismatch for a poisoned round every rank is in (wire.h): [reason, count, elems,
// shape, other elems, other shape, bitmap of the ranks of the other shape], a shape packing dtype,
// op and root (dtype | op << 8 | root << 16). Every rank of the round gets the same words, so
// every rank can say the same thing. The DATA that brought the last rank in sends them to every
// rank at once (as a result goes): the rank that completed the bitmap returns, and moves its
// block sequence on (inc_failure.cc, resync_after_mismatch), at once, and its next collective may
// take this copy before the others' retransmission timers fire. A later DATA for the round (a
// rank whose answer was lost) gets them alone, from the copy or, once a newer round took it, from
// the job's record of its last poisoned collective (kStale in handle_data).
Reply Engine::mismatch_reply(Job& job, const wire::PacketView& pkt, const CopyView& c) {
  const uint32_t words = (job.world + 31) / 32;
  job.mismatch_words.resize(6 + words);  // a root's may hold a leaf's longer words
  int32_t* w = job.mismatch_words.data();
  put_mismatch_head(c, w);
  put_bitmap_words(c.other_ranks, words, w + 6);
  std::copy(job.mismatch_words.begin(), job.mismatch_words.end(), scratch_.begin());
  const size_t k = copy_index(c.slot, c.shadow);
  const bool first = !job.mismatch_valid || job.mismatch_copy != k || job.mismatch_seq != c.seq;
  job.mismatch_valid = true;
  job.mismatch_from_child = false;
  job.child_pending = false;
  job.mismatch_coll = c.coll;
  job.mismatch_copy = k;
  job.mismatch_seq = c.seq;
  Reply r = error_to_sender(job, pkt, static_cast<uint16_t>(6 + words));
  if (first) {
    r.target = Reply::Target::kAllRanks;
    counters_.replies_out += job.nranks - 1;
  }
  return r;
}

// The job's last mismatch words (Job::mismatch_words) to pkt's sender.
Reply Engine::mismatch_again(const Job& job, const wire::PacketView& pkt) {
  Reply r = error_to_sender(job, pkt, static_cast<uint16_t>(job.mismatch_words.size()));
  r.payload = bytes_of(job.mismatch_words);
  return r;
}

// A root: leaf pkt.hdr.rank's own ranks disagree on the round pkt names (its ERROR
// kRoundMismatch, LeafRelay::local_mismatch: both shapes, the leaf's ranks of each in global
// ranks). Once every other leaf's partial of that round is in, their shape says which group their
// ranks belong to: the words then go to every leaf at once, and to every later partial of that
// collective (handle_data), so that every rank of the tree fails it alike; the round itself is
// left to be taken by a newer one.
Reply Engine::handle_child_mismatch(Job& job, const wire::PacketView& pkt) {
  const wire::Header& h = pkt.hdr;
  if (!job.ready || h.slot >= job.cfg.slots.num_slots) {
    ++counters_.malformed;
    return {};
  }
  ++counters_.mismatched;
  const size_t k = copy_index(h.slot, h.shadow);
  if (job.mismatch_valid && job.mismatch_from_child && job.mismatch_copy == k &&
      job.mismatch_seq == h.seq && job.mismatch_coll == h.coll) {
    return mismatch_again(job, pkt);  // the leaf asks again: its answer was lost
  }
  job.mismatch_valid = false;  // an older collective's words no longer answer
  job.child_pending = true;
  job.child_leaf = h.rank;
  job.mismatch_coll = h.coll;
  job.mismatch_copy = k;
  job.mismatch_seq = h.seq;
  job.child_words.resize(h.count);  // the error path; allocates at most once per size
  for (size_t i = 0; i < h.count; ++i) job.child_words[i] = static_cast<int32_t>(pkt.word(i));
  return finish_child_mismatch(job, pkt);
}

// The pending leaf report's answer to every leaf once the other leaves' partials of its round
// are in (kNone before): [kRoundMismatch, count, elems, shape, other elems, other shape, the
// global ranks of the other shape, the tree tag], the first shape being the other leaves'.
Reply Engine::finish_child_mismatch(Job& job, const wire::PacketView& pkt) {
  const auto slot = static_cast<uint16_t>(job.mismatch_copy / 2);
  const bool shadow = (job.mismatch_copy % 2) != 0;
  const CopyView c = job.table->copy(slot, shadow);
  const std::vector<int32_t>& in = job.child_words;
  const size_t gw = (in.size() - 7) / 2;
  const bool sender_in = job.child_leaf < job.world && test_bit(c.bitmap, job.child_leaf);
  if (job.world > 1 &&
      (!c.used || c.seq != job.mismatch_seq || sender_in || c.contributors + 1 < job.world)) {
    return {};
  }
  const int32_t shape = mismatch_shape(c.dtype, c.op, c.root);
  // The other leaves called with the leaf's second shape: its groups swap.
  const bool swap = job.world > 1 && static_cast<int32_t>(c.elems) == in[4] && shape == in[5] &&
                    !(static_cast<int32_t>(c.elems) == in[2] && shape == in[3]);
  std::vector<int32_t>& w = job.mismatch_words;
  w.resize(7 + gw);
  w[0] = in[0];
  w[1] = in[1];
  w[2] = swap ? in[4] : in[2];
  w[3] = swap ? in[5] : in[3];
  w[4] = swap ? in[2] : in[4];
  w[5] = swap ? in[3] : in[5];
  std::copy_n(in.begin() + 6 + (swap ? gw : 0), gw, w.begin() + 6);
  w[6 + gw] = in.back();
  job.child_pending = false;
  job.mismatch_valid = true;
  job.mismatch_from_child = true;
  Reply r = mismatch_again(job, pkt);
  r.hdr.seq = job.mismatch_seq;
  r.hdr.slot = slot;
  r.hdr.shadow = shadow;
  r.target = Reply::Target::kAllRanks;
  counters_.replies_out += job.nranks - 1;
  return r;
}

// ERROR to the sender: payload [reason, extra] or, with a bitmap, [reason, bitmap words]
// (put_bitmap_words).
Reply Engine::error_reply(const Job& job, const wire::PacketView& pkt, wire::ErrorReason reason,
                          std::span<const uint64_t> bitmap, uint32_t extra) {
  scratch_[0] = static_cast<int32_t>(reason);
  uint16_t n = 2;
  if (!bitmap.empty()) {
    const uint32_t words = (job.world + 31) / 32;
    // A leaf's bitmap covers its served ranks: the relay puts them at their global positions.
    if (!job.relay) {
      put_bitmap_words(bitmap, words, scratch_.data() + 1);
    } else {
      job.relay->put_global_bitmap(bitmap, scratch_.data() + 1);
    }
    n = static_cast<uint16_t>(1 + words);
  } else {
    scratch_[1] = static_cast<int32_t>(extra);
  }
  return error_to_sender(job, pkt, n);
}

// The ERROR reply to pkt's sender with the first n control words of scratch_.
Reply Engine::error_to_sender(const Job& job, const wire::PacketView& pkt, uint16_t n) {
  Reply r;
  r.target = Reply::Target::kSender;
  r.hdr = reply_header(job.cfg, pkt.hdr, wire::kFlagError);
  r.hdr.rank = static_cast<uint16_t>(pkt.hdr.rank + job.rank_base);  // the (global) rank it answers
  r.hdr.count = n;
  r.payload = bytes_of(scratch_);
  ++counters_.replies_out;
  return r;
}

}  // namespace ina::agg
