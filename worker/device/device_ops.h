// The device operations the device-buffer pipeline needs (device_pipeline.h), behind a small
// interface: streams (in-order queues of asynchronous work), events, asynchronous copies between
// host and device, pinned host memory, host functions on a stream, and "is this a device
// pointer?". cuda_device_ops.cc implements it with the CUDA runtime; tests implement it with host
// memory and one thread per stream (tests/worker/fake_device_ops.h), so the schedule, the buffer
// reuse and the request lifecycle are tested without a GPU.
//
// Handles (streams, events) are opaque pointers; a null stream is the caller's default stream
// (CUDA: the legacy default stream). Every call returns a Status; asynchronous failures surface
// at the next synchronize on the stream or event, as in CUDA.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "ina/base/status.h"

namespace ina::worker {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  // "cuda" or the fake's name, for messages.
  virtual const char* name() const = 0;
  // OK when the operations can run (a device and a driver); else why not. Cheap after the
  // first call.
  virtual Status available() = 0;
  // True when `p` is device memory that host code must not dereference (managed memory counts as
  // device: it is reached through copies ordered on streams). False for host memory, for
  // pointers the runtime does not know, and when no device is available.
  virtual bool is_device_pointer(const void* p) = 0;

  // Makes the device that owns `p` current for this thread's later calls (CUDA: cudaSetDevice;
  // libina's runtime state is its own, so the application's current device is untouched). A
  // host pointer leaves it unchanged.
  virtual Status use_device_of(const void* p) = 0;

  virtual Result<void*> alloc_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* p) = 0;

  // A stream of our own that never synchronizes implicitly with the default stream (CUDA:
  // cudaStreamNonBlocking), so a host function holding the user's stream cannot stall it.
  virtual Result<void*> create_stream() = 0;
  virtual void destroy_stream(void* stream) = 0;
  virtual Result<void*> create_event() = 0;
  virtual void destroy_event(void* event) = 0;

  // Enqueued on `stream`: completes after the work enqueued on it before this call.
  virtual Status record_event(void* event, void* stream) = 0;
  // Work enqueued on `stream` after this call starts after the last record of `event`.
  virtual Status stream_wait_event(void* stream, void* event) = 0;
  // Blocks the calling thread until the last record of `event` completed.
  virtual Status event_synchronize(void* event) = 0;
  virtual Status stream_synchronize(void* stream) = 0;
  // Copies `bytes` from src to dst in stream order; either side may be host or device memory.
  virtual Status copy_async(void* dst, const void* src, size_t bytes, void* stream) = 0;
  // Enqueues fn on `stream`: later work on the stream starts after fn returned. fn may block
  // (it is how an asynchronous collective holds the user's stream until it completes) but must
  // not call into DeviceOps.
  virtual Status launch_host_func(void* stream, std::function<void()> fn) = 0;
};

// The CUDA implementation, from libina-cuda.so (loaded at the first call, plugin_loader.cc). When
// the plugin cannot be loaded, or without the cuda feature, an object whose available() says why
// (naming the plugin and dlerror()'s reason) and whose calls fail with that message.
std::unique_ptr<DeviceOps> make_cuda_device_ops();

// The CUDA runtime's DeviceOps itself (cuda_device_ops.cc, linked into libina-cuda.so only).
std::unique_ptr<DeviceOps> make_cuda_runtime_device_ops();

// Device operations that are off for the reason `why`: available() returns it, nothing is a
// device pointer, every call fails with it.
std::unique_ptr<DeviceOps> make_unavailable_device_ops(Status why);

}  // namespace ina::worker
