// The engine's join barrier (engine.h): HELLOs, the incarnations they name, the barrier that
// completes when every served rank joined, and the WELCOME that starts an incarnation.
#include <algorithm>
#include <string>
#include <vector>

#include "aggregator/engine.h"
#include "aggregator/engine_job.h"
#include "aggregator/reply_build.h"

namespace ina::agg {

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

// Join barrier. Each rank's HELLO carries a random nonce that names its incarnation (its
// communicator). The barrier completes when every rank has joined; that resets the slot table (a
// new incarnation starts its block sequence afresh) and WELCOMEs every rank. A rank seen with a new
// nonce has restarted. While the barrier is open, the barrier starts over. Once it is complete
// (the ranks run), the new incarnation only joins the next barrier (next_bitmap): the running
// ranks are not disturbed, and the next barrier completes, resetting the slots, when every rank
// has a new incarnation (the job restarted). Only packets with the job's tag get here, so a forged
// HELLO can do neither. on_packet() has checked the world size and the rank.
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

}  // namespace ina::agg
