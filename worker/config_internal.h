// Parsing helpers and limits shared by Config::from_env (config.cc), Config::validate
// (config_validate.cc) and the C ABI's config merge (c_api.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ina/base/status.h"
#include "ina/ina.hpp"
#include "ina/protocol/wire.h"

namespace ina::worker {

// Parses "host", "host:port", "[ipv6]", "[ipv6]:port" or a bare IPv6 literal ("::1"). A missing
// port is wire::kDefaultPort. `what` names the source in errors ("INA_AGGREGATOR",
// "config.aggregator").
Status parse_host_port(std::string_view s, std::string_view what, std::string* host,
                       uint16_t* port);
// The same with another default port (INA_CONTROLLER: kDefaultControllerPort).
Status parse_host_port(std::string_view s, std::string_view what, uint16_t default_port,
                       std::string* host, uint16_t* port);

// Parses an aggregator list "a[,b,...]", each element as parse_host_port (default port
// wire::kDefaultPort): 1 .. kMaxShards elements, none empty, no address twice. Errors name `what`,
// the element's position and text, and the expected form.
Status parse_aggregator_list(std::string_view s, std::string_view what,
                             std::vector<AggregatorAddress>* out);

// Stores an aggregator list in cfg: one element sets aggregator_host/port and clears
// cfg->aggregators; more set both (aggregator_host/port = shard 0).
void set_aggregators(Config* cfg, std::vector<AggregatorAddress> list);

// The job's aggregators in shard order: cfg.aggregators, else the one aggregator_host:port.
std::vector<AggregatorAddress> aggregator_list(const Config& cfg);

// The fields INA_TRANSPORT=dpdk|xdp (`kind`: kDpdk or kXdp) requires: dpdk_args
// (INA_DPDK_ARGS) or xdp_iface (INA_XDP_IFACE), local_ip (INA_LOCAL_IP), and local_port + rank
// within 65535. Errors name the variable. Config::validate calls it for its transport unless
// host_only; the transport's options are built after it (bypass_endpoint.h).
Status validate_bypass(const Config& cfg, AggregatorTransport kind);

// The limits Config::validate checks and from_env's parsers apply.
inline constexpr uint32_t kMaxWorldSize = 65535;  // ranks are 16 bits on the wire
inline constexpr uint32_t kMaxBlockElems = 16384;
inline constexpr uint32_t kMaxWindow = wire::kMaxSlot + 1;
inline constexpr uint64_t kMaxTimeoutMs = 24ull * 3600 * 1000;  // a day: beyond that it is a typo
inline constexpr uint64_t kMaxRetransmitUs = 60ull * 1000 * 1000;

// The message of a value out of range: "invalid FIELD VALUE: must be in RANGE (ENV)".
std::string range_error(std::string_view field, std::string_view env, const std::string& value,
                        const std::string& range);

// The most aggregators one job may be sharded over (each costs the communicator a thread and a
// socket).
inline constexpr size_t kMaxShards = 64;

// ina-controller's default HTTP port.
inline constexpr uint16_t kDefaultControllerPort = 47480;

}  // namespace ina::worker
