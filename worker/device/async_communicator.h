// The outermost Communicator: device buffers, CUDA streams and asynchronous collectives in front
// of the host Communicator (communicator.cc). See async_communicator.cc for the threading.
#pragma once

#include <memory>

#include "ina/ina.hpp"
#include "worker/device/device_ops.h"

namespace ina::worker {

// Wraps `inner` (which must not be used elsewhere afterwards). `ops` is the device backend
// (make_cuda_device_ops(), or a fake in tests).
std::unique_ptr<Communicator> make_async_communicator(std::unique_ptr<Communicator> inner,
                                                      std::unique_ptr<DeviceOps> ops,
                                                      const Config& cfg);

}  // namespace ina::worker
