// See ctl_format.h.
#include "controller/ctl_format.h"

#include <algorithm>
#include <sstream>

namespace ina::ctl {
namespace {

using json = nlohmann::json;

// A field as a cell: strings as they are, numbers and booleans as JSON writes them, "-" for a
// missing or null field.
std::string cell(const json& o, const char* key) {
  if (!o.is_object() || !o.contains(key) || o.at(key).is_null()) return "-";
  const json& v = o.at(key);
  if (v.is_string()) return v.get<std::string>().empty() ? "-" : v.get<std::string>();
  return v.dump();
}

uint64_t number(const json& o, const char* key) {
  if (!o.is_object() || !o.contains(key) || !o.at(key).is_number_unsigned()) return 0;
  return o.at(key).get<uint64_t>();
}

// "1.2 s", "35 ms", "4 min" for a duration in ms.
std::string age(const json& o, const char* key) {
  if (!o.is_object() || !o.contains(key) || !o.at(key).is_number()) return "-";
  const double ms = o.at(key).get<double>();
  std::ostringstream s;
  s.precision(ms < 10000 ? 2 : 3);
  if (ms < 1000) {
    s << static_cast<int64_t>(ms) << " ms";
  } else if (ms < 120000) {
    s << ms / 1000 << " s";
  } else {
    s << static_cast<int64_t>(ms / 60000) << " min";
  }
  return s.str();
}

// One placement in a few words: "flat x [0,128)", "leaf 1 (ranks 4-7) x [0,64)", "root z [0,64)".
std::string placement_cell(const json& p, uint64_t slots) {
  const std::string role = cell(p, "role");
  std::string s;
  if (role == "leaf") {
    const uint64_t base = number(p, "rank_base");
    s = "leaf " + cell(p, "child_index") + " (ranks " + std::to_string(base) + "-" +
        std::to_string(base + number(p, "local_ranks") - 1) + ") ";
  } else if (role == "root") {
    s = "root ";
  }
  const uint64_t b = number(p, "slot_base");
  return s + cell(p, "aggregator") + " [" + std::to_string(b) + "," + std::to_string(b + slots) +
         ")";
}

}  // namespace

std::string format_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size(), 0);
  auto measure = [&width](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], r[i].size());
  };
  measure(header);
  for (const auto& r : rows) measure(r);
  std::string out;
  auto line = [&](const std::vector<std::string>& r) {
    std::string l;
    for (size_t i = 0; i < r.size() && i < width.size(); ++i) {
      l += r[i];
      if (i + 1 < r.size()) l += std::string(width[i] - r[i].size() + 2, ' ');
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    out += l + "\n";
  };
  line(header);
  for (const auto& r : rows) line(r);
  return out;
}

std::string aggregators_table(const json& aggregators) {
  if (!aggregators.is_array() || aggregators.empty()) return "no aggregator is registered\n";
  std::vector<std::vector<std::string>> rows;
  for (const json& a : aggregators) {
    const bool draining = a.is_object() && a.value("draining", false);
    rows.push_back({cell(a, "id"), cell(a, "address"), draining ? "draining" : "serving",
                    cell(a, "free_slots") + "/" + cell(a, "slot_capacity"), cell(a, "max_fan_in"),
                    cell(a, "block_elems"), age(a, "heartbeat_age_ms"),
                    a.is_object() && a.contains("jobs") ? std::to_string(a.at("jobs").size()) : "-",
                    cell(a, "http")});
  }
  return format_table(
      {"ID", "ADDRESS", "STATE", "FREE/SLOTS", "FAN-IN", "BLOCK", "HEARTBEAT", "JOBS", "HTTP"},
      rows);
}

std::string jobs_table(const json& jobs) {
  if (!jobs.is_array() || jobs.empty()) return "no job\n";
  std::vector<std::vector<std::string>> rows;
  for (const json& j : jobs) {
    std::string where;
    const json placements = j.is_object() ? j.value("placements", json::array()) : json::array();
    for (const json& p : placements) {
      if (!where.empty()) where += ", ";
      if (where.size() > 60) {
        where += "...";
        break;
      }
      where += placement_cell(p, number(j, "slots"));
    }
    rows.push_back({cell(j, "id"), cell(j, "name"), cell(j, "world"), cell(j, "state"),
                    cell(j, "shape"), where.empty() ? "-" : where, age(j, "idle_ms"),
                    cell(j, "reason")});
  }
  return format_table({"ID", "NAME", "WORLD", "STATE", "SHAPE", "PLACEMENT", "IDLE", "REASON"},
                      rows);
}

std::string job_details(const json& job) {
  if (!job.is_object()) return "";
  std::string out;
  auto field = [&](const char* label, const std::string& v) {
    out += std::string(label) +
           std::string(14 - std::min<size_t>(13, std::string(label).size()), ' ') + v + "\n";
  };
  field("job", cell(job, "id") + " '" + cell(job, "name") + "'");
  field("state", cell(job, "state"));
  if (cell(job, "reason") != "-") field("reason", cell(job, "reason"));
  field("world", cell(job, "world"));
  field("shape", cell(job, "shape"));
  field("slots", cell(job, "slots"));
  field("block", cell(job, "block_elems"));
  field("replacements", cell(job, "replacements"));
  field("idle", age(job, "idle_ms"));
  const json placements = job.value("placements", json::array());
  if (!placements.empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const json& p : placements) {
      const std::string role = cell(p, "role");
      std::string ranks = "-";
      if (role == "leaf") {
        const uint64_t base = number(p, "rank_base");
        ranks = std::to_string(base) + "-" + std::to_string(base + number(p, "local_ranks") - 1);
      }
      const uint64_t b = number(p, "slot_base");
      rows.push_back(
          {role, cell(p, "aggregator"), cell(p, "address"),
           "[" + std::to_string(b) + "," + std::to_string(b + number(job, "slots")) + ")", ranks});
    }
    out += "\n" + format_table({"ROLE", "AGGREGATOR", "ADDRESS", "SLOTS", "RANKS"}, rows);
  }
  return out;
}

json admission_json(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  json o = json::object();
  if (!std::getline(in, line) || (line != "admitted" && line != "refused")) return json();
  o["result"] = line;
  while (std::getline(in, line)) {
    const size_t sp = line.find(' ');
    if (sp == std::string::npos) continue;
    const std::string k = line.substr(0, sp);
    const std::string v = line.substr(sp + 1);
    if (k == "aggregator") {
      o["aggregators"].push_back(v);
    } else if (k == "job" || k == "slots" || k == "block" || k == "shards") {
      o[k] = std::strtoull(v.c_str(), nullptr, 10);
    } else {
      o[k] = v;
    }
  }
  return o;
}

std::string admission_summary(const json& a) {
  if (!a.is_object()) return "";
  if (cell(a, "result") == "refused") {
    return "refused: job " + cell(a, "job") + ": " + cell(a, "reason") +
           " (its ranks run on the host path)\n";
  }
  std::string where;
  for (const json& x : a.value("aggregators", json::array())) {
    where += (where.empty() ? "" : ", ") + x.get<std::string>();
  }
  std::string s = "admitted: job " + cell(a, "job") + " on " + where + ", slots " +
                  cell(a, "slots") + ", block " + cell(a, "block");
  if (cell(a, "reason") != "-") s += " (" + cell(a, "reason") + ")";
  return s + "\n";
}

std::string error_text(int status, const std::string& body) {
  const json o = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (o.is_object() && o.contains("error") && o.at("error").is_string()) {
    return o.at("error").get<std::string>();
  }
  std::string t = body;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  if (t.rfind("error ", 0) == 0) return t.substr(6);
  return t.empty() ? "HTTP " + std::to_string(status) : t;
}

}  // namespace ina::ctl
