// ina-ctl: the command-line client of ina-controller's API, for people and for scripts.
//
//   ina-ctl [--controller host:port] [--json | --table] SUBCOMMAND
//     aggregators | jobs | job ID [--stragglers] | drain ID [--off] | remove-job ID |
//     admit NAME --world N [--rank R] [--slots S] [--shards K] | release NAME [--rank R]... |
//     metrics
//
// Output: on a terminal, tables and sentences (`jobs`, `aggregators`, `job`, `admit`, ...);
// with --json (or into a pipe, as scripts have always read it) the controller's JSON (`admit`:
// its "key value" answer in a pipe, a JSON object with --json). --table forces the text into a
// pipe. `metrics` is the Prometheus text either way. `job` on a terminal ends with the
// stragglers by time lost with their causes (`--stragglers`: that text only).
//
// Exit status: 0 done; 1 the controller answered with an error, or cannot be reached (the cause
// named: name resolution, connection refused, timeout); 2 a usage error (an unknown subcommand
// names itself and lists the valid ones); 3 `admit` was refused.
//
// The controller: --controller, else INA_CONTROLLER (as the workers use), else 127.0.0.1:47480.
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "controller/ctl_format.h"
#include "controller/straggler_report.h"
#include "ina_config.h"

namespace {

using json = nlohmann::json;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitRefused = 3;

// Why `host:port` cannot be reached, in the system's words: the resolver's error, or connect()'s
// errno ("Connection refused", "No route to host"), or a timeout after `timeout_s`.
std::string reach_cause(const std::string& host, int port, int timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) return "cannot resolve '" + host + "': " + ::gai_strerror(rc);
  std::string cause = "no address for '" + host + "'";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      cause = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const int n = ::poll(&p, 1, timeout_s * 1000);
        socklen_t len = sizeof err;
        if (n == 0) {
          err = ETIMEDOUT;
        } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
          err = errno;
        }
      }
    }
    ::close(fd);
    if (err == 0) {
      cause = "it accepts connections but did not answer the request (is it ina-controller?)";
      break;
    }
    cause = std::string("connect: ") + std::strerror(err);
  }
  ::freeaddrinfo(res);
  return cause;
}

// The first argument that is neither an option nor an option's value: the subcommand as typed.
std::string typed_subcommand(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--controller") {
      ++i;
      continue;
    }
    if (!a.empty() && a[0] == '-') continue;
    return a;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ina-ctl: query and operate ina-controller (tables on a terminal, JSON with --json; exit "
      "1 on an error, 2 on a usage error, 3 when admit is refused)"};
  app.set_version_flag("--version", "ina-ctl " INA_VERSION);
  const char* env_controller = std::getenv("INA_CONTROLLER");
  std::string controller =
      env_controller != nullptr && *env_controller != '\0' ? env_controller : "127.0.0.1:47480";
  app.add_option("--controller", controller,
                 "controller host:port (default: INA_CONTROLLER, else 127.0.0.1:47480)")
      ->capture_default_str();
  bool as_json = false;
  bool as_table = false;
  auto* json_flag =
      app.add_flag("--json", as_json, "print the controller's JSON (the default into a pipe)");
  app.add_flag("--table", as_table, "print tables and sentences (the default on a terminal)")
      ->excludes(json_flag);
  app.require_subcommand(1);
  app.fallthrough();  // --json, --table and --controller also after the subcommand
  auto* aggs = app.add_subcommand("aggregators", "list aggregators");
  auto* jobs = app.add_subcommand("jobs", "list jobs");
  auto* job =
      app.add_subcommand("job", "one job's state and telemetry (stragglers, stalled slots)");
  uint32_t job_id = 0;
  job->add_option("id", job_id, "job id")->required();
  bool stragglers_only = false;
  job->add_flag("--stragglers", stragglers_only,
                "the straggler ranking as text only (default: the job, and the ranking after it "
                "when stdout is a terminal)");
  auto* drain = app.add_subcommand("drain", "stop placing jobs on an aggregator");
  std::string agg_id;
  bool off = false;
  drain->add_option("id", agg_id, "aggregator id (host:port)")->required();
  drain->add_flag("--off", off, "undo: place jobs there again");
  auto* remove = app.add_subcommand("remove-job", "forget a job and free its slots");
  remove->add_option("id", job_id, "job id")->required();
  auto* admit =
      app.add_subcommand("admit", "ask for admission as a worker would (exit 3: refused)");
  std::string name;
  uint32_t world = 0;
  uint32_t slots = 128;
  uint32_t rank = 0;
  uint32_t shards = 0;
  admit->add_option("name", name, "job name")->required();
  admit->add_option("--world", world, "world size")->required()->check(CLI::Range(1, 65535));
  admit->add_option("--rank", rank, "the asking rank (a tree rank gets its leaf)")
      ->capture_default_str();
  admit->add_option("--slots", slots, "slots (window)")->capture_default_str();
  admit
      ->add_option("--shards", shards,
                   "shard the job over K aggregators (default: the controller's)")
      ->check(CLI::Range(1, 256));
  auto* release = app.add_subcommand(
      "release",
      "release a job's ranks as the workers do when they finish (every rank: forgotten)");
  std::vector<uint32_t> release_ranks;
  release->add_option("name", name, "job name")->required();
  release->add_option("--rank", release_ranks,
                      "the rank(s) to release (repeatable; default: every rank of the job)");
  auto* metrics = app.add_subcommand("metrics", "the controller's Prometheus metrics");

  // An unknown subcommand names itself and the valid ones (CLI11 would only say that a
  // subcommand is required).
  if (const std::string typed = typed_subcommand(argc, argv); !typed.empty()) {
    std::set<std::string> known;
    std::string list;
    for (const CLI::App* s : app.get_subcommands({})) {
      known.insert(s->get_name());
      list += (list.empty() ? "" : ", ") + s->get_name();
    }
    if (known.count(typed) == 0) {
      std::fprintf(stderr, "ina-ctl: unknown subcommand '%s'; valid: %s (ina-ctl --help)\n",
                   typed.c_str(), list.c_str());
      return kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }

  const size_t colon = controller.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      (port = std::atoi(controller.c_str() + colon + 1)) < 1 || port > 65535) {
    std::fprintf(stderr, "ina-ctl: --controller '%s' is not host:port (port 1..65535)\n",
                 controller.c_str());
    return kExitUsage;
  }
  const std::string host = controller.substr(0, colon);
  constexpr int kConnectTimeoutS = 3;
  httplib::Client cli(host, port);
  cli.set_connection_timeout(kConnectTimeoutS, 0);
  cli.set_read_timeout(10, 0);
  // Text for people on a terminal (or with --table); JSON with --json or into a pipe.
  const bool text = as_table || (!as_json && isatty(STDOUT_FILENO) != 0);

  // One request; on failure the error printed for a person and false.
  auto request = [&](const std::function<httplib::Result()>& call, httplib::Result* out) {
    *out = call();
    if (!*out) {
      std::fprintf(stderr, "ina-ctl: cannot reach the controller at %s: %s (%s)\n",
                   controller.c_str(), reach_cause(host, port, kConnectTimeoutS).c_str(),
                   httplib::to_string(out->error()).c_str());
      return false;
    }
    if ((*out)->status != 200) {
      std::fprintf(stderr, "ina-ctl: %s\n",
                   ina::ctl::error_text((*out)->status, (*out)->body).c_str());
      return false;
    }
    return true;
  };

  httplib::Result res{nullptr, httplib::Error::Unknown};
  if (aggs->parsed() || jobs->parsed()) {
    if (!request([&] { return cli.Get(aggs->parsed() ? "/v1/aggregators" : "/v1/jobs"); }, &res))
      return kExitError;
    const json o = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
    if (!text || o.is_discarded()) {
      std::fputs(res->body.c_str(), stdout);
    } else {
      std::fputs(
          (aggs->parsed() ? ina::ctl::aggregators_table(o) : ina::ctl::jobs_table(o)).c_str(),
          stdout);
    }
    return 0;
  }
  if (job->parsed()) {
    if (!request([&] { return cli.Get("/v1/jobs/" + std::to_string(job_id)); }, &res))
      return kExitError;
    const json o = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
    if (!stragglers_only) {
      std::fputs(text && o.is_object() ? ina::ctl::job_details(o).c_str() : res->body.c_str(),
                 stdout);
    }
    if (stragglers_only || isatty(STDOUT_FILENO) != 0 || as_table) {
      // The straggler ranking with causes as text; a pipe gets the JSON alone.
      const std::string report = o.is_object() ? ina::ctl::straggler_report(o) : std::string{};
      if (!stragglers_only) std::fputs("\n", stdout);
      std::fputs(report.empty() ? "no telemetry for this job yet\n" : report.c_str(), stdout);
    }
    return 0;
  }
  if (drain->parsed() || remove->parsed()) {
    const bool ok = request(
        [&] {
          return drain->parsed()
                     ? cli.Post("/v1/aggregators/drain?id=" + agg_id + "&on=" + (off ? "0" : "1"),
                                "", "text/plain")
                     : cli.Delete("/v1/jobs/" + std::to_string(job_id));
        },
        &res);
    if (!ok) return kExitError;
    if (!text) {
      std::fputs(res->body.c_str(), stdout);
    } else if (drain->parsed()) {
      std::printf("aggregator %s: %s\n", agg_id.c_str(),
                  off ? "serving (jobs are placed there again)"
                      : "draining (no new jobs placed there; its jobs keep running)");
    } else {
      std::printf("job %u removed (its slots are free)\n", job_id);
    }
    return 0;
  }
  if (admit->parsed()) {
    if (!request(
            [&] {
              return cli.Get("/v1/admit?name=" + name + "&world=" + std::to_string(world) +
                             "&rank=" + std::to_string(rank) + "&slots=" + std::to_string(slots) +
                             (shards > 0 ? "&shards=" + std::to_string(shards) : std::string{}));
            },
            &res))
      return kExitError;
    const json a = ina::ctl::admission_json(res->body);
    if (as_json && a.is_object()) {
      std::printf("%s\n", a.dump(2).c_str());
    } else if (text && a.is_object()) {
      std::fputs(ina::ctl::admission_summary(a).c_str(), stdout);
    } else {
      std::fputs(res->body.c_str(), stdout);
    }
    return a.is_object() && a.value("result", "") == "refused" ? kExitRefused : 0;
  }
  if (release->parsed()) {
    if (release_ranks.empty()) {
      // Every rank of the job: its world from the job list.
      if (!request([&] { return cli.Get("/v1/jobs"); }, &res)) return kExitError;
      const json all = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
      uint32_t w = 0;
      for (const json& j : all.is_array() ? all : json::array()) {
        if (j.is_object() && j.value("name", "") == name) w = j.value("world", 0u);
      }
      if (w == 0) {
        std::fprintf(stderr, "ina-ctl: release: no job named '%s'\n", name.c_str());
        return kExitError;
      }
      for (uint32_t r = 0; r < w; ++r) release_ranks.push_back(r);
    }
    for (uint32_t r : release_ranks) {
      if (!request(
              [&] { return cli.Get("/v1/release?name=" + name + "&rank=" + std::to_string(r)); },
              &res)) {
        return kExitError;
      }
    }
    if (text) {
      std::printf("job '%s': released %zu rank(s)\n", name.c_str(), release_ranks.size());
    } else {
      std::printf("{\"ok\":true,\"released\":%zu}\n", release_ranks.size());
    }
    return 0;
  }
  if (metrics->parsed()) {
    if (!request([&] { return cli.Get("/metrics"); }, &res)) return kExitError;
    std::fputs(res->body.c_str(), stdout);
    return 0;
  }
  return kExitUsage;
}
