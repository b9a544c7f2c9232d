// ina-controller's request parsing and worker answer (see requests.h).
#include "controller/requests.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "controller/json_fields.h"

namespace ina::ctl {

using json = nlohmann::json;

bool parse_u32(const std::string& s, uint32_t* out) {
  if (s.empty() || s.size() > 10) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > UINT32_MAX) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

Result<HeartbeatRequest> parse_heartbeat_request(const std::string& body) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("body is not a JSON object");
  HeartbeatRequest r;
  AggregatorInfo& a = r.info;
  try {
    a.id = j.at("id").get<std::string>();
    a.host = j.at("host").get<std::string>();
    a.port = json_unsigned_at<uint16_t>(j, "port");
    a.slot_capacity = json_unsigned_at<uint32_t>(j, "slot_capacity");
    a.max_fan_in = json_unsigned_at<uint32_t>(j, "max_fan_in");
    a.block_elems = json_unsigned_at<uint32_t>(j, "block_elems");
    a.http = j.value("http", std::string{});
  } catch (const json::exception& e) {
    return invalid_argument(std::string("heartbeat: ") + e.what());
  }
  if (auto t = j.find("jobs"); t != j.end() && t->is_object()) {
    for (auto it = t->begin(); it != t->end(); ++it) {
      HeartbeatRequest::JobReport x;
      if (!parse_u32(it.key(), &x.job)) continue;
      x.telemetry = it.value().dump();
      if (auto pk = it.value().find("packets");
          pk != it.value().end() && pk->is_number_unsigned()) {
        x.has_packets = true;
        x.packets = pk->get<uint64_t>();
      }
      r.jobs.push_back(std::move(x));
    }
  }
  return r;
}

Result<AdmitRequest> parse_admit_request(const QueryParams& params) {
  auto value = [&](const char* name) -> const std::string* {
    const auto it = params.find(name);
    return it == params.end() ? nullptr : &it->second;
  };
  auto field = [&](const char* name, uint32_t* out) {
    const std::string* v = value(name);
    return v == nullptr || parse_u32(*v, out);
  };
  AdmitRequest a;
  if (const std::string* n = value("name")) a.name = *n;
  if (value("world") == nullptr || !field("world", &a.world) || !field("rank", &a.rank) ||
      !field("slots", &a.slots) || !field("block", &a.block_elems) || !field("shards", &a.shards) ||
      (value("shards") != nullptr && a.shards == 0)) {
    return invalid_argument(
        "world, rank, slots, block and shards must be unsigned decimal numbers (world required, "
        "shards >= 1)");
  }
  if (const std::string* dp = value("dtypes")) {
    const std::string& d = *dp;
    for (size_t at = 0; !d.empty() && at <= d.size();) {
      const size_t comma = d.find(',', at);
      a.dtypes.push_back(d.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  }
  return a;
}

// One aggregator: an "aggregator host:port" line (a tree rank's own leaf); a job that asked for
// shards: "shards K" and K "aggregator" lines in shard order. "reason" on an admitted answer says
// why there are fewer shards than asked.
std::string admission_text(const JobInfo& j, uint32_t rank, const ControllerState& st) {
  std::ostringstream s;
  auto address = [&](const Placement* p) -> std::string {
    return p == nullptr ? "" : st.address_of(p->aggregator);
  };
  std::vector<std::string> addrs;
  if (j.state == JobState::kActive) {
    if (j.is_tree() || j.shards_asked <= 1) {
      addrs.push_back(address(j.placement_for_rank(rank)));
    } else {
      for (const Placement& p : j.placements) addrs.push_back(address(&p));
    }
  }
  const bool placed =
      !addrs.empty() &&
      std::none_of(addrs.begin(), addrs.end(), [](const std::string& a) { return a.empty(); });
  if (!placed) {
    std::string reason = j.reason;
    if (j.state == JobState::kActive || reason.empty()) reason = "the job's aggregator is gone";
    s << "refused\njob " << j.id << "\nreason " << reason << "\n";
    return s.str();
  }
  s << "admitted\njob " << j.id << "\nkey " << key_to_hex(j.key) << "\n";
  if (!j.is_tree() && j.shards_asked > 1) s << "shards " << addrs.size() << "\n";
  for (const std::string& a : addrs) s << "aggregator " << a << "\n";
  s << "slots " << j.slots << "\nblock " << j.block_elems << "\n";
  if (!j.reason.empty()) s << "reason " << j.reason << "\n";
  return s.str();
}

}  // namespace ina::ctl
