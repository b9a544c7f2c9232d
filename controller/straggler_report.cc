// straggler_report (see straggler_report.h).
#include "controller/straggler_report.h"

#include <cstdio>
#include <map>
#include <vector>

namespace ina::ctl {
namespace {

using json = nlohmann::json;

double num(const json& o, const char* k) {
  return o.is_object() && o.contains(k) && o[k].is_number() ? o[k].get<double>() : 0.0;
}

std::string fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

// One straggler entry: "rank 5  STRAGGLER  lost 12.3 ms (80%), in 10% of collectives (3 ms
// each), cause: late start (...)  [start 12.3, link 0, loss 0, return 0 ms]".
std::string entry(const json& s, const char* unit) {
  std::string t = std::string(unit) + " " + std::to_string(s.value("rank", 0));
  t += s.value("straggler", false) ? "  STRAGGLER" : "";
  t += "  lost " + fmt("%.1f", num(s, "lost_ms")) + " ms (" +
       fmt("%.0f", num(s, "lost_share") * 100) + "%)";
  if (s.value("episodes", 0) > 0) {
    t += ", in " + fmt("%.0f", num(s, "collective_fraction") * 100) + "% of collectives (" +
         std::to_string(s.value("episodes", 0)) + " hold-ups, " +
         fmt("%.2f", num(s, "mean_episode_ms")) + " ms each)";
  }
  if (s.contains("cause"))
    t += ", cause: " + s.value("cause_text", s.value("cause", std::string{}));
  if (s.contains("lost_ms_by_cause") && s["lost_ms_by_cause"].is_object()) {
    std::string parts;
    for (const char* c : {"start", "link", "loss", "return"}) {
      if (!parts.empty()) parts += ", ";
      parts += std::string(c) + " " + fmt("%.1f", num(s["lost_ms_by_cause"], c));
    }
    t += "  [" + parts + " ms]";
  }
  return t;
}

const json* first_named(const json& tele) {
  if (!tele.is_object() || !tele.contains("stragglers") || !tele["stragglers"].is_array()) {
    return nullptr;
  }
  for (const json& s : tele["stragglers"]) {
    if (s.value("straggler", false)) return &s;
  }
  return nullptr;
}

}  // namespace

std::string straggler_report(const json& job, size_t top) {
  std::map<std::string, const json*> teles;  // aggregator -> its telemetry
  if (job.contains("telemetry_by_aggregator") && job["telemetry_by_aggregator"].is_object()) {
    for (const auto& [agg, t] : job["telemetry_by_aggregator"].items()) teles[agg] = &t;
  } else if (job.contains("telemetry") && job["telemetry"].is_object()) {
    teles[job.value("aggregator", std::string("aggregator"))] = &job["telemetry"];
  }
  if (teles.empty()) return "";
  std::string out = "stragglers by time lost (ina-ctl's summary of the telemetry above):\n";
  const json* root = nullptr;
  std::string root_agg;
  for (const auto& [agg, t] : teles) {
    if (!t->is_object()) continue;
    const std::string role = t->value("role", std::string("flat"));
    const bool is_root = role == "root";
    if (is_root) {
      root = t;
      root_agg = agg;
    }
    out += "  " + role + " " + agg;
    if (role == "leaf") out += " (leaf " + std::to_string(t->value("child_index", 0)) + ")";
    if (t->contains("lost_window")) {
      const json& w = (*t)["lost_window"];
      out += ": " + fmt("%.1f", num(w, "lost_ms")) + " ms lost in the last " +
             fmt("%.1f", num(w, "span_s")) + " s, " + std::to_string(w.value("collectives", 0)) +
             " collectives";
    }
    out += "\n";
    size_t shown = 0;
    bool any = false;
    if (t->contains("stragglers") && (*t)["stragglers"].is_array()) {
      for (const json& s : (*t)["stragglers"]) {
        const bool named = s.value("straggler", false);
        any = any || named;
        if (!named && shown >= top) continue;
        out += "    " + entry(s, is_root ? "leaf" : "rank") + "\n";
        ++shown;
      }
    }
    if (!any) out += "    no straggler: the lost time is within the job's noise\n";
  }
  if (root != nullptr) {
    const json* leaf = first_named(*root);
    out += "  path: root " + root_agg;
    if (leaf == nullptr) {
      out += ": no leaf named\n";
    } else {
      const int child = leaf->value("rank", 0);
      out += " -> leaf " + std::to_string(child) + " (" + leaf->value("cause", std::string{}) + ")";
      bool found = false;
      for (const auto& [agg, t] : teles) {
        if (!t->is_object() || t->value("role", std::string{}) != "leaf" ||
            t->value("child_index", -1) != child) {
          continue;
        }
        found = true;
        out += " at " + agg;
        if (const json* r = first_named(*t); r != nullptr) {
          out += " -> rank " + std::to_string(r->value("rank", 0)) + " (" +
                 r->value("cause_text", std::string{}) + ")\n";
        } else {
          out += ": no rank of it named (the leaf itself or its link to the root: " +
                 leaf->value("cause_text", std::string{}) + ")\n";
        }
      }
      if (!found) out += ": no telemetry from that leaf\n";
    }
  }
  return out;
}

}  // namespace ina::ctl
