// The state the engine keeps per job (Engine::Job, an EngineJob): its table, join barrier and
// incarnations, counters, telemetry and loss tracking, a leaf's relay, its last poisoned
// collective. Private to the engine's files (engine.cc: jobs and rounds; engine_join.cc;
// engine_failure.cc; engine_telemetry.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "aggregator/job.h"
#include "aggregator/leaf_relay.h"
#include "aggregator/slot_table.h"
#include "aggregator/straggler.h"

namespace ina::agg {

struct EngineJob {
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

}  // namespace ina::agg
