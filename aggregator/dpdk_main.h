// The `--backend dpdk` path of ina-aggregator: EAL start, port setup, the per-lcore counters
// printed by the main lcore, the control agent (controller heartbeats, /metrics) served from the
// merged per-lcore snapshots, and the stop sequence on SIGINT/SIGTERM (stop the loops, stop and
// close the port, release the EAL). Kept apart from main.cc so that the CLI only parses flags.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "aggregator/engine.h"
#include "ina_config.h"
#if INA_HAVE_CONTROLLER
#include "aggregator/agent_main.h"
#endif

namespace ina::agg {

struct DpdkCliOptions {
  std::string port;  // DPDK port name or number ("" = port 0)
  std::string ip;    // our IPv4 address (required)
  std::string mac;   // "" = the port's address
  uint16_t udp_port = 47474;
  uint16_t burst = 32;
  uint16_t rx_queues = 0;  // 0: one per worker lcore (at most the port's)
  uint32_t stats_ms = 5000;
  std::vector<std::string> eal_args;  // after `--` on the command line
  std::vector<JobConfig> jobs;        // served from the start (may be empty with an agent)
  // Jobs from the controller: slot memory shared by all jobs and the largest block.
  uint32_t slot_capacity = 0;
  uint32_t max_payload_bytes = 0;  // the largest block in bytes (jobs from the controller)
#if INA_HAVE_CONTROLLER
  // Started once the port runs (controller heartbeats and/or the HTTP endpoint); its data_port
  // is set to udp_port, its advertise_host defaults to --ip.
  std::optional<AgentCliOptions> agent;
#endif
};

// Runs until `stop`; returns the process exit code (0, 1 on error, 77 when the EAL cannot start).
int run_dpdk_aggregator(const DpdkCliOptions& o, const std::atomic<bool>& stop);

}  // namespace ina::agg
