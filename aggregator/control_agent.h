// The aggregator's control plane (feature 'controller'): heartbeats to ina-controller, which
// answer with the jobs to serve (applied with the backend's set_jobs), and an HTTP endpoint
// with Prometheus /metrics and /v1/telemetry (per-job straggler ranking, lag histograms, stalled
// slots). It reads only the serving threads' published snapshots, never an engine itself. Any
// backend plugs in through AgentTarget (the kernel UDP one and the DPDK one, see dpdk_main.cc).
//
// If the controller is unreachable the aggregator keeps serving the jobs it has, so a controller
// restart does not disturb running jobs; heartbeats resume when it is back.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "aggregator/udp_backend.h"
#include "ina/base/status.h"

namespace ina::agg {

struct AgentOptions {
  std::string controller_host;  // "" : no controller (HTTP endpoint only)
  uint16_t controller_port = 47480;
  // Controller replicas (host, port), the first one controller_host:port: on a failed heartbeat
  // the next one gets the following heartbeat (each forwards to the leader). Empty: the one.
  std::vector<std::pair<std::string, uint16_t>> controllers;
  std::string id;                            // "" : advertise_host:data_port
  std::string advertise_host = "127.0.0.1";  // where workers reach the data plane
  uint16_t data_port = 0;
  uint32_t slot_capacity = 4096;
  uint32_t max_fan_in = 64;
  uint32_t block_elems = 2048;
  std::string http_bind = "127.0.0.1";
  int http_port = -1;  // -1: no HTTP endpoint; 0: any free port
  std::chrono::milliseconds heartbeat{200};
};

// Prometheus text of a snapshot (pure; tested alone).
std::string prometheus_text(const AggregatorSnapshot& s);
// JSON of one job's telemetry: counters, straggler ranking with mean lag, rounds completed last
// and lag histograms, stalled slots with their missing ranks.
std::string job_telemetry_json(const JobSnapshot& j);
// The jobs of the controller's answer to a heartbeat ({"jobs": [...]}; per job "job", "key",
// "world", "slots", "block_elems", "slot_base", and for trees "role" with a leaf's "rank_base",
// "local_ranks", "child_index", "parent" and optional "parent_world" and "leaf_bases"). An error
// names the entry and the field (pure; tested alone).
Result<std::vector<JobConfig>> parse_heartbeat_jobs(const std::string& body);

// The backend the agent serves: both callables are thread safe and called from the agent's
// threads (snapshot: the last published one; set_jobs: the jobs to serve from now on, applied by
// the serving threads at their next safe point).
struct AgentTarget {
  std::function<AggregatorSnapshot()> snapshot;
  std::function<void(std::vector<JobConfig>)> set_jobs;
};

class ControlAgent {
 public:
  ~ControlAgent();  // stops the threads
  static Result<std::unique_ptr<ControlAgent>> start(const AgentOptions& opts, AgentTarget target);
  static Result<std::unique_ptr<ControlAgent>> start(const AgentOptions& opts, UdpAggregator* agg);
  int http_port() const;
  uint64_t heartbeats_ok() const;

 private:
  ControlAgent() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ina::agg
