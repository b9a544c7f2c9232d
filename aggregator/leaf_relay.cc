// The tree-leaf relay (see leaf_relay.h).
#include "aggregator/leaf_relay.h"

#include <algorithm>
#include <string>

#include "aggregator/reply_build.h"
#include "ina/protocol/codec.h"

namespace ina::agg {

Status LeafRelay::check_config(const JobConfig& cfg) {
  const std::string name = "engine: job " + std::to_string(cfg.job);
  if (!cfg.is_leaf()) {
    if (cfg.tree == TreeConfig{.role = cfg.tree.role}) return ok_status();
    return invalid_argument(name +
                            ": rank_base, local_ranks, child_index, parent, "
                            "parent_world and leaf_bases are for role leaf only (role is " +
                            tree_role_name(cfg.tree.role) + ")");
  }
  const TreeConfig& t = cfg.tree;
  if (t.local_ranks < 1) {
    return invalid_argument(name + ": leaf local_ranks must be at least 1, got 0");
  }
  if (uint64_t{t.rank_base} + t.local_ranks > cfg.slots.world_size) {
    return invalid_argument(name + ": leaf ranks [rank_base " + std::to_string(t.rank_base) +
                            ", + local_ranks " + std::to_string(t.local_ranks) +
                            ") must lie inside the world of " +
                            std::to_string(cfg.slots.world_size) + " ranks");
  }
  if (t.child_index > 65534) {
    return invalid_argument(name + ": leaf child_index must be in 0..65534, got " +
                            std::to_string(t.child_index));
  }
  if (t.parent_world != 0 && t.child_index >= t.parent_world) {
    return invalid_argument(name + ": leaf child_index " + std::to_string(t.child_index) +
                            " must be below parent_world " + std::to_string(t.parent_world));
  }
  if (t.leaf_bases.empty()) return ok_status();
  const auto& b = t.leaf_bases;
  const std::string form =
      " (the first global rank of each leaf by child index: starting "
      "at 0, strictly ascending, below the world of " +
      std::to_string(cfg.slots.world_size) + ")";
  if (t.parent_world != 0 && b.size() != t.parent_world) {
    return invalid_argument(name + ": leaf_bases has " + std::to_string(b.size()) +
                            " entries, parent_world is " + std::to_string(t.parent_world) + form);
  }
  if (t.child_index >= b.size()) {
    return invalid_argument(name + ": leaf_bases has " + std::to_string(b.size()) +
                            " entries, too few for child_index " + std::to_string(t.child_index) +
                            form);
  }
  for (size_t i = 0; i < b.size(); ++i) {
    if ((i == 0 && b[i] != 0) || (i > 0 && b[i] <= b[i - 1]) || b[i] >= cfg.slots.world_size) {
      return invalid_argument(name + ": leaf_bases[" + std::to_string(i) +
                              "] = " + std::to_string(b[i]) + " is out of order" + form);
    }
  }
  const uint64_t end = t.child_index + 1 < b.size() ? b[t.child_index + 1] : cfg.slots.world_size;
  if (b[t.child_index] != t.rank_base || end != uint64_t{t.rank_base} + t.local_ranks) {
    return invalid_argument(name + ": leaf_bases gives leaf " + std::to_string(t.child_index) +
                            " ranks [" + std::to_string(b[t.child_index]) + ", " +
                            std::to_string(end) + "), rank_base/local_ranks say [" +
                            std::to_string(t.rank_base) + ", " +
                            std::to_string(uint64_t{t.rank_base} + t.local_ranks) + ")");
  }
  return ok_status();
}

LeafRelay::LeafRelay(const JobConfig& cfg, SlotTable& table, JobCounters& job_counters,
                     EngineCounters& counters, std::vector<int32_t>& scratch)
    : cfg_(cfg),
      table_(table),
      job_counters_(job_counters),
      counters_(counters),
      scratch_(scratch),
      up_key_(wire::incarnation_key(cfg.key, 0)) {
  const TreeConfig& t = cfg.tree;
  const uint32_t world = cfg.slots.world_size;
  parent_world_ = t.parent_world != 0     ? t.parent_world
                  : !t.leaf_bases.empty() ? static_cast<uint32_t>(t.leaf_bases.size())
                                          : (world + t.local_ranks - 1) / t.local_ranks;
  const size_t copies = size_t{cfg.slots.num_slots} * 2;
  tree_state_.assign(copies, kNone);
  reforward_rank_.assign(copies, kNoRank);
  report_words_ = (world + 31) / 32;
  report_.assign(copies * (report_words_ + wire::kTreeNoteWords), 0);
  report_seq_.assign(copies, 0);
  report_valid_.assign(copies, 0);
  above_stride_ = 5 + report_words_;
  above_words_.assign(copies * above_stride_, 0);
  mismatch_seq_.assign(copies, 0);
}

Reply LeafRelay::join(std::span<const BlockSeq> rank_nonces, uint32_t max_bytes) {
  hello_bytes_ = max_bytes;
  std::fill(tree_state_.begin(), tree_state_.end(), kNone);
  // The leaf's nonce grows whenever one of its ranks' nonces does (the root orders a leaf's
  // incarnations as the leaf orders its ranks'): the newest of its ranks' nonces, and past its own
  // previous one.
  BlockSeq newest = rank_nonces[0];
  for (size_t r = 1; r < rank_nonces.size(); ++r) {
    if (wire::nonce_newer(rank_nonces[r], newest)) newest = rank_nonces[r];
  }
  parent_nonce_ =
      parent_nonce_ == 0 || wire::nonce_newer(newest, parent_nonce_) ? newest : parent_nonce_ + 1;
  return hello(false);
}

// The HELLO to the parent: rank child_index of the parent's job, payload [parent world, the
// largest block the leaf's ranks can carry].
Reply LeafRelay::hello(bool retransmit) {
  Reply r;
  r.target = Reply::Target::kParent;
  r.hdr = reply_header(cfg_, wire::Header{},
                       wire::kFlagHello | (retransmit ? wire::kFlagRetransmit : uint8_t{0}));
  r.hdr.seq = parent_nonce_;
  r.hdr.rank = static_cast<uint16_t>(cfg_.tree.child_index);
  r.hdr.count = 2;
  scratch_[0] = static_cast<int32_t>(parent_world_);
  scratch_[1] = static_cast<int32_t>(hello_bytes_);
  r.payload = bytes_of(scratch_);
  ++counters_.parent_hellos;
  ++counters_.replies_out;
  return r;
}

Reply LeafRelay::forward(uint16_t slot, bool shadow) {
  const size_t k = copy_index(slot, shadow);
  tree_state_[k] = table_.copy(slot, shadow).mode == CopyMode::kRaw ? kExpSent : kForwarded;
  reforward_rank_[k] = kNoRank;
  report_valid_[k] = 0;
  ++counters_.forwarded;
  ++job_counters_.forwarded;
  return send_partial(slot, shadow, false);
}

Reply LeafRelay::on_resend(const wire::Header& h) {
  const size_t k = copy_index(h.slot, h.shadow);
  // The parent gave up on this round: so does every rank that asks about it.
  if (tree_state_[k] == kAborted || tree_state_[k] == kMismatched) {
    return above_reply(k, Reply::Target::kSender, h.rank + cfg_.tree.rank_base, h);
  }
  // The parent answers a duplicate of a completed copy with its result.
  if (!h.has(wire::kFlagRetransmit)) return {};
  uint16_t& by = reforward_rank_[k];
  if (by != kNoRank && by != h.rank) {
    // This wave already re-forwarded it; what the root said it lacks answers this rank.
    if (report_for(k, table_.copy(h.slot, h.shadow).seq)) {
      return root_missing_reply(k, Reply::Target::kSender, h.rank + cfg_.tree.rank_base, h);
    }
    return {};
  }
  by = h.rank;
  ++counters_.reforwarded;
  ++job_counters_.reforwarded;
  return send_partial(h.slot, h.shadow, true);
}

// A completed copy to the parent as rank child_index, so the parent reduces it as one more rank:
// int32 and MIN/MAX as a DATA packet of the reduced block; float SUM first as a PARTIAL exponent
// request (count 0, exp = MAX over the local ranks, NONFINITE ORed) and, once the root answered,
// as PARTIAL fixed-point words (exp = E - B, the unit's exponent). Which one: the copy's tree
// state.
Reply LeafRelay::send_partial(uint16_t slot, bool shadow, bool retransmit) {
  const CopyView c = table_.copy(slot, shadow);
  const uint8_t state = tree_state_[copy_index(slot, shadow)];
  Reply r;
  r.target = Reply::Target::kParent;
  wire::Header in;
  in.coll = c.coll;
  uint8_t flags = (c.nonfinite ? wire::kFlagNonFinite : uint8_t{0}) |
                  (retransmit ? wire::kFlagRetransmit : uint8_t{0});
  if (c.mode == CopyMode::kRaw) flags |= wire::kFlagPartial;
  r.hdr = reply_header(cfg_, in, flags);
  set_round(&r, c);
  if (c.mode == CopyMode::kRaw) {
    if (state == kExpSent) {
      r.hdr.count = 0;
      r.hdr.exp = c.exp;
      r.payload = nullptr;
    } else {
      const int scale = codec::scale_exponent(c.dtype, c.answer_exp, cfg_.slots.world_size);
      r.hdr.exp = scale == codec::kNoScale ? kNoExponent : static_cast<int16_t>(scale);
      r.payload = c.partial;
    }
  }
  r.hdr.rank = static_cast<uint16_t>(cfg_.tree.child_index);
  r.hdr.slot = slot;
  r.hdr.shadow = shadow;
  ++counters_.replies_out;
  return r;
}

// WELCOME completes the leaf's join, the root's exponent lets a float SUM copy's words go up,
// RESULT of a forwarded copy replaces its partial, ERROR is counted (a world-size mismatch teaches
// the parent's world when it was not configured; a missing-children report goes to the ranks).
LeafRelay::FromParent LeafRelay::on_parent(const wire::PacketView& pkt, Join join, Reply* out) {
  const wire::Header& h = pkt.hdr;
  if (h.has(wire::kFlagError)) {
    *out = on_error(pkt, join);
    return FromParent::kReply;
  }
  if (h.has(wire::kFlagHello)) {  // WELCOME
    if (join != Join::kParent || h.count != wire::kWelcomeWords || pkt.word(0) < 1 ||
        pkt.word(1) < 1) {
      ++counters_.parent_stale;
      return FromParent::kReply;
    }
    if (h.seq != parent_nonce_) {
      ++counters_.parent_stale;
      // The parent's barrier completed (its notice to every child, seq 0): the WELCOME that
      // answers this leaf's HELLO, the only one it adopts, is one HELLO away (WIRE.md).
      if (h.seq == 0) *out = hello(true);
      return FromParent::kReply;
    }
    // The parent incarnation's key seals this leaf's partials and the parent's answers.
    up_key_ = wire::incarnation_key(cfg_.key, wire::welcome_epoch(pkt));
    return FromParent::kJoined;
  }
  const size_t k = copy_index(h.slot, h.shadow);
  if (h.has(wire::kFlagPartial)) {
    // The root's exponent for a float SUM round this leaf asked about: quantize the local ranks'
    // words with it and send them up.
    if (join != Join::kDone || h.slot >= cfg_.slots.num_slots || h.count != 0 ||
        tree_state_[k] != kExpSent ||
        !table_.quantize_partial(h.slot, h.shadow, h.seq, h.exp, h.has(wire::kFlagNonFinite))) {
      ++counters_.parent_stale;
      return FromParent::kReply;
    }
    tree_state_[k] = kForwarded;
    *out = send_partial(h.slot, h.shadow, false);
    return FromParent::kReply;
  }
  // RESULT of a copy this leaf forwarded and still waits for (the slot table checks the round).
  if (join != Join::kDone || h.slot >= cfg_.slots.num_slots || tree_state_[k] != kForwarded ||
      !table_.store_result(pkt)) {
    ++counters_.parent_stale;
    return FromParent::kReply;
  }
  tree_state_[k] = kHaveResult;
  ++counters_.parent_results;
  ++job_counters_.parent_results;
  return FromParent::kResult;
}

Reply LeafRelay::on_error(const wire::PacketView& pkt, Join join) {
  const wire::Header& h = pkt.hdr;
  ++counters_.parent_errors;
  if (h.count < 2) return {};
  const auto reason = static_cast<wire::ErrorReason>(pkt.word(0));
  if (reason == wire::ErrorReason::kMissingRanks) return on_root_missing(pkt, join);
  if (reason == wire::ErrorReason::kAborted) return on_root_abort(pkt, join);
  if (reason == wire::ErrorReason::kRoundMismatch) return on_root_mismatch(pkt, join);
  if (reason == wire::ErrorReason::kWorldSizeMismatch && cfg_.tree.parent_world == 0) {
    const auto w = static_cast<uint32_t>(pkt.word(1));
    if (w > cfg_.tree.child_index && w <= 65535 && w != parent_world_) {
      parent_world_ = w;
      if (join == Join::kParent) return hello(false);
    }
  }
  return {};
}

// The root's kMissingRanks ERROR about a copy this leaf forwarded and still waits for: its bitmap
// names the root's ranks, i.e. the leaves. Turned into global ranks (the missing leaves' rank
// ranges cleared, from leaf_bases or the balanced rule), kept for the ranks' later
// retransmissions, and sent to every local rank now (they are all waiting on the copy).
Reply LeafRelay::on_root_missing(const wire::PacketView& pkt, Join join) {
  const wire::Header& h = pkt.hdr;
  if (join != Join::kDone || h.slot >= cfg_.slots.num_slots) {
    ++counters_.parent_stale;
    return {};
  }
  const size_t k = copy_index(h.slot, h.shadow);
  const CopyView c = table_.copy(h.slot, h.shadow);
  if (!awaits_parent(k) || !c.complete || c.seq != h.seq) {
    ++counters_.parent_stale;
    return {};
  }
  const TreeConfig& t = cfg_.tree;
  const uint32_t n = parent_world_;
  const uint32_t W = cfg_.slots.world_size;
  const bool by_rule = t.leaf_bases.empty();
  int32_t* bits = report(k);
  int32_t* note = bits + report_words_;
  for (uint32_t w = 0; w < report_words_; ++w) {
    const uint32_t lo = w * 32;
    const uint32_t valid = W - lo >= 32 ? ~uint32_t{0} : (uint32_t{1} << (W - lo)) - 1;
    bits[w] = static_cast<int32_t>(valid);
  }
  uint32_t m = 0;
  for (uint32_t leaf = 0; leaf < n; ++leaf) {
    const size_t word = 1 + leaf / 32;
    const bool present =
        word < h.count && ((static_cast<uint32_t>(pkt.word(word)) >> (leaf % 32)) & 1u) != 0;
    // This leaf's own ranks all contributed (the copy is complete here).
    if (present || leaf == t.child_index) continue;
    if (m < wire::kTreeNoteMaxLeaves) note[3 + m] = static_cast<int32_t>(leaf);
    ++m;
    const uint32_t hi = first_rank(leaf + 1);
    for (uint32_t r = first_rank(leaf); r < hi && r < W; ++r) {
      bits[r / 32] =
          static_cast<int32_t>(static_cast<uint32_t>(bits[r / 32]) & ~(uint32_t{1} << (r % 32)));
    }
  }
  note[0] = static_cast<int32_t>(wire::kTreeNoteTag);
  note[1] = static_cast<int32_t>(by_rule ? wire::kTreeNoteByRule : 0u);
  note[2] = static_cast<int32_t>(m);
  report_seq_[k] = c.seq;
  report_valid_[k] = 1;
  ++counters_.parent_missing;
  return root_missing_reply(k, Reply::Target::kAllRanks, 0, h);
}

// A kMissingRanks ERROR about copy `k` from its stored root report: [reason, global bitmap, tree
// note with the missing leaves listed].
uint32_t LeafRelay::first_rank(uint32_t leaf) const {
  const TreeConfig& t = cfg_.tree;
  const uint32_t W = cfg_.slots.world_size;
  if (leaf >= parent_world_) return W;
  if (!t.leaf_bases.empty()) return leaf < t.leaf_bases.size() ? t.leaf_bases[leaf] : W;
  return static_cast<uint32_t>(uint64_t{leaf} * W / parent_world_);
}

// A local rank's abort (Engine::handle_abort) for a round this leaf has no result of: the parent
// hears it as this leaf giving up, [kAborted, child_index, cause]. Sent for every abort a rank
// sends (each sends it twice, best effort): the root keeps the first and ignores the rest.
Reply LeafRelay::forward_abort(const wire::Header& h, uint32_t cause) {
  if (h.slot >= cfg_.slots.num_slots) return {};
  const size_t k = copy_index(h.slot, h.shadow);
  const CopyView c = table_.copy(h.slot, h.shadow);
  // An incomplete round never went up; a complete one did, and counts while it awaits the parent.
  if (c.seq != h.seq || (c.complete && !awaits_parent(k))) return {};
  scratch_[0] = static_cast<int32_t>(wire::ErrorReason::kAborted);
  scratch_[1] = static_cast<int32_t>(cfg_.tree.child_index);
  scratch_[2] = static_cast<int32_t>(cause);
  Reply r;
  r.target = Reply::Target::kParent;
  r.hdr = reply_header(cfg_, h, wire::kFlagError);
  r.hdr.rank = static_cast<uint16_t>(cfg_.tree.child_index);
  r.hdr.count = 3;
  r.payload = bytes_of(scratch_);
  ++counters_.replies_out;
  ++counters_.aborts_forwarded;
  return r;
}

long LeafRelay::waiting_copy(const wire::Header& h, Join join) {
  if (join != Join::kDone || h.slot >= cfg_.slots.num_slots) {
    ++counters_.parent_stale;
    return -1;
  }
  const size_t k = copy_index(h.slot, h.shadow);
  const CopyView c = table_.copy(h.slot, h.shadow);
  if (!awaits_parent(k) || !c.complete || c.seq != h.seq) {
    ++counters_.parent_stale;
    return -1;
  }
  return static_cast<long>(k);
}

// The root's ERROR kAborted in answer to this leaf's partial (or exponent request) for a copy it
// waits on: another leaf gave up on the round. Every local rank fails it now, and their
// retransmissions get the same answer (on_resend).
Reply LeafRelay::on_root_abort(const wire::PacketView& pkt, Join join) {
  if (pkt.hdr.count < 3) return {};
  const long k = waiting_copy(pkt.hdr, join);
  if (k < 0) return {};
  tree_state_[k] = kAborted;
  int32_t* w = above_words_.data() + static_cast<size_t>(k) * above_stride_;
  w[0] = static_cast<int32_t>(first_rank(static_cast<uint32_t>(pkt.word(1))));
  w[1] = static_cast<int32_t>(pkt.word(2));
  return above_reply(static_cast<size_t>(k), Reply::Target::kAllRanks, 0, pkt.hdr);
}

Reply LeafRelay::local_mismatch(const wire::Header& h) {
  const size_t k = copy_index(h.slot, h.shadow);
  const CopyView c = table_.copy(h.slot, h.shadow);
  if (tree_state_[k] == kMismatched && mismatch_seq_[k] == c.seq) {
    return above_reply(k, Reply::Target::kSender, h.rank + cfg_.tree.rank_base, h);
  }
  // First, or again on a local rank's resend while the parent has not answered (a lost ERROR).
  tree_state_[k] = kMismatchUp;
  mismatch_seq_[k] = c.seq;
  put_mismatch_head(c, scratch_.data());
  // The ranks of the other shape, then those of the first (this leaf's ranks only: the root sees
  // which shape the other leaves' ranks called with and words the answer from it).
  int32_t* other = scratch_.data() + 6;
  int32_t* first = other + report_words_;
  std::fill_n(other, 2 * report_words_, 0);
  for (uint32_t r = 0; r < cfg_.tree.local_ranks; ++r) {
    const uint32_t g = cfg_.tree.rank_base + r;
    const auto bit = static_cast<int32_t>(uint32_t{1} << (g % 32));
    if (test_bit(c.other_ranks, r)) {
      other[g / 32] |= bit;
    } else if (test_bit(c.bitmap, r)) {
      first[g / 32] |= bit;
    }
  }
  scratch_[6 + 2 * report_words_] = static_cast<int32_t>(wire::kTreeNoteTag);
  wire::Header in;
  in.coll = c.coll;
  in.seq = c.seq;
  in.slot = h.slot;
  in.shadow = h.shadow;
  in.elems = c.elems;
  Reply r;
  r.target = Reply::Target::kParent;
  r.hdr = reply_header(cfg_, in, wire::kFlagError);
  r.hdr.rank = static_cast<uint16_t>(cfg_.tree.child_index);
  r.hdr.count = static_cast<uint16_t>(7 + 2 * report_words_);
  r.payload = bytes_of(scratch_);
  ++counters_.replies_out;
  return r;
}

// The root's full kRoundMismatch about a copy this leaf forwarded: the leaves disagree. Its bitmap
// names leaves (of the other shape); the ranks get it in global ranks, each leaf's range set. Or
// the words a leaf whose own ranks disagree sent up, which the root passes to every leaf as they
// are: a bitmap of global ranks, then the tree note's tag (WIRE.md, "Mismatches in a tree").
Reply LeafRelay::on_root_mismatch(const wire::PacketView& pkt, Join join) {
  const wire::Header& h = pkt.hdr;
  if (h.count == 7 + report_words_ &&
      static_cast<uint32_t>(pkt.word(h.count - 1u)) == wire::kTreeNoteTag) {
    if (join != Join::kDone || h.slot >= cfg_.slots.num_slots) {
      ++counters_.parent_stale;
      return {};
    }
    const size_t k = copy_index(h.slot, h.shadow);
    const CopyView c = table_.copy(h.slot, h.shadow);
    const bool poisoned_here =
        tree_state_[k] == kMismatchUp && mismatch_seq_[k] == h.seq && c.seq == h.seq;
    if (!poisoned_here && waiting_copy(h, join) < 0) return {};
    tree_state_[k] = kMismatched;
    mismatch_seq_[k] = h.seq;
    int32_t* w = above_words_.data() + k * above_stride_;
    for (size_t i = 0; i < 5 + report_words_; ++i) w[i] = static_cast<int32_t>(pkt.word(1 + i));
    return above_reply(k, Reply::Target::kAllRanks, 0, h);
  }
  const uint32_t leaf_words = (parent_world_ + 31) / 32;
  if (pkt.hdr.count < 6 + leaf_words) return {};  // the short form: nothing to relay
  const long k = waiting_copy(pkt.hdr, join);
  if (k < 0) return {};
  tree_state_[k] = kMismatched;
  mismatch_seq_[k] = pkt.hdr.seq;
  int32_t* w = above_words_.data() + static_cast<size_t>(k) * above_stride_;
  for (size_t i = 0; i < 5; ++i) w[i] = static_cast<int32_t>(pkt.word(1 + i));
  uint32_t* bits = reinterpret_cast<uint32_t*>(w + 5);
  std::fill_n(bits, report_words_, 0u);
  const uint32_t W = cfg_.slots.world_size;
  for (uint32_t leaf = 0; leaf < parent_world_; ++leaf) {
    if (((static_cast<uint32_t>(pkt.word(6 + leaf / 32)) >> (leaf % 32)) & 1u) == 0) continue;
    const uint32_t hi = first_rank(leaf + 1);
    for (uint32_t r = first_rank(leaf); r < hi && r < W; ++r)
      bits[r / 32] |= uint32_t{1} << (r % 32);
  }
  return above_reply(static_cast<size_t>(k), Reply::Target::kAllRanks, 0, pkt.hdr);
}

Reply LeafRelay::above_reply(size_t k, Reply::Target target, uint32_t rank,
                             const wire::Header& in) {
  const bool aborted = tree_state_[k] == kAborted;
  const size_t n = aborted ? 2 : above_stride_;
  scratch_[0] = static_cast<int32_t>(aborted ? wire::ErrorReason::kAborted
                                             : wire::ErrorReason::kRoundMismatch);
  const int32_t* w = above_words_.data() + k * above_stride_;
  std::copy(w, w + n, scratch_.begin() + 1);
  return copy_error(k, table_.copy(static_cast<uint16_t>(k / 2), (k % 2) != 0).seq, n, target, rank,
                    in);
}

Reply LeafRelay::copy_error(size_t k, BlockSeq seq, size_t n, Reply::Target target, uint32_t rank,
                            const wire::Header& in) {
  Reply r;
  r.target = target;
  r.hdr = reply_header(cfg_, in, wire::kFlagError);
  r.hdr.seq = seq;
  r.hdr.slot = static_cast<uint16_t>(k / 2);
  r.hdr.shadow = (k % 2) != 0;
  r.hdr.rank = static_cast<uint16_t>(rank);
  r.hdr.count = static_cast<uint16_t>(1 + n);
  r.payload = bytes_of(scratch_);
  counters_.replies_out += target == Reply::Target::kAllRanks ? cfg_.tree.local_ranks : 1;
  return r;
}

Reply LeafRelay::root_missing_reply(size_t k, Reply::Target target, uint32_t rank,
                                    const wire::Header& in) {
  const int32_t* src = report(k);
  const uint32_t listed =
      std::min<uint32_t>(static_cast<uint32_t>(src[report_words_ + 2]), wire::kTreeNoteMaxLeaves);
  const size_t n = report_words_ + 3 + listed;
  scratch_[0] = static_cast<int32_t>(wire::ErrorReason::kMissingRanks);
  std::copy(src, src + n, scratch_.begin() + 1);
  return copy_error(k, report_seq_[k], n, target, rank, in);
}

void LeafRelay::put_global_bitmap(std::span<const uint64_t> served, int32_t* dst) const {
  const uint32_t world = cfg_.slots.world_size;
  const uint32_t words = (world + 31) / 32;
  for (uint32_t w = 0; w < words; ++w) {
    uint32_t bits = 0;
    for (uint32_t b = 0; b < 32; ++b) {
      const uint32_t r = w * 32 + b;
      if (r >= world) break;
      const uint32_t local = r - cfg_.tree.rank_base;  // wraps below rank_base
      if (local >= cfg_.tree.local_ranks || test_bit(served, local)) bits |= uint32_t{1} << b;
    }
    dst[w] = static_cast<int32_t>(bits);
  }
}

void LeafRelay::append_root_missing(size_t copy, BlockSeq seq, std::vector<uint32_t>* out) const {
  if (!report_for(copy, seq)) return;
  const int32_t* bits = report(copy);
  for (uint32_t r = 0; r < cfg_.slots.world_size; ++r) {
    if (((static_cast<uint32_t>(bits[r / 32]) >> (r % 32)) & 1u) == 0) out->push_back(r);
  }
}

}  // namespace ina::agg
