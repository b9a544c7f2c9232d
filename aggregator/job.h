// The aggregator's job vocabulary, shared by the engine (engine.h), the tree-leaf relay
// (leaf_relay.h), the replies they build (reply_build.h) and the backends: a job's configuration
// and place in a tree, the Reply the engine hands a backend, the engine's, a job's and a rank's
// counters, and the straggler telemetry kept per rank.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "aggregator/slot_table.h"
#include "ina/protocol/key.h"
#include "ina/protocol/wire.h"

namespace ina::agg {

// A job's place in a two-level aggregation tree. kFlat: the aggregator serves every rank.
// kLeaf: it serves global ranks [rank_base, rank_base + local_ranks), forwards each completed
// slot copy's partial to its parent as rank child_index (int32 and MIN/MAX: a DATA packet of the
// reduced block; float SUM: a PARTIAL exponent request, then, with the root's exponent, PARTIAL
// fixed-point words: WIRE.md), and multicasts the parent's RESULT to its ranks. kRoot: an ordinary
// job whose ranks are the leaves (by child_index), so slots.world_size is the number of leaves; the
// engine treats it exactly like kFlat.
enum class TreeRole : uint8_t { kFlat, kLeaf, kRoot };
const char* tree_role_name(TreeRole r);

struct TreeConfig {
  TreeRole role = TreeRole::kFlat;
  uint32_t rank_base = 0;    // leaf: first global rank served
  uint32_t local_ranks = 0;  // leaf: consecutive global ranks served (>= 1)
  uint32_t child_index = 0;  // leaf: this leaf's rank in the root's job
  // leaf: the root's world (number of leaves), sent in the leaf's HELLO. 0: not known; the leaf
  // then guesses ceil(world / local_ranks) and adopts the world the root names in its
  // world-size-mismatch ERROR.
  uint32_t parent_world = 0;
  std::string parent;  // leaf: "host:port" of the root's data plane (the backend's business)
  // leaf, optional: the first global rank of every leaf of the tree, by child index (size: the
  // root's world, ascending, starting at 0; leaf i serves [leaf_bases[i], leaf_bases[i+1]), the
  // last one up to the world). Used to turn the root's missing-children report into global ranks
  // for the workers' errors. Empty: the controller's balanced rule, leaf i of n serves
  // [floor(i*W/n), floor((i+1)*W/n)) of world W (and the workers' error says so).
  std::vector<uint32_t> leaf_bases;

  bool operator==(const TreeConfig&) const = default;
};

struct JobConfig {
  JobId job = 1;
  // The job's secret: every packet of the job carries a tag under it (mac.h, WIRE.md); it
  // never travels. All zero: no key configured (packets are sealed and verified with the zero key,
  // which authenticates nothing).
  Key128 key;
  // world size (the job's global world, what HELLOs carry; for a root: the number of leaves),
  // slot count, block size
  SlotTableConfig slots;
  // The job's range of the aggregator's slot memory: [slot_base, slot_base + slots.num_slots).
  // Packets carry slots relative to the range (0 .. num_slots-1), so a job can never name a slot
  // outside it. Checked against the engine's capacity and the other jobs' ranges (see
  // Engine::set_slot_capacity).
  uint32_t slot_base = 0;
  TreeConfig tree;

  bool is_leaf() const { return tree.role == TreeRole::kLeaf; }
  // Ranks this aggregator serves (and keeps addresses, counters and telemetry for): local_ranks
  // for a leaf, the world otherwise. Rank indices of the engine's per-rank views are
  // 0..served_ranks()-1; add first_rank() for the global rank.
  uint32_t served_ranks() const { return is_leaf() ? tree.local_ranks : slots.world_size; }
  uint32_t first_rank() const { return is_leaf() ? tree.rank_base : 0; }

  // Every field: a backend's set_jobs() replaces a served job whose config differs in any.
  bool operator==(const JobConfig&) const = default;
};

// Counters of one job (multi-tenancy: what each tenant sent and what was refused in its name).
struct JobCounters {
  uint64_t packets = 0;    // packets that passed the tag check
  uint64_t completed = 0;  // completed slot copies
  uint64_t bad_tag = 0;    // packets naming this job whose tag its key does not give: dropped
  // Leaf jobs only (see EngineCounters for the meaning).
  uint64_t forwarded = 0;
  uint64_t reforwarded = 0;
  uint64_t parent_results = 0;
  bool parent_joined = false;  // the root has WELCOMEd this leaf's current incarnation
};

// What the backend must send after a packet. `hdr` plus `payload` (`payload_bytes()` bytes in wire
// order: little-endian words) describe the packet; payload points into the engine and is valid
// until the next on_packet(). The backend writes the header (wire::encode_header) and copies the
// payload behind it, then seals the tag with the job's key (wire::seal; one sealed buffer for a
// multicast: the tag does not cover the destination).
struct Reply {
  enum class Target : uint8_t {
    kNone,      // send nothing
    kSender,    // unicast to the rank that sent the packet
    kAllRanks,  // to every rank of hdr.job (rank addresses are the backend's business)
    kParent,    // leaf job: to the parent aggregator of hdr.job (its address: the backend's)
  };
  Target target = Target::kNone;
  wire::Header hdr;
  const uint8_t* payload = nullptr;
  // The key the backend seals the encoded packet with (wire::seal): the job's, or its current
  // incarnation's (WIRE.md, "Incarnations"); the engine chooses.
  Key128 key;
  size_t payload_bytes() const {
    return size_t{hdr.count} * wire::payload_width(hdr.flags, hdr.dtype);
  }
  size_t packet_size() const { return wire::kHeaderSize + payload_bytes(); }
};

// Counters of one engine (one writer). Per-rank vectors are indexed by rank of the single job;
// multi-job counters live in the job map.
struct EngineCounters {
  uint64_t packets_in = 0;
  uint64_t bytes_in = 0;
  uint64_t replies_out = 0;  // reply packets (a multicast counts one per rank)
  uint64_t completed = 0;    // completed slot copies
  uint64_t duplicates = 0;   // kDuplicate + kResendResult + kReportMissing
  uint64_t resent_results = 0;
  uint64_t stale = 0;
  uint64_t malformed = 0;  // decode errors + bad slot/rank/size + unexpected kinds
  uint64_t mismatched = 0;
  uint64_t unknown_job = 0;
  uint64_t bad_tag = 0;    // a known job, a tag its key does not give: dropped, no state
  uint64_t not_ready = 0;  // data before the join barrier completed
  uint64_t hellos = 0;
  uint64_t world_size_mismatch = 0;  // HELLOs whose world size differs from the job's
  // HELLOs with a valid tag naming an incarnation older than the rank's current (or next) one:
  // a replay, dropped with no state change (the nonce order: WIRE.md).
  uint64_t stale_hellos = 0;
  uint64_t nonfinite_blocks = 0;
  // ERROR kAborted from workers that marked a round aborted (a rank gave up at its deadline);
  // DATA for such a round is answered with the same words (by_verdict[kAborted]).
  uint64_t aborted_rounds = 0;
  // Aggregation trees (leaf jobs).
  uint64_t forwarded = 0;       // completed partials sent to the parent
  uint64_t reforwarded = 0;     // partials sent again for a worker's retransmission
  uint64_t parent_results = 0;  // parent RESULTs accepted (and multicast to the local ranks)
  uint64_t parent_stale = 0;    // parent RESULT/WELCOME not matching a waiting copy or join
  uint64_t parent_errors = 0;   // ERROR packets from the parent (counted)
  // Root missing-children reports for a waiting copy, turned into global ranks and sent to the
  // local ranks (at once to all of them, and again to any that retransmits for the copy).
  uint64_t parent_missing = 0;
  uint64_t parent_hellos = 0;  // HELLOs sent to the parent
  // Local ranks' aborts passed on to the parent as this leaf's (LeafRelay::forward_abort).
  uint64_t aborts_forwarded = 0;
  wire::DecodeCounters decode;
  std::array<uint64_t, static_cast<size_t>(Verdict::kCount_)> by_verdict{};
};

// Every scalar counter of EngineCounters with its name, in one order, as f(name, member
// pointer): the backends' reports and per-lcore totals go through this list instead of naming the
// fields again (a counter added to EngineCounters is added here once).
template <class F>
void for_each_scalar_counter(F&& f) {
  f("packets_in", &EngineCounters::packets_in);
  f("bytes_in", &EngineCounters::bytes_in);
  f("replies_out", &EngineCounters::replies_out);
  f("completed", &EngineCounters::completed);
  f("duplicates", &EngineCounters::duplicates);
  f("resent_results", &EngineCounters::resent_results);
  f("stale", &EngineCounters::stale);
  f("malformed", &EngineCounters::malformed);
  f("mismatched", &EngineCounters::mismatched);
  f("unknown_job", &EngineCounters::unknown_job);
  f("bad_tag", &EngineCounters::bad_tag);
  f("not_ready", &EngineCounters::not_ready);
  f("hellos", &EngineCounters::hellos);
  f("world_size_mismatch", &EngineCounters::world_size_mismatch);
  f("stale_hellos", &EngineCounters::stale_hellos);
  f("nonfinite_blocks", &EngineCounters::nonfinite_blocks);
  f("aborted_rounds", &EngineCounters::aborted_rounds);
  f("forwarded", &EngineCounters::forwarded);
  f("reforwarded", &EngineCounters::reforwarded);
  f("parent_results", &EngineCounters::parent_results);
  f("parent_stale", &EngineCounters::parent_stale);
  f("parent_errors", &EngineCounters::parent_errors);
  f("parent_missing", &EngineCounters::parent_missing);
  f("parent_hellos", &EngineCounters::parent_hellos);
  f("aborts_forwarded", &EngineCounters::aborts_forwarded);
}

// Adds every counter of `from` (scalars, decode errors, verdicts) into `into`.
inline void add_counters(EngineCounters& into, const EngineCounters& from) {
  for_each_scalar_counter([&](const char*, uint64_t EngineCounters::*m) { into.*m += from.*m; });
  for (size_t i = 0; i < into.decode.by_error.size(); ++i) {
    into.decode.by_error[i] += from.decode.by_error[i];
  }
  for (size_t i = 0; i < into.by_verdict.size(); ++i) into.by_verdict[i] += from.by_verdict[i];
}

struct RankCounters {
  uint64_t packets = 0;
  uint64_t retransmits = 0;
  uint64_t duplicates = 0;
};

// Straggler telemetry of one rank of a job. Lag: how long after the first contribution to a
// slot copy's round this rank's contribution arrived (0 for the first). Kept per rank as a log2
// histogram in microseconds plus sum and count; `last` counts the rounds this rank completed
// (arrived last). Updated on the packet path without allocation.
inline constexpr size_t kLagBuckets = 24;  // bucket 0: < 1 us; bucket b: [2^(b-1), 2^b) us
struct RankTelemetry {
  uint64_t lag_count = 0;
  uint64_t lag_sum_ns = 0;
  uint64_t last = 0;
  std::array<uint64_t, kLagBuckets> lag_hist{};
  double mean_lag_us() const {
    return lag_count == 0 ? 0.0
                          : static_cast<double>(lag_sum_ns) / 1e3 / static_cast<double>(lag_count);
  }
};
inline size_t lag_bucket(uint64_t lag_ns) {
  const uint64_t us = lag_ns / 1000;
  if (us == 0) return 0;
  const size_t b = static_cast<size_t>(64 - __builtin_clzll(us));  // 1 us -> 1, 2..3 -> 2, ...
  return b < kLagBuckets ? b : kLagBuckets - 1;
}

// Ranks ordered by median lag (log2 bucket), worst first; ties by mean lag, then by rounds
// completed last (Engine::straggler_ranking on one job's telemetry; also used on telemetry summed
// over several engines).
std::vector<uint32_t> rank_stragglers(std::span<const RankTelemetry> t);

// A round that has waited too long: its slot copy, its age and the ranks it still lacks.
struct StalledSlot {
  uint16_t slot = 0;
  bool shadow = false;
  BlockSeq seq = 0;
  uint64_t age_ns = 0;
  uint32_t contributors = 0;
  // Ranks not yet contributed (global ranks). For a leaf's copy waiting on its parent: the ranks
  // behind other leaves from the root's last missing report for the round (empty before one).
  std::vector<uint32_t> missing;
  bool waiting_parent = false;  // leaf: complete here, its partial waits for the parent's result
};

}  // namespace ina::agg
