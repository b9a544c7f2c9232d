// ControllerState (see state.h): registry, first-fit placement on slot ranges, sticky admission,
// expiry, and the JSON form persisted by ina-controller.
#include "controller/state.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace ina::ctl {

const char* job_state_name(JobState s) {
  switch (s) {
    case JobState::kActive: return "active";
    case JobState::kRefused: return "refused";
    case JobState::kLost: return "lost";
  }
  return "?";
}

namespace {
constexpr uint32_t kMaxWorld = 65535;
constexpr uint32_t kMaxSlots = 32768;  // the wire's 15-bit slot index
constexpr uint32_t kMaxBlock = 16384;
const char* const kDTypes[] = {"int32", "float32", "float16", "bfloat16"};
}  // namespace

ControllerState::ControllerState(StateOptions opts, KeyGen keygen)
    : opts_(opts), keygen_(std::move(keygen)) {}

Status ControllerState::heartbeat(const AggregatorInfo& info, Millis now) {
  if (info.id.empty()) return invalid_argument("aggregator: id must not be empty");
  if (info.host.empty()) return invalid_argument("aggregator " + info.id + ": host must not be empty");
  if (info.port == 0) return invalid_argument("aggregator " + info.id + ": port must be in 1..65535");
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
    return ok_status();
  }
  const bool draining = it->second.draining;  // the controller's decision, not the aggregator's
  it->second = info;
  it->second.draining = draining;
  it->second.last_heartbeat = now;
  return ok_status();
}

std::vector<JobInfo> ControllerState::jobs_on(const std::string& aggregator) const {
  std::vector<JobInfo> out;
  for (const auto& [id, j] : jobs_) {
    if (j.state == JobState::kActive && j.aggregator == aggregator) out.push_back(j);
  }
  return out;
}

uint32_t ControllerState::free_slots(const std::string& aggregator) const {
  auto it = aggs_.find(aggregator);
  if (it == aggs_.end()) return 0;
  uint64_t used = 0;
  for (const JobInfo& j : jobs_on(aggregator)) used += j.slots;
  return used >= it->second.slot_capacity ? 0 : it->second.slot_capacity - static_cast<uint32_t>(used);
}

std::optional<uint32_t> ControllerState::find_range(const AggregatorInfo& agg,
                                                    uint32_t slots) const {
  std::vector<std::pair<uint32_t, uint32_t>> used;  // [base, end)
  for (const JobInfo& j : jobs_on(agg.id)) used.emplace_back(j.slot_base, j.slot_base + j.slots);
  std::sort(used.begin(), used.end());
  uint64_t at = 0;
  for (const auto& [lo, hi] : used) {
    if (lo >= at + slots) break;
    at = std::max<uint64_t>(at, hi);
  }
  if (at + slots > agg.slot_capacity) return std::nullopt;
  return static_cast<uint32_t>(at);
}

std::string ControllerState::placement_refusal(const AdmitRequest& req) const {
  if (aggs_.empty()) return "no aggregator is registered";
  uint32_t best_fan_in = 0;
  uint32_t best_free = 0;
  size_t live = 0;
  for (const auto& [id, a] : aggs_) {
    if (a.draining) continue;
    ++live;
    best_fan_in = std::max(best_fan_in, a.max_fan_in);
    if (a.max_fan_in >= req.world) best_free = std::max(best_free, free_slots(id));
  }
  if (live == 0) return "every aggregator is draining";
  if (best_fan_in < req.world) {
    return "world size " + std::to_string(req.world) + " exceeds every aggregator's fan-in (largest " +
           std::to_string(best_fan_in) + "; aggregation trees are not built yet)";
  }
  return "no aggregator has " + std::to_string(req.slots) +
         " contiguous free slots (most free on a fitting aggregator: " + std::to_string(best_free) +
         ")";
}

Result<JobInfo> ControllerState::admit(const AdmitRequest& req, Millis now) {
  const bool name_ok =
      !req.name.empty() && req.name.size() <= 128 &&
      req.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-") ==
          std::string::npos;
  if (!name_ok) return invalid_argument("admit: name must be 1..128 of [A-Za-z0-9._:-]");
  if (req.world < 1 || req.world > kMaxWorld) return invalid_argument("admit: world must be in 1..65535");
  if (req.rank >= req.world) {
    return invalid_argument("admit: rank " + std::to_string(req.rank) + " must be below world " +
                            std::to_string(req.world));
  }
  if (req.slots < 1 || req.slots > kMaxSlots) return invalid_argument("admit: slots must be in 1..32768");
  if (req.block_elems < 1 || req.block_elems > kMaxBlock) {
    return invalid_argument("admit: block must be in 1..16384");
  }
  for (const std::string& d : req.dtypes) {
    if (std::find(std::begin(kDTypes), std::end(kDTypes), d) == std::end(kDTypes)) {
      return invalid_argument("admit: dtype '" + d + "' is not one of int32, float32, float16, bfloat16");
    }
  }
  if (auto it = by_name_.find(req.name); it != by_name_.end()) {
    const JobInfo& j = jobs_.at(it->second);
    if (j.world != req.world) {
      return invalid_argument("admit: job '" + req.name + "' was admitted with world " +
                              std::to_string(j.world) + ", asked with " + std::to_string(req.world));
    }
    return j;
  }
  JobInfo j;
  j.id = next_id_++;
  j.name = req.name;
  j.world = req.world;
  j.slots = req.slots;
  j.dtypes = req.dtypes;
  j.admitted_at = now;
  // First fit over live, non-draining aggregators with enough fan-in, in id order.
  for (const auto& [id, a] : aggs_) {
    if (a.draining || a.max_fan_in < req.world) continue;
    if (auto base = find_range(a, req.slots)) {
      j.state = JobState::kActive;
      j.aggregator = id;
      j.slot_base = *base;
      j.block_elems = std::min(req.block_elems, a.block_elems);
      do {
        j.key = keygen_();
      } while (j.key == 0);  // 0 is the hand-configured default: never hand it out
      ++admitted_total;
      break;
    }
  }
  if (j.aggregator.empty()) {
    j.state = JobState::kRefused;
    j.reason = placement_refusal(req);
    j.block_elems = req.block_elems;
    ++refused_total;
  }
  by_name_[j.name] = j.id;
  jobs_[j.id] = j;
  return j;
}

Status ControllerState::release(const std::string& name, uint32_t rank) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return Status(StatusCode::kNotFound, "release: no job named '" + name + "'");
  JobInfo& j = jobs_.at(it->second);
  if (rank >= j.world) {
    return invalid_argument("release: rank " + std::to_string(rank) + " must be below world " +
                            std::to_string(j.world));
  }
  j.released.insert(rank);
  if (j.released.size() == j.world) return remove_job(j.id);
  return ok_status();
}

Status ControllerState::remove_job(JobId id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return Status(StatusCode::kNotFound, "no job " + std::to_string(id));
  by_name_.erase(it->second.name);
  jobs_.erase(it);
  return ok_status();
}

Status ControllerState::drain(const std::string& aggregator, bool on) {
  auto it = aggs_.find(aggregator);
  if (it == aggs_.end()) return Status(StatusCode::kNotFound, "no aggregator '" + aggregator + "'");
  it->second.draining = on;
  return ok_status();
}

std::vector<std::string> ControllerState::expire(Millis now) {
  std::vector<std::string> gone;
  for (auto it = aggs_.begin(); it != aggs_.end();) {
    if (now - it->second.last_heartbeat > opts_.heartbeat_timeout) {
      gone.push_back(it->first);
      it = aggs_.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& id : gone) {
    for (auto& [jid, j] : jobs_) {
      if (j.state == JobState::kActive && j.aggregator == id) {
        j.state = JobState::kLost;
        j.reason = "aggregator " + id + " stopped heartbeating; the job runs on the host fallback";
        ++lost_total;
      }
    }
  }
  return gone;
}

const JobInfo* ControllerState::job(JobId id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobInfo* ControllerState::job_by_name(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &jobs_.at(it->second);
}

void ControllerState::set_job_telemetry(JobId id, std::string json) {
  if (auto it = jobs_.find(id); it != jobs_.end()) it->second.telemetry_json = std::move(json);
}

// ---- persistence ----

std::string ControllerState::to_json() const {
  nlohmann::json j;
  j["version"] = 1;
  j["next_id"] = next_id_;
  j["aggregators"] = nlohmann::json::array();
  for (const auto& [id, a] : aggs_) {
    j["aggregators"].push_back({{"id", a.id},
                                {"host", a.host},
                                {"port", a.port},
                                {"slot_capacity", a.slot_capacity},
                                {"max_fan_in", a.max_fan_in},
                                {"block_elems", a.block_elems},
                                {"http", a.http},
                                {"draining", a.draining}});
  }
  j["jobs"] = nlohmann::json::array();
  for (const auto& [id, x] : jobs_) {
    j["jobs"].push_back({{"id", x.id},
                         {"name", x.name},
                         {"world", x.world},
                         {"key", x.key},
                         {"slots", x.slots},
                         {"block_elems", x.block_elems},
                         {"dtypes", x.dtypes},
                         {"state", job_state_name(x.state)},
                         {"reason", x.reason},
                         {"aggregator", x.aggregator},
                         {"slot_base", x.slot_base},
                         {"released", x.released}});
  }
  return j.dump(2);
}

Status ControllerState::from_json(const std::string& text, Millis now) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.at("version").get<int>() != 1) return invalid_argument("state: unknown version");
    std::map<std::string, AggregatorInfo> aggs;
    for (const auto& a : j.at("aggregators")) {
      AggregatorInfo x;
      x.id = a.at("id").get<std::string>();
      x.host = a.at("host").get<std::string>();
      x.port = a.at("port").get<uint16_t>();
      x.slot_capacity = a.at("slot_capacity").get<uint32_t>();
      x.max_fan_in = a.at("max_fan_in").get<uint32_t>();
      x.block_elems = a.at("block_elems").get<uint32_t>();
      x.http = a.at("http").get<std::string>();
      x.draining = a.at("draining").get<bool>();
      x.last_heartbeat = now;
      aggs.emplace(x.id, x);
    }
    std::map<JobId, JobInfo> jobs;
    std::map<std::string, JobId> names;
    for (const auto& o : j.at("jobs")) {
      JobInfo x;
      x.id = o.at("id").get<JobId>();
      x.name = o.at("name").get<std::string>();
      x.world = o.at("world").get<uint32_t>();
      x.key = o.at("key").get<uint64_t>();
      x.slots = o.at("slots").get<uint32_t>();
      x.block_elems = o.at("block_elems").get<uint32_t>();
      x.dtypes = o.at("dtypes").get<std::vector<std::string>>();
      const std::string st = o.at("state").get<std::string>();
      if (st == "active") {
        x.state = JobState::kActive;
      } else if (st == "refused") {
        x.state = JobState::kRefused;
      } else if (st == "lost") {
        x.state = JobState::kLost;
      } else {
        return invalid_argument("state: job " + std::to_string(x.id) + ": unknown state '" + st + "'");
      }
      x.reason = o.at("reason").get<std::string>();
      x.aggregator = o.at("aggregator").get<std::string>();
      x.slot_base = o.at("slot_base").get<uint32_t>();
      x.released = o.at("released").get<std::set<uint32_t>>();
      x.admitted_at = now;
      names[x.name] = x.id;
      jobs.emplace(x.id, std::move(x));
    }
    aggs_ = std::move(aggs);
    jobs_ = std::move(jobs);
    by_name_ = std::move(names);
    next_id_ = j.at("next_id").get<JobId>();
    for (const auto& [id, x] : jobs_) next_id_ = std::max<JobId>(next_id_, id + 1);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("state: malformed JSON: ") + e.what());
  }
  return ok_status();
}

}  // namespace ina::ctl
