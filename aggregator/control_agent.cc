// ControlAgent (see control_agent.h): one heartbeat thread (httplib client, JSON with
// nlohmann-json) and, when asked for, one HTTP server thread.
#include "aggregator/control_agent.h"

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "ina/base/http_bind.h"
#include "ina/base/log.h"

namespace ina::agg {
namespace {

// `us` microseconds as decimal seconds, exactly: 1048576 -> "1.048576", 1 -> "0.000001",
// 2000000 -> "2" (a histogram's `le` must name the bound it counts, not a rounding of it).
std::string micros_as_seconds(uint64_t us) {
  std::string s = std::to_string(us / 1000000);
  uint64_t frac = us % 1000000;
  if (frac != 0) {
    char digits[8];
    std::snprintf(digits, sizeof digits, "%06llu", static_cast<unsigned long long>(frac));
    std::string f = digits;
    while (f.back() == '0') f.pop_back();
    s += "." + f;
  }
  return s;
}

using json = nlohmann::json;
constexpr const char* kComponent = "agent";

json telemetry(const JobSnapshot& j) {
  json o;
  o["job"] = j.cfg.job;
  o["world"] = j.cfg.slots.world_size;
  o["slot_base"] = j.cfg.slot_base;
  o["slots"] = j.cfg.slots.num_slots;
  o["ready"] = j.ready;
  o["packets"] = j.counters.packets;
  o["completed"] = j.counters.completed;
  o["bad_tag"] = j.counters.bad_tag;
  o["role"] = tree_role_name(j.cfg.tree.role);
  if (j.cfg.is_leaf()) {
    // The leaf's place in its tree and its traffic with the parent; ranks below are global.
    o["rank_base"] = j.cfg.tree.rank_base;
    o["local_ranks"] = j.cfg.tree.local_ranks;
    o["child_index"] = j.cfg.tree.child_index;
    o["parent"] = j.cfg.tree.parent;
    o["parent_joined"] = j.counters.parent_joined;
    o["forwarded"] = j.counters.forwarded;
    o["reforwarded"] = j.counters.reforwarded;
    o["parent_results"] = j.counters.parent_results;
  }
  const uint32_t first = j.cfg.first_rank();
  // The stragglers by lost time, each with its arrival-lag telemetry; a snapshot
  // without the lost-time ranking (a part not ranked yet) lists them by lag.
  const bool by_loss = j.lost_ranking.size() == j.telemetry.size() && !j.lost_ranking.empty();
  std::vector<const RankVerdict*> verdicts;
  std::vector<uint32_t> order;
  if (by_loss) {
    for (const RankVerdict& v : j.lost_ranking) {
      verdicts.push_back(&v);
      order.push_back(v.rank);
    }
  } else {
    order = j.straggler_ranking;
  }
  json ranking = json::array();
  for (size_t i = 0; i < order.size(); ++i) {
    const uint32_t r = order[i];
    if (r >= j.telemetry.size()) continue;
    const RankTelemetry& t = j.telemetry[r];
    json hist = json::array();
    size_t last_nonzero = 0;
    for (size_t b = 0; b < kLagBuckets; ++b) {
      if (t.lag_hist[b] != 0) last_nonzero = b + 1;
    }
    for (size_t b = 0; b < last_nonzero; ++b) hist.push_back(t.lag_hist[b]);
    json e = {{"rank", first + r},
              {"mean_lag_us", t.mean_lag_us()},
              {"completed_last", t.last},
              {"timed", t.lag_count},
              {"lag_hist_log2_us", hist}};
    if (by_loss) {
      const RankVerdict& v = *verdicts[i];
      json by_cause = json::object();
      for (size_t c = 0; c < kLagCauses; ++c) {
        by_cause[lag_cause_name(static_cast<LagCause>(c))] =
            static_cast<double>(v.loss.lost_ns[c]) / 1e6;
      }
      e["straggler"] = v.named;
      e["lost_ms"] = static_cast<double>(v.lost_ns) / 1e6;
      e["lost_share"] = v.share;
      e["z"] = v.z;
      e["p"] = v.p;
      e["cause"] = lag_cause_name(v.cause);
      e["cause_text"] = lag_cause_meaning(v.cause);
      e["lost_ms_by_cause"] = by_cause;
      e["episodes"] = v.loss.episodes;
      e["collectives_held"] = v.loss.collectives;
      e["collective_fraction"] = v.collective_fraction;
      e["mean_episode_ms"] = v.mean_episode_ms;
      e["retransmits_added"] = v.loss.retransmits_added;
      e["resent_completed"] = v.loss.resent_completed;
    }
    ranking.push_back(std::move(e));
  }
  o["stragglers"] = ranking;
  uint64_t lost = 0;
  for (const RankLoss& l : j.loss.ranks) lost += l.lost_total_ns();
  o["lost_window"] = {{"span_s", static_cast<double>(j.loss.span_ns) / 1e9},
                      {"collectives", j.loss.collectives},
                      {"lost_ms", static_cast<double>(lost) / 1e6}};
  json lag_order = json::array();
  for (uint32_t r : j.straggler_ranking) lag_order.push_back(first + r);
  o["lag_ranking"] = lag_order;  // by median arrival lag (the former ranking)
  json stalled = json::array();
  for (const StalledSlot& s : j.stalled) {
    stalled.push_back({{"slot", s.slot},
                       {"shadow", s.shadow},
                       {"seq", s.seq},
                       {"age_ms", static_cast<double>(s.age_ns) / 1e6},
                       {"contributors", s.contributors},
                       {"missing_ranks", s.missing},
                       {"waiting_parent", s.waiting_parent}});
  }
  o["stalled_slots"] = stalled;
  return o;
}

}  // namespace

std::string job_telemetry_json(const JobSnapshot& j) { return telemetry(j).dump(); }

Result<std::vector<JobConfig>> parse_heartbeat_jobs(const std::string& body) {
  const json ans = json::parse(body, nullptr, false);
  if (!ans.is_object() || !ans.contains("jobs") || !ans["jobs"].is_array()) {
    return invalid_argument("heartbeat answer: expected a JSON object with a \"jobs\" array");
  }
  std::vector<JobConfig> want;
  size_t i = 0;
  for (const json& x : ans["jobs"]) {
    const std::string where = "heartbeat answer: jobs[" + std::to_string(i++) + "]";
    if (!x.is_object()) return invalid_argument(where + ": expected an object");
    // An unsigned field, present (or optional with a default) and within max.
    auto field = [&](const char* name, uint64_t max, bool required, uint64_t* out) -> Status {
      if (!x.contains(name)) {
        return required ? invalid_argument(where + ": field \"" + name + "\" is missing")
                        : ok_status();
      }
      const json& v = x[name];
      if (!v.is_number_unsigned() || v.get<uint64_t>() > max) {
        return invalid_argument(where + ": field \"" + name + "\" must be an integer in 0.." +
                                std::to_string(max) + ", got " + v.dump());
      }
      *out = v.get<uint64_t>();
      return ok_status();
    };
    uint64_t job = 0, world = 0, slots = 0, block = 0, base = 0;
    INA_RETURN_IF_ERROR(field("job", UINT32_MAX, true, &job));
    Key128 key;
    if (!x.contains("key")) return invalid_argument(where + ": field \"key\" is missing");
    if (!x["key"].is_string() || !parse_key_hex(x["key"].get<std::string>(), &key)) {
      return invalid_argument(where +
                              ": field \"key\" must be a string of 32 hexadecimal "
                              "digits, got " +
                              x["key"].dump());
    }
    INA_RETURN_IF_ERROR(field("world", 65535, true, &world));
    INA_RETURN_IF_ERROR(field("slots", uint64_t{wire::kMaxSlot} + 1, true, &slots));
    INA_RETURN_IF_ERROR(field("block_elems", UINT16_MAX, true, &block));
    INA_RETURN_IF_ERROR(field("slot_base", UINT32_MAX, true, &base));
    JobConfig c;
    c.job = static_cast<JobId>(job);
    c.key = key;
    c.slots.world_size = static_cast<uint32_t>(world);
    c.slots.num_slots = static_cast<uint32_t>(slots);
    // block_elems counts 4-byte elements: the block is 4 x block_elems bytes (wire v2).
    c.slots.max_payload_bytes = static_cast<uint32_t>(block) * 4;
    c.slot_base = static_cast<uint32_t>(base);
    // Aggregation trees (the controller's leaf contract): "role" flat (the default), leaf or root.
    if (x.contains("role")) {
      const json& r = x["role"];
      const std::string role = r.is_string() ? r.get<std::string>() : std::string{};
      if (role == "flat") {
        c.tree.role = TreeRole::kFlat;
      } else if (role == "leaf") {
        c.tree.role = TreeRole::kLeaf;
      } else if (role == "root") {
        c.tree.role = TreeRole::kRoot;
      } else {
        return invalid_argument(where +
                                ": field \"role\" must be \"flat\", \"leaf\" or "
                                "\"root\", got " +
                                r.dump());
      }
    }
    if (c.is_leaf()) {
      uint64_t rank_base = 0, local = 0, child = 0, parent_world = 0;
      INA_RETURN_IF_ERROR(field("rank_base", 65535, true, &rank_base));
      INA_RETURN_IF_ERROR(field("local_ranks", 65535, true, &local));
      INA_RETURN_IF_ERROR(field("child_index", 65534, true, &child));
      INA_RETURN_IF_ERROR(field("parent_world", 65535, false, &parent_world));
      if (!x.contains("parent") || !x["parent"].is_string() ||
          x["parent"].get<std::string>().find(':') == std::string::npos) {
        return invalid_argument(
            where + ": role leaf needs field \"parent\" as \"host:port\"" +
            (x.contains("parent") ? ", got " + x["parent"].dump() : std::string(", missing")));
      }
      if (local < 1 || rank_base + local > world) {
        return invalid_argument(
            where + ": leaf ranks [rank_base, rank_base + local_ranks) = [" +
            std::to_string(rank_base) + ", " + std::to_string(rank_base + local) +
            ") must be non-empty and inside the world of " + std::to_string(world));
      }
      c.tree.rank_base = static_cast<uint32_t>(rank_base);
      c.tree.local_ranks = static_cast<uint32_t>(local);
      c.tree.child_index = static_cast<uint32_t>(child);
      c.tree.parent_world = static_cast<uint32_t>(parent_world);
      c.tree.parent = x["parent"].get<std::string>();
      if (x.contains("leaf_bases")) {
        const json& b = x["leaf_bases"];
        bool good = b.is_array();
        if (good) {
          for (const json& v : b) {
            if (!v.is_number_unsigned() || v.get<uint64_t>() >= world) good = false;
          }
        }
        if (!good) {
          return invalid_argument(where +
                                  ": field \"leaf_bases\" must be an array of ranks "
                                  "below the world of " +
                                  std::to_string(world) +
                                  " (the first rank of each leaf by child index), got " + b.dump());
        }
        for (const json& v : b) c.tree.leaf_bases.push_back(v.get<uint32_t>());
      }
    }
    want.push_back(std::move(c));
  }
  return want;
}

// The per-job label is ina_job, not job: Prometheus sets "job" on every scraped series itself (the
// scrape job's name) and renames a target's own "job" label to "exported_job".
std::string prometheus_text(const AggregatorSnapshot& s) {
  std::ostringstream m;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    m << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
      << name << " " << v << "\n";
  };
  counter("ina_aggregator_packets_total", "Datagrams handed to the engine.", s.engine.packets_in);
  counter("ina_aggregator_completed_total", "Completed slot rounds.", s.engine.completed);
  counter(
      "ina_aggregator_bad_tag_total",
      "Packets dropped for a tag that the job's key does not give (forged, corrupt, wrong key).",
      s.engine.bad_tag);
  counter("ina_aggregator_unknown_job_total", "Packets dropped for a job not served.",
          s.engine.unknown_job);
  counter("ina_aggregator_malformed_total", "Malformed packets dropped.", s.engine.malformed);
  counter("ina_aggregator_tx_datagrams_total", "Datagrams sent.", s.tx_datagrams);
  counter("ina_aggregator_send_errors_total", "Failed sends.", s.send_errors);
  m << "# HELP ina_aggregator_jobs Jobs served.\n# TYPE ina_aggregator_jobs gauge\n"
    << "ina_aggregator_jobs " << s.jobs.size() << "\n";
  m << "# HELP ina_aggregator_job_packets_total Packets per job (tag verified).\n"
       "# TYPE ina_aggregator_job_packets_total counter\n";
  for (const JobSnapshot& j : s.jobs) {
    m << "ina_aggregator_job_packets_total{ina_job=\"" << j.cfg.job << "\"} " << j.counters.packets
      << "\n";
  }
  m << "# HELP ina_aggregator_job_completed_total Completed rounds per job.\n"
       "# TYPE ina_aggregator_job_completed_total counter\n";
  for (const JobSnapshot& j : s.jobs) {
    m << "ina_aggregator_job_completed_total{ina_job=\"" << j.cfg.job << "\"} "
      << j.counters.completed << "\n";
  }
  m << "# HELP ina_aggregator_job_bad_tag_total Packets naming the job with a tag its key does not "
       "give.\n"
       "# TYPE ina_aggregator_job_bad_tag_total counter\n";
  for (const JobSnapshot& j : s.jobs) {
    m << "ina_aggregator_job_bad_tag_total{ina_job=\"" << j.cfg.job << "\"} " << j.counters.bad_tag
      << "\n";
  }
  m << "# HELP ina_aggregator_rank_lag_seconds Lag of a rank's contribution behind the round's "
       "first.\n# TYPE ina_aggregator_rank_lag_seconds histogram\n";
  for (const JobSnapshot& j : s.jobs) {
    for (size_t r = 0; r < j.telemetry.size(); ++r) {
      const RankTelemetry& t = j.telemetry[r];
      const std::string labels = "ina_job=\"" + std::to_string(j.cfg.job) + "\",rank=\"" +
                                 std::to_string(j.cfg.first_rank() + r) + "\"";
      uint64_t cum = 0;
      for (size_t b = 0; b + 1 < kLagBuckets; ++b) {
        cum += t.lag_hist[b];
        // Bucket b holds lags below 2^b us, written exactly (1.048576, not 1.04858).
        m << "ina_aggregator_rank_lag_seconds_bucket{" << labels << ",le=\""
          << micros_as_seconds(uint64_t{1} << b) << "\"} " << cum << "\n";
      }
      m << "ina_aggregator_rank_lag_seconds_bucket{" << labels << ",le=\"+Inf\"} " << t.lag_count
        << "\n"
        << "ina_aggregator_rank_lag_seconds_sum{" << labels << "} "
        << static_cast<double>(t.lag_sum_ns) * 1e-9 << "\n"
        << "ina_aggregator_rank_lag_seconds_count{" << labels << "} " << t.lag_count << "\n";
    }
  }
  m << "# HELP ina_aggregator_rank_completed_last_total Rounds this rank arrived last to.\n"
       "# TYPE ina_aggregator_rank_completed_last_total counter\n";
  for (const JobSnapshot& j : s.jobs) {
    for (size_t r = 0; r < j.telemetry.size(); ++r) {
      m << "ina_aggregator_rank_completed_last_total{ina_job=\"" << j.cfg.job << "\",rank=\""
        << j.cfg.first_rank() + r << "\"} " << j.telemetry[r].last << "\n";
    }
  }
  m << "# HELP ina_aggregator_straggler_position Rank's place in the straggler ranking (0: "
       "worst).\n# TYPE ina_aggregator_straggler_position gauge\n";
  for (const JobSnapshot& j : s.jobs) {
    for (size_t i = 0; i < j.straggler_ranking.size(); ++i) {
      m << "ina_aggregator_straggler_position{ina_job=\"" << j.cfg.job << "\",rank=\""
        << j.cfg.first_rank() + j.straggler_ranking[i] << "\"} " << i << "\n";
    }
  }
  // Lost time: labelled ina_job, like every family after the label rename.
  m << "# HELP ina_aggregator_rank_lost_seconds_total Time the rank held up completed rounds "
       "beyond the next-to-last arrival, by cause (start: late start, link: bandwidth, loss: "
       "lossy link, return: results not received).\n"
       "# TYPE ina_aggregator_rank_lost_seconds_total counter\n";
  for (const JobSnapshot& j : s.jobs) {
    for (size_t r = 0; r < j.loss.total_ns.size(); ++r) {
      for (size_t c = 0; c < kLagCauses; ++c) {
        m << "ina_aggregator_rank_lost_seconds_total{ina_job=\"" << j.cfg.job << "\",rank=\""
          << j.cfg.first_rank() + r << "\",cause=\"" << lag_cause_name(static_cast<LagCause>(c))
          << "\"} " << static_cast<double>(j.loss.total_ns[r][c]) * 1e-9 << "\n";
      }
    }
  }
  m << "# HELP ina_aggregator_rank_straggler Named a straggler by the lost-time test over the "
       "window (1) or not (0).\n# TYPE ina_aggregator_rank_straggler gauge\n";
  for (const JobSnapshot& j : s.jobs) {
    for (const RankVerdict& v : j.lost_ranking) {
      m << "ina_aggregator_rank_straggler{ina_job=\"" << j.cfg.job << "\",rank=\""
        << j.cfg.first_rank() + v.rank << "\"} " << (v.named ? 1 : 0) << "\n";
    }
  }
  m << "# HELP ina_aggregator_stalled_slots Rounds waiting longer than the stall threshold.\n"
       "# TYPE ina_aggregator_stalled_slots gauge\n";
  for (const JobSnapshot& j : s.jobs) {
    m << "ina_aggregator_stalled_slots{ina_job=\"" << j.cfg.job << "\"} " << j.stalled.size()
      << "\n";
  }
  m << "# HELP ina_aggregator_stalled_missing Stalled rounds that lack this rank.\n"
       "# TYPE ina_aggregator_stalled_missing gauge\n";
  for (const JobSnapshot& j : s.jobs) {
    std::map<uint32_t, uint32_t> per_rank;
    for (const StalledSlot& st : j.stalled) {
      for (uint32_t r : st.missing) ++per_rank[r];
    }
    for (const auto& [r, n] : per_rank) {
      m << "ina_aggregator_stalled_missing{ina_job=\"" << j.cfg.job << "\",rank=\"" << r << "\"} "
        << n << "\n";
    }
  }
  return m.str();
}

struct ControlAgent::Impl {
  AgentOptions opts;
  AgentTarget target;
  std::unique_ptr<httplib::Server> http;
  int http_port = -1;
  std::thread http_thread;
  std::thread hb_thread;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::atomic<uint64_t> hb_ok{0};

  void heartbeat_loop() {
    std::vector<std::pair<std::string, uint16_t>> replicas = opts.controllers;
    if (replicas.empty()) replicas.emplace_back(opts.controller_host, opts.controller_port);
    size_t current = 0;
    auto client = [&replicas](size_t i) {
      auto c = std::make_unique<httplib::Client>(replicas[i].first, replicas[i].second);
      c->set_connection_timeout(1, 0);
      c->set_read_timeout(2, 0);
      return c;
    };
    std::unique_ptr<httplib::Client> cli = client(current);
    bool reachable = true;
    std::unique_lock<std::mutex> lk(mu);
    while (!stopping) {
      lk.unlock();
      const AggregatorSnapshot s = target.snapshot();
      json body = {{"id", opts.id},
                   {"host", opts.advertise_host},
                   {"port", opts.data_port},
                   {"slot_capacity", opts.slot_capacity},
                   {"max_fan_in", opts.max_fan_in},
                   {"block_elems", opts.block_elems},
                   // A wildcard-bound endpoint is reached at the advertised address.
                   {"http", http_port > 0 ? (opts.http_bind == "0.0.0.0" || opts.http_bind == "::"
                                                 ? opts.advertise_host
                                                 : opts.http_bind) +
                                                ":" + std::to_string(http_port)
                                          : std::string{}}};
      json jobs = json::object();
      for (const JobSnapshot& j : s.jobs) jobs[std::to_string(j.cfg.job)] = telemetry(j);
      body["jobs"] = jobs;
      auto res = cli->Post("/v1/aggregators/heartbeat", body.dump(), "application/json");
      if (res && res->status == 200) {
        Result<std::vector<JobConfig>> want = parse_heartbeat_jobs(res->body);
        if (want.ok()) {
          target.set_jobs(std::move(want).value());
          ++hb_ok;
          if (!reachable) INA_INFO(kComponent, "controller reachable again");
          reachable = true;
        } else {
          INA_WARN(kComponent,
                   "controller's heartbeat answer ignored (keeping the current jobs): %s",
                   want.status().message().c_str());
        }
      } else {
        if (reachable) {
          // Keep serving the jobs we have: a controller restart must not stop running jobs.
          INA_WARN(kComponent, "controller %s:%u unreachable (%s); serving the current jobs%s",
                   replicas[current].first.c_str(), unsigned{replicas[current].second},
                   res ? ("HTTP " + std::to_string(res->status)).c_str()
                       : httplib::to_string(res.error()).c_str(),
                   replicas.size() > 1 ? "; trying the next replica" : "");
          reachable = false;
        }
        if (replicas.size() > 1) {
          current = (current + 1) % replicas.size();
          cli = client(current);
        }
      }
      lk.lock();
      cv.wait_for(lk, opts.heartbeat, [this] { return stopping; });
    }
  }
};

ControlAgent::~ControlAgent() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->hb_thread.joinable()) impl_->hb_thread.join();
  if (impl_->http) impl_->http->stop();
  if (impl_->http_thread.joinable()) impl_->http_thread.join();
}

Result<std::unique_ptr<ControlAgent>> ControlAgent::start(const AgentOptions& opts,
                                                          UdpAggregator* agg) {
  return start(opts,
               AgentTarget{[agg] { return agg->snapshot(); },
                           [agg](std::vector<JobConfig> jobs) { agg->set_jobs(std::move(jobs)); }});
}

Result<std::unique_ptr<ControlAgent>> ControlAgent::start(const AgentOptions& opts,
                                                          AgentTarget target) {
  if (!target.snapshot || !target.set_jobs) {
    return invalid_argument("agent: the target needs both snapshot and set_jobs");
  }
  std::unique_ptr<ControlAgent> a(new ControlAgent());
  a->impl_ = std::make_unique<Impl>();
  Impl& m = *a->impl_;
  m.opts = opts;
  m.target = std::move(target);
  const std::function<AggregatorSnapshot()> snap = m.target.snapshot;
  if (m.opts.id.empty()) m.opts.id = opts.advertise_host + ":" + std::to_string(opts.data_port);
  if (opts.http_port >= 0) {
    m.http = std::make_unique<httplib::Server>();
    m.http->Get("/metrics", [snap](const httplib::Request&, httplib::Response& res) {
      res.set_content(prometheus_text(snap()), "text/plain; version=0.0.4");
    });
    m.http->Get("/v1/telemetry", [snap](const httplib::Request&, httplib::Response& res) {
      json out = json::array();
      for (const JobSnapshot& j : snap().jobs) out.push_back(telemetry(j));
      res.set_content(out.dump(2) + "\n", "application/json");
    });
    INA_ASSIGN_OR_RETURN(m.http_port, http::bind_exclusive(*m.http, opts.http_bind, opts.http_port,
                                                           "agent: --http-port"));
    m.http_thread = std::thread([&m] { m.http->listen_after_bind(); });
    // httplib's stop() does nothing before the accept loop runs, so an agent destroyed right
    // after start() would wait for its HTTP thread forever: wait for the loop (bounded).
    for (int i = 0; i < 2000 && !m.http->is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (!opts.controller_host.empty()) m.hb_thread = std::thread([&m] { m.heartbeat_loop(); });
  return a;
}

int ControlAgent::http_port() const { return impl_->http_port; }
uint64_t ControlAgent::heartbeats_ok() const { return impl_->hb_ok.load(); }

}  // namespace ina::agg
