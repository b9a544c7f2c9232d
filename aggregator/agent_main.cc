// The control agent beside either backend of ina-aggregator (see agent_main.h).
#include "aggregator/agent_main.h"

#include <cstdio>
#include <utility>

#include "aggregator/port_file.h"
#include "ina/base/log.h"

namespace ina::agg {

std::unique_ptr<ControlAgent> agent_with_port_file(Result<std::unique_ptr<ControlAgent>> started,
                                                   const std::string& http_port_file) {
  if (!started.ok()) {
    INA_ERROR("aggregator", "%s", started.status().to_string().c_str());
    return nullptr;
  }
  std::unique_ptr<ControlAgent> agent = std::move(started).value();
  if (!http_port_file.empty() && agent->http_port() > 0 &&
      !write_port_file(http_port_file, static_cast<uint16_t>(agent->http_port()))) {
    INA_ERROR("aggregator", "cannot write --http-port-file %s", http_port_file.c_str());
    return nullptr;
  }
  return agent;
}

}  // namespace ina::agg
