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
// Length (over 600 lines): one per-datagram state machine (decode, tag, the join barrier with its
// incarnations, the slot verdicts and their replies, errors, telemetry) whose handlers all work on
// the one Job struct private to this file, plus the per-job queries; split further, that struct
// would have to leave this file. The tree-leaf relay is leaf_relay.cc's.
#include "aggregator/engine.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <random>
#include <string>

#include "aggregator/leaf_relay.h"
#include "aggregator/reply_build.h"

namespace ina::agg {

struct Engine::Job {
  JobConfig cfg;
  std::unique_ptr<SlotTable> table;
  uint32_t world = 0;
  // Join barrier of the current incarnation: who has joined, with which nonce.
  std::vector<uint64_t> hello_bitmap;  // bit r = rank r joined
  std::vector<BlockSeq> nonce;         // per rank; meaningful where its hello bit is set
  uint32_t joined = 0;
  bool ready = false;  // every rank joined this incarnation
  // The current incarnation (WIRE.md, "Incarnations"): its epoch (0: none yet) and key, which
  // seals and verifies every packet but HELLO, WELCOME and the answers to a HELLO. Set when the
  // job becomes ready (its WELCOME goes out), so that until then the ranks of the previous
  // incarnation are still understood (and told the job is not ready).
  uint64_t epoch = 0;
  Key128 traffic;
  // The next incarnation, while this one runs (ready): ranks that HELLOed with a new nonce (a
  // restarted rank, with a valid tag). They do not reopen the barrier for the ranks still running;
  // when every rank has a new incarnation, it becomes the current one (a new barrier completes).
  std::vector<uint64_t> next_bitmap;
  std::vector<BlockSeq> next_nonce;
  // Each rank's largest block in bytes, from its HELLO (0: it named none), for the current and
  // the next incarnation: the barrier's WELCOME offers the smallest, so every rank uses one block.
  std::vector<uint32_t> hello_bytes;
  std::vector<uint32_t> next_hello_bytes;
  uint32_t next_joined = 0;
  std::vector<RankCounters> ranks;
  JobCounters counters;
  // Telemetry: time of each copy's first contribution (index copy_index(slot, shadow); 0: none).
  std::vector<uint64_t> first_ns;
  std::vector<RankTelemetry> tele;
  // Lost time (straggler.h): per copy the next-to-last contribution's time and whether its round
  // is in flight (started, not completed), and the rounds in flight (0 -> 1: a collective starts).
  std::vector<uint64_t> second_ns;
  std::vector<uint8_t> open;
  uint32_t inflight = 0;
  LossTracker loss;
  // Served ranks: a leaf's [rank_base, rank_base + nranks); flat and root: [0, world).
  uint32_t nranks = 0;
  uint32_t rank_base = 0;
  // WELCOME payload: the job's slots and block (at most every rank's HELLO limit; for a leaf, at
  // most the parent's too).
  uint32_t welcome_slots = 0;
  uint32_t welcome_bytes = 0;  // max_payload_bytes
  // A leaf's link to its parent (null for flat and root jobs). A leaf is ready only once the
  // parent WELCOMEd it: every local rank joined this incarnation (joined == nranks) is not enough.
  std::unique_ptr<LeafRelay> relay;
  // The job's last poisoned collective (ranks called it with different arguments): its id (the
  // header's coll) and the words every rank was told (mismatch_reply). Every later DATA of that
  // collective that finds its copy taken by a newer round (a rank whose answer was lost, or slower
  // than the others to resend) gets these words again instead of kSuperseded, so that it fails,
  // and resynchronizes, as the others did (engine.cc, handle_data). Sized at add_job.
  bool mismatch_valid = false;
  uint32_t mismatch_coll = 0;
  size_t mismatch_copy = 0;  // copy_index of the round that told every rank, and its seq
  BlockSeq mismatch_seq = 0;
  // A root: the words came from a leaf whose own ranks disagree (child_mismatch): every DATA of
  // that collective, from any leaf, is answered with them.
  bool mismatch_from_child = false;
  // A root: a leaf's words (child_words) wait for the other leaves' partials of the round, whose
  // shape says which of the leaf's two groups the other leaves' ranks belong to.
  bool child_pending = false;
  uint32_t child_leaf = 0;
  std::vector<int32_t> child_words;
  std::vector<int32_t> mismatch_words;
};

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

// A bitmap of uint64 words as `words` int32 control words: word w holds ranks 32w..32w+31 (the
// low half of uint64 word w/2 first).
void put_bitmap_words(std::span<const uint64_t> bitmap, uint32_t words, int32_t* dst) {
  for (uint32_t w = 0; w < words; ++w) {
    dst[w] = static_cast<int32_t>(static_cast<uint32_t>(bitmap[w / 2] >> (32 * (w % 2))));
  }
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
                        JobId* sender_job, bool counted_elsewhere) {
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
  if (opts_.check_tag && !verify_tag(job.cfg, job.traffic, job.relay.get(), h, datagram))
      [[unlikely]] {
    counters_.bad_tag += one;
    job.counters.bad_tag += one;
    return {};
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
    r = hello ? handle_hello(job, lp) : handle_data(job, lp, now_ns);
  } else {
    r = hello ? handle_hello(job, pkt) : handle_data(job, pkt, now_ns);
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

// Join barrier. Each rank's HELLO carries a random nonce that names its incarnation (its
// communicator). The barrier completes when every rank has joined; that resets the slot table (a
// new incarnation starts its block sequence afresh) and WELCOMEs every rank. A rank seen with a new
// nonce has restarted. While the barrier is open, the barrier starts over. Once it is complete
// (the ranks run), the new incarnation only joins the next barrier (next_bitmap): the running
// ranks are not disturbed, and the next barrier completes, resetting the slots, when every rank
// has a new incarnation (the job restarted). Only packets with the job's tag get here, so a forged
// HELLO can do neither. on_packet() has checked the world size and the rank.
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

// The WELCOME (join barrier passed): the slots, block size and incarnation epoch the ranks use, to
// one rank or all. To one rank (h: its HELLO) seq is its HELLO's nonce, and that is the only
// WELCOME a worker adopts: a WELCOME of an earlier incarnation replayed to it names an older
// nonce, so it cannot make the worker take an old epoch (and then old RESULTs). The nonces differ
// per rank and one WELCOME goes to all, so the multicast carries seq 0: a notice that the barrier
// completed, which each rank answers by sending its HELLO again at once (WIRE.md).
Reply Engine::welcome_reply(const Job& job, const wire::Header& h, Reply::Target target) {
  Reply r;
  r.target = target;
  r.hdr = reply_header(job.cfg, h, wire::kFlagHello | wire::kFlagResult);
  r.hdr.seq = target == Reply::Target::kSender ? h.seq : 0;
  r.hdr.slot = 0;
  r.hdr.shadow = false;
  r.hdr.count = wire::kWelcomeWords;
  scratch_[0] = static_cast<int32_t>(job.welcome_slots);
  scratch_[1] = static_cast<int32_t>(job.welcome_bytes);
  scratch_[2] = static_cast<int32_t>(static_cast<uint32_t>(job.epoch));
  scratch_[3] = static_cast<int32_t>(static_cast<uint32_t>(job.epoch >> 32));
  r.payload = bytes_of(scratch_);
  counters_.replies_out += target == Reply::Target::kAllRanks ? job.nranks : 1;
  return r;
}

Reply Engine::handle_hello(Job& job, const wire::PacketView& pkt) {
  const wire::Header& h = pkt.hdr;
  const bool retransmit = h.has(wire::kFlagRetransmit);

  auto welcome = [&](Reply::Target target) { return welcome_reply(job, h, target); };
  auto missing = [&]() -> Reply {
    if (!retransmit) return {};
    return error_reply(job, pkt, wire::ErrorReason::kMissingRanks, job.hello_bitmap, 0);
  };

  // Nonces only grow (WIRE.md): a HELLO older than the newest incarnation seen of its rank (the
  // current one, or the one waiting for the next barrier; also after the barrier started over)
  // is a replay, and changes nothing.
  const bool is_next = job.ready && test_bit(job.next_bitmap, h.rank);
  const BlockSeq newest = is_next ? job.next_nonce[h.rank] : job.nonce[h.rank];
  if (newest != 0 && h.seq != newest && h.seq != job.nonce[h.rank] &&
      !wire::nonce_newer(h.seq, newest)) {
    ++counters_.stale_hellos;
    return {};
  }
  if (test_bit(job.hello_bitmap, h.rank)) {
    if (job.nonce[h.rank] == h.seq) {
      // Same incarnation: its WELCOME was lost (or the barrier is still open).
      if (job.ready) return welcome(Reply::Target::kSender);
      // A leaf waiting for its parent: the worker's timer repairs a lost HELLO or WELCOME there.
      if (job.relay && job.joined == job.nranks) return retransmit ? job.relay->rejoin() : Reply{};
      return missing();
    }
    if (job.ready) {
      // A new incarnation of this rank while the others run: it waits for the next barrier.
      moved_ = true;
      if (!test_bit(job.next_bitmap, h.rank)) {
        job.next_bitmap[h.rank / 64] |= uint64_t{1} << (h.rank % 64);
        ++job.next_joined;
      }
      job.next_nonce[h.rank] = h.seq;
      job.next_hello_bytes[h.rank] = hello_limit(pkt);
      if (job.next_joined < job.nranks) {
        if (!retransmit) return {};
        return error_reply(job, pkt, wire::ErrorReason::kMissingRanks, job.next_bitmap, 0);
      }
      // Every rank has a new incarnation: it is the current one, and its barrier is complete.
      job.hello_bitmap.swap(job.next_bitmap);
      job.nonce.swap(job.next_nonce);
      job.hello_bytes.swap(job.next_hello_bytes);
      job.joined = job.nranks;
      job.ready = false;
      job.counters.parent_joined = false;
      std::fill(job.next_bitmap.begin(), job.next_bitmap.end(), uint64_t{0});
      job.next_joined = 0;
      return barrier_complete(job, h);
    }
    // A new incarnation of this rank before the barrier completed: everyone joins again.
    std::fill(job.hello_bitmap.begin(), job.hello_bitmap.end(), uint64_t{0});
    job.joined = 0;
    job.ready = false;
    job.counters.parent_joined = false;
  }
  moved_ = true;
  job.hello_bitmap[h.rank / 64] |= uint64_t{1} << (h.rank % 64);
  job.nonce[h.rank] = h.seq;
  job.hello_bytes[h.rank] = hello_limit(pkt);
  if (++job.joined == job.nranks) {
    std::fill(job.next_bitmap.begin(), job.next_bitmap.end(), uint64_t{0});
    job.next_joined = 0;
    return barrier_complete(job, h);
  }
  return missing();
}

// Every served rank joined the current incarnation: reset the slots, then WELCOME every rank (a
// leaf: join the parent first).
Reply Engine::barrier_complete(Job& job, const wire::Header& h) {
  job.table->reset();
  job.mismatch_valid = false;
  job.child_pending = false;
  // One block for every rank: the smallest any of them can carry (a multiple of 4 bytes, so that
  // every element width divides it).
  job.welcome_bytes = job.cfg.slots.max_payload_bytes;
  for (const uint32_t b : job.hello_bytes) {
    if (b != 0) job.welcome_bytes = std::min(job.welcome_bytes, b & ~uint32_t{3});
  }
  std::fill(job.first_ns.begin(), job.first_ns.end(), uint64_t{0});
  std::fill(job.open.begin(), job.open.end(), uint8_t{0});
  job.inflight = 0;
  if (job.relay) {
    // Every local rank joined: this leaf joins its parent, and WELCOMEs its ranks only when
    // the parent WELCOMEs it (handle_parent).
    job.counters.parent_joined = false;
    return job.relay->join(job.nonce, job.welcome_bytes);
  }
  start_incarnation(job);
  return welcome_reply(job, h, Reply::Target::kAllRanks);
}

// The job becomes ready: the epoch of the barrier that completed (every engine of this aggregator
// computes the same one from the same HELLOs) and its key, from now on the only key of the job's
// packets but HELLO and WELCOME (WIRE.md, "Incarnations").
void Engine::start_incarnation(Job& job) {
  job.ready = true;
  job.epoch = wire::incarnation_epoch(job.cfg.key, opts_.epoch_salt, job.nonce);
  job.traffic = wire::incarnation_key(job.cfg.key, job.epoch);
}

// The largest block a HELLO names (its second word), 0 for none (on_packet() checked the count).
uint32_t Engine::hello_limit(const wire::PacketView& pkt) {
  return pkt.hdr.count >= 2 ? static_cast<uint32_t>(pkt.word(1)) : 0;
}

// DATA of a valid rank (checked by on_packet()).
Reply Engine::handle_data(Job& job, const wire::PacketView& pkt, uint64_t now_ns) {
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
  const Verdict v = job.table->on_data(pkt);
  ++counters_.by_verdict[static_cast<size_t>(v)];
  if (job.child_pending && h.coll == job.mismatch_coll) [[unlikely]] {
    // A root: another leaf's partial of the round a leaf reported poisoned.
    Reply told = finish_child_mismatch(job, pkt);
    if (told.target != Reply::Target::kNone) return told;
  }
  moved_ = v == Verdict::kAdded || v == Verdict::kCompleted || v == Verdict::kExpCompleted ||
           v == Verdict::kMismatchPending;
  if ((v == Verdict::kAdded || v == Verdict::kCompleted) && opts_.telemetry && now_ns != 0) {
    // The lag behind the round's first contribution; the first one starts the clock.
    const size_t copy = copy_index(h.slot, h.shadow);
    uint64_t& first = job.first_ns[copy];
    const uint32_t n = job.table->contributors(h.slot, h.shadow);
    uint64_t lag = 0;
    if (n == 1) {
      first = now_ns;
      // A round replacing one still in flight (abandoned) keeps its place in the count.
      if (job.open[copy] == 0) {
        job.open[copy] = 1;
        if (job.inflight++ == 0) job.loss.on_collective_start(now_ns);
      }
    } else if (now_ns > first) {
      lag = now_ns - first;
    }
    if (n + 1 == job.nranks) job.second_ns[copy] = now_ns;  // the next-to-last contribution
    RankTelemetry& t = job.tele[h.rank];
    ++t.lag_count;
    t.lag_sum_ns += lag;
    ++t.lag_hist[lag_bucket(lag)];
    if (retransmit) job.loss.on_retransmit_added(h.rank, now_ns);
    if (v == Verdict::kCompleted) {
      if (job.open[copy] != 0) {
        job.open[copy] = 0;
        --job.inflight;
      }
      if (job.world > 1) ++t.last;
      job.loss.on_completion(h.rank, now_ns, job.second_ns[copy], retransmit);
    }
    job.loss.on_arrival(h.rank, now_ns);
  } else if (v == Verdict::kResendResult && retransmit && opts_.telemetry && now_ns != 0) {
    job.loss.on_resent_completed(h.rank, now_ns);
  }

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

std::span<const RankTelemetry> Engine::rank_telemetry(JobId job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return {};
  return it->second->tele;
}

std::vector<uint32_t> rank_stragglers(std::span<const RankTelemetry> t) {
  std::vector<uint32_t> order(t.size());
  for (uint32_t r = 0; r < order.size(); ++r) order[r] = r;
  // Ranked by the median lag (the lower median's histogram bucket), then the mean: one long
  // descheduling of an otherwise punctual rank moves its mean a lot and its median not at all,
  // while a rank that is late most of the time moves both. The histogram and the mean still show
  // intermittent stragglers.
  std::vector<size_t> median(t.size(), 0);
  for (size_t r = 0; r < t.size(); ++r) {
    const uint64_t half = (t[r].lag_count + 1) / 2;
    uint64_t cum = 0;
    for (size_t b = 0; b < kLagBuckets; ++b) {
      cum += t[r].lag_hist[b];
      if (cum >= half && half > 0) {
        median[r] = b;
        break;
      }
    }
  }
  std::stable_sort(order.begin(), order.end(), [&t, &median](uint32_t a, uint32_t b) {
    if (median[a] != median[b]) return median[a] > median[b];
    const double la = t[a].mean_lag_us();
    const double lb = t[b].mean_lag_us();
    if (la != lb) return la > lb;
    return t[a].last > t[b].last;
  });
  return order;
}

std::vector<uint32_t> Engine::straggler_ranking(JobId job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return {};
  return rank_stragglers(it->second->tele);
}

LossWindow Engine::loss_window(JobId job, uint64_t now_ns) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return {};
  return it->second->loss.window(now_ns);
}

std::vector<StalledSlot> Engine::stalled_slots(JobId job, uint64_t now_ns, uint64_t min_age_ns,
                                               size_t max) const {
  std::vector<StalledSlot> out;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return out;
  const Job& j = *it->second;
  for (uint32_t slot = 0; slot < j.cfg.slots.num_slots; ++slot) {
    for (bool shadow : {false, true}) {
      const uint64_t first = j.first_ns[copy_index(static_cast<uint16_t>(slot), shadow)];
      if (first == 0 || now_ns < first || now_ns - first < min_age_ns) continue;
      const CopyView c = j.table->copy(static_cast<uint16_t>(slot), shadow);
      if (!c.used) continue;
      const size_t k = copy_index(static_cast<uint16_t>(slot), shadow);
      const bool waiting_parent = c.complete && j.relay && j.relay->awaits_parent(k);
      if (c.complete && !waiting_parent) continue;
      StalledSlot s;
      s.waiting_parent = waiting_parent;
      s.slot = static_cast<uint16_t>(slot);
      s.shadow = shadow;
      s.seq = c.seq;
      s.age_ns = now_ns - first;
      s.contributors = c.contributors;
      for (uint32_t r = 0; r < j.nranks; ++r) {
        if (((c.bitmap[r / 64] >> (r % 64)) & 1) == 0) s.missing.push_back(j.rank_base + r);
      }
      // The root's last report, in global ranks: the ranks behind the other leaves it lacks.
      if (waiting_parent) j.relay->append_root_missing(k, c.seq, &s.missing);
      out.push_back(std::move(s));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const StalledSlot& a, const StalledSlot& b) { return a.age_ns > b.age_ns; });
  if (out.size() > max) out.resize(max);
  return out;
}

const SlotTable* Engine::slot_table(JobId job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : it->second->table.get();
}

}  // namespace ina::agg
