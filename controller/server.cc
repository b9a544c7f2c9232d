// ControllerServer (see server.h). One mutex guards the state; httplib runs handlers on its
// thread pool; an expiry thread removes silent aggregators (re-placing their jobs) and expires
// idle jobs. Every change that must survive a restart (admission, release, drain, a new
// aggregator, expiry, re-placement) rewrites the state file through a temporary file and rename,
// so a crash never leaves it half written.
//
// Routes:
//   POST   /v1/aggregators/heartbeat   JSON registration + telemetry -> JSON {jobs, draining}; each
//                                      job: job key world slots slot_base block_elems role, and
//                                      for a leaf rank_base local_ranks parent child_index
//   GET    /v1/aggregators             JSON list
//   POST   /v1/aggregators/drain?id=ID&on=0|1
//   GET    /v1/jobs                    JSON list
//   GET    /v1/jobs/ID                 JSON: shape, placements, the aggregators' telemetry
//   DELETE /v1/jobs/ID
//   GET    /v1/admit?name=&world=&rank=&slots=&block=&shards=&dtypes=a,b   text (admission_text)
//   GET    /v1/release?name=&rank=
//   GET    /metrics                    Prometheus text format
#include "controller/server.h"

#include <httplib.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "controller/replica_etcd.h"
#include "controller/requests.h"
#include "controller/state.h"
#include "controller/state_file.h"
#include "ina/base/http_bind.h"
#include "ina/base/log.h"

namespace ina::ctl {
namespace {

using json = nlohmann::json;
constexpr const char* kComponent = "controller";

Millis now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

json placement_json(const Placement& p, const ControllerState& st) {
  json o = {{"aggregator", p.aggregator}, {"role", role_name(p.role)}, {"slot_base", p.slot_base}};
  if (std::string a = st.address_of(p.aggregator); !a.empty()) o["address"] = a;
  if (p.role == Role::kLeaf) {
    o["rank_base"] = p.rank_base;
    o["local_ranks"] = p.local_ranks;
    o["child_index"] = p.child_index;
    o["parent"] = p.parent;
  } else if (p.role == Role::kRoot) {
    o["leaves"] = p.local_ranks;
  }
  return o;
}

json job_json(const JobInfo& j, const ControllerState& st, Millis now) {
  json placements = json::array();
  for (const Placement& p : j.placements) placements.push_back(placement_json(p, st));
  json o = {{"id", j.id},
            {"name", j.name},
            {"world", j.world},
            {"state", job_state_name(j.state)},
            {"reason", j.reason},
            {"shape", j.shape()},
            {"placements", placements},
            {"shards_asked", j.shards_asked},
            {"replacements", j.replacements},
            {"idle_ms", now - j.last_activity},
            {"slots", j.slots},
            {"block_elems", j.block_elems},
            {"dtypes", j.dtypes},
            {"released_ranks", j.released}};
  // The first placement (shard 0, or leaf 0 of a tree) as before placements existed.
  if (!j.placements.empty()) {
    const Placement& p0 = j.placements.front();
    o["aggregator"] = p0.aggregator;
    o["slot_base"] = p0.slot_base;
    if (std::string a = st.address_of(p0.aggregator); !a.empty()) o["address"] = a;
  }
  if (j.is_tree()) {
    o["tree"] = {{"leaves", j.placements.size() - 1}, {"root", j.placements.back().aggregator}};
  }
  // The aggregators' telemetry: "telemetry" is the first placement's report (a flat job's only
  // one; a tree's leaf 0, a sharded job's shard 0), "telemetry_by_aggregator" all of them.
  if (!j.placements.empty()) {
    if (auto t = j.telemetry.find(j.placements.front().aggregator); t != j.telemetry.end()) {
      o["telemetry"] = json::parse(t->second, nullptr, /*allow_exceptions=*/false);
    }
  }
  if (j.placements.size() > 1 && !j.telemetry.empty()) {
    json all = json::object();
    for (const auto& [agg, text] : j.telemetry) {
      all[agg] = json::parse(text, nullptr, /*allow_exceptions=*/false);
    }
    o["telemetry_by_aggregator"] = all;
  }
  return o;
}

json assignment_json(const Assignment& a) {
  json o = {{"job", a.job},
            {"key", key_to_hex(a.key)},
            {"world", a.world},
            {"slots", a.slots},
            {"slot_base", a.placement.slot_base},
            {"block_elems", a.block_elems},
            {"role", role_name(a.placement.role)}};
  if (a.placement.role == Role::kLeaf) {
    o["rank_base"] = a.placement.rank_base;
    o["local_ranks"] = a.placement.local_ranks;
    o["parent"] = a.parent_address;
    o["child_index"] = a.placement.child_index;
    if (a.parent_world > 0) o["parent_world"] = a.parent_world;
    if (!a.leaf_bases.empty()) o["leaf_bases"] = a.leaf_bases;
  }
  return o;
}

}  // namespace

namespace {

// A job key from the kernel's CSPRNG (getrandom(2): blocks only until it is seeded at boot).
Key128 random_key() {
  uint64_t w[2] = {0, 0};
  auto* p = reinterpret_cast<unsigned char*>(w);
  size_t got = 0;
  while (got < sizeof w) {
    const ssize_t n = ::getrandom(p + got, sizeof w - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      // No getrandom (pre-3.17 kernel): std::random_device reads the kernel's source too.
      std::random_device rd;
      for (auto& x : w) x = (uint64_t{rd()} << 32) ^ rd();
      break;
    }
  }
  return Key128{w[0], w[1]};
}

}  // namespace

struct ControllerServer::Impl {
  ServerOptions opts;
  httplib::Server http;
  int port = 0;
  std::mutex mu;
  ControllerState state;
  std::unique_ptr<EtcdReplica> replica;  // --store etcd://...: shared state, one leader
  std::string self;                      // this replica's advertised host:port
  // admission latency (server side: request parsed to answer built), by the answer's kind
  static constexpr const char* kAdmitKinds[4] = {"flat", "tree", "sharded", "refused"};
  double admit_seconds_sum[4] = {};
  uint64_t admit_count[4] = {};
  double admit_seconds_max[4] = {};
  uint64_t heartbeats = 0;
  std::string persist_error;
  // expiry thread
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopping = false;

  explicit Impl(const ServerOptions& o)
      : opts(o),
        state(StateOptions{o.heartbeat_timeout_ms, o.default_shards, o.job_idle_ttl_ms},
              random_key) {}

  // Called with mu held. A failed write is logged at error level (the first at once, then at most
  // one line per kPersistLogEvery with the count of those not logged) and counted in /metrics;
  // the next successful write says so.
  static constexpr Millis kPersistLogEvery = 10000;
  uint64_t persist_failures = 0;
  uint64_t persist_unlogged = 0;
  Millis persist_logged_at = 0;
  bool persist_logged_any = false;
  // Returns false only with --store etcd when the change was not stored (see persist_replica):
  // the caller answers 503 and the client asks again.
  bool persist() {
    if (replica) return persist_replica();
    if (opts.state_file.empty()) return true;
    const Status st = write_file_atomic(opts.state_file, state.to_json());
    if (st.ok()) {
      if (!persist_error.empty()) {
        INA_INFO(kComponent, "--state-file %s written again (%llu failed writes since start)",
                 opts.state_file.c_str(), static_cast<unsigned long long>(persist_failures));
      }
      persist_error.clear();
      return true;
    }
    persist_error = st.message();
    ++persist_failures;
    const Millis now = now_ms();
    if (persist_logged_any && now - persist_logged_at < kPersistLogEvery) {
      ++persist_unlogged;
      return true;
    }
    const std::string unlogged = persist_unlogged == 0
                                     ? std::string{}
                                     : " (" + std::to_string(persist_unlogged) +
                                           " more failed writes since the last message)";
    INA_ERROR(kComponent,
              "--state-file %s: %s; a restart would lose the changes since the last good "
              "write%s",
              opts.state_file.c_str(), persist_error.c_str(), unlogged.c_str());
    persist_unlogged = 0;
    persist_logged_at = now;
    persist_logged_any = true;
    return true;
  }

  // etcd: the leader's fenced write. A failed one leaves the state in memory ahead of etcd, so it
  // is replaced by etcd's (or, when etcd cannot be read either, this replica stops leading and
  // loads it again when it leads next): nothing unstored is ever answered from.
  bool persist_replica() {
    const Status st = replica->save(state.to_json());
    if (st.ok()) {
      persist_error.clear();
      return true;
    }
    persist_error = st.message();
    ++persist_failures;
    Result<std::string> text = replica->reload();
    if (text.ok()) {
      const Status loaded = load_replica_state(*text);
      if (!loaded.ok()) replica->step_down("the stored state does not load");
    } else {
      replica->step_down("the state in etcd cannot be read back after a failed write");
    }
    // At most one line per kPersistLogEvery (an etcd outage fails every write), with the count.
    const Millis now = now_ms();
    if (persist_logged_any && now - persist_logged_at < kPersistLogEvery) {
      ++persist_unlogged;
      return false;
    }
    INA_WARN(kComponent, "state not stored in %s: %s (%llu failed writes since start)",
             replica->describe().c_str(), st.message().c_str(),
             static_cast<unsigned long long>(persist_failures));
    persist_unlogged = 0;
    persist_logged_at = now;
    persist_logged_any = true;
    return false;
  }

  // Called with mu held: the state as etcd holds it ("" : nothing stored yet).
  Status load_replica_state(const std::string& text) {
    if (!text.empty()) return state.from_json(text, now_ms());
    const ControllerState empty(
        StateOptions{opts.heartbeat_timeout_ms, opts.default_shards, opts.job_idle_ttl_ms},
        random_key);
    return state.from_json(empty.to_json(), now_ms());
  }

  // A write reaching a replica that does not lead goes to the leader (one hop: a forwarded
  // request is never forwarded again). True when the request was answered here.
  bool forward_unless_leading(const httplib::Request& req, httplib::Response& res) {
    if (!replica || replica->leading()) return false;
    const std::string leader = replica->leader();
    res.set_header("X-Ina-Leader", leader);
    auto unavailable_reply = [&res](const std::string& why) {
      res.status = 503;
      res.set_content("error " + why + "\n", "text/plain");
    };
    if (leader.empty() || leader == self || req.has_header("X-Ina-Forwarded")) {
      unavailable_reply("no controller replica leads at the moment (election in " +
                        replica->describe() + "); ask again");
      return true;
    }
    const size_t colon = leader.rfind(':');
    httplib::Client cli(leader.substr(0, colon), std::atoi(leader.c_str() + colon + 1));
    cli.set_connection_timeout(1, 0);
    cli.set_read_timeout(5, 0);
    httplib::Headers h = {{"X-Ina-Forwarded", self}};
    const std::string type = req.get_header_value("Content-Type");
    httplib::Result r = req.method == "POST"     ? cli.Post(req.target.c_str(), h, req.body,
                                                        type.empty() ? "text/plain" : type.c_str())
                            : req.method == "DELETE" ? cli.Delete(req.target.c_str(), h)
                                                 : cli.Get(req.target.c_str(), h);
    if (!r) {
      unavailable_reply("the leader " + leader + " cannot be reached (" +
                        httplib::to_string(r.error()) + "); ask again");
      return true;
    }
    res.status = r->status;
    res.set_content(r->body, r->get_header_value("Content-Type").c_str());
    return true;
  }

  // Called with mu held after a change of the state: its audit trail (one line per decision:
  // state.h) into the log at info.
  void log_audit() {
    for (const std::string& line : state.take_audit()) INA_INFO(kComponent, "%s", line.c_str());
  }

  void routes();
  std::string metrics();
};

void ControllerServer::Impl::routes() {
  auto bad = [](httplib::Response& res, int code, const std::string& msg) {
    res.status = code;
    res.set_content(json{{"error", msg}}.dump() + "\n", "application/json");
  };
  auto status_reply = [bad](httplib::Response& res, const Status& s) {
    if (s.ok()) {
      res.set_content("{\"ok\":true}\n", "application/json");
      return;
    }
    bad(res, s.code() == StatusCode::kNotFound ? 404 : 400, s.message());
  };

  http.Post("/v1/aggregators/heartbeat",
            [this, bad](const httplib::Request& req, httplib::Response& res) {
              if (forward_unless_leading(req, res)) return;
              Result<HeartbeatRequest> r = parse_heartbeat_request(req.body);
              if (!r.ok()) return bad(res, 400, r.status().message());
              const AggregatorInfo& a = r.value().info;
              std::lock_guard<std::mutex> g(mu);
              const bool known = state.aggregators().count(a.id) != 0;
              const Status s = state.heartbeat(a, now_ms());
              if (!s.ok()) return bad(res, 400, s.message());
              ++heartbeats;
              if (!known && !persist()) return bad(res, 503, "registration not stored; again");
              log_audit();
              const Millis now = now_ms();
              for (const HeartbeatRequest::JobReport& x : r.value().jobs) {
                state.set_job_telemetry(x.job, a.id, x.telemetry);
                // The per-job packet counter is the job's activity (job expiry).
                if (x.has_packets) state.note_job_packets(x.job, a.id, x.packets, now);
              }
              json out;
              out["draining"] = state.aggregators().at(a.id).draining;
              out["jobs"] = json::array();
              for (const Assignment& x : state.jobs_on(a.id))
                out["jobs"].push_back(assignment_json(x));
              res.set_content(out.dump() + "\n", "application/json");
            });

  http.Get("/v1/aggregators", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> g(mu);
    const Millis now = now_ms();
    json out = json::array();
    for (const auto& [id, a] : state.aggregators()) {
      json jobs = json::array();
      json placements = json::array();
      for (const Assignment& x : state.jobs_on(id)) {
        jobs.push_back(x.job);
        placements.push_back({{"job", x.job},
                              {"role", role_name(x.placement.role)},
                              {"slot_base", x.placement.slot_base},
                              {"slots", x.slots}});
      }
      out.push_back({{"id", id},
                     {"address", a.host + ":" + std::to_string(a.port)},
                     {"http", a.http},
                     {"slot_capacity", a.slot_capacity},
                     {"free_slots", state.free_slots(id)},
                     {"max_fan_in", a.max_fan_in},
                     {"block_elems", a.block_elems},
                     {"draining", a.draining},
                     {"heartbeat_age_ms", now - a.last_heartbeat},
                     {"jobs", jobs},
                     {"placements", placements}});
    }
    res.set_content(out.dump(2) + "\n", "application/json");
  });

  http.Post("/v1/aggregators/drain", [this, status_reply, bad](const httplib::Request& req,
                                                               httplib::Response& res) {
    if (forward_unless_leading(req, res)) return;
    std::lock_guard<std::mutex> g(mu);
    const Status s = state.drain(req.get_param_value("id"), req.get_param_value("on") != "0");
    if (s.ok() && !persist()) return bad(res, 503, "drain not stored; ask again");
    log_audit();
    status_reply(res, s);
  });

  http.Get("/v1/jobs", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> g(mu);
    json out = json::array();
    const Millis now = now_ms();
    for (const auto& [id, j] : state.jobs()) out.push_back(job_json(j, state, now));
    res.set_content(out.dump(2) + "\n", "application/json");
  });

  http.Get(R"(/v1/jobs/(\d+))", [this, bad](const httplib::Request& req, httplib::Response& res) {
    uint32_t id = 0;
    if (!parse_u32(req.matches[1], &id)) return bad(res, 400, "job id is not a 32-bit number");
    std::lock_guard<std::mutex> g(mu);
    const JobInfo* j = state.job(id);
    if (j == nullptr) return bad(res, 404, "no job " + std::to_string(id));
    res.set_content(job_json(*j, state, now_ms()).dump(2) + "\n", "application/json");
  });

  http.Delete(R"(/v1/jobs/(\d+))",
              [this, bad, status_reply](const httplib::Request& req, httplib::Response& res) {
                if (forward_unless_leading(req, res)) return;
                uint32_t id = 0;
                if (!parse_u32(req.matches[1], &id))
                  return bad(res, 400, "job id is not a 32-bit number");
                std::lock_guard<std::mutex> g(mu);
                const Status s = state.remove_job(id);
                if (s.ok() && !persist()) return bad(res, 503, "removal not stored; ask again");
                log_audit();
                status_reply(res, s);
              });

  http.Get("/v1/admit", [this](const httplib::Request& req, httplib::Response& res) {
    if (forward_unless_leading(req, res)) return;
    const auto t0 = std::chrono::steady_clock::now();
    Result<AdmitRequest> parsed = parse_admit_request(req.params);
    if (!parsed.ok()) {
      res.status = 400;
      res.set_content("error " + parsed.status().message() + "\n", "text/plain");
      return;
    }
    const AdmitRequest& a = parsed.value();
    std::lock_guard<std::mutex> g(mu);
    const JobInfo* before = state.job_by_name(a.name);
    const JobId known = before == nullptr ? 0 : before->id;
    Result<JobInfo> r = state.admit(a, now_ms());
    if (!r.ok()) {
      res.status = 400;
      res.set_content("error " + r.status().message() + "\n", "text/plain");
      return;
    }
    // A new job; the other ranks change nothing. Not stored (etcd): not answered either.
    if (r.value().id != known && !persist()) {
      res.status = 503;
      res.set_content("error admission not stored; ask again\n", "text/plain");
      return;
    }
    log_audit();
    INA_DEBUG(kComponent, "admission request of rank %u of '%s' (world %u): job %u %s", a.rank,
              a.name.c_str(), a.world, r.value().id, job_state_name(r.value().state));
    res.set_content(admission_text(r.value(), a.rank, state), "text/plain");
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int kind = r.value().state != JobState::kActive ? 3
                     : r.value().is_tree()                ? 1
                     : r.value().shards_asked > 1         ? 2
                                                          : 0;
    admit_seconds_sum[kind] += dt;
    admit_seconds_max[kind] = std::max(admit_seconds_max[kind], dt);
    ++admit_count[kind];
  });

  http.Get(
      "/v1/release", [this, status_reply](const httplib::Request& req, httplib::Response& res) {
        if (forward_unless_leading(req, res)) return;
        uint32_t rank = 0;
        if (!parse_u32(req.get_param_value("rank"), &rank)) {
          res.status = 400;
          res.set_content("{\"error\":\"rank must be an unsigned decimal number\"}\n",
                          "application/json");
          return;
        }
        std::lock_guard<std::mutex> g(mu);
        const Status s = state.release(req.get_param_value("name"), rank);
        if (s.ok() && !persist()) {
          res.status = 503;
          res.set_content("{\"error\":\"release not stored; ask again\"}\n", "application/json");
          return;
        }
        log_audit();
        status_reply(res, s);
      });

  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4");
  });
}

namespace {

// One metric family's HELP and TYPE lines (Prometheus text format 0.0.4).
void family(std::ostream& m, const char* name, const char* type, const char* help) {
  m << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

// A family of one unlabelled sample.
template <class V>
void single(std::ostream& m, const char* name, const char* type, const char* help, V value) {
  family(m, name, type, help);
  m << name << " " << value << "\n";
}

}  // namespace

std::string ControllerServer::Impl::metrics() {
  std::lock_guard<std::mutex> g(mu);
  std::ostringstream m;
  family(m, "ina_controller_aggregators", "gauge", "Registered aggregators.");
  size_t draining = 0;
  for (const auto& [id, a] : state.aggregators()) draining += a.draining ? 1 : 0;
  m << "ina_controller_aggregators{state=\"serving\"} " << state.aggregators().size() - draining
    << "\nina_controller_aggregators{state=\"draining\"} " << draining << "\n";
  family(m, "ina_controller_jobs", "gauge", "Jobs known to the controller.");
  size_t by_state[kJobStates] = {};
  size_t by_shape[3] = {};  // flat, tree, sharded (active jobs)
  for (const auto& [id, j] : state.jobs()) {
    ++by_state[static_cast<int>(j.state)];
    if (j.state == JobState::kActive) ++by_shape[j.is_tree() ? 1 : j.is_sharded() ? 2 : 0];
  }
  for (int s = 0; s < kJobStates; ++s) {
    m << "ina_controller_jobs{state=\"" << job_state_name(static_cast<JobState>(s)) << "\"} "
      << by_state[s] << "\n";
  }
  family(m, "ina_controller_active_jobs", "gauge", "Active jobs by placement shape.");
  const char* shapes[3] = {"flat", "tree", "sharded"};
  for (int s = 0; s < 3; ++s) {
    m << "ina_controller_active_jobs{shape=\"" << shapes[s] << "\"} " << by_shape[s] << "\n";
  }
  // Decisions (one per job run: its first request, or a refusal decided again) apart from the
  // requests (every rank's, ina_controller_admission_seconds_count): distinct names and help.
  family(m, "ina_controller_admission_decisions_total", "counter",
         "Admission decisions, one per job run (not per rank): a new job admitted or refused.");
  m << "ina_controller_admission_decisions_total{result=\"admitted\"} " << state.admitted_total
    << "\n"
    << "ina_controller_admission_decisions_total{result=\"refused\"} " << state.refused_total
    << "\n";
  single(m, "ina_controller_trees_total", "counter",
         "Jobs admitted as a two-level aggregation tree.", state.admitted_tree_total);
  single(m, "ina_controller_sharded_total", "counter", "Jobs admitted with shards asked (K > 1).",
         state.admitted_sharded_total);
  single(m, "ina_controller_short_shards_total", "counter",
         "Sharded jobs admitted with fewer shards than asked.", state.short_shards_total);
  single(m, "ina_controller_jobs_lost_total", "counter",
         "Jobs whose aggregator stopped heartbeating and that could not be re-placed.",
         state.lost_total);
  single(m, "ina_controller_replacements_total", "counter",
         "Placements moved off a silent aggregator.", state.replaced_total);
  single(m, "ina_controller_jobs_expired_total", "counter",
         "Jobs expired after the idle TTL without packets.", state.expired_total);
  single(m, "ina_controller_job_idle_ttl_seconds", "gauge", "The idle TTL (0: jobs never expire).",
         static_cast<double>(opts.job_idle_ttl_ms) / 1e3);
  // Admission latency: one series per answer kind and no unlabelled total next to them, so that
  // sum() over the family is the true total.
  family(m, "ina_controller_admission_seconds", "summary",
         "Admission requests, one per rank, and their server-side latency (request parsed to "
         "answer built) by answer kind.");
  for (int k = 0; k < 4; ++k) {
    m << "ina_controller_admission_seconds_sum{kind=\"" << kAdmitKinds[k] << "\"} "
      << admit_seconds_sum[k] << "\n"
      << "ina_controller_admission_seconds_count{kind=\"" << kAdmitKinds[k] << "\"} "
      << admit_count[k] << "\n";
  }
  family(m, "ina_controller_admission_max_seconds", "gauge",
         "Slowest server-side admission since start by answer kind.");
  for (int k = 0; k < 4; ++k) {
    m << "ina_controller_admission_max_seconds{kind=\"" << kAdmitKinds[k] << "\"} "
      << admit_seconds_max[k] << "\n";
  }
  single(m, "ina_controller_heartbeats_total", "counter", "Aggregator heartbeats received.",
         heartbeats);
  family(m, "ina_controller_free_slots", "gauge", "Free slots per aggregator.");
  for (const auto& [id, a] : state.aggregators()) {
    m << "ina_controller_free_slots{aggregator=\"" << id << "\"} " << state.free_slots(id) << "\n";
  }
  if (replica) {
    single(m, "ina_controller_leader", "gauge",
           "1 when this replica leads (--store etcd), 0 when it follows.",
           replica->leading() ? 1 : 0);
  }
  single(m, "ina_controller_persist_ok", "gauge",
         "1 when the last write of the state file succeeded (or none is configured).",
         persist_error.empty() ? 1 : 0);
  single(m, "ina_controller_persist_failures_total", "counter",
         "Failed writes of the state file (each also logged at error level, rate-limited).",
         persist_failures);
  return m.str();
}

ControllerServer::~ControllerServer() = default;

Status ControllerServer::check(const ServerOptions& opts) {
  if (opts.heartbeat_timeout_ms < 1) return invalid_argument("heartbeat timeout must be >= 1 ms");
  if (opts.default_shards < 1 || opts.default_shards > 256) {
    return invalid_argument("default shards must be in 1..256");
  }
  if (opts.job_idle_ttl_ms < 0) return invalid_argument("job idle TTL must be >= 0 ms (0: never)");
  if (!opts.store.empty() && !opts.state_file.empty()) {
    return invalid_argument("--store etcd://... and --state-file exclude each other");
  }
  if (opts.state_file.empty()) return ok_status();
  Result<std::string> text = read_state_file(opts.state_file);
  if (text.ok()) {
    ControllerState probe(StateOptions{}, random_key);
    const Status st = probe.from_json(*text, 0);
    if (!st.ok()) return Status(st.code(), "--state-file " + opts.state_file + ": " + st.message());
  } else if (text.status().code() != StatusCode::kNotFound) {
    return Status(text.status().code(), "--state-file: " + text.status().message());
  }
  const Status st = check_writable(opts.state_file);
  if (!st.ok()) return Status(st.code(), "--state-file " + opts.state_file + ": " + st.message());
  return ok_status();
}

Result<std::unique_ptr<ControllerServer>> ControllerServer::create(const ServerOptions& opts) {
  INA_RETURN_IF_ERROR(check(opts));
  std::unique_ptr<ControllerServer> s(new ControllerServer());
  s->impl_ = std::make_unique<Impl>(opts);
  Impl& m = *s->impl_;
  if (!opts.store.empty()) {
    INA_ASSIGN_OR_RETURN(m.replica, EtcdReplica::create(opts.store));
  }
  if (!opts.state_file.empty()) {
    // A file that exists but cannot be read is an error (starting empty would overwrite it).
    Result<std::string> text = read_state_file(opts.state_file);
    if (text.ok()) {
      const Status st = m.state.from_json(*text, now_ms());
      if (!st.ok()) {
        return Status(st.code(), "--state-file " + opts.state_file + ": " + st.message());
      }
    } else if (text.status().code() != StatusCode::kNotFound) {
      return Status(text.status().code(), "--state-file: " + text.status().message());
    }
    // Refuse to start when the file cannot be written: the controller would serve, and a
    // restart would lose every job admitted since.
    const Status st = write_file_atomic(opts.state_file, m.state.to_json());
    if (!st.ok()) return Status(st.code(), "--state-file " + opts.state_file + ": " + st.message());
  }
  m.routes();
  m.http.set_read_timeout(5, 0);
  INA_ASSIGN_OR_RETURN(m.port, http::bind_exclusive(m.http, opts.bind, opts.port, "--port"));
  m.self = opts.advertise.empty() ? opts.bind + ":" + std::to_string(m.port) : opts.advertise;
  return s;
}

uint16_t ControllerServer::port() const { return static_cast<uint16_t>(impl_->port); }

Status ControllerServer::run() {
  Impl& m = *impl_;
  if (m.replica) {
    m.replica->start(m.self, [&m](const std::string& text, bool) {
      std::lock_guard<std::mutex> g(m.mu);
      return m.load_replica_state(text);
    });
  }
  std::thread expiry([&m] {
    const auto period =
        std::chrono::milliseconds(std::max<int64_t>(m.opts.heartbeat_timeout_ms / 4, 10));
    std::unique_lock<std::mutex> lk(m.stop_mu);
    while (!m.stop_cv.wait_for(lk, period, [&m] { return m.stopping; })) {
      if (m.replica && !m.replica->leading()) continue;  // the leader expires
      std::lock_guard<std::mutex> g(m.mu);
      const Millis now = now_ms();
      const bool aggs_gone = !m.state.expire(now).empty();
      if (!m.state.expire_jobs(now).empty() || aggs_gone) m.persist();
      m.log_audit();
    }
  });
  const bool ok = m.http.listen_after_bind();
  {
    std::lock_guard<std::mutex> g(m.stop_mu);
    m.stopping = true;
  }
  m.stop_cv.notify_all();
  expiry.join();
  if (m.replica) m.replica->stop();
  return ok ? ok_status() : unavailable("http server failed");
}

void ControllerServer::stop() { impl_->http.stop(); }

}  // namespace ina::ctl
