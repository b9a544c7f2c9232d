// ina-controller: the aggregation manager (see server.h for the API).
//
//   ina-controller [--bind 127.0.0.1] [--port 47480] [--port-file F] [--state-file F]
//                  [--heartbeat-timeout-ms 3000] [--default-shards 1] [--job-idle-ttl-ms 600000]
//                  [--store etcd://h1:2379,h2:2379 --advertise HOST:PORT]   (replicas, one leads)
//
// Serves until SIGINT/SIGTERM.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "controller/server.h"
#include "ina_config.h"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ina-controller: aggregator registry, job admission, API and metrics"};
  app.set_version_flag("--version", "ina-controller " INA_VERSION);
  ina::ctl::ServerOptions opts;
  std::string port_file;
  app.add_option("--bind", opts.bind, "address to listen on")->capture_default_str();
  app.add_option("--port", opts.port, "HTTP port (0: any free port; see --port-file)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--port-file", port_file, "write the bound port to this file once listening");
  app.add_option("--state-file", opts.state_file,
                 "persist jobs and aggregators here (loaded at start when it exists)");
  app.add_option("--heartbeat-timeout-ms", opts.heartbeat_timeout_ms,
                 "remove an aggregator silent this long")
      ->check(CLI::Range(int64_t{10}, int64_t{3600000}))
      ->capture_default_str();
  app.add_option("--default-shards", opts.default_shards,
                 "shards for an admission that asks for none (spread over that many aggregators "
                 "when they have room)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--job-idle-ttl-ms", opts.job_idle_ttl_ms,
                 "expire an admitted job none of whose aggregators saw packets this long (a "
                 "crashed trainer never releases it), freeing its slots; 0: never")
      ->check(CLI::Range(int64_t{0}, int64_t{30} * 24 * 3600 * 1000))
      ->capture_default_str();
  app.add_option("--store", opts.store,
                 "etcd://host:port[,host:port...]: keep the state in etcd and run as one of "
                 "several replicas, one of which leads (instead of --state-file)");
  app.add_option("--advertise", opts.advertise,
                 "host:port other replicas and clients reach this one at (--store; default "
                 "--bind:--port)");
  bool check_config = false;
  app.add_flag("--check-config", check_config,
               "check the arguments (as a service's ExecStart would pass them) and exit 0 without "
               "binding or writing anything (non-zero on a bad argument)");
  CLI11_PARSE(app, argc, argv);
  if (check_config) {
    if (!opts.store.empty() && !opts.state_file.empty()) {
      std::fprintf(stderr, "ina-controller: --store and --state-file exclude each other\n");
      return 1;
    }
    std::printf("ina-controller: configuration ok: %s:%u, state %s\n", opts.bind.c_str(),
                unsigned{opts.port},
                !opts.store.empty()       ? opts.store.c_str()
                : opts.state_file.empty() ? "none"
                                          : opts.state_file.c_str());
    return 0;
  }

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  auto server = ina::ctl::ControllerServer::create(opts);
  if (!server.ok()) {
    std::fprintf(stderr, "ina-controller: %s\n", server.status().to_string().c_str());
    return 1;
  }
  ina::ctl::ControllerServer& s = **server;
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr || std::fprintf(f, "%u\n", unsigned{s.port()}) <= 0 || std::fclose(f) != 0 ||
        std::rename(tmp.c_str(), port_file.c_str()) != 0) {
      std::fprintf(stderr, "ina-controller: cannot write --port-file %s\n", port_file.c_str());
      return 1;
    }
  }
  std::printf("ina-controller listening on %s:%u\n", opts.bind.c_str(), unsigned{s.port()});
  std::fflush(stdout);
  // httplib's stop() does nothing before run()'s accept loop starts: a SIGTERM right at start
  // (systemctl stop) is repeated until run() has returned.
  std::atomic<bool> served{false};
  std::thread watcher([&s, &served] {
    while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    while (!served.load()) {
      s.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const ina::Status st = s.run();
  served.store(true);
  g_stop.store(true);
  watcher.join();
  if (!st.ok()) {
    std::fprintf(stderr, "ina-controller: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
