// The Communicator behind ina::Communicator::create: argument checks in front of the engine.
// Exposed inside the library so tests can build a communicator on an in-memory transport.
#pragma once

#include <memory>

#include "ina/ina.hpp"
#include "worker/transport.h"

namespace ina::worker {

// Validates `cfg`, wraps `transport` with fault injection when cfg.fault asks for it, and joins
// the job. Communicator::create is this with a kernel UDP transport to cfg's aggregator.
Result<std::unique_ptr<Communicator>> create_communicator(const Config& cfg,
                                                          std::unique_ptr<Transport> transport);

// The seed FaultInjection uses: cfg.fault.seed, or one derived from the rank when it is 0.
uint64_t effective_fault_seed(const Config& cfg);

}  // namespace ina::worker
