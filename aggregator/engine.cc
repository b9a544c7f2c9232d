// The aggregator's packet logic (see engine.h). Order of checks for every datagram:
//   1. wire::decode: a datagram that is not a well-formed INA packet is counted by reason.
//   2. job lookup, then the tag (the packet MAC under the job's key over the datagram: WIRE.md): a
//      packet for a job this engine does not serve, or whose tag the job's key does not give
//      (forged, corrupted, truncated into a valid shape, another job's key), is counted and never
//      answered, before it touches any state (join barrier, slot table, the rank's address that
//      the backend learns from *sender_rank), so a stray or hostile sender learns nothing and
//      cannot make the aggregator send traffic anywhere (isolation between jobs). A captured
//      genuine packet replayed later in the same incarnation passes the tag; the slot table's
//      round check makes it stale. Which key (WIRE.md, "Incarnations"): a HELLO the job's (its
//      sender does not know the incarnation yet); anything else the key of the job's current
//      incarnation (incarnation_key of the epoch its barrier got), so that a packet captured in an
//      earlier incarnation of the job, whose block sequence started at 1 too, fails here.
//      A float SUM DATA packet is verified by the pass that stores its words in the slot table
//      (SlotTable::raw_words_for: only where a forged packet's words change nothing), or, the one
//      that completes its round, by a pass that scans them in the datagram, where the completion
//      reads them.
//   3. kind: workers send only DATA and HELLO; RESULT/ERROR/WELCOME flags from them are malformed,
//      except for a leaf job, where they are its parent's answers (handle_parent).
//   4. HELLO -> join barrier; DATA -> slot table, once the barrier is complete.
// A leaf job of an aggregation tree serves global ranks [rank_base, rank_base + local_ranks): its
// slot table, counters and telemetry are indexed by rank - rank_base, and replies and error
// bitmaps name global ranks. What it does beyond a flat job (join its parent once its local ranks
// joined, send its completed copies' partials up and relay the parent's RESULTs, the root's
// missing-children report) is its LeafRelay's (leaf_relay.h), which the engine calls at a few
// points: the parent's packets (handle_parent), a completed barrier, a completed copy, a
// retransmission for a copy still waiting for the parent, and the bitmaps of its errors.
// Every reply is built in place (header + a pointer to the payload): RESULT payloads point at the
// slot copy's accumulator, control payloads at scratch_, sized in add_job(), so nothing here
// allocates per packet.
//
// This file holds the jobs, the dispatch and the rounds (DATA through the slot table and its
// verdicts' replies). The other phases have files of their own, all working on the per-job state
// of engine_job.h: the join barrier (engine_join.cc), aborts, mismatches and error replies
// (engine_failure.cc), telemetry and loss tracking (engine_telemetry.cc). The tree-leaf relay is
// leaf_relay.cc's.
#include "aggregator/engine.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include "aggregator/engine_job.h"
#include "aggregator/leaf_relay.h"
#include "aggregator/reply_build.h"

namespace ina::agg {

namespace {

// The datagram's tag is the one the job's key (a HELLO) or its incarnation's key gives (WIRE.md).
// At a leaf, its parent's answers (RESULT, ERROR) carry the parent incarnation's key; an ERROR
// there may also be a local rank's abort (this incarnation's key) or the parent's answer to the
// leaf's HELLO (the job's key). One tag per packet but such a leaf ERROR: the key is chosen
// by the flags, and derived once per incarnation.
bool verify_tag(const JobConfig& cfg, const Key128& traffic, const LeafRelay* relay,
                const wire::Header& h, std::span<const uint8_t> datagram) {
  if (h.has(wire::kFlagHello)) return wire::tag_ok(datagram, cfg.key);
  if (relay != nullptr && h.has(wire::kFlagResult | wire::kFlagError)) [[unlikely]] {
    if (wire::tag_ok(datagram, relay->up_key())) return true;
    return h.has(wire::kFlagError) &&
           (wire::tag_ok(datagram, traffic) || wire::tag_ok(datagram, cfg.key));
  }
  return wire::tag_ok(datagram, traffic);
}

}  // namespace

uint64_t draw_epoch_salt() {
  uint64_t v = 0;
  auto* p = reinterpret_cast<uint8_t*>(&v);
  size_t got = 0;
  while (got < sizeof v) {
    const ssize_t n = ::getrandom(p + got, sizeof v - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      // No getrandom (pre-3.17 kernel): std::random_device reads the kernel's source too.
      std::random_device rd;
      return uint64_t{rd()} << 32 | rd();
    }
  }
  return v;
}

const char* tree_role_name(TreeRole r) {
  switch (r) {
    case TreeRole::kFlat: return "flat";
    case TreeRole::kLeaf: return "leaf";
    case TreeRole::kRoot: return "root";
  }
  return "?";
}

Engine::Engine() = default;
Engine::Engine(EngineOptions opts) : opts_(opts) {}
Engine::~Engine() = default;

Status Engine::add_job(const JobConfig& cfg) {
  if (jobs_.count(cfg.job) != 0) {
    return Status(StatusCode::kAlreadyExists,
                  "engine: job " + std::to_string(cfg.job) + " is already served");
  }
  INA_RETURN_IF_ERROR(LeafRelay::check_config(cfg));
  SlotTableConfig table_cfg = cfg.slots;
  table_cfg.world_size = cfg.served_ranks();
  if (cfg.is_leaf()) {
    // A leaf's float SUM waits for the root's exponent and quantizes for the global world.
    table_cfg.defer_float_sum = true;
    table_cfg.quant_world = cfg.slots.world_size;
  }
  INA_ASSIGN_OR_RETURN(std::unique_ptr<SlotTable> table, SlotTable::create(table_cfg));
  if (slot_capacity_ != 0) {
    // Ranges are half-open; computed in 64 bits so base + count cannot wrap.
    const uint64_t lo = cfg.slot_base;
    const uint64_t hi = lo + cfg.slots.num_slots;
    const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + ")";
    if (hi > slot_capacity_) {
      return Status(StatusCode::kResourceExhausted,
                    "engine: job " + std::to_string(cfg.job) + ": slot range " + range +
                        " exceeds the capacity of " + std::to_string(slot_capacity_) + " slots");
    }
    for (const auto& [id, other] : jobs_) {
      const uint64_t olo = other->cfg.slot_base;
      const uint64_t ohi = olo + other->cfg.slots.num_slots;
      if (lo < ohi && olo < hi) {
        return Status(StatusCode::kResourceExhausted,
                      "engine: job " + std::to_string(cfg.job) + ": slot range " + range +
                          " overlaps job " + std::to_string(id) + "'s [" + std::to_string(olo) +
                          ", " + std::to_string(ohi) + ")");
      }
    }
  }
  auto job = std::make_unique<Job>();
  job->cfg = cfg;
  job->world = cfg.slots.world_size;
  job->nranks = cfg.served_ranks();
  job->rank_base = cfg.first_rank();
  job->welcome_slots = cfg.slots.num_slots;
  job->welcome_bytes = cfg.slots.max_payload_bytes;
  job->table = std::move(table);
  if (cfg.is_leaf()) {
    job->relay =
        std::make_unique<LeafRelay>(job->cfg, *job->table, job->counters, counters_, scratch_);
  }
  // No incarnation yet: a key no worker holds (an epoch is never 0).
  job->traffic = wire::incarnation_key(cfg.key, 0);
  job->hello_bitmap.assign(job->table->bitmap_words(), 0);
  job->nonce.assign(job->nranks, 0);
  job->next_bitmap.assign(job->table->bitmap_words(), 0);
  job->next_nonce.assign(job->nranks, 0);
  job->hello_bytes.assign(job->nranks, 0);
  job->next_hello_bytes.assign(job->nranks, 0);
  job->ranks.assign(job->nranks, RankCounters{});
  job->first_ns.assign(size_t{cfg.slots.num_slots} * 2, 0);
  job->tele.assign(job->nranks, RankTelemetry{});
  job->second_ns.assign(size_t{cfg.slots.num_slots} * 2, 0);
  job->open.assign(size_t{cfg.slots.num_slots} * 2, 0);
  job->loss.reset(job->nranks, opts_.straggler);
  // Largest control payload: [reason, bitmap as ceil(world/32) int32 words, a leaf's tree
  // note]; WELCOME needs 2.
  // A poisoned round's ERROR: [reason, count, elems, shape, other elems, other shape, ranks].
  scratch_.resize(std::max<size_t>(scratch_.size(), 6 + (size_t{job->world} + 31) / 32 +
                                                        (job->relay ? wire::kTreeNoteWords : 0)));
  // A root's may grow to a leaf's words in global ranks (child_mismatch), once.
  job->mismatch_words.assign(6 + (size_t{job->world} + 31) / 32, 0);
  jobs_.emplace(cfg.job, std::move(job));
  last_job_ = nullptr;
  return ok_status();
}

Status Engine::remove_job(JobId job) {
  last_job_ = nullptr;
  if (jobs_.erase(job) == 0) {
    return Status(StatusCode::kNotFound, "engine: job " + std::to_string(job) + " is not served");
  }
  return ok_status();
}

std::vector<JobConfig> Engine::jobs() const {
  std::vector<JobConfig> out;
  out.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) out.push_back(job->cfg);
  return out;
}

const JobConfig* Engine::job_config(JobId job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : &it->second->cfg;
}

Reply Engine::on_packet(std::span<const uint8_t> datagram, uint64_t now_ns, int32_t* sender_rank,
                        JobId* sender_job, bool counted_elsewhere, const Key128* tag_checked) {
  *sender_rank = -1;
  *sender_job = 0;
  // Every counter of this function moves by `one`: 0 for a copy another engine counts.
  const uint64_t one = counted_elsewhere ? 0 : 1;
  counters_.packets_in += one;
  counters_.bytes_in += one * datagram.size();
  // A worker's liveness probe (WIRE.md): sent only for the ICMP a dead aggregator's host would
  // answer; nothing to do, and not malformed.
  if (datagram.empty()) [[unlikely]]
    return {};

  wire::PacketView pkt;
  const wire::DecodeError err = wire::decode(datagram, &pkt);
  if (err != wire::DecodeError::kOk) [[unlikely]] {
    if (one != 0) counters_.decode.add(err);
    counters_.malformed += one;
    return {};
  }
  const wire::Header& h = pkt.hdr;
  if (last_job_ == nullptr || last_id_ != h.job) [[unlikely]] {
    auto it = jobs_.find(h.job);
    if (it == jobs_.end()) [[unlikely]] {
      counters_.unknown_job += one;
      return {};
    }
    last_id_ = h.job;
    last_job_ = it->second.get();
  }
  Job& job = *last_job_;
  // A float SUM DATA packet's words are stored in the slot table by the pass that verifies its
  // tag (and, float32, scans them): one read of the datagram instead of three. Only where the
  // table says a forged packet may write (raw_words_for), so that a packet failing the tag still
  // changes nothing; every other packet is verified before anything else.
  // The packet that completes its round is verified (and scanned) in the datagram without a
  // copy: the completion reads its words there (raw_words_for's `completes`).
  StoredWords stored;
  bool fused = false;
  if (opts_.check_tag) [[likely]] {
    uint8_t* words = nullptr;
    bool completes = false;
    if ((h.flags & ~(wire::kFlagRetransmit | wire::kFlagNonFinite)) == 0 &&
        codec::needs_exponent(h.dtype, h.op)) {
      const uint32_t served = static_cast<uint32_t>(h.rank) - job.rank_base;  // as below
      if (served < job.nranks) {
        wire::Header local = h;
        local.rank = static_cast<uint16_t>(served);
        words = job.table->raw_words_for(local, &completes);
      }
    }
    // Verified by the backend under the key verify_tag would take (it takes the traffic key for
    // every packet without these flags).
    const bool checked =
        tag_checked != nullptr &&
        (h.flags & (wire::kFlagHello | wire::kFlagResult | wire::kFlagError)) == 0 &&
        *tag_checked == job.traffic;
    bool ok;
    // Where the packet completes its round its words stay in the datagram (the completion reads
    // them there); any other float SUM DATA's are stored in the table by the verifying pass.
    stored.in_datagram = completes;
    if (checked) {
      ok = true;  // the table scans the words (stored.scanned stays false)
      if (words != nullptr && !completes) {
        std::memcpy(words, datagram.data() + wire::kHeaderSize,
                    datagram.size() - wire::kHeaderSize);
      }
    } else if (words == nullptr) {
      ok = verify_tag(job.cfg, job.traffic, job.relay.get(), h, datagram);
    } else if (h.dtype == DType::kFloat32) {
      MagnitudeCodes codes;
      codes.bad = codec::nonfinite_code(h.dtype, h.op);
      ok = completes ? wire::tag_ok_scan(datagram, job.traffic, &codes)
                     : wire::tag_ok_copy(datagram, job.traffic, words, &codes);
      stored.scanned = true;
      stored.scan = codec::scan_of_codes(h.dtype, codes.top, codes.nonfinite);
    } else {  // scanned by on_data, in the datagram or where stored
      ok = completes ? wire::tag_ok(datagram, job.traffic)
                     : wire::tag_ok_copy(datagram, job.traffic, words);
    }
    if (!ok) [[unlikely]] {
      counters_.bad_tag += one;
      job.counters.bad_tag += one;
      return {};
    }
    fused = words != nullptr;
  }
  // Every reply is about this job: the backend seals it with the key the receiver verifies
  // (WIRE.md, "Incarnations"): the job's for WELCOME, HELLO (a leaf's, to its parent) and the
  // answers to a worker's HELLO; the parent incarnation's for a leaf's partials; the current
  // incarnation's for the rest.
  auto keyed = [&job](Reply r, bool answers_hello = false) {
    if (r.hdr.has(wire::kFlagHello) || (answers_hello && r.target == Reply::Target::kSender)) {
      r.key = job.cfg.key;
    } else if (r.target == Reply::Target::kParent) {
      r.key = job.relay->up_key();
    } else {
      r.key = job.traffic;
    }
    return r;
  };
  job.counters.packets += one;
  // The one ERROR a worker sends: it gives up on a round (wire.h, kAborted).
  const bool abort =
      h.flags == wire::kFlagError && h.count == 3 &&
      static_cast<uint32_t>(pkt.word(0)) == static_cast<uint32_t>(wire::ErrorReason::kAborted);
  // And the one a tree leaf sends its root (a root may be configured as a flat job whose ranks are
  // the leaves): its own ranks disagree on a round (WIRE.md, "Mismatches in a tree"):
  // [kRoundMismatch, 5 words, a bitmap of global ranks, the tree tag].
  const bool child_mismatch = !job.relay && h.flags == wire::kFlagError && h.count >= 9 &&
                              (h.count - 7) % 2 == 0 &&
                              static_cast<uint32_t>(pkt.word(0)) ==
                                  static_cast<uint32_t>(wire::ErrorReason::kRoundMismatch) &&
                              static_cast<uint32_t>(pkt.word(h.count - 1u)) == wire::kTreeNoteTag;
  if (!abort && !child_mismatch && (h.has(wire::kFlagResult) || h.has(wire::kFlagError)))
      [[unlikely]] {
    // A leaf's parent answers with RESULT, WELCOME, ERROR and exponent answers (tag checked).
    if (job.relay) return keyed(handle_parent(job, pkt));
    // Only the aggregator sends RESULT, WELCOME and ERROR: a worker (or a loop in the network)
    // sending one is broken, and it must never be added to a slot.
    counters_.malformed += one;
    return {};
  }
  const bool hello = h.has(wire::kFlagHello);
  if (hello) {
    counters_.hellos += one;
    // [world_size] or [world_size, the rank's largest block in bytes] (at least 4).
    if ((h.count != 1 && h.count != 2) || (h.count == 2 && static_cast<uint32_t>(pkt.word(1)) < 4))
        [[unlikely]] {
      counters_.malformed += one;
      return {};
    }
    if (static_cast<uint32_t>(pkt.word(0)) != job.world) {
      // Checked before the rank: a worker configured for a larger world may carry a rank beyond
      // ours, and it deserves to learn why it cannot join.
      counters_.world_size_mismatch += one;
      return keyed(error_reply(job, pkt, wire::ErrorReason::kWorldSizeMismatch, {}, job.world),
                   true);
    }
  }
  // The served rank (wraps for a global rank below a leaf's rank_base, so one compare).
  const uint32_t local = static_cast<uint32_t>(h.rank) - job.rank_base;
  if (local >= job.nranks) [[unlikely]] {
    if (!hello) counters_.by_verdict[static_cast<size_t>(Verdict::kBadRank)] += one;
    counters_.malformed += one;
    return {};
  }
  RankCounters& rc = job.ranks[local];
  rc.packets += one;
  if (h.has(wire::kFlagRetransmit)) rc.retransmits += one;
  moved_ = false;
  Reply r;
  if (abort) [[unlikely]] {
    wire::PacketView lp = pkt;
    lp.hdr.rank = static_cast<uint16_t>(local);
    r = handle_abort(job, lp, h.rank);
  } else if (child_mismatch) [[unlikely]] {
    r = handle_child_mismatch(job, pkt);
  } else if (job.relay) {
    // The handlers and the slot table see the served rank.
    wire::PacketView lp = pkt;
    lp.hdr.rank = static_cast<uint16_t>(local);
    r = hello ? handle_hello(job, lp) : handle_data(job, lp, now_ns, fused ? &stored : nullptr);
  } else {
    r = hello ? handle_hello(job, pkt) : handle_data(job, pkt, now_ns, fused ? &stored : nullptr);
  }
  if (moved_) {
    // A packet that moved the job on: the backend may learn the rank's address from it. A
    // replay (a stale round, a duplicate, an old incarnation's HELLO) is answered at most to its
    // sender and redirects nothing.
    *sender_rank = static_cast<int32_t>(local);
    *sender_job = h.job;
  }
  return keyed(std::move(r), hello);
}

// The RESULT of the slot copy `h` names (its round, shape, exponents and sum), to one rank or all;
// `extra_flags` are or'ed into the header's flags.
Reply Engine::result_reply(const Job& job, const wire::Header& h, Reply::Target target,
                           uint8_t extra_flags) {
  const CopyView c = job.table->copy(h.slot, h.shadow);
  Reply r;
  r.target = target;
  r.hdr = reply_header(
      job.cfg, h,
      wire::kFlagResult | (c.nonfinite ? wire::kFlagNonFinite : uint8_t{0}) | extra_flags);
  set_round(&r, c);
  counters_.replies_out += target == Reply::Target::kAllRanks ? job.nranks : 1;
  // A result to all ranks is a block that completed (a resend to one rank is not).
  if (target == Reply::Target::kAllRanks && c.nonfinite) ++counters_.nonfinite_blocks;
  return r;
}

// DATA of a valid rank (checked by on_packet()).
Reply Engine::handle_data(Job& job, const wire::PacketView& pkt, uint64_t now_ns,
                          const StoredWords* stored) {
  const wire::Header& h = pkt.hdr;
  RankCounters& rc = job.ranks[h.rank];  // the served rank (on_packet)
  const bool retransmit = h.has(wire::kFlagRetransmit);

  if (!job.ready) {
    ++counters_.not_ready;
    if (!retransmit) return {};
    return error_reply(job, pkt, wire::ErrorReason::kJobNotReady, job.hello_bitmap, 0);
  }

  if (job.mismatch_valid && job.mismatch_from_child && h.coll == job.mismatch_coll) [[unlikely]] {
    // A root: a leaf's ranks disagree on this collective; the other leaves' partials for it, and
    // that leaf's later ones, get its words (they never complete a round).
    ++counters_.mismatched;
    return mismatch_again(job, pkt);
  }
  const Verdict v = job.table->on_data(pkt, stored);
  ++counters_.by_verdict[static_cast<size_t>(v)];
  if (job.child_pending && h.coll == job.mismatch_coll) [[unlikely]] {
    // A root: another leaf's partial of the round a leaf reported poisoned.
    Reply told = finish_child_mismatch(job, pkt);
    if (told.target != Reply::Target::kNone) return told;
  }
  moved_ = v == Verdict::kAdded || v == Verdict::kCompleted || v == Verdict::kExpCompleted ||
           v == Verdict::kMismatchPending;
  if (opts_.telemetry && now_ns != 0) note_arrival(job, h, v, now_ns);

  const size_t k = copy_index(h.slot, h.shadow);

  switch (v) {
    case Verdict::kAdded: return {};
    case Verdict::kCompleted: {
      ++counters_.completed;
      ++job.counters.completed;
      // A leaf's partial goes up (float SUM: its exponent first); the result comes back in
      // handle_parent().
      if (job.relay) return job.relay->forward(h.slot, h.shadow);
      return result_reply(job, h, Reply::Target::kAllRanks, 0);
    }
    case Verdict::kExpCompleted:
      // Root: every leaf's exponent request is in: E = MAX goes to every leaf.
      return exp_answer(job, h, Reply::Target::kAllRanks, 0);
    case Verdict::kResendExp:
      ++counters_.duplicates;
      ++rc.duplicates;
      return exp_answer(job, h, Reply::Target::kSender, wire::kFlagRetransmit);
    case Verdict::kResendResult: {
      ++counters_.duplicates;
      ++rc.duplicates;
      // A leaf's copy complete here, no result from the parent yet: the relay repairs it.
      if (job.relay && !job.relay->has_result(k)) return job.relay->on_resend(h);
      ++counters_.resent_results;
      // Marked RETRANSMIT so that the worker can tell this copy from the original result: an
      // original arriving after the worker resent its DATA proves the resend was spurious
      // (the Eifel idea), and its round trip is a valid RTT sample.
      return result_reply(job, h, Reply::Target::kSender, wire::kFlagRetransmit);
    }
    case Verdict::kDuplicate:
      ++counters_.duplicates;
      ++rc.duplicates;
      return {};
    case Verdict::kReportMissing: {
      ++counters_.duplicates;
      ++rc.duplicates;
      const CopyView c = job.table->copy(h.slot, h.shadow);
      return error_reply(job, pkt, wire::ErrorReason::kMissingRanks, c.bitmap, 0);
    }
    case Verdict::kStale: {
      // The others have moved past this round: a sender still waiting for it learns so now
      // (wire.h, kSuperseded); a delayed duplicate's sender ignores the answer. A round of the
      // last poisoned collective gets that collective's mismatch words instead: the others moved
      // on because they were told of the mismatch, and so must this rank be.
      ++counters_.stale;
      if (job.mismatch_valid && h.coll == job.mismatch_coll) {
        ++counters_.mismatched;
        return mismatch_again(job, pkt);
      }
      scratch_[0] = static_cast<int32_t>(wire::ErrorReason::kSuperseded);
      scratch_[1] = static_cast<int32_t>(job.table->copy(h.slot, h.shadow).seq);
      return error_to_sender(job, pkt, 2);
    }
    case Verdict::kMismatch: {
      ++counters_.mismatched;
      const CopyView c = job.table->copy(h.slot, h.shadow);
      if (c.poisoned && !job.relay) return mismatch_reply(job, pkt, c);
      // A leaf whose ranks disagree: the root tells every leaf (LeafRelay::local_mismatch).
      if (c.poisoned) return job.relay->local_mismatch(h);
      return error_reply(job, pkt, wire::ErrorReason::kRoundMismatch, {}, c.count);
    }
    case Verdict::kMismatchPending:
      // Poisoned, some ranks not in yet: they are all told once every rank is (their resends).
      ++counters_.mismatched;
      return {};
    case Verdict::kAborted: {
      // A rank gave up on this round: the sender, which came late, fails as that rank did.
      return aborted_reply(job, pkt, job.table->copy(h.slot, h.shadow));
    }
    case Verdict::kBadSlot:
    case Verdict::kBadRank:
    case Verdict::kTooLarge:
    case Verdict::kCount_: ++counters_.malformed; return {};
  }
  return {};
}

// Root: the exponent answer of a float SUM round to the leaves (PARTIAL | RESULT, count 0, exp =
// the MAX over the leaves' requests, NONFINITE ORed), to all of them or one.
Reply Engine::exp_answer(const Job& job, const wire::Header& h, Reply::Target target,
                         uint8_t extra_flags) {
  const CopyView c = job.table->copy(h.slot, h.shadow);
  Reply r;
  r.target = target;
  r.hdr = reply_header(job.cfg, h,
                       wire::kFlagPartial | wire::kFlagResult |
                           (c.nonfinite ? wire::kFlagNonFinite : uint8_t{0}) | extra_flags);
  set_round(&r, c);
  r.hdr.count = 0;
  r.hdr.exp = c.answer_exp;
  r.payload = nullptr;
  counters_.replies_out += target == Reply::Target::kAllRanks ? job.nranks : 1;
  return r;
}

// What a leaf's parent sends it (the key was checked): the relay checks and counts it; a WELCOME
// of its join completes the leaf's barrier, a RESULT goes to the local ranks.
Reply Engine::handle_parent(Job& job, const wire::PacketView& pkt) {
  using Join = LeafRelay::Join;
  const Join join = job.ready                  ? Join::kDone
                    : job.joined == job.nranks ? Join::kParent
                                               : Join::kOpen;
  Reply r;
  switch (job.relay->on_parent(pkt, join, &r)) {
    case LeafRelay::FromParent::kReply:
      // The root's mismatch, relayed to every local rank: kept for their later DATA of that
      // collective that finds its copy taken by a newer round (kStale in handle_data).
      if (r.target == Reply::Target::kAllRanks && r.hdr.has(wire::kFlagError) && r.hdr.count >= 1 &&
          scratch_[0] == static_cast<int32_t>(wire::ErrorReason::kRoundMismatch)) {
        job.mismatch_valid = true;
        job.mismatch_from_child = false;
        job.mismatch_coll = r.hdr.coll;
        job.mismatch_copy = copy_index(r.hdr.slot, r.hdr.shadow);
        job.mismatch_seq = r.hdr.seq;
        job.mismatch_words.assign(scratch_.begin(), scratch_.begin() + r.hdr.count);
      }
      return r;
    case LeafRelay::FromParent::kJoined:
      job.counters.parent_joined = true;
      start_incarnation(job);
      // The ranks use at most what both levels hold.
      job.welcome_slots = std::min(job.cfg.slots.num_slots, static_cast<uint32_t>(pkt.word(0)));
      job.welcome_bytes =
          std::min<uint32_t>(job.welcome_bytes, static_cast<uint32_t>(pkt.word(1)) & ~uint32_t{3});
      return welcome_reply(job, pkt.hdr, Reply::Target::kAllRanks);
    case LeafRelay::FromParent::kResult:
      // RETRANSMIT stays: such a result answers a re-forward, i.e. some rank's retransmission.
      return result_reply(job, pkt.hdr, Reply::Target::kAllRanks,
                          static_cast<uint8_t>(pkt.hdr.flags & wire::kFlagRetransmit));
  }
  return r;
}

std::span<const RankCounters> Engine::rank_counters(JobId job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return {};
  return it->second->ranks;
}

uint32_t Engine::world_size(JobId job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : it->second->world;
}

bool Engine::job_ready(JobId job) const {
  auto it = jobs_.find(job);
  return it != jobs_.end() && it->second->ready;
}

uint64_t Engine::epoch(JobId job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : it->second->epoch;
}

bool Engine::current_keys(JobId job, Key128* traffic, Key128* up) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return false;
  *traffic = it->second->traffic;
  *up = it->second->relay ? it->second->relay->up_key() : it->second->cfg.key;
  return true;
}

const JobCounters* Engine::job_counters(JobId job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : &it->second->counters;
}

const SlotTable* Engine::slot_table(JobId job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : it->second->table.get();
}

}  // namespace ina::agg
