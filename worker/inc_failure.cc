// Failure handling of the in-network engine (inc_engine.h): the aggregator's error reports, the
// deadline and the aborts that settle it, and the text of every error a collective returns.
//
// A dead aggregator: its host answers our datagrams with ICMP port unreachable, which the kernel
// UDP transport counts as refusals. Refusals during a collective and no datagram from the
// aggregator for kRefusedSilence end the collective at once with Unavailable (the communicator
// redoes it on the host path when the fallback is armed), instead of waiting for the deadline,
// which stays for aggregators that are alive but silent and for ranks that are missing. An
// aggregator that is alive answers every retransmission (a result or its contributor bitmap), so
// silence with refusals is not what a slow job looks like. After kSilenceProbe without a datagram
// the rank sends the aggregator an empty datagram (Transport::probe; the aggregator ignores it),
// so that a dead one is refused within tens of milliseconds: otherwise, with no result coming
// back, the rank would send nothing, and learn nothing, until a retransmission timer fired
// (hundreds of milliseconds on a loaded machine). Joining, the same holds after
// kRefusedJoin of refusals with no answer at all (longer: an aggregator may start a little after
// its ranks), so a dead or mistyped aggregator, and the probe that asks whether a lost one is
// back, fail within a second instead of the join's whole deadline.
//
// A silent aggregator: one restarted on the same port (a supervisor's restart) neither refuses
// nor answers (it has no key for this incarnation: every DATA is a bad tag there), and neither
// does a host that is down. An aggregator that is alive answers every retransmission, with a
// result or, while ranks are missing, its contributor bitmap (a straggler of seconds keeps
// getting them). So where the host path can take over (the path policy arms this with
// set_silence_limit), kSilentResends retransmissions unanswered and nothing authentic for the
// limit end the collective with Unavailable too. Without the fallback only the deadline ends the
// wait, as before: an early error would gain a user nothing over a stall of the aggregator that
// may pass.
#include <algorithm>
#include <string>
#include <vector>

#include "ina/base/log.h"
#include "worker/inc_engine.h"
#include "worker/inc_engine_internal.h"

namespace ina::worker {

Status IncEngine::on_error(const wire::PacketView& pv) {
  ++stats_.error_reports;
  const wire::Header& h = pv.hdr;
  if (h.count < 1) {
    ++stats_.malformed;
    return ok_status();
  }
  const auto reason = static_cast<wire::ErrorReason>(pv.word(0));
  switch (reason) {
    case wire::ErrorReason::kMissingRanks:
    case wire::ErrorReason::kJobNotReady:
      if (in_collective(h.seq)) remember_missing(pv, reason);
      break;
    case wire::ErrorReason::kRoundMismatch:
      if (in_collective(h.seq)) {
        resync_after_mismatch();
        // A flat aggregator's poisoned round: both shapes and their ranks (wire.h).
        if (h.count >= 6 + (world_ + 31) / 32) {
          mismatch_body_ = mismatch_text(pv);
          return invalid_argument("collective " + std::to_string(coll_.coll) + ": " +
                                  mismatch_body_);
        }
        mismatch_body_ =
            "ranks disagree on count/dtype/op: every rank must call allreduce with the same "
            "arguments (and the same INA_BLOCK_ELEMS and INA_WINDOW)";
        std::string m = describe_collective() + ": " + mismatch_body_;
        if (h.count >= 2) {
          const uint16_t slot = h.slot;
          m += "; the aggregator's round for block seq " + std::to_string(h.seq) + " (slot " +
               std::to_string(slot) + ") expects " + std::to_string(pv.word(1)) + " elements";
          if (slot < coll_.width) m += ", this rank sent " + std::to_string(slots_[slot].count);
        }
        return invalid_argument(std::move(m));
      }
      break;
    case wire::ErrorReason::kAborted:
    case wire::ErrorReason::kSuperseded: {
      // Another rank gave up on a round this rank still waits for (it reached its deadline
      // before this rank's block arrived), or the others have moved past it since: every rank
      // fails the collective. Only the outstanding round counts: the answer to a delayed
      // duplicate of an older round says nothing.
      const Slot* sl = h.slot < coll_.width ? &slots_[h.slot] : nullptr;
      const bool aborted = reason == wire::ErrorReason::kAborted;
      if (sl == nullptr || !sl->active || sl->seq != h.seq || sl->shadow != h.shadow ||
          h.count < (aborted ? 3 : 2)) {
        break;
      }
      // The copy holds a round at or past this collective's resynchronization point: the others
      // moved on because the aggregator told them the ranks disagree on this collective, and
      // this rank was not told (its answer was lost, or it has not resent yet). Its next resend
      // of the poisoned round gets the same mismatch words (the aggregator keeps them for the
      // collective), so it waits for them instead of failing otherwise than the others did.
      if (!aborted && seq_offset(static_cast<BlockSeq>(pv.word(1)), resync_point(coll_.base_seq)) <
                          (uint32_t{1} << 31)) {
        break;
      }
      const std::string who = aborted ? "rank " + std::to_string(pv.word(1)) + " gave up on"
                                      : std::string("the other ranks gave up on and moved past");
      // What the aggregator last said it lacked for that round (or any), when it said so: the
      // ranks that made the others give up.
      const MissingReport* rep = report_for(h.slot, h.seq);
      std::string lacking;
      if (rep != nullptr && rep->reason == wire::ErrorReason::kMissingRanks) {
        lacking = missing_clause(*rep);
      }
      // The ranks that did not contribute, when known, come first: they are the cause, and the
      // rank that gave up is only the first to reach its deadline.
      std::string cause;
      if (!lacking.empty()) cause = lacking.substr(2) + "; ";  // without its leading "; "
      return deadline_exceeded(describe_collective() + ": aborted: " + cause + who + " block seq " +
                               std::to_string(h.seq) + " (slot " + std::to_string(h.slot) +
                               ") at the deadline (INA_TIMEOUT_MS), before the round completed; "
                               "every rank fails this collective, and the communicator stays "
                               "usable for the next one");
    }
    case wire::ErrorReason::kWorldSizeMismatch:
    default: break;  // not about a collective; joining handles it
  }
  return ok_status();
}

void IncEngine::remember_missing(const wire::PacketView& pv, wire::ErrorReason reason) {
  missing_.valid = true;
  missing_.reason = reason;
  missing_.seq = pv.hdr.seq;
  missing_.slot = pv.hdr.slot;
  missing_.bitmap.resize(pv.hdr.count - 1u);  // capacity stays after the first report
  for (size_t w = 1; w < pv.hdr.count; ++w) {
    missing_.bitmap[w - 1] = static_cast<uint32_t>(pv.word(w));
  }
  if (pv.hdr.slot < slot_missing_.size()) {
    MissingReport& r = slot_missing_[pv.hdr.slot];
    r.valid = true;
    r.reason = reason;
    r.seq = missing_.seq;
    r.slot = missing_.slot;
    r.bitmap.assign(missing_.bitmap.begin(), missing_.bitmap.end());  // capacity reused
  }
}

std::string IncEngine::tree_note_text(const MissingReport& r) const {
  // A tree leaf's note after the world's bitmap words (see wire::ErrorReason::kMissingRanks):
  // the tag, flags, the number of leaves the missing ranks are behind, the first few of them.
  const std::vector<uint32_t>& b = r.bitmap;
  const size_t words = (size_t{world_} + 31) / 32;
  if (!r.valid || r.reason != wire::ErrorReason::kMissingRanks || b.size() < words + 3 ||
      b[words] != wire::kTreeNoteTag) {
    return {};
  }
  const bool by_rule = (b[words + 1] & wire::kTreeNoteByRule) != 0;
  const uint32_t leaves = b[words + 2];
  if (leaves == 0) return {};
  const size_t listed = std::min<size_t>({b.size() - words - 3, leaves, wire::kTreeNoteMaxLeaves});
  std::string s = leaves == 1 ? " (behind tree leaf " : " (behind tree leaves ";
  for (size_t i = 0; i < listed; ++i) {
    if (i != 0) s += ", ";
    s += std::to_string(b[words + 3 + i]);
  }
  if (leaves > listed) s += ", ... (" + std::to_string(leaves) + " in all)";
  if (by_rule) {
    s += "; the root names leaves only, their ranks follow from the balanced rule leaf i of n "
         "serves [i*W/n, (i+1)*W/n)";
  }
  return s + ")";
}

bool IncEngine::in_collective(BlockSeq seq) const {
  return seq_offset(seq, coll_.base_seq) < coll_.rounds_total;
}

// ---------------------------------------------------------------------------------------------
// Messages

std::string IncEngine::describe_collective() const {
  std::string s = "allreduce of " + std::to_string(coll_.count) + " ";
  s += dtype_name(coll_.dtype);
  s += " elements (";
  s += op_name(coll_.op);
  s += ")";
  return s;
}

// A poisoned round's words (wire.h, kRoundMismatch): the same text on every rank. The group
// holding rank 0 comes first, whichever shape reached the aggregator first.
std::string IncEngine::mismatch_text(const wire::PacketView& pv) const {
  const uint32_t words = (world_ + 31) / 32;
  std::vector<uint32_t> other(words), first(words);
  for (uint32_t w = 0; w < words; ++w) {
    other[w] = static_cast<uint32_t>(pv.word(6 + w));
    first[w] = ~other[w];
  }
  auto shape = [](uint32_t elems, uint32_t packed) {
    const auto t = static_cast<DType>(packed & 0xFF);
    const auto op = static_cast<ReduceOp>((packed >> 8) & 0xFF);
    const auto root = static_cast<uint16_t>(packed >> 16);
    std::string s = std::to_string(elems) + " " + std::string(dtype_name(t)) + " elements (" +
                    std::string(op_name(op)) + ")";
    if (root != wire::kNoRoot) s += " to root " + std::to_string(root);
    return s;
  };
  // missing_ranks_text lists the ranks whose bit is clear.
  const std::string a = "ranks " + missing_ranks_text(other) + ": " +
                        shape(static_cast<uint32_t>(pv.word(2)), static_cast<uint32_t>(pv.word(3)));
  const std::string b = "ranks " + missing_ranks_text(first) + ": " +
                        shape(static_cast<uint32_t>(pv.word(4)), static_cast<uint32_t>(pv.word(5)));
  const bool rank0_other = (other[0] & 1u) != 0;
  return "ranks disagree on count/dtype/op (" + (rank0_other ? b + "; " + a : a + "; " + b) +
         "): every rank must call allreduce with the same arguments; the communicator stays "
         "usable for the next collective";
}

// At the deadline. This rank gives up on its outstanding rounds (ERROR kAborted), but a late
// rank's last block may reach the aggregator before the abort does: then the round completes
// there, the late rank returns success, and this rank must not fail. The two race to the
// aggregator, and only there is their order known, so it decides: it answers each abort with the
// round's result (the round completed first) or with the abort (the abort came first; every
// later DATA for the round gets the same words, so the late rank fails too). This rank waits for
// those answers, up to kAbortSettle, resending its aborts on the retransmission timer: a result
// for every remaining round completes the collective (late, and the same on every rank); any
// abort, or no answer, fails it. A block this rank never sent cannot have completed anywhere, so
// with one left the collective fails at once. An aggregator that is alive answers within a round
// trip: a rank that is gone costs the others one round trip past their deadline, not
// kAbortSettle.
Status IncEngine::settle_at_deadline(Status failed) {
  uint64_t outstanding = 0;
  for (uint32_t s = 0; s < coll_.width; ++s) outstanding += slots_[s].active ? 1 : 0;
  const bool all_sent = outstanding == coll_.rounds_left;
  send_aborts(/*keep_active=*/all_sent);
  if (!all_sent) return failed;
  // However the wait ends, results sample RTTs again and no round stays outstanding.
  settling_ = true;
  struct Settled {
    IncEngine* e;
    ~Settled() {
      e->settling_ = false;
      for (uint32_t s = 0; s < e->coll_.width; ++s) e->slots_[s].active = false;
    }
  } settled{this};
  const Clock::time_point start = Clock::now();
  const Clock::time_point until = start + kAbortSettle;
  Clock::duration rto = cc_.rto();
  Clock::time_point due = start + rto;
  transport_->set_spin(std::chrono::microseconds(0));  // waiting on the slow, not on a round trip
  for (;;) {
    if (coll_.rounds_left == 0) {
      ++stats_.late_completions;
      INA_DEBUG("worker",
                "rank %d: %s completed %.1f ms after its deadline: the aggregator had completed "
                "every outstanding round before this rank's abort",
                cfg_.rank, describe_collective().c_str(), ms_since(start));
      return ok_status();
    }
    Clock::time_point now = Clock::now();
    if (now >= until) break;
    const auto wait = std::chrono::ceil<std::chrono::microseconds>(std::min(due, until) - now);
    Result<size_t> n = transport_->recv_batch(rx_, wait);
    if (!n.ok()) break;
    for (size_t i = 0; i < n.value(); ++i) {
      // An answer that ends the collective (an abort, a mismatch) fails it. The deadline's own
      // message stays: it names the ranks the aggregator missed.
      Status st = on_datagram(rx_[i]);
      if (!st.ok()) return st.code() == StatusCode::kDeadlineExceeded ? failed : st;
    }
    now = Clock::now();
    if (now >= due && coll_.rounds_left > 0) {
      resend_aborts();
      rto *= 2;
      due = now + rto;
    }
  }
  return failed;
}

void IncEngine::resend_aborts() {
  tx_.clear();
  for (uint32_t s = 0; s < coll_.width; ++s) {
    const Slot& sl = slots_[s];
    if (sl.active) tx_.emplace_back(sl.pkt, sl.pkt_len);
  }
  if (tx_.empty()) return;
  stats_.packets_sent += tx_.size();
  (void)transport_->send_batch(tx_);
}

void IncEngine::send_aborts(bool keep_active) {
  tx_.clear();
  for (uint32_t s = 0; s < coll_.width; ++s) {
    Slot& sl = slots_[s];
    if (!sl.active) continue;
    wire::Header h;  // dtype int32, op sum: the payload is control words
    h.flags = wire::kFlagError;
    h.job = cfg_.job;
    h.seq = sl.seq;
    h.rank = static_cast<uint16_t>(cfg_.rank);
    h.slot = static_cast<uint16_t>(s);
    h.shadow = sl.shadow;
    h.count = 3;
    h.coll = coll_.coll;
    h.elems = static_cast<uint32_t>(coll_.count);
    wire::encode_header(h, sl.pkt);
    const int32_t words[3] = {static_cast<int32_t>(wire::ErrorReason::kAborted), cfg_.rank,
                              static_cast<int32_t>(wire::kAbortDeadline)};
    wire::store_words(sl.pkt + wire::kHeaderSize, words, 3);
    sl.pkt_len = static_cast<uint32_t>(wire::control_packet_size(3));
    seal_tag(std::span<uint8_t>(sl.pkt, sl.pkt_len), traffic_key_);
    sl.active = keep_active;  // the round is given up (or its answer awaited)
    tx_.emplace_back(sl.pkt, sl.pkt_len);
  }
  if (tx_.empty()) return;
  // Twice: one lost copy must not let a late rank complete the round. Best effort: the
  // collective has failed already, and a send error says nothing new.
  for (int i = 0; i < 2; ++i) {
    stats_.packets_sent += tx_.size();
    (void)transport_->send_batch(tx_);
  }
}

// After a mismatch every rank fails the collective (the poisoned rounds tell them all), but each
// advanced its counters by its own block count: every rank moves to the same next point instead
// (the next multiple of 2^24 of the block sequence above this collective's first block, every
// slot's copy parity reset), so the next collective's rounds line up again.
void IncEngine::resync_after_mismatch() { resync(coll_.base_seq, next_coll_); }

BlockSeq IncEngine::resync_point(BlockSeq from) {
  constexpr BlockSeq kStep = BlockSeq{1} << 24;
  const auto next = static_cast<BlockSeq>((from / kStep + 1) * kStep);
  return next == 0 ? 1 : next;  // 0 is never a block's seq
}

void IncEngine::resync(BlockSeq from, uint32_t next_coll) {
  next_seq_ = resync_point(from);
  next_coll_ = next_coll;
  std::fill(use_.begin(), use_.end(), 0u);
}

std::string IncEngine::missing_ranks_text(const std::vector<uint32_t>& bitmap) const {
  // "3", "0-2, 5", capped so a huge job does not produce a huge message.
  constexpr size_t kMaxRanges = 16;
  auto present = [&](uint32_t r) {
    const size_t w = r / 32;
    return w < bitmap.size() && ((bitmap[w] >> (r % 32)) & 1u) != 0;
  };
  std::string s;
  size_t ranges = 0;
  uint32_t missing = 0;
  for (uint32_t r = 0; r < world_;) {
    if (present(r)) {
      ++r;
      continue;
    }
    uint32_t end = r;
    while (end + 1 < world_ && !present(end + 1)) ++end;
    missing += end - r + 1;
    if (ranges < kMaxRanges) {
      if (!s.empty()) s += ", ";
      s += std::to_string(r);
      if (end > r) s += "-" + std::to_string(end);
    }
    ++ranges;
    r = end + 1;
  }
  if (ranges > kMaxRanges) s += ", ... (" + std::to_string(missing) + " in all)";
  return s;
}

std::string IncEngine::refused_note(uint64_t refusals_at_start) const {
  if (transport_->refusals() <= refusals_at_start) return {};
  return "; aggregator " + transport_->peer_name() + " refused (no process listening?)";
}

Status IncEngine::gone_status(Clock::duration silent) const {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(silent).count();
  return unavailable(describe_collective() + ": aggregator " + transport_->peer_name() +
                     " is gone: it refused our datagrams (ICMP port unreachable: nothing listens "
                     "at its port) and sent nothing for " +
                     std::to_string(ms) + " ms");
}

Status IncEngine::silent_status(Clock::duration silent, uint64_t resends) const {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(silent).count();
  return unavailable(describe_collective() + ": aggregator " + transport_->peer_name() +
                     " is silent: nothing authentic from it for " + std::to_string(ms) +
                     " ms and " + std::to_string(resends) +
                     " retransmissions unanswered (stopped, restarted without this job's "
                     "incarnation, or its host down?)");
}

// The aggregator's report on round `seq` of slot `slot` when it has one, else its latest report of
// any block; null without one.
const IncEngine::MissingReport* IncEngine::report_for(size_t slot, BlockSeq seq) const {
  if (slot < slot_missing_.size() && slot_missing_[slot].valid && slot_missing_[slot].seq == seq) {
    return &slot_missing_[slot];
  }
  return missing_.valid ? &missing_ : nullptr;
}

// "; ranks 4-7 (behind tree leaf 1) did not contribute (aggregator bitmap)", from a report of the
// aggregator (a kMissingRanks bitmap, or kJobNotReady's HELLO bitmap).
std::string IncEngine::missing_clause(const MissingReport& rep) const {
  const std::string ranks = missing_ranks_text(rep.bitmap);
  if (rep.reason == wire::ErrorReason::kJobNotReady) {
    return "; the aggregator reports job " + std::to_string(cfg_.job) + " not ready: ranks " +
           (ranks.empty() ? std::string("?") : ranks) + " have not joined (did a rank restart?)";
  }
  if (ranks.empty())
    return "; every rank contributed (aggregator bitmap) but the result did not arrive";
  const bool one = ranks.find_first_of(",-") == std::string::npos;
  return (one ? "; rank " : "; ranks ") + ranks + tree_note_text(rep) +
         " did not contribute (aggregator bitmap)";
}

Status IncEngine::deadline_status(std::chrono::milliseconds limit) const {
  // The oldest outstanding round is the one the collective is waiting for.
  const Slot* oldest = nullptr;
  for (uint32_t s = 0; s < coll_.width; ++s) {
    const Slot& sl = slots_[s];
    if (!sl.active) continue;
    if (oldest == nullptr ||
        seq_offset(sl.seq, coll_.base_seq) < seq_offset(oldest->seq, coll_.base_seq)) {
      oldest = &sl;
    }
  }
  std::string m =
      describe_collective() + ": deadline " + std::to_string(limit.count()) + " ms exceeded";
  if (oldest != nullptr) {
    m += " waiting for block seq " + std::to_string(oldest->seq) + " (slot " +
         std::to_string(oldest - slots_.data()) + ")";
  }
  // The aggregator's report on the oldest outstanding block, when it has one: a rank that is gone
  // is missing from every block from its last one on, while the live ranks, whose windows stop
  // W blocks further, have all sent the oldest; a later block's report would name them too.
  const MissingReport* rep =
      oldest != nullptr ? report_for(static_cast<size_t>(oldest - slots_.data()), oldest->seq)
                        : (missing_.valid ? &missing_ : nullptr);
  if (rep != nullptr)
    return deadline_exceeded(m + missing_clause(*rep) + refused_note(refusals_at_start_));
  if (heard_) {
    return deadline_exceeded(m + "; the aggregator did not report which ranks are missing" +
                             refused_note(refusals_at_start_));
  }
  return unavailable(m + ": no answer from aggregator " + transport_->peer_name() +
                     refused_note(refusals_at_start_));
}

}  // namespace ina::worker
