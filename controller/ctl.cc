// ina-ctl: the command-line client of ina-controller's API.
//
//   ina-ctl [--controller host:port] aggregators | jobs | job ID [--stragglers] | drain ID [--off]
//   |
//           remove-job ID | admit NAME --world N [--rank R] [--slots S] [--shards K] | metrics
//
// Prints the controller's JSON (or text) answer; exits 1 with the error on a failed request.
// `jobs` and `job` show each job's shape (flat, tree, sharded), its placements (aggregator, role,
// slot range, a leaf's ranks and parent), re-placements, idle time and an expired job's reason.
// On a terminal `job` then prints the stragglers by time lost with their causes, and for a tree
// the path from the root to the worst leaf and its worst rank, as text (`--stragglers`: that
// text only, also into a pipe; a pipe otherwise gets the JSON alone).
#include <httplib.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "controller/straggler_report.h"
#include "ina_config.h"

int main(int argc, char** argv) {
  CLI::App app{"ina-ctl: query and operate ina-controller"};
  app.set_version_flag("--version", "ina-ctl " INA_VERSION);
  std::string controller = "127.0.0.1:47480";
  app.add_option("--controller", controller, "controller host:port")->capture_default_str();
  app.require_subcommand(1);
  auto* aggs = app.add_subcommand("aggregators", "list aggregators");
  auto* jobs = app.add_subcommand("jobs", "list jobs");
  auto* job =
      app.add_subcommand("job", "one job's state and telemetry (stragglers, stalled slots)");
  uint32_t job_id = 0;
  job->add_option("id", job_id, "job id")->required();
  bool stragglers_only = false;
  job->add_flag("--stragglers", stragglers_only,
                "the straggler ranking as text only (default: the JSON, and the text after it "
                "when stdout is a terminal)");
  auto* drain = app.add_subcommand("drain", "stop placing jobs on an aggregator");
  std::string agg_id;
  bool off = false;
  drain->add_option("id", agg_id, "aggregator id (host:port)")->required();
  drain->add_flag("--off", off, "undo: place jobs there again");
  auto* remove = app.add_subcommand("remove-job", "forget a job and free its slots");
  remove->add_option("id", job_id, "job id")->required();
  auto* admit = app.add_subcommand("admit", "ask for admission as a worker would");
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
  auto* metrics = app.add_subcommand("metrics", "the controller's Prometheus metrics");
  CLI11_PARSE(app, argc, argv);

  const size_t colon = controller.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      (port = std::atoi(controller.c_str() + colon + 1)) < 1 || port > 65535) {
    std::fprintf(stderr, "ina-ctl: --controller '%s' is not host:port (port 1..65535)\n",
                 controller.c_str());
    return 2;
  }
  httplib::Client cli(controller.substr(0, colon), port);
  cli.set_connection_timeout(3, 0);
  cli.set_read_timeout(10, 0);

  httplib::Result res{nullptr, httplib::Error::Unknown};
  if (aggs->parsed()) {
    res = cli.Get("/v1/aggregators");
  } else if (jobs->parsed()) {
    res = cli.Get("/v1/jobs");
  } else if (job->parsed()) {
    res = cli.Get("/v1/jobs/" + std::to_string(job_id));
  } else if (drain->parsed()) {
    res = cli.Post("/v1/aggregators/drain?id=" + agg_id + "&on=" + (off ? "0" : "1"), "",
                   "text/plain");
  } else if (remove->parsed()) {
    res = cli.Delete("/v1/jobs/" + std::to_string(job_id));
  } else if (admit->parsed()) {
    res = cli.Get("/v1/admit?name=" + name + "&world=" + std::to_string(world) +
                  "&rank=" + std::to_string(rank) + "&slots=" + std::to_string(slots) +
                  (shards > 0 ? "&shards=" + std::to_string(shards) : std::string{}));
  } else if (metrics->parsed()) {
    res = cli.Get("/metrics");
  }
  if (!res) {
    std::fprintf(stderr, "ina-ctl: cannot reach the controller at %s: %s\n", controller.c_str(),
                 httplib::to_string(res.error()).c_str());
    return 1;
  }
  if (!(job->parsed() && stragglers_only && res->status == 200)) {
    std::fputs(res->body.c_str(), res->status == 200 ? stdout : stderr);
  }
  if (job->parsed() && res->status == 200 && (stragglers_only || isatty(STDOUT_FILENO) != 0)) {
    // The straggler ranking with causes as text (issue 21); a pipe gets the JSON alone.
    const auto o = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
    const std::string text = o.is_object() ? ina::ctl::straggler_report(o) : std::string{};
    std::fputs(text.empty() ? "no telemetry for this job yet\n" : text.c_str(), stdout);
  }
  return res->status == 200 ? 0 : 1;
}
