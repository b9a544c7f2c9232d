// Parsing helpers shared by Config::from_env (config.cc) and the C ABI's config merge (c_api.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ina/protocol/status.h"

namespace ina::worker {

// Parses "host", "host:port", "[ipv6]", "[ipv6]:port" or a bare IPv6 literal ("::1"). A missing
// port is wire::kDefaultPort. `what` names the source in errors ("INA_AGGREGATOR",
// "config.aggregator").
Status parse_host_port(std::string_view s, std::string_view what, std::string* host,
                       uint16_t* port);
// The same with another default port (INA_CONTROLLER: kDefaultControllerPort).
Status parse_host_port(std::string_view s, std::string_view what, uint16_t default_port,
                       std::string* host, uint16_t* port);

// ina-controller's default HTTP port.
inline constexpr uint16_t kDefaultControllerPort = 47480;

}  // namespace ina::worker
