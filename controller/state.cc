// ControllerState (see state.h): registry, placement (flat first fit, two-level trees, shards),
// sticky admission, expiry of aggregators with re-placement, expiry of idle jobs, and the JSON
// form persisted by ina-controller.
//
// The slot accounting invariants (admit, release, expiry, drain, re-placement) are kept by the
// functions of this file; the JSON form (to_json, from_json), which must round-trip every field
// (the fuzz harness checks it), is state_json.cc's, and the file I/O state_file.cc's.
#include "controller/state.h"

#include <algorithm>

namespace ina::ctl {

const char* job_state_name(JobState s) {
  switch (s) {
    case JobState::kActive: return "active";
    case JobState::kRefused: return "refused";
    case JobState::kLost: return "lost";
    case JobState::kExpired: return "expired";
  }
  return "?";
}

const char* role_name(Role r) {
  switch (r) {
    case Role::kFlat: return "flat";
    case Role::kLeaf: return "leaf";
    case Role::kRoot: return "root";
  }
  return "?";
}

const char* JobInfo::shape() const {
  if (placements.empty()) return "none";
  if (is_tree()) return "tree";
  return placements.size() > 1 ? "sharded" : "flat";
}

const Placement* JobInfo::placement_for_rank(uint32_t rank) const {
  if (placements.empty()) return nullptr;
  if (!is_tree()) return &placements.front();
  for (const Placement& p : placements) {
    if (p.role == Role::kLeaf && rank >= p.rank_base && rank - p.rank_base < p.local_ranks)
      return &p;
  }
  return nullptr;
}

bool JobInfo::uses(const std::string& aggregator) const {
  for (const Placement& p : placements) {
    if (p.aggregator == aggregator) return true;
  }
  return false;
}

namespace {
constexpr uint32_t kMaxWorld = 65535;
constexpr uint32_t kMaxSlots = 32768;  // the wire's 15-bit slot index
constexpr uint32_t kMaxBlock = 16384;
constexpr uint32_t kMaxShards = 256;
const char* const kDTypes[] = {"int32",    "float32",     "float16",
                               "bfloat16", "float8_e4m3", "float8_e5m2"};

// Leaf i of n over `world` ranks serves [floor(i*world/n), floor((i+1)*world/n)).
uint32_t leaf_rank_base(uint32_t i, uint32_t n, uint32_t world) {
  return static_cast<uint32_t>(uint64_t{i} * world / n);
}

// "job 3 'resnet' (world 4)": how every audit line names a job.
std::string job_text(const JobInfo& j) {
  return "job " + std::to_string(j.id) + " '" + j.name + "' (world " + std::to_string(j.world) +
         ")";
}

// The placements of a job for the audit trail, e.g. "flat on x slots [0,128)", "sharded over 2:
// x slots [0,64), y slots [0,64)", "tree: leaf 0 ranks 0-3 on x slots [0,64), ..., root on z
// slots [0,64)". At most 8 placements are named (a log line has room for about 1000 bytes).
std::string placement_text(const JobInfo& j) {
  if (j.placements.empty()) return "no placement";
  auto one = [&j](const Placement& p) {
    std::string s;
    if (p.role == Role::kLeaf) {
      s = "leaf " + std::to_string(p.child_index) + " ranks " + std::to_string(p.rank_base) + "-" +
          std::to_string(p.rank_base + p.local_ranks - 1) + " on ";
    } else if (p.role == Role::kRoot) {
      s = "root on ";
    }
    return s + p.aggregator + " slots [" + std::to_string(p.slot_base) + "," +
           std::to_string(uint64_t{p.slot_base} + j.slots) + ")";
  };
  std::string s = j.is_tree()      ? std::string("tree: ")
                  : j.is_sharded() ? "sharded over " + std::to_string(j.placements.size()) + ": "
                                   : std::string("flat on ");
  constexpr size_t kNamed = 8;
  for (size_t i = 0; i < j.placements.size() && i < kNamed; ++i) {
    if (i > 0) s += ", ";
    s += one(j.placements[i]);
  }
  if (j.placements.size() > kNamed) {
    s += ", ... " + std::to_string(j.placements.size() - kNamed) + " more";
    if (j.is_tree()) s += ", " + one(j.placements.back());
  }
  return s;
}
}  // namespace

ControllerState::ControllerState(StateOptions opts, KeyGen keygen)
    : opts_(opts), keygen_(std::move(keygen)) {
  if (opts_.default_shards < 1) opts_.default_shards = 1;
}

Status ControllerState::heartbeat(const AggregatorInfo& info, Millis now) {
  if (info.id.empty()) return invalid_argument("aggregator: id must not be empty");
  if (info.host.empty())
    return invalid_argument("aggregator " + info.id + ": host must not be empty");
  if (info.port == 0)
    return invalid_argument("aggregator " + info.id + ": port must be in 1..65535");
  if (info.slot_capacity < 1 || info.slot_capacity > 1u << 24) {
    return invalid_argument("aggregator " + info.id + ": slot_capacity must be in 1..16777216");
  }
  if (info.max_fan_in < 1 || info.max_fan_in > kMaxWorld) {
    return invalid_argument("aggregator " + info.id + ": max_fan_in must be in 1..65535");
  }
  if (info.block_elems < 1 || info.block_elems > kMaxBlock) {
    return invalid_argument("aggregator " + info.id + ": block_elems must be in 1..16384");
  }
  auto it = aggs_.find(info.id);
  if (it == aggs_.end()) {
    AggregatorInfo a = info;
    a.draining = false;
    a.last_heartbeat = now;
    aggs_.emplace(a.id, a);
    audit("aggregator " + a.id + " registered: data plane " + a.host + ":" +
          std::to_string(a.port) + ", " + std::to_string(a.slot_capacity) + " slots, fan-in " +
          std::to_string(a.max_fan_in) + ", block " + std::to_string(a.block_elems) +
          (a.http.empty() ? std::string{} : ", http " + a.http));
    return ok_status();
  }
  const bool draining = it->second.draining;  // the controller's decision, not the aggregator's
  it->second = info;
  it->second.draining = draining;
  it->second.last_heartbeat = now;
  return ok_status();
}

std::vector<Assignment> ControllerState::jobs_on(const std::string& aggregator) const {
  std::vector<Assignment> out;
  for (const auto& [id, j] : jobs_) {
    if (j.state != JobState::kActive) continue;
    for (const Placement& p : j.placements) {
      if (p.aggregator != aggregator) continue;
      Assignment a;
      a.job = j.id;
      a.key = j.key;
      a.world = p.role == Role::kRoot ? p.local_ranks : j.world;
      a.slots = j.slots;
      a.block_elems = j.block_elems;
      a.placement = p;
      if (p.role == Role::kLeaf) {
        a.parent_address = address_of(p.parent);
        std::vector<int64_t> bases;
        for (const Placement& q : j.placements) {
          if (q.role == Role::kRoot) a.parent_world = q.local_ranks;
          if (q.role != Role::kLeaf) continue;
          if (q.child_index >= bases.size()) bases.resize(size_t{q.child_index} + 1, -1);
          bases[q.child_index] = q.rank_base;
        }
        if (bases.size() == a.parent_world &&
            std::none_of(bases.begin(), bases.end(), [](int64_t b) { return b < 0; })) {
          a.leaf_bases.assign(bases.begin(), bases.end());
        }
      }
      out.push_back(std::move(a));
    }
  }
  return out;
}

uint32_t ControllerState::free_slots(const std::string& aggregator) const {
  auto it = aggs_.find(aggregator);
  if (it == aggs_.end()) return 0;
  uint64_t used = 0;
  for (const Assignment& a : jobs_on(aggregator)) used += a.slots;
  return used >= it->second.slot_capacity ? 0
                                          : it->second.slot_capacity - static_cast<uint32_t>(used);
}

ControllerState::RangeIndex ControllerState::used_ranges() const {
  RangeIndex used;
  for (const auto& [id, j] : jobs_) {
    if (j.state != JobState::kActive) continue;
    for (const Placement& p : j.placements) {
      used[p.aggregator].emplace_back(p.slot_base, p.slot_base + j.slots);
    }
  }
  for (auto& [agg, ranges] : used) std::sort(ranges.begin(), ranges.end());
  return used;
}

std::optional<uint32_t> ControllerState::find_range(const AggregatorInfo& agg, uint32_t slots,
                                                    const RangeIndex& index) const {
  uint64_t at = 0;
  if (auto it = index.find(agg.id); it != index.end()) {
    for (const auto& [lo, hi] : it->second) {  // sorted [base, end)
      if (lo >= at + slots) break;
      at = std::max<uint64_t>(at, hi);
    }
  }
  if (at + slots > agg.slot_capacity) return std::nullopt;
  return static_cast<uint32_t>(at);
}

std::vector<Placement> ControllerState::candidates(uint32_t min_fan_in, uint32_t slots,
                                                   const std::set<std::string>& exclude) const {
  const RangeIndex index = used_ranges();
  std::vector<Placement> out;
  for (const auto& [id, a] : aggs_) {
    if (a.draining || a.max_fan_in < min_fan_in || exclude.count(id) != 0) continue;
    if (auto base = find_range(a, slots, index)) {
      Placement p;
      p.aggregator = id;
      p.slot_base = *base;
      out.push_back(std::move(p));
    }
  }
  return out;
}

uint32_t ControllerState::largest_fan_in() const {
  uint32_t f = 0;
  for (const auto& [id, a] : aggs_) {
    if (!a.draining) f = std::max(f, a.max_fan_in);
  }
  return f;
}

std::string ControllerState::flat_refusal(uint32_t world, uint32_t slots) const {
  uint32_t best_free = 0;
  for (const auto& [id, a] : aggs_) {
    if (!a.draining && a.max_fan_in >= world) best_free = std::max(best_free, free_slots(id));
  }
  return "no aggregator has " + std::to_string(slots) +
         " contiguous free slots (most free on a fitting aggregator: " + std::to_string(best_free) +
         ")";
}

std::optional<std::vector<Placement>> ControllerState::plan_tree(uint32_t world, uint32_t slots,
                                                                 uint32_t fan_in,
                                                                 std::string* why) const {
  const uint32_t n = (world + fan_in - 1) / fan_in;
  const uint32_t per_leaf = (world + n - 1) / n;  // the largest block
  const std::vector<Placement> leaves = candidates(per_leaf, slots, {});
  const std::vector<Placement> roots = candidates(n, slots, {});
  auto in_leaves = [&](const std::string& id) {
    return std::any_of(leaves.begin(), leaves.end(),
                       [&](const Placement& p) { return p.aggregator == id; });
  };
  // The root: preferably an aggregator that cannot be a leaf, so no leaf candidate is spent.
  const Placement* root = nullptr;
  for (const Placement& r : roots) {
    if (!in_leaves(r.aggregator)) {
      root = &r;
      break;
    }
  }
  if (root == nullptr && !roots.empty() && leaves.size() >= size_t{n} + 1) root = &roots.front();
  if (root == nullptr || leaves.size() - (in_leaves(root->aggregator) ? 1 : 0) < n) {
    std::set<std::string> any;
    for (const Placement& p : leaves) any.insert(p.aggregator);
    for (const Placement& p : roots) any.insert(p.aggregator);
    *why = "tree for world " + std::to_string(world) + " needs " + std::to_string(n) +
           " leaves with fan-in >= " + std::to_string(per_leaf) +
           " and a root with fan-in >= " + std::to_string(n) + " on another aggregator: only " +
           std::to_string(any.size()) + " aggregators have " + std::to_string(slots) +
           " contiguous free slots (" + std::to_string(leaves.size()) +
           " with fan-in >= " + std::to_string(per_leaf) + ", " + std::to_string(roots.size()) +
           " with fan-in >= " + std::to_string(n) + ")";
    if (n > fan_in) {
      *why += " (a two-level tree of " + std::to_string(n) + " leaves needs a root fan-in of " +
              std::to_string(n) + ", largest " + std::to_string(fan_in) + ")";
    }
    return std::nullopt;
  }
  std::vector<Placement> out;
  for (const Placement& l : leaves) {
    if (out.size() == n) break;
    if (l.aggregator == root->aggregator) continue;
    Placement p = l;
    p.role = Role::kLeaf;
    p.child_index = static_cast<uint32_t>(out.size());
    p.rank_base = leaf_rank_base(p.child_index, n, world);
    p.local_ranks = leaf_rank_base(p.child_index + 1, n, world) - p.rank_base;
    p.parent = root->aggregator;
    out.push_back(std::move(p));
  }
  Placement r = *root;
  r.role = Role::kRoot;
  r.local_ranks = n;
  out.push_back(std::move(r));
  return out;
}

Result<JobInfo> ControllerState::admit(const AdmitRequest& req, Millis now) {
  const bool name_ok = !req.name.empty() && req.name.size() <= 128 &&
                       req.name.find_first_not_of(
                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-") ==
                           std::string::npos;
  if (!name_ok) return invalid_argument("admit: name must be 1..128 of [A-Za-z0-9._:-]");
  if (req.world < 1 || req.world > kMaxWorld)
    return invalid_argument("admit: world must be in 1..65535");
  if (req.rank >= req.world) {
    return invalid_argument("admit: rank " + std::to_string(req.rank) + " must be below world " +
                            std::to_string(req.world));
  }
  if (req.slots < 1 || req.slots > kMaxSlots)
    return invalid_argument("admit: slots must be in 1..32768");
  if (req.block_elems < 1 || req.block_elems > kMaxBlock) {
    return invalid_argument("admit: block must be in 1..16384");
  }
  if (req.shards > kMaxShards) return invalid_argument("admit: shards must be in 1..256");
  for (const std::string& d : req.dtypes) {
    if (std::find(std::begin(kDTypes), std::end(kDTypes), d) == std::end(kDTypes)) {
      return invalid_argument("admit: dtype '" + d +
                              "' is not one of int32, float32, float16, bfloat16, float8_e4m3, "
                              "float8_e5m2");
    }
  }
  std::string anew;  // why an earlier answer under this name is decided again
  if (auto it = by_name_.find(req.name); it != by_name_.end()) {
    JobInfo& j = jobs_.at(it->second);
    // A refused rank asking again is a new run (see the file comment): the refusal is decided
    // again. Ranks asking for the first time get the answer the others got.
    const bool refused_again = j.state == JobState::kRefused && j.told_refusal.count(req.rank) != 0;
    if (j.state != JobState::kExpired && !refused_again) {
      if (j.world != req.world) {
        return invalid_argument("admit: job '" + req.name + "' was admitted with world " +
                                std::to_string(j.world) + ", asked with " +
                                std::to_string(req.world));
      }
      if (j.state == JobState::kRefused) j.told_refusal.insert(req.rank);
      return j;
    }
    // An expired job's ranks have been silent for the whole TTL: this is a new run of the job.
    anew = j.state == JobState::kExpired
               ? "a new run after job " + std::to_string(j.id) + " expired"
               : "rank " + std::to_string(req.rank) + " asked again after job " +
                     std::to_string(j.id) + " was refused (" + j.reason + ")";
    jobs_.erase(it->second);
    by_name_.erase(it);
  }
  JobInfo j;
  j.id = next_id_++;
  j.name = req.name;
  j.world = req.world;
  j.slots = req.slots;
  j.dtypes = req.dtypes;
  j.admitted_at = now;
  j.last_activity = now;
  j.shards_asked = req.shards != 0 ? req.shards : opts_.default_shards;
  const uint32_t fan_in = largest_fan_in();
  std::string why;
  if (aggs_.empty()) {
    why = "no aggregator is registered";
  } else if (fan_in == 0) {
    why = "every aggregator is draining";
  } else if (req.world > fan_in) {
    if (req.shards > 1) {
      why = "shards=" + std::to_string(req.shards) +
            ": sharding a job that needs an aggregation tree "
            "(world " +
            std::to_string(req.world) + " exceeds every aggregator's fan-in, largest " +
            std::to_string(fan_in) + ") is not supported; ask without shards";
    } else if (auto tree = plan_tree(req.world, req.slots, fan_in, &why)) {
      j.placements = std::move(*tree);
      j.shards_asked = 1;
    }
  } else {
    std::vector<Placement> c = candidates(req.world, req.slots, {});
    if (c.empty()) {
      why = flat_refusal(req.world, req.slots);
    } else {
      if (c.size() > j.shards_asked) c.resize(j.shards_asked);
      for (Placement& p : c) p.local_ranks = req.world;
      j.placements = std::move(c);
      if (j.shards_asked > 1 && j.placements.size() < j.shards_asked) {
        j.reason = "admitted with " + std::to_string(j.placements.size()) + " of " +
                   std::to_string(j.shards_asked) + " shards: only " +
                   std::to_string(j.placements.size()) +
                   " aggregators with fan-in >= " + std::to_string(req.world) + " have " +
                   std::to_string(req.slots) + " contiguous free slots";
        ++short_shards_total;
      }
    }
  }
  if (!j.placements.empty()) {
    j.state = JobState::kActive;
    j.block_elems = req.block_elems;
    for (const Placement& p : j.placements) {
      j.block_elems = std::min(j.block_elems, aggs_.at(p.aggregator).block_elems);
    }
    do {
      j.key = keygen_();
    } while (j.key.is_zero());  // zero is "no key configured": never hand it out
    ++admitted_total;
    if (j.is_tree()) ++admitted_tree_total;
    if (j.shards_asked > 1) ++admitted_sharded_total;
    audit(job_text(j) + " admitted, first asked by rank " + std::to_string(req.rank) + ": " +
          placement_text(j) + ", block " + std::to_string(j.block_elems) +
          (j.reason.empty() ? std::string{} : "; " + j.reason) +
          (anew.empty() ? std::string{} : "; " + anew));
  } else {
    j.state = JobState::kRefused;
    j.reason = why;
    j.block_elems = req.block_elems;
    j.told_refusal.insert(req.rank);
    ++refused_total;
    audit(job_text(j) + " refused, first asked by rank " + std::to_string(req.rank) + ": " + why +
          "; its ranks run on the host path" + (anew.empty() ? std::string{} : "; " + anew));
  }
  by_name_[j.name] = j.id;
  jobs_[j.id] = j;
  return j;
}

Status ControllerState::release(const std::string& name, uint32_t rank) {
  auto it = by_name_.find(name);
  if (it == by_name_.end())
    return Status(StatusCode::kNotFound, "release: no job named '" + name + "'");
  JobInfo& j = jobs_.at(it->second);
  if (rank >= j.world) {
    return invalid_argument("release: rank " + std::to_string(rank) + " must be below world " +
                            std::to_string(j.world));
  }
  j.released.insert(rank);
  if (j.released.size() < j.world) return ok_status();
  audit(job_text(j) + " " + job_state_name(j.state) + ", released by every rank: forgotten" +
        (j.state == JobState::kActive ? ", freed " + placement_text(j) : std::string{}));
  jobs_.erase(it->second);
  by_name_.erase(it);
  return ok_status();
}

Status ControllerState::remove_job(JobId id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return Status(StatusCode::kNotFound, "no job " + std::to_string(id));
  const JobInfo& j = it->second;
  audit(job_text(j) + " " + job_state_name(j.state) + ", removed on request" +
        (j.state == JobState::kActive ? ": freed " + placement_text(j) : std::string{}));
  by_name_.erase(j.name);
  jobs_.erase(it);
  return ok_status();
}

Status ControllerState::drain(const std::string& aggregator, bool on) {
  auto it = aggs_.find(aggregator);
  if (it == aggs_.end()) return Status(StatusCode::kNotFound, "no aggregator '" + aggregator + "'");
  it->second.draining = on;
  std::string jobs;
  size_t n = 0;
  for (const auto& [id, j] : jobs_) {
    if (j.state != JobState::kActive || !j.uses(aggregator)) continue;
    if (n++ < 8) jobs += (jobs.empty() ? " " : ", ") + std::to_string(id);
  }
  if (n > 8) jobs += ", ...";
  audit("aggregator " + aggregator + " drain " + (on ? "on" : "off") +
        (on ? ": no new jobs placed there; " : ": placing jobs there again; ") + std::to_string(n) +
        " active jobs on it" + (n > 0 ? ":" + jobs : std::string{}) +
        (on && n > 0 ? " keep running" : ""));
  return ok_status();
}

bool ControllerState::replace_placements(JobInfo& j, const std::set<std::string>& gone,
                                         std::string* why) {
  // The job's own aggregators are excluded: one job id per aggregator.
  std::set<std::string> exclude(gone.begin(), gone.end());
  for (const Placement& p : j.placements) exclude.insert(p.aggregator);
  std::vector<Placement> next;
  std::string root_moved_to;
  std::vector<std::string> dropped;
  uint32_t moved = 0;
  for (const Placement& p : j.placements) {
    if (gone.count(p.aggregator) == 0) {
      next.push_back(p);
      continue;
    }
    // A leaf needs its ranks' fan-in, a root its leaves', a flat placement or shard the world.
    const std::vector<Placement> c = candidates(p.local_ranks, j.slots, exclude);
    if (c.empty()) {
      if (j.is_sharded()) {
        dropped.push_back(p.aggregator);
        continue;
      }
      *why = "aggregator " + p.aggregator + " stopped heartbeating and no other aggregator with " +
             "fan-in >= " + std::to_string(p.local_ranks) + " has " + std::to_string(j.slots) +
             " contiguous free slots; the job runs on the host fallback";
      return false;
    }
    Placement q = p;
    q.aggregator = c.front().aggregator;
    q.slot_base = c.front().slot_base;
    exclude.insert(q.aggregator);
    if (q.role == Role::kRoot) root_moved_to = q.aggregator;
    next.push_back(std::move(q));
    ++moved;
  }
  if (next.empty()) {
    *why =
        "every shard's aggregator stopped heartbeating and no other has room; the job runs on "
        "the host fallback";
    return false;
  }
  if (!root_moved_to.empty()) {
    for (Placement& p : next) {
      if (p.role == Role::kLeaf) p.parent = root_moved_to;
    }
  }
  for (const Placement& p : next)
    j.block_elems = std::min(j.block_elems, aggs_.at(p.aggregator).block_elems);
  j.placements = std::move(next);
  j.replacements += moved;
  replaced_total += moved;
  if (!dropped.empty()) {
    j.reason = "running on " + std::to_string(j.placements.size()) + " of " +
               std::to_string(j.shards_asked) + " shards: lost shard aggregator(s)";
    for (const std::string& d : dropped) j.reason += " " + d;
  }
  return true;
}

std::vector<std::string> ControllerState::expire(Millis now) {
  std::vector<std::string> gone;
  for (auto it = aggs_.begin(); it != aggs_.end();) {
    if (now - it->second.last_heartbeat > opts_.heartbeat_timeout) {
      audit("aggregator " + it->first + " expired: no heartbeat for " +
            std::to_string(now - it->second.last_heartbeat) + " ms (timeout " +
            std::to_string(opts_.heartbeat_timeout) +
            " ms): removed; its jobs follow (re-placed or lost)");
      gone.push_back(it->first);
      it = aggs_.erase(it);
    } else {
      ++it;
    }
  }
  if (gone.empty()) return gone;
  const std::set<std::string> gone_set(gone.begin(), gone.end());
  for (auto& [jid, j] : jobs_) {
    if (j.state != JobState::kActive) continue;
    if (std::none_of(j.placements.begin(), j.placements.end(),
                     [&](const Placement& p) { return gone_set.count(p.aggregator) != 0; })) {
      continue;
    }
    std::string why;
    if (replace_placements(j, gone_set, &why)) {
      audit(job_text(j) + " re-placed off silent aggregator(s): now " + placement_text(j) +
            (j.reason.empty() ? std::string{} : "; " + j.reason));
      j.last_activity = now;
      for (const std::string& g : gone) {
        j.packets_seen.erase(g);
        j.telemetry.erase(g);
      }
    } else {
      j.state = JobState::kLost;
      j.reason = why;
      ++lost_total;
      audit(job_text(j) + " lost: " + why);
    }
  }
  return gone;
}

void ControllerState::note_job_packets(JobId id, const std::string& aggregator, uint64_t packets,
                                       Millis now) {
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.state != JobState::kActive) return;
  JobInfo& j = it->second;
  if (!j.uses(aggregator)) return;  // a stale report from an aggregator the job left
  auto seen = j.packets_seen.find(aggregator);
  // Any change counts (an aggregator restart resets its counters); a first report with packets
  // too (the controller may have restarted mid-job).
  const bool active = seen == j.packets_seen.end() ? packets > 0 : seen->second != packets;
  j.packets_seen[aggregator] = packets;
  if (active) j.last_activity = std::max(j.last_activity, now);
}

std::vector<JobId> ControllerState::expire_jobs(Millis now) {
  std::vector<JobId> out;
  if (opts_.job_idle_ttl <= 0) return out;
  for (auto& [id, j] : jobs_) {
    if (j.state != JobState::kActive || now - j.last_activity <= opts_.job_idle_ttl) continue;
    // Only jobs whose aggregators report packet counts for them: an aggregator that does not
    // (an older one) must not have its busy jobs expired.
    if (j.packets_seen.empty()) continue;
    j.state = JobState::kExpired;
    j.reason = "no packets on any of its aggregators for " + std::to_string(now - j.last_activity) +
               " ms (idle TTL " + std::to_string(opts_.job_idle_ttl) + " ms): expired, slots freed";
    ++expired_total;
    audit(job_text(j) + " expired: " + j.reason + " (was " + placement_text(j) + ")");
    out.push_back(id);
  }
  return out;
}

std::string ControllerState::address_of(const std::string& id) const {
  auto it = aggs_.find(id);
  if (it == aggs_.end()) return "";
  return it->second.host + ":" + std::to_string(it->second.port);
}

const JobInfo* ControllerState::job(JobId id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobInfo* ControllerState::job_by_name(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &jobs_.at(it->second);
}

void ControllerState::set_job_telemetry(JobId id, const std::string& aggregator, std::string json) {
  auto it = jobs_.find(id);
  if (it == jobs_.end() || !it->second.uses(aggregator)) return;
  it->second.telemetry[aggregator] = std::move(json);
}

}  // namespace ina::ctl
