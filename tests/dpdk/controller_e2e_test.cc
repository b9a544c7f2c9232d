// Suite dpdk: the DPDK aggregator under ina-controller, run by controller_e2e.sh inside a network
// namespace it creates. A real ina-controller (the namespace's loopback), a DPDK aggregator
// (ina-aggregator --backend dpdk --controller on the vdev given, two worker lcores) that registers
// and heartbeats, and N kernel-UDP ranks as threads of this process, admitted through the
// controller, that reach the aggregator through the veth the vdev sits on. Checked:
// the aggregator registers with its --ip as address; a job is admitted on it and its int32 and
// float32 SUMs run in-network, bit for bit equal to the protocol model; both lcores' engines got
// the job and its frames (the merged /v1/telemetry counts the rounds); the controller's /v1 API
// shows the job active with the aggregator's telemetry; the aggregator's /metrics serves the job's
// counters; after the ranks release it the job leaves the controller and every lcore's engine.
// Exits 77 with the reason when the aggregator's EAL cannot start.
//   controller_e2e_test WORLD PORT_NAME VDEV AGG_IP
// e.g. controller_e2e_test 4 net_af_packet0 net_af_packet0,iface=ag0,qpairs=2 10.77.0.1
#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "ina/ina.hpp"
#include "tests/check.h"
#include "tests/integration/thread_ranks.h"

extern char** environ;

namespace {

using ina::testing::g_failures;

using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr int kAggPort = 47474;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t j = s.find(' ', i);
    out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

using ina::testing::slurp;

// A child process with stdout and stderr in `log`.
struct Child {
  pid_t pid = -1;
  std::string log;
  bool spawn(std::vector<std::string> args, const std::string& log_path) {
    log = log_path;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) pid = -1;
    return rc == 0;
  }
  // Exit status if it has exited (128 + signal for a signal), else -1.
  int exited() {
    if (pid <= 0) return -2;
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      pid = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    return -1;
  }
  // SIGTERM, then SIGKILL after 5 s; the exit status (-1: killed).
  int stop() {
    if (pid <= 0) return -2;
    kill(pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(50ms);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    pid = -1;
    return -1;
  }
  ~Child() { stop(); }
};

int read_port(const std::string& path) {
  std::ifstream in(path);
  int p = 0;
  return (in >> p) ? p : 0;
}

json get_json(int port, const std::string& path) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(1, 0);
  c.set_read_timeout(2, 0);
  auto r = c.Get(path);
  if (!r || r->status != 200) return json();
  return json::parse(r->body, nullptr, false);
}

std::string get_text(int port, const std::string& path) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(1, 0);
  auto r = c.Get(path);
  return r ? r->body : "";
}

// Polls `pred` every 20 ms for up to `limit`.
template <class F>
bool eventually(F pred, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

}  // namespace

int main(int argc, char** argv) {
  const int world = argc > 4 ? std::atoi(argv[1]) : 0;
  if (world < 2 || world > 8) {
    std::printf("usage: %s WORLD(2..8) PORT_NAME VDEV AGG_IP\n", argv[0]);
    return 1;
  }
  const std::string port_name = argv[2], vdev = argv[3], agg_ip = argv[4];
  const char* kAggIp = agg_ip.c_str();
  const char* agg_bin = std::getenv("INA_AGGREGATOR_BIN");
  const char* ctl_bin = std::getenv("INA_CONTROLLER_BIN");
  if (agg_bin == nullptr || ctl_bin == nullptr) {
    std::printf("FAIL: INA_AGGREGATOR_BIN and INA_CONTROLLER_BIN must be set (meson test)\n");
    return 1;
  }
  const std::string tag = std::to_string(getpid());
  char tmpl[] = "/tmp/ina-dpdk-ctl-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::printf("FAIL: mkdtemp\n");
    return 1;
  }
  const std::string dir = tmpl;
  int rc = 0;
  {
    Child ctl, agg;
    // The controller.
    if (!ctl.spawn({ctl_bin, "--bind", "127.0.0.1", "--port", "0", "--port-file", dir + "/ctl.port",
                    "--heartbeat-timeout-ms", "3000"},
                   dir + "/ctl.log")) {
      std::printf("FAIL: cannot spawn %s\n", ctl_bin);
      return 1;
    }
    int ctl_port = 0;
    eventually([&] { return (ctl_port = read_port(dir + "/ctl.port")) > 0; }, 10000ms);
    if (ctl_port <= 0) {
      std::printf("FAIL: the controller wrote no port:\n%s\n", slurp(dir + "/ctl.log").c_str());
      return 1;
    }

    // The DPDK aggregator: main lcore 0, worker lcores 1 and 2 (slot s on lcore s % 2).
    const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
    const std::string lcores =
        "0@0,1@" + std::to_string(1 % cpus) + ",2@" + std::to_string(cpus > 2 ? 2 : 0);
    std::vector<std::string> args = {agg_bin,
                                     "--backend",
                                     "dpdk",
                                     "--dpdk-port",
                                     port_name,
                                     "--ip",
                                     kAggIp,
                                     "--port",
                                     std::to_string(kAggPort),
                                     "--controller",
                                     "127.0.0.1:" + std::to_string(ctl_port),
                                     "--slot-capacity",
                                     "256",
                                     "--block-elems",
                                     "256",
                                     "--http-port",
                                     "0",
                                     "--http-port-file",
                                     dir + "/agg.http",
                                     "--heartbeat-ms",
                                     "50",
                                     "--stats-interval-ms",
                                     "0",
                                     "--"};
    for (const std::string& a :
         split("--no-huge -m 256 --no-shconf --no-pci --no-telemetry --log-level=3 "
               "--file-prefix ina_cagg_" +
               tag + " --vdev=" + vdev + " --lcores " + lcores)) {
      args.push_back(a);
    }
    if (!agg.spawn(args, dir + "/agg.log")) {
      std::printf("FAIL: cannot spawn %s\n", agg_bin);
      return 1;
    }
    int agg_http = 0;
    int agg_exit = -1;
    const bool up = eventually(
        [&] {
          if (agg.pid <= 0) return true;
          agg_exit = agg.exited();
          if (agg_exit >= 0) return true;
          agg_http = read_port(dir + "/agg.http");
          return agg_http > 0 &&
                 slurp(dir + "/agg.log").find("ina-aggregator (dpdk)") != std::string::npos;
        },
        20000ms);
    if (agg_exit == 77) {
      std::printf("SKIP: the aggregator's EAL cannot start: %s\n", slurp(dir + "/agg.log").c_str());
      return 77;  // the controller is stopped by Child's destructor
    }
    if (!up || agg.pid <= 0) {
      std::printf("FAIL: the DPDK aggregator did not start:\n%s\n",
                  slurp(dir + "/agg.log").c_str());
      return 1;
    }
    // One rx queue per worker lcore where the vdev has that many (af_packet qpairs=2).
    if (vdev.find("qpairs=2") != std::string::npos) {
      CHECK(slurp(dir + "/agg.log").find("lcores 2 rx queues 2") != std::string::npos,
            "the aggregator did not set up 2 rx queues for 2 lcores:\n%s",
            slurp(dir + "/agg.log").c_str());
    }
    // Registered: the controller lists it with the address workers reach it at.
    const std::string address = std::string(kAggIp) + ":" + std::to_string(kAggPort);
    json aggs;
    CHECK(eventually([&] {
            aggs = get_json(ctl_port, "/v1/aggregators");
            return aggs.is_array() && aggs.size() == 1;
          }),
          "the DPDK aggregator did not register: %s", aggs.dump().c_str());
    if (aggs.is_array() && aggs.size() == 1) {
      CHECK(aggs[0]["address"] == address, "registered as %s, want %s",
            aggs[0]["address"].dump().c_str(), address.c_str());
      CHECK(aggs[0]["slot_capacity"] == 256, "slot capacity %s",
            aggs[0]["slot_capacity"].dump().c_str());
    }

    // The ranks: admitted through the controller, kernel UDP to the address it names.
    const std::string job_name = "dpdk-managed-" + tag;
    ina::testing::ThreadRanks ranks = ina::testing::create_thread_ranks(world, [&](int r) {
      ina::Config c;
      c.rank = r;
      c.world_size = world;
      c.controller_host = "127.0.0.1";
      c.controller_port = static_cast<uint16_t>(ctl_port);
      c.job_name = job_name;
      c.block_elems = 256;
      c.window = 32;
      c.timeout = 20s;
      return c;
    });
    for (int r = 0; r < world; ++r) {
      const ina::Status& s = ranks.created[static_cast<size_t>(r)];
      if (s.ok()) continue;
      std::printf("FAIL: rank %d: %s\n", r, s.to_string().c_str());
      rc = 1;
    }

    uint32_t job_id = 0;
    uint64_t rounds = 0;  // slot rounds the cases need at least
    if (rc == 0) {
      const std::vector<ina::testing::Case> cases = {
          {ina::DType::kInt32, ina::ReduceOp::kSum, 10007},
          {ina::DType::kFloat32, ina::ReduceOp::kSum, 30011},
      };
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        const auto& c = cases[ci];
        rounds += (c.count + 255) / 256;
        const ina::testing::ThreadCase tc =
            ina::testing::run_thread_case(ranks.comms, c, static_cast<int>(ci), 256);
        for (int r = 0; r < world; ++r) {
          const auto i = static_cast<size_t>(r);
          CHECK(tc.status[i].ok(), "case %zu rank %d: %s", ci, r, tc.status[i].to_string().c_str());
          CHECK(tc.out[i] == tc.want, "case %zu rank %d: result differs from the protocol model",
                ci, r);
          CHECK(ranks.comms[i]->stats().host_collectives == 0, "case %zu rank %d: ran on the host",
                ci, r);
        }
        std::printf(
            "case %zu: %zu elements, %d ranks admitted by the controller, DPDK "
            "aggregator: %s\n",
            ci, c.count, world, g_failures == 0 ? "exact" : "WRONG");
      }

      // The controller's view: the job, active, on our aggregator, with its telemetry.
      json jobs;
      CHECK(eventually([&] {
              jobs = get_json(ctl_port, "/v1/jobs");
              return jobs.is_array() && jobs.size() == 1;
            }),
            "/v1/jobs: %s", jobs.dump().c_str());
      if (jobs.is_array() && jobs.size() == 1) {
        const json& j = jobs[0];
        job_id = j["id"].get<uint32_t>();
        CHECK(j["name"] == job_name, "job name %s", j["name"].dump().c_str());
        CHECK(j["state"] == "active", "job state %s", j["state"].dump().c_str());
        CHECK(j["world"] == world, "job world %s", j["world"].dump().c_str());
        CHECK(j.value("address", "") == address, "job address %s", j.dump().c_str());
        json one;
        CHECK(eventually([&] {
                one = get_json(ctl_port, "/v1/jobs/" + std::to_string(job_id));
                return one.is_object() && one.contains("telemetry") &&
                       one["telemetry"].value("completed", uint64_t{0}) >= rounds;
              }),
              "/v1/jobs/%u: no telemetry with >= %llu completed rounds: %s", job_id,
              static_cast<unsigned long long>(rounds), one.dump().c_str());
      }
      // The aggregator's own endpoints: both lcores' engines merged.
      json tel;
      CHECK(eventually([&] {
              tel = get_json(agg_http, "/v1/telemetry");
              return tel.is_array() && tel.size() == 1 &&
                     tel[0].value("completed", uint64_t{0}) >= rounds;
            }),
            "aggregator /v1/telemetry: %s", tel.dump().c_str());
      if (tel.is_array() && tel.size() == 1) {
        CHECK(tel[0]["job"] == job_id, "telemetry job %s", tel[0]["job"].dump().c_str());
        CHECK(tel[0]["ready"] == true, "job not ready on every lcore: %s", tel[0].dump().c_str());
        CHECK(tel[0]["stragglers"].size() == static_cast<size_t>(world), "straggler ranking: %s",
              tel[0]["stragglers"].dump().c_str());
        CHECK(tel[0]["bad_tag"] == 0, "bad keys: %s", tel[0].dump().c_str());
      }
      const std::string m = get_text(agg_http, "/metrics");
      const std::string series =
          "ina_aggregator_job_completed_total{ina_job=\"" + std::to_string(job_id) + "\"} ";
      const size_t at = m.find(series);
      CHECK(at != std::string::npos, "/metrics lacks %s:\n%s", series.c_str(), m.c_str());
      if (at != std::string::npos) {
        const uint64_t done = std::strtoull(m.c_str() + at + series.size(), nullptr, 10);
        CHECK(done >= rounds, "/metrics: %llu completed rounds, want >= %llu",
              static_cast<unsigned long long>(done), static_cast<unsigned long long>(rounds));
      }
      CHECK(m.find("ina_aggregator_jobs 1") != std::string::npos, "/metrics: jobs:\n%s", m.c_str());
    }
    ranks.comms.clear();  // release: the controller forgets the job, the aggregator drops it

    if (rc == 0) {
      json jobs, tel;
      CHECK(eventually([&] {
              jobs = get_json(ctl_port, "/v1/jobs");
              return jobs.is_array() && jobs.empty();
            }),
            "the released job is still listed: %s", jobs.dump().c_str());
      CHECK(eventually([&] {
              tel = get_json(agg_http, "/v1/telemetry");
              return tel.is_array() && tel.empty();
            }),
            "the aggregator still serves the released job: %s", tel.dump().c_str());
    }
    const int agg_code = agg.stop();
    CHECK(agg_code == 0, "the aggregator exited with %d after SIGTERM", agg_code);
    const std::string agg_log = slurp(dir + "/agg.log");
    if (rc == 0) {
      const size_t per = agg_log.find("per lcore:");
      if (per != std::string::npos) std::printf("%s", agg_log.substr(per).c_str());
      // The per-lcore counters: both worker lcores aggregated (slot s on lcore s % 2).
      for (const char* l : {"lcore 1:", "lcore 2:"}) {
        const size_t p = agg_log.find(std::string("  ") + l);
        CHECK(p != std::string::npos, "no counters of %s", l);
        if (p != std::string::npos) {
          const size_t c = agg_log.find("completed ", p);
          const uint64_t done =
              c == std::string::npos ? 0 : std::strtoull(agg_log.c_str() + c + 10, nullptr, 10);
          CHECK(done > 0, "%s completed no rounds", l);
        }
      }
    }
    ctl.stop();
    if (g_failures > 0 || rc == 1) {
      std::printf("aggregator log:\n%s\ncontroller log:\n%s\n", agg_log.c_str(),
                  slurp(dir + "/ctl.log").c_str());
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::remove_all("/var/run/dpdk/ina_cagg_" + tag, ec);
  if (rc != 0) return rc;
  std::printf("%s\n", g_failures == 0 ? "PASS" : "FAILED");
  return g_failures == 0 ? 0 : 1;
}
