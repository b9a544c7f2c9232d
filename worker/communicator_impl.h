// The Communicator behind ina::Communicator::create: argument checks in front of the engine.
// Exposed inside the library so tests can build a communicator on an in-memory transport.
#pragma once

#include <memory>

#include "ina/ina.hpp"
#include "worker/transport.h"

namespace ina::worker {

// Validates `cfg`, wraps `transport` with fault injection when cfg.fault asks for it, builds the
// host TCP mesh when cfg.store is set (rank 0 serves the TcpStore), and joins the job.
// `transport` may be null (host only: cfg.store is then required). A join that fails for want of
// an aggregator (unavailable, deadline) is not an error when the mesh exists: the communicator
// starts on the host path. Communicator::create is this with a kernel UDP transport to cfg's
// aggregator.
Result<std::unique_ptr<Communicator>> create_communicator(const Config& cfg,
                                                          std::unique_ptr<Transport> transport);

// The seed FaultInjection uses: cfg.fault.seed, or one derived from the rank when it is 0.
uint64_t effective_fault_seed(const Config& cfg);

}  // namespace ina::worker
