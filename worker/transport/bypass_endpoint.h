// The Ethernet/IPv4/UDP identity shared by the kernel-bypass worker transports (DPDK and AF_XDP):
// they build whole frames, so each needs this worker's IPv4 and MAC, its UDP port, and the
// aggregator's IPv4, port and (unless ARP finds it) MAC. One reader of Config's fields for both.
#pragma once

#include <cstdint>

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

// The endpoint of Config's fields (local_ip, local_mac, local_port + rank, aggregator_mac; from
// INA_LOCAL_IP ... by Config::from_env) and its aggregator, which must be an IPv4 literal (no name
// resolution on these paths). Checks validate_bypass(cfg, kind) first (config_internal.h); `kind`
// (kDpdk, kXdp) goes into the errors, which name the variable.
Result<BypassEndpoint> bypass_endpoint_from_config(const Config& cfg, AggregatorTransport kind);

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
