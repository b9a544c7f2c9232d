// The kernel UDP transports of a job: one socket per aggregator (shard) of its list, the factory
// Communicator::create and the path policy's re-admission use.
#pragma once

#include <memory>
#include <vector>

#include "ina/base/status.h"
#include "ina/ina.hpp"
#include "worker/transport/transport.h"

namespace ina::worker {

// One kernel UDP socket per aggregator (shard) of `list`, for rank `rank`; with several, an error
// names the shard.
Result<std::vector<std::unique_ptr<Transport>>> udp_transports(
    int rank, const std::vector<AggregatorAddress>& list);

}  // namespace ina::worker
