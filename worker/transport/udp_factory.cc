// One kernel UDP transport per aggregator of a job (udp_factory.h).
#include "worker/transport/udp_factory.h"

#include <string>
#include <utility>

#include "ina/base/log.h"
#include "worker/transport/udp_transport.h"

namespace ina::worker {

Result<std::vector<std::unique_ptr<Transport>>> udp_transports(
    int rank, const std::vector<AggregatorAddress>& list) {
  std::vector<std::unique_ptr<Transport>> transports;
  for (size_t k = 0; k < list.size(); ++k) {
    UdpTransportOptions opts;
    opts.host = list[k].host;
    opts.port = list[k].port;
    Result<std::unique_ptr<UdpTransport>> udp = UdpTransport::create(opts);
    if (!udp.ok()) {
      if (list.size() == 1) return udp.status();
      return Status(udp.status().code(), "shard " + std::to_string(k) + " of " +
                                             std::to_string(list.size()) + ": " +
                                             udp.status().message());
    }
    INA_DEBUG("worker", "rank %d: transport udp to %s (shard %zu of %zu)", rank,
              udp.value()->peer_name().c_str(), k, list.size());
    transports.push_back(std::move(udp.value()));
  }
  return transports;
}

}  // namespace ina::worker
