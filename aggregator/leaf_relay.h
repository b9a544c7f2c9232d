// The tree-leaf relay: the half of a leaf job (TreeRole::kLeaf, engine.h) that talks to its parent
// aggregator. A leaf job serves global ranks [rank_base, rank_base + local_ranks) as a flat job
// serves its world, and the engine runs their join barrier and slot table as for any job; what a
// leaf does beyond that is here, and a flat or root job has no relay (the engine's Job holds a
// null one). The protocol is WIRE.md's (PARTIAL, the tree note); in short:
//  - Join. Once every local rank joined an incarnation, the leaf HELLOs its parent as rank
//    child_index, payload [parent world], with a nonce that grows whenever one of its ranks' nonces
//    does, so a new worker incarnation is a new leaf incarnation at the root. The parent's WELCOME
//    completes the leaf's barrier, and only then does the engine WELCOME the local ranks. A
//    world-size-mismatch ERROR teaches the parent's world when it was not configured.
//  - Partials. Each completed slot copy goes up as one more rank of the parent's job: int32 and
//    MIN/MAX as DATA of the reduced block; float SUM first as a PARTIAL exponent request, whose
//    answer (the root's exponent) the leaf quantizes its ranks' words with before it sends them as
//    PARTIAL words. The copy then waits, per copy, for the parent's RESULT, which replaces the
//    partial in the slot table and which the engine multicasts to the local ranks.
//  - Repair. A local rank's retransmission for a copy still waiting re-forwards the partial, once
//    per wave of timeouts (reforward_rank_), so every loss is repaired by the workers' timers.
//  - The root's missing-children report for a waiting copy names leaves: the relay turns it into
//    global ranks plus a tree note, sends it to every local rank, and keeps it for their later
//    retransmissions and for Engine::stalled_slots().
//  - Aborts (wire.h, ErrorReason::kAborted). A local rank that gives up on a round has it marked
//    aborted here, and the relay tells the parent as well, as rank child_index giving up: the
//    root's round then cannot complete either, whichever leaf comes late. A late leaf's partial
//    is answered by the root with the abort, which the relay hands to every local rank (the abort
//    names the first global rank of the leaf that gave up) and keeps for their retransmissions:
//    every rank of the tree fails the round, as on a flat aggregator.
//  - Mismatches across leaves (ErrorReason::kRoundMismatch). Each leaf's round is consistent, but
//    the leaves' partials disagree at the root, which poisons its round and answers every leaf
//    with both shapes and a bitmap of leaves. The relay turns the bitmap into global ranks and
//    hands the words to every local rank (and their retransmissions): every rank of the tree
//    fails with the same error, naming the same ranks.
// Pure logic, like the engine: no sockets, clock or logging, and every vector is sized by the
// constructor, so nothing allocates per packet. The relay borrows its job's config, slot table and
// counters and its engine's counters and control-payload scratch; they outlive it (the engine's Job
// owns the first three and the relay, the engine the rest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "aggregator/job.h"
#include "aggregator/slot_table.h"
#include "ina/base/status.h"
#include "ina/protocol/wire.h"

namespace ina::agg {

class LeafRelay {
 public:
  // A job's tree fields: a leaf's must name a consistent place in the tree (local ranks inside the
  // world, child_index below the parent's world, leaf_bases well formed and agreeing with
  // rank_base/local_ranks); the other roles must leave every leaf-only field unset.
  // kInvalidArgument saying which.
  static Status check_config(const JobConfig& cfg);

  // For a leaf job whose config passed check_config(). `scratch` must hold the largest control
  // payload: 1 + ceil(world / 32) + wire::kTreeNoteWords words (the engine sizes it per job).
  LeafRelay(const JobConfig& cfg, SlotTable& table, JobCounters& job_counters,
            EngineCounters& counters, std::vector<int32_t>& scratch);
  LeafRelay(const LeafRelay&) = delete;
  LeafRelay& operator=(const LeafRelay&) = delete;

  // Every local rank joined a new incarnation (`rank_nonces`, by served rank; the slot table was
  // reset): the HELLO to the parent for a new leaf incarnation, naming `max_bytes` (the largest
  // block every local rank can carry) as this leaf's limit.
  Reply join(std::span<const BlockSeq> rank_nonces, uint32_t max_bytes);
  // A local rank retransmitted its HELLO while the parent has not WELCOMEd the leaf: the HELLO to
  // the parent again, marked RETRANSMIT (the workers' timers repair a lost HELLO or WELCOME).
  Reply rejoin() { return hello(true); }

  // A copy completed here: its partial goes to the parent (float SUM: the exponent request first).
  Reply forward(uint16_t slot, bool shadow);
  // Local rank `global_rank` gave up on the round `h` names (its ERROR kAborted, cause `cause`),
  // which has no result here: the same abort to the parent, as this leaf's. Target kNone when the
  // copy holds another round or its result.
  Reply forward_abort(const wire::Header& h, uint32_t cause);
  // Every local rank is in a poisoned copy (its ranks called the collective with different
  // arguments; `h` is the DATA that asks): the parent must tell every leaf, so the words go up as
  // this leaf's ERROR kRoundMismatch in global ranks (WIRE.md, "Mismatches in a tree"); once the
  // parent answered, the answer goes to the asking rank.
  Reply local_mismatch(const wire::Header& h);
  // The parent's RESULT has replaced copy `copy`'s partial (copy_index).
  bool has_result(size_t copy) const { return tree_state_[copy] == kHaveResult; }
  // DATA of a local rank (`h.rank`: its served rank) for a copy complete here and not has_result():
  // the partial or the parent's result was lost (or is slow). A retransmission sends the partial
  // again, the first one of a wave of timeouts; the others get the root's missing report, if any.
  Reply on_resend(const wire::Header& h);

  // Where the leaf's join stands when a packet of its parent arrives.
  enum class Join : uint8_t {
    kOpen,    // some local rank has not joined the current incarnation
    kParent,  // every local rank has; the parent has not WELCOMEd it yet
    kDone,    // the parent WELCOMEd it: the job is ready
  };
  // What the engine does about a packet of the parent (on_parent).
  enum class FromParent : uint8_t {
    kReply,   // send *out (target kNone: nothing)
    kJoined,  // the parent WELCOMEd the join (the answer to its HELLO): the barrier is complete
    kResult,  // the parent's RESULT replaced the partial of the copy it names: multicast it
  };
  // A RESULT, WELCOME or ERROR of the parent (its tag checked): counted, checked against the copy
  // or join it answers (parent_stale when it answers none), and acted on. `*out`, which the caller
  // default-constructs, is written only when there is something to send.
  FromParent on_parent(const wire::PacketView& pkt, Join join, Reply* out);

  // A bitmap of served ranks as the world's ceil(world / 32) int32 control words (the layout of
  // WIRE.md's bitmaps): the served ranks at their global positions, the other leaves' ranks
  // present (this aggregator does not wait for them).
  void put_global_bitmap(std::span<const uint64_t> served, int32_t* dst) const;

  // The key of the leaf's packets to and from its parent but HELLO and WELCOME: the parent
  // incarnation's (from its WELCOME; before one, a key the parent never uses).
  const Key128& up_key() const { return up_key_; }

  // Copy `copy`'s round, if complete here, waits for the parent (its exponent or its result).
  bool awaits_parent(size_t copy) const {
    return tree_state_[copy] == kForwarded || tree_state_[copy] == kExpSent;
  }
  // Appends the global ranks the root's last missing report for copy `copy`'s round `seq` says it
  // lacks (the ranks behind the other leaves); nothing before such a report.
  void append_root_missing(size_t copy, BlockSeq seq, std::vector<uint32_t>* out) const;

 private:
  // What happened to a copy's completed round (meaningful only while the copy is complete: every
  // completion sets kForwarded or kExpSent).
  enum TreeState : uint8_t {
    kNone = 0,
    kForwarded = 1,   // the partial went to the parent; its result is awaited
    kHaveResult = 2,  // the parent's result replaced the partial
    kExpSent = 3,     // float SUM: the exponent request went up; E is awaited
    kAborted = 4,     // the parent answered the partial with an abort (above_words_)
    kMismatched = 5,  // the parent answered the partial with a round mismatch (above_words_)
    kMismatchUp = 6,  // the local ranks disagree (a poisoned copy): the parent was told
  };
  static constexpr uint16_t kNoRank = 0xFFFF;  // served ranks are below 65535

  Reply hello(bool retransmit);
  Reply send_partial(uint16_t slot, bool shadow, bool retransmit);
  Reply on_error(const wire::PacketView& pkt, Join join);
  Reply on_root_missing(const wire::PacketView& pkt, Join join);
  Reply on_root_abort(const wire::PacketView& pkt, Join join);
  Reply on_root_mismatch(const wire::PacketView& pkt, Join join);
  // The copy the parent's ERROR `h` answers, if this leaf waits on the parent for it: its index,
  // else counted as parent_stale and -1.
  long waiting_copy(const wire::Header& h, Join join);
  // The parent's verdict on copy `copy`'s round (state kAborted or kMismatched, above_words_) as
  // an ERROR to `target`.
  Reply above_reply(size_t copy, Reply::Target target, uint32_t rank, const wire::Header& in);
  // An ERROR about copy `copy`'s round `seq` to `target` (rank: the global rank it answers, 0 for
  // all), its payload the reason and `n` words already in scratch_.
  Reply copy_error(size_t copy, BlockSeq seq, size_t n, Reply::Target target, uint32_t rank,
                   const wire::Header& in);
  // The first global rank of leaf `leaf` of the parent (leaf_bases, or the balanced rule); the
  // world size for a leaf beyond the parent's world.
  uint32_t first_rank(uint32_t leaf) const;
  Reply root_missing_reply(size_t copy, Reply::Target target, uint32_t rank,
                           const wire::Header& in);
  // Copy `copy`'s stored report: report_words_ bitmap words, then the tree note.
  int32_t* report(size_t copy) {
    return report_.data() + copy * (report_words_ + wire::kTreeNoteWords);
  }
  const int32_t* report(size_t copy) const {
    return report_.data() + copy * (report_words_ + wire::kTreeNoteWords);
  }
  bool report_for(size_t copy, BlockSeq seq) const {
    return report_valid_[copy] != 0 && report_seq_[copy] == seq;
  }

  const JobConfig& cfg_;
  SlotTable& table_;
  JobCounters& job_counters_;
  EngineCounters& counters_;
  std::vector<int32_t>& scratch_;
  uint32_t parent_world_ = 0;  // sent in the HELLO to the parent
  BlockSeq parent_nonce_ = 0;  // this leaf incarnation's nonce at the parent
  uint32_t hello_bytes_ = 0;   // the block limit in the HELLO to the parent
  // The key of the parent's incarnation this leaf joined (WIRE.md, "Incarnations"): its partials
  // and the parent's answers carry it. From the parent's WELCOME to this leaf's HELLO.
  Key128 up_key_;
  std::vector<uint8_t> tree_state_;  // per copy (copy_index): the TreeState of its round
  // Per copy: the served rank whose retransmission last re-forwarded the partial (kNoRank: none
  // yet). Only that rank's next retransmission re-forwards again, so one wave of timeouts at the
  // local ranks sends the partial once, not once per rank.
  std::vector<uint16_t> reforward_rank_;
  // Per copy, the words after the reason of the parent's verdict in global ranks: kAborted
  // [rank that gave up, cause]; kMismatched [count, elems, shape, other elems, other shape,
  // report_words_ bitmap words of the ranks of the other shape]. above_stride_ words each.
  std::vector<int32_t> above_words_;
  size_t above_stride_ = 0;
  // Per copy: the round of the states kMismatchUp and kMismatched (a poisoned copy never
  // completes, so tree_state_ alone could be an older round's).
  std::vector<BlockSeq> mismatch_seq_;
  // Per copy: the root's last missing-children report for the waiting round, in global ranks
  // (report_words_ int32 bitmap words of the world, then the wire tree note), valid while
  // report_seq_[copy] is the copy's seq and report_valid_[copy] is set.
  uint32_t report_words_ = 0;
  std::vector<int32_t> report_;  // copies * (report_words_ + wire::kTreeNoteWords)
  std::vector<BlockSeq> report_seq_;
  std::vector<uint8_t> report_valid_;
};

}  // namespace ina::agg
