// bypass_endpoint_from_config and the options of INA_TRANSPORT=dpdk|xdp (bypass_endpoint.h),
// built from Config's fields only: Config::from_env parsed the variables (config.cc), so a bad
// one is named before any transport plugin is loaded.
#include "worker/transport/bypass_endpoint.h"

#include <algorithm>
#include <string>

#include "worker/config_internal.h"
#include "worker/transport/dpdk_transport.h"
#include "worker/transport/xdp_transport.h"

namespace ina::worker {

Result<BypassEndpoint> bypass_endpoint_from_config(const Config& cfg, AggregatorTransport kind) {
  INA_RETURN_IF_ERROR(validate_bypass(cfg, kind));
  BypassEndpoint o;
  o.local_ip = cfg.local_ip;
  o.local_mac_set = cfg.local_mac.has_value();
  if (cfg.local_mac) o.local_mac = *cfg.local_mac;
  o.aggregator_mac_set = cfg.aggregator_mac.has_value();
  if (cfg.aggregator_mac) o.aggregator_mac = *cfg.aggregator_mac;
  o.local_port =
      static_cast<uint16_t>(cfg.local_port + static_cast<unsigned>(std::max(cfg.rank, 0)));
  // Checked here, not by validate: a controller's admission sets the aggregator after it.
  Result<uint32_t> aip = frame::parse_ipv4(cfg.aggregator_host);
  if (!aip.ok()) {
    return invalid_argument(
        "invalid INA_AGGREGATOR host \"" + cfg.aggregator_host +
        "\": INA_TRANSPORT=" + (kind == AggregatorTransport::kDpdk ? "dpdk" : "xdp") +
        " needs an IPv4 address a.b.c.d (no names)");
  }
  o.aggregator_ip = aip.value();
  o.aggregator_port = cfg.aggregator_port;
  return o;
}

Result<DpdkTransportOptions> dpdk_options_from_config(const Config& cfg) {
  INA_ASSIGN_OR_RETURN(BypassEndpoint e,
                       bypass_endpoint_from_config(cfg, AggregatorTransport::kDpdk));
  DpdkTransportOptions o;
  o.eal_args = cfg.dpdk_args;
  o.port = cfg.dpdk_port;
  apply_endpoint(e, &o);
  return o;
}

Result<XdpTransportOptions> xdp_options_from_config(const Config& cfg) {
  INA_ASSIGN_OR_RETURN(BypassEndpoint e,
                       bypass_endpoint_from_config(cfg, AggregatorTransport::kXdp));
  XdpTransportOptions o;
  o.iface = cfg.xdp_iface;
  o.queue = cfg.xdp_queue;
  o.force_copy = cfg.xdp_copy;
  apply_endpoint(e, &o);
  return o;
}

}  // namespace ina::worker
