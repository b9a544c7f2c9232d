// The `--backend udp` path of ina-aggregator (the default): the kernel UDP aggregator created and
// bound, its port written to --port-file, the control agent (controller heartbeats, /metrics)
// started on it, the "listening" line, the serving threads run until SIGINT/SIGTERM, then the
// counters printed. Kept apart from main.cc so that the CLI only parses flags (as dpdk_main.h).
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "aggregator/engine.h"
#include "aggregator/udp_backend.h"
#include "ina_config.h"
#if INA_HAVE_CONTROLLER
#include "aggregator/agent_main.h"
#endif

namespace ina::agg {

struct UdpCliOptions {
  UdpOptions udp;               // the backend's own (--bind, --port, --threads, ...)
  std::vector<JobConfig> jobs;  // served from the start (may be empty with an agent)
#if INA_HAVE_CONTROLLER
  // Started once the sockets are bound (controller heartbeats and/or the HTTP endpoint), with
  // the bound port as its data_port.
  std::optional<AgentCliOptions> agent;
#endif
  std::string port_file;  // the bound UDP port is written here once listening
};

// Runs until `stop`; returns the process exit code (0, 1 on error).
int run_udp_aggregator(const UdpCliOptions& o, const std::atomic<bool>& stop);

}  // namespace ina::agg
