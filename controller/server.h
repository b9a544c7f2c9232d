// ina-controller's HTTP/JSON server around ControllerState: aggregator heartbeats, worker
// admission (a plain-text answer the worker library parses without a JSON dependency), the
// operator API used by ina-ctl, Prometheus /metrics, and the persisted state file.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "ina/base/status.h"

namespace ina::ctl {

struct ServerOptions {
  std::string bind = "127.0.0.1";
  uint16_t port = 47480;   // 0: any free port (see ControllerServer::port())
  std::string state_file;  // "" : state is not persisted
  int64_t heartbeat_timeout_ms = 3000;
  uint32_t default_shards = 1;       // shards for an admission that asks for none
  int64_t job_idle_ttl_ms = 600000;  // active job without packets this long expires; 0: never
  // "etcd://h1:p1,h2:p2": the state lives in etcd and replicas elect a leader (replica_etcd.h);
  // "" : the state file (or nothing). Not both.
  std::string store;
  std::string
      advertise;  // this replica's "host:port" for clients and other replicas ("": bind:port)
};

class ControllerServer {
 public:
  ~ControllerServer();
  // Loads the state file (when it exists), binds the port.
  static Result<std::unique_ptr<ControllerServer>> create(const ServerOptions& opts);
  uint16_t port() const;
  // Serves until stop() (from any thread).
  Status run();
  void stop();

 private:
  ControllerServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ina::ctl
