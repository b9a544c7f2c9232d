// The Ethernet/IPv4/UDP identity shared by the kernel-bypass worker transports (DPDK and AF_XDP):
// they build whole frames, so each needs this worker's IPv4 and MAC, its UDP port, and the
// aggregator's IPv4, port and (unless ARP finds it) MAC. One parser of the environment for both.
#pragma once

#include <cstdint>
#include <string_view>

#include "ina/base/status.h"
#include "ina/ina.hpp"
#include "ina/protocol/frame.h"

namespace ina::worker {

struct BypassEndpoint {
  uint32_t local_ip = 0;       // host order
  bool local_mac_set = false;  // else the port's / interface's MAC
  frame::Mac local_mac{};
  uint16_t local_port = 0;     // INA_LOCAL_PORT (default 47500) + rank
  uint32_t aggregator_ip = 0;  // host order
  uint16_t aggregator_port = 47474;
  bool aggregator_mac_set = false;  // else ARP
  frame::Mac aggregator_mac{};
};

// Reads INA_LOCAL_IP (required), INA_LOCAL_MAC, INA_LOCAL_PORT (default 47500; rank r uses it +
// r), INA_AGGREGATOR_MAC, and the aggregator from cfg (an IPv4 literal: no name resolution on
// these paths). `transport` ("dpdk", "xdp") and `local_ip_hint` go into the errors, which name the
// variable and the expected form.
Result<BypassEndpoint> bypass_endpoint_from_env(const Config& cfg, std::string_view transport,
                                                std::string_view local_ip_hint);

// "invalid NAME="VALUE": expected FORM".
Status env_error(const char* name, std::string_view value, std::string_view form);
// The variable's value, nullptr when unset or empty.
const char* nonempty_env(const char* name);

// Copies the endpoint into a transport's options (which have the same field names).
template <class Options>
void apply_endpoint(const BypassEndpoint& e, Options* o) {
  o->local_ip = e.local_ip;
  o->local_mac_set = e.local_mac_set;
  o->local_mac = e.local_mac;
  o->local_port = e.local_port;
  o->aggregator_ip = e.aggregator_ip;
  o->aggregator_port = e.aggregator_port;
  o->aggregator_mac_set = e.aggregator_mac_set;
  o->aggregator_mac = e.aggregator_mac;
}

}  // namespace ina::worker
