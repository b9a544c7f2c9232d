// DeviceOps when libina is built without the cuda feature: nothing is a device pointer, and every
// device call fails with "built without CUDA".
#include <string>

#include "worker/device/device_ops.h"

namespace ina::worker {
namespace {

Status no_cuda() {
  return unimplemented(
      "libina was built without CUDA (configure with -Dcuda=enabled and the CUDA toolkit): "
      "device buffers and CUDA streams are not supported");
}

class NoDeviceOps final : public DeviceOps {
 public:
  const char* name() const override { return "cuda"; }
  Status available() override { return no_cuda(); }
  bool is_device_pointer(const void*) override { return false; }
  Status use_device_of(const void*) override { return no_cuda(); }
  Result<void*> alloc_pinned(size_t) override { return no_cuda(); }
  void free_pinned(void*) override {}
  Result<void*> create_stream() override { return no_cuda(); }
  void destroy_stream(void*) override {}
  Result<void*> create_event() override { return no_cuda(); }
  void destroy_event(void*) override {}
  Status record_event(void*, void*) override { return no_cuda(); }
  Status stream_wait_event(void*, void*) override { return no_cuda(); }
  Status event_synchronize(void*) override { return no_cuda(); }
  Status stream_synchronize(void*) override { return no_cuda(); }
  Status copy_async(void*, const void*, size_t, void*) override { return no_cuda(); }
  Status launch_host_func(void*, std::function<void()>) override { return no_cuda(); }
};

}  // namespace

std::unique_ptr<DeviceOps> make_cuda_device_ops() { return std::make_unique<NoDeviceOps>(); }

}  // namespace ina::worker
