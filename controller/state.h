// The aggregation manager's state as pure logic (no I/O, no clock: callers pass `now`): the
// aggregator registry with heartbeats, job admission and placement on slot ranges (one flat
// aggregator, a two-level aggregation tree, or K shards), expiry of silent aggregators with
// re-placement of their jobs, expiry of idle jobs, draining, release. ina-controller wraps it in
// an HTTP server (server.cc); the tests drive it directly.
//
// Admission is by job name and sticky: every rank of a job asks with the same name and gets the
// same answer, a refusal included, so all ranks agree on the path (in-network or host fallback)
// even when capacity frees up between the first and the last rank's request.
//
// A refusal is not forever: it is re-evaluated when a rank that was already told it asks again.
// A rank asks once per communicator, so its second request starts a new run of the job (a
// restart, the next launch under the same name) and the condition that caused the refusal (a
// drain, no capacity, no aggregator) may have cleared. Ranks of the run that was refused and that
// ask for the first time still get the refusal, so one run's ranks agree. (A new run whose first
// requests come from ranks that the old refusal never reached joins the old answer until one of
// its ranks was told before; should the ranks of one run still disagree, libina's join agreement
// over the host mesh sends all of them to the host path.) An admission is never re-evaluated:
// ranks are running on it.
//
// Audit: every decision (registration of a new aggregator, admission, refusal, drain on/off,
// removal, re-placement, loss, expiry of an aggregator or a job, release) appends one line with
// the job, its ranks, placement and reason to a queue the server drains into its log at info
// (take_audit()).
//
// Placement rules (admit()):
//   - world <= the largest fan-in of the serving aggregators, no sharding: one flat placement,
//     first fit over the aggregators in id order.
//   - world > every fan-in: a two-level tree. n = ceil(world / largest fan-in) leaves, leaf i
//     serving the consecutive global ranks [floor(i*world/n), floor((i+1)*world/n)) (balanced:
//     sizes differ by at most one), each on an aggregator whose fan-in covers its ranks, plus a
//     root (world n) on an aggregator that is none of the leaves. Each gets the job's slot count.
//   - shards K (the request's, else StateOptions::default_shards): K flat placements on K
//     distinct aggregators, fewer when fewer have room (the answer says so), refused when none.
//     Sharding a job that needs a tree is refused when asked for explicitly; a controller
//     default only applies where a flat placement fits.
//
// Re-placement (expire()): a placement on a silent aggregator is moved to another aggregator with
// room (a lost shard that cannot be moved is dropped while other shards remain); the job keeps
// its id and key (the new aggregator never saw the job, and the old one drops it from its list
// when it re-registers, so nothing stale can match), and the workers learn the new placement at
// their next admission request. When it cannot be moved the job becomes kLost.
//
// Job expiry (expire_jobs()): an active job none of whose aggregators reported new packets for it
// for StateOptions::job_idle_ttl (a crashed trainer never releases it) becomes kExpired and its
// slots are freed; a job no aggregator reports packet counts for is never expired. A later
// admission under the same name starts a new job.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ina/base/status.h"
#include "ina/protocol/siphash.h"
#include "ina/protocol/types.h"

namespace ina::ctl {

using Millis = int64_t;  // a monotonic-ish time in ms (the server passes a steady clock)

struct AggregatorInfo {
  std::string id;    // stable name, "host:port" of its data plane
  std::string host;  // where workers send packets
  uint16_t port = 0;
  uint32_t slot_capacity = 0;
  uint32_t max_fan_in = 0;   // largest world size it serves alone
  uint32_t block_elems = 0;  // largest block it accepts
  std::string http;          // its metrics/telemetry endpoint "host:port" ("" if none)
  bool draining = false;
  Millis last_heartbeat = 0;
};

enum class JobState : uint8_t {
  kActive,   // placed on aggregators
  kRefused,  // no capacity at admission: the job runs on the host fallback
  kLost,     // its aggregator stopped heartbeating and it could not be re-placed: host path
  kExpired,  // no packets on any of its aggregators for the idle TTL: slots freed
};
constexpr int kJobStates = 4;
const char* job_state_name(JobState s);

enum class Role : uint8_t { kFlat, kLeaf, kRoot };
const char* role_name(Role r);

// One aggregator's part in a job: a slot range and, in a tree, its role.
struct Placement {
  std::string aggregator;  // AggregatorInfo::id
  uint32_t slot_base = 0;
  Role role = Role::kFlat;
  uint32_t rank_base = 0;    // leaf: first global rank it serves
  uint32_t local_ranks = 0;  // leaf: consecutive ranks from rank_base; root: leaves; flat: world
  uint32_t child_index = 0;  // leaf: its rank in the root's job
  std::string parent;        // leaf: the root's aggregator id
  bool operator==(const Placement&) const = default;
};

// What the controller tells one aggregator about one job (the heartbeat answer's entry).
struct Assignment {
  JobId job = 0;
  Key128 key;          // the job's 128-bit key (32 hex digits in every text form)
  uint32_t world = 0;  // the job's world; a root's is its number of leaves
  uint32_t slots = 0;
  uint32_t block_elems = 0;
  Placement placement;
  std::string parent_address;  // leaf: the root's data plane "host:port"
  uint32_t parent_world = 0;   // leaf: the root's world (its number of leaves)
  // leaf: the first global rank of every leaf of the job, by child index (so the leaf can name
  // the ranks behind another leaf in its workers' errors); empty when the placements do not
  // cover child indices 0..parent_world-1.
  std::vector<uint32_t> leaf_bases;
};

struct JobInfo {
  JobId id = 0;
  std::string name;
  uint32_t world = 0;
  Key128 key;          // 128-bit, never zero once admitted (keygen)
  uint32_t slots = 0;  // slot range size (the workers' window)
  uint32_t block_elems = 0;
  std::vector<std::string> dtypes;
  JobState state = JobState::kActive;
  std::string reason;  // why refused, lost or expired; or why fewer shards than asked
  // kActive (and where it was, for kLost/kExpired): flat: one; sharded: one flat placement per
  // shard, shard order; tree: the leaves by child_index, then the root.
  std::vector<Placement> placements;
  uint32_t shards_asked = 1;
  uint32_t replacements = 0;  // placements moved off silent aggregators
  Millis admitted_at = 0;
  Millis last_activity = 0;  // admission, re-placement, or new packets reported for the job
  std::map<std::string, uint64_t> packets_seen;  // per aggregator: last reported packet count
  std::set<uint32_t> released;                   // ranks that finished
  std::set<uint32_t> told_refusal;               // kRefused: ranks given it (not persisted)
  // Each of its aggregators' last report on this job (opaque here), by aggregator id.
  std::map<std::string, std::string> telemetry;

  bool is_tree() const { return !placements.empty() && placements.back().role == Role::kRoot; }
  bool is_sharded() const { return !is_tree() && placements.size() > 1; }
  // "flat", "tree" or "sharded" (by placements; "none" without any).
  const char* shape() const;
  // The placement a rank sends to: its leaf in a tree, else the first (shard 0).
  const Placement* placement_for_rank(uint32_t rank) const;
  bool uses(const std::string& aggregator) const;
};

struct AdmitRequest {
  std::string name;
  uint32_t world = 0;
  uint32_t rank = 0;
  uint32_t slots = 128;
  uint32_t block_elems = 2048;
  uint32_t shards = 0;  // 0: StateOptions::default_shards
  std::vector<std::string> dtypes;
};

struct StateOptions {
  Millis heartbeat_timeout = 3000;  // an aggregator silent this long is removed
  uint32_t default_shards = 1;      // shards for a request that names none
  Millis job_idle_ttl = 600000;     // an active job without packets this long expires; 0: never
};

class ControllerState {
 public:
  // A job key per call (the server: getrandom(2)); zero keys are drawn again.
  using KeyGen = std::function<Key128()>;
  ControllerState(StateOptions opts, KeyGen keygen);

  // Registration and heartbeat in one (idempotent, so a restarted controller rebuilds its
  // registry from the next heartbeats; jobs survive a restart through the persisted state). The
  // caller answers with jobs_on(): the jobs the aggregator must serve.
  Status heartbeat(const AggregatorInfo& info, Millis now);
  // What the aggregator must serve: one entry per active job placed on it.
  std::vector<Assignment> jobs_on(const std::string& aggregator) const;
  // Admission (see the file comment). kInvalidArgument for a bad request or a name admitted
  // with another world size; a refusal is not an error: the JobInfo says kRefused and why.
  Result<JobInfo> admit(const AdmitRequest& req, Millis now);
  // A rank is done with the job; when every rank is, the job is forgotten (its slots freed).
  Status release(const std::string& name, uint32_t rank);
  Status remove_job(JobId id);
  // Stops placing jobs on the aggregator; the jobs it has keep running.
  Status drain(const std::string& aggregator, bool on);
  // Removes aggregators silent past the timeout and re-places their jobs (see the file comment);
  // jobs that cannot be re-placed become kLost. Returns the removed aggregators' ids.
  std::vector<std::string> expire(Millis now);
  // An aggregator reported `packets` (its running count) for a job: a change is activity.
  void note_job_packets(JobId id, const std::string& aggregator, uint64_t packets, Millis now);
  // Active jobs idle past StateOptions::job_idle_ttl become kExpired. Returns their ids.
  std::vector<JobId> expire_jobs(Millis now);

  const std::map<std::string, AggregatorInfo>& aggregators() const { return aggs_; }
  // "host:port" of a registered aggregator; "" when `id` is not registered.
  std::string address_of(const std::string& id) const;
  const std::map<JobId, JobInfo>& jobs() const { return jobs_; }
  const JobInfo* job(JobId id) const;
  const JobInfo* job_by_name(const std::string& name) const;
  // Free slots of an aggregator (capacity minus active jobs' ranges).
  uint32_t free_slots(const std::string& aggregator) const;
  // An aggregator's report on a job; kept only from the job's current aggregators.
  void set_job_telemetry(JobId id, const std::string& aggregator, std::string json);

  // The audit lines of the decisions since the last call (oldest first), for the server's log.
  std::vector<std::string> take_audit() { return std::exchange(audit_, {}); }

  // Counters for /metrics.
  uint64_t admitted_total = 0;
  uint64_t refused_total = 0;
  uint64_t lost_total = 0;
  uint64_t admitted_tree_total = 0;
  uint64_t admitted_sharded_total = 0;
  uint64_t short_shards_total = 0;  // sharded admissions with fewer shards than asked
  uint64_t replaced_total = 0;      // placements moved off a silent aggregator
  uint64_t expired_total = 0;

  // Persistence: the whole state as JSON text, and back (jobs and aggregators; an aggregator
  // restored from the file gets `now` as its last heartbeat, so it has a full timeout to
  // re-register, and a job `now` as its last activity). Files of version 1 (one aggregator and
  // slot_base per job, no placements) still load.
  std::string to_json() const;
  Status from_json(const std::string& text, Millis now);

 private:
  // Every aggregator's slot ranges [base, end) taken by active jobs, sorted (one pass over jobs).
  using RangeIndex = std::map<std::string, std::vector<std::pair<uint32_t, uint32_t>>>;
  RangeIndex used_ranges() const;
  // First fit of `slots` contiguous slots on `agg` at or above 0; nullopt when none.
  std::optional<uint32_t> find_range(const AggregatorInfo& agg, uint32_t slots,
                                     const RangeIndex& used) const;
  // Serving aggregators (not draining, not in `exclude`) with fan-in >= min_fan_in and a free
  // range of `slots`, in id order, each as a flat placement of that range.
  std::vector<Placement> candidates(uint32_t min_fan_in, uint32_t slots,
                                    const std::set<std::string>& exclude) const;
  uint32_t largest_fan_in() const;  // over serving aggregators; 0 when none
  std::string flat_refusal(uint32_t world, uint32_t slots) const;
  // A two-level tree for `world` ranks with leaves of at most `fan_in` (largest_fan_in(), > 0)
  // ranks; on failure nullopt and *why says what is missing.
  std::optional<std::vector<Placement>> plan_tree(uint32_t world, uint32_t slots, uint32_t fan_in,
                                                  std::string* why) const;
  // Moves the job's placements on `gone` aggregators elsewhere; false when it cannot (*why).
  bool replace_placements(JobInfo& j, const std::set<std::string>& gone, std::string* why);

  // One line of the audit trail (see the file comment).
  void audit(std::string line) { audit_.push_back(std::move(line)); }

  StateOptions opts_;
  KeyGen keygen_;
  std::vector<std::string> audit_;
  std::map<std::string, AggregatorInfo> aggs_;
  std::map<JobId, JobInfo> jobs_;
  std::map<std::string, JobId> by_name_;
  JobId next_id_ = 1;
};

}  // namespace ina::ctl
