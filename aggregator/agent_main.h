// The control agent as ina-aggregator runs it beside either backend (udp_main.cc, dpdk_main.cc;
// feature 'controller'): the options its flags give, and its start with the HTTP port written to
// --http-port-file.
#pragma once

#include <memory>
#include <string>

#include "aggregator/control_agent.h"
#include "ina/base/status.h"

namespace ina::agg {

// --controller, --http-port and the like: the agent's options (each backend sets data_port once
// it serves) and the file the HTTP port is written to.
struct AgentCliOptions {
  AgentOptions agent;
  std::string http_port_file;  // "": none
};

// The agent `started` (ControlAgent::start's answer) with its HTTP port, when it listens, written
// to `http_port_file`. Either failure is printed ("ina-aggregator: ...") and gives nullptr.
std::unique_ptr<ControlAgent> agent_with_port_file(Result<std::unique_ptr<ControlAgent>> started,
                                                   const std::string& http_port_file);

}  // namespace ina::agg
