// The `--backend dpdk` path of ina-aggregator: EAL start, port setup, the per-lcore counters printed
// by the main lcore, and the stop sequence on SIGINT/SIGTERM (stop the loops, stop and close the
// port, release the EAL). Kept apart from main.cc so that the CLI only parses flags.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "aggregator/engine.h"

namespace ina::agg {

struct DpdkCliOptions {
  std::string port;                     // DPDK port name or number ("" = port 0)
  std::string ip;                       // our IPv4 address (required)
  std::string mac;                      // "" = the port's address
  uint16_t udp_port = 47474;
  uint16_t burst = 32;
  uint32_t stats_ms = 5000;
  std::vector<std::string> eal_args;    // after `--` on the command line
};

// Runs until `stop`; returns the process exit code (0, 1 on error, 77 when the EAL cannot start).
int run_dpdk_aggregator(const DpdkCliOptions& o, const JobConfig& job,
                        const std::atomic<bool>& stop);

}  // namespace ina::agg
