// The JSON form of ControllerState (see state.h) that ina-controller persists (state_file.h):
// to_json writes every field the state holds, from_json checks and loads it (version 3; versions
// 1 and 2 still load), so a restarted controller keeps its jobs and placements.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "controller/json_fields.h"
#include "controller/state.h"

namespace ina::ctl {

namespace {

nlohmann::json placement_json(const Placement& p) {
  nlohmann::json o = {{"aggregator", p.aggregator},
                      {"slot_base", p.slot_base},
                      {"role", role_name(p.role)},
                      {"local_ranks", p.local_ranks}};
  if (p.role == Role::kLeaf) {
    o["rank_base"] = p.rank_base;
    o["child_index"] = p.child_index;
    o["parent"] = p.parent;
  }
  return o;
}

Result<Placement> placement_from_json(const nlohmann::json& o) {
  Placement p;
  p.aggregator = o.at("aggregator").get<std::string>();
  p.slot_base = json_unsigned_at<uint32_t>(o, "slot_base");
  const std::string role = o.at("role").get<std::string>();
  bool known = false;
  for (Role r : {Role::kFlat, Role::kLeaf, Role::kRoot}) {
    if (role == role_name(r)) {
      p.role = r;
      known = true;
    }
  }
  if (!known) {
    return invalid_argument("state: placement on " + p.aggregator + ": role '" + role +
                            "' is not flat, leaf or root");
  }
  p.local_ranks = json_unsigned_at<uint32_t>(o, "local_ranks");
  if (p.role == Role::kLeaf) {
    p.rank_base = json_unsigned_at<uint32_t>(o, "rank_base");
    p.child_index = json_unsigned_at<uint32_t>(o, "child_index");
    p.parent = o.at("parent").get<std::string>();
  }
  return p;
}

}  // namespace

std::string ControllerState::to_json() const {
  nlohmann::json j;
  // Version 3: job keys are 128-bit, as 32 hex digits (versions 1 and 2: a 64-bit number).
  j["version"] = 3;
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
    nlohmann::json pl = nlohmann::json::array();
    for (const Placement& p : x.placements) pl.push_back(placement_json(p));
    j["jobs"].push_back({{"id", x.id},
                         {"name", x.name},
                         {"world", x.world},
                         {"key", key_to_hex(x.key)},
                         {"slots", x.slots},
                         {"block_elems", x.block_elems},
                         {"dtypes", x.dtypes},
                         {"state", job_state_name(x.state)},
                         {"reason", x.reason},
                         {"placements", pl},
                         {"shards_asked", x.shards_asked},
                         {"replacements", x.replacements},
                         {"released", x.released}});
  }
  return j.dump(2);
}

Status ControllerState::from_json(const std::string& text, Millis now) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    const uint32_t version = json_unsigned_at<uint32_t>(j, "version");
    if (version < 1 || version > 3) {
      return invalid_argument("state: version " + std::to_string(version) + " is not 1, 2 or 3");
    }
    std::map<std::string, AggregatorInfo> aggs;
    for (const auto& a : j.at("aggregators")) {
      AggregatorInfo x;
      x.id = a.at("id").get<std::string>();
      x.host = a.at("host").get<std::string>();
      x.port = json_unsigned_at<uint16_t>(a, "port");
      x.slot_capacity = json_unsigned_at<uint32_t>(a, "slot_capacity");
      x.max_fan_in = json_unsigned_at<uint32_t>(a, "max_fan_in");
      x.block_elems = json_unsigned_at<uint32_t>(a, "block_elems");
      x.http = a.at("http").get<std::string>();
      x.draining = a.at("draining").get<bool>();
      x.last_heartbeat = now;
      aggs.emplace(x.id, x);
    }
    std::map<JobId, JobInfo> jobs;
    std::map<std::string, JobId> names;
    for (const auto& o : j.at("jobs")) {
      JobInfo x;
      x.id = json_unsigned_at<JobId>(o, "id");
      x.name = o.at("name").get<std::string>();
      x.world = json_unsigned_at<uint32_t>(o, "world");
      const auto& key = o.at("key");
      if (key.is_string()) {
        if (!parse_key_hex(key.get<std::string>(), &x.key)) {
          return invalid_argument("state: job " + std::to_string(x.id) +
                                  ": \"key\" is not 32 hexadecimal digits");
        }
      } else {
        // Versions 1 and 2 kept 64-bit keys: widened (hi = 0), so the job keeps its key.
        x.key = Key128{json_unsigned<uint64_t>(key, "key"), 0};
      }
      x.slots = json_unsigned_at<uint32_t>(o, "slots");
      x.block_elems = json_unsigned_at<uint32_t>(o, "block_elems");
      x.dtypes = o.at("dtypes").get<std::vector<std::string>>();
      const std::string st = o.at("state").get<std::string>();
      bool known = false;
      for (int s = 0; s < kJobStates; ++s) {
        if (st == job_state_name(static_cast<JobState>(s))) {
          x.state = static_cast<JobState>(s);
          known = true;
        }
      }
      if (!known) {
        return invalid_argument("state: job " + std::to_string(x.id) + ": unknown state '" + st +
                                "'");
      }
      x.reason = o.at("reason").get<std::string>();
      if (version == 1) {
        // One aggregator per job ("" when refused).
        const std::string agg = o.at("aggregator").get<std::string>();
        if (!agg.empty()) {
          Placement p;
          p.aggregator = agg;
          p.slot_base = json_unsigned_at<uint32_t>(o, "slot_base");
          p.local_ranks = x.world;
          x.placements.push_back(std::move(p));
        }
      } else {
        for (const auto& p : o.at("placements")) {
          Result<Placement> r = placement_from_json(p);
          if (!r.ok()) return r.status();
          x.placements.push_back(std::move(r.value()));
        }
        x.shards_asked = json_unsigned_at<uint32_t>(o, "shards_asked");
        x.replacements = json_unsigned_at<uint32_t>(o, "replacements");
      }
      const nlohmann::json& released = o.at("released");
      if (!released.is_array()) {
        throw nlohmann::json::type_error::create(302, "\"released\" must be an array", nullptr);
      }
      for (const auto& r : released) x.released.insert(json_unsigned<uint32_t>(r, "released"));
      x.admitted_at = now;
      x.last_activity = now;
      names[x.name] = x.id;
      jobs.emplace(x.id, std::move(x));
    }
    aggs_ = std::move(aggs);
    jobs_ = std::move(jobs);
    by_name_ = std::move(names);
    next_id_ = json_unsigned_at<JobId>(j, "next_id");
    for (const auto& [id, x] : jobs_) next_id_ = std::max<JobId>(next_id_, id + 1);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("state: malformed JSON: ") + e.what());
  }
  return ok_status();
}

}  // namespace ina::ctl
