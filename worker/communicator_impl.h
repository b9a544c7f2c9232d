// The Communicator behind ina::Communicator::create: argument checks in front of the engine.
// Exposed inside the library so tests can build a communicator on an in-memory transport.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ina/ina.hpp"
#include "worker/device/device_ops.h"
#include "worker/transport/transport.h"

namespace ina::worker {

// Validates `cfg`, wraps `transport` with fault injection when cfg.fault asks for it, builds the
// host TCP mesh when cfg.store is set (rank 0 serves the TcpStore), and joins the job.
// `transport` may be null (host only: cfg.store is then required). A join that fails for want of
// an aggregator (unavailable, deadline) is not an error when the mesh exists: the communicator
// starts on the host path. Communicator::create is this with a kernel UDP transport to cfg's
// aggregator.
// The result is wrapped for device buffers and asynchronous collectives
// (device/async_communicator.h) with make_cuda_device_ops(), or with `device_ops` (tests: a fake).
Result<std::unique_ptr<Communicator>> create_communicator(const Config& cfg,
                                                          std::unique_ptr<Transport> transport);
Result<std::unique_ptr<Communicator>> create_communicator(const Config& cfg,
                                                          std::unique_ptr<Transport> transport,
                                                          std::unique_ptr<DeviceOps> device_ops);
// A job sharded over several aggregators (Config::aggregators): one transport per aggregator in
// shard order (their number must match aggregator_list(cfg)); empty: host only. `not_served`:
// why there is no transport although INA is configured (a refused admission, a transport that
// failed); logged once as a warning, an error on every rank with Config::require_inc.
Result<std::unique_ptr<Communicator>> create_communicator(
    const Config& cfg, std::vector<std::unique_ptr<Transport>> transports,
    std::unique_ptr<DeviceOps> device_ops, const std::string& not_served = {});

}  // namespace ina::worker
