// DeviceOps that are off for a reason: libina built without CUDA, or libina-cuda.so not loadable.
// Nothing is a device pointer, and every device call fails with that reason.
#include <string>
#include <utility>

#include "worker/device/device_ops.h"

namespace ina::worker {
namespace {

class UnavailableDeviceOps final : public DeviceOps {
 public:
  explicit UnavailableDeviceOps(Status why) : why_(std::move(why)) {}
  const char* name() const override { return "cuda"; }
  Status available() override { return why_; }
  bool is_device_pointer(const void*) override { return false; }
  Status use_device_of(const void*) override { return why_; }
  Result<void*> alloc_pinned(size_t) override { return why_; }
  void free_pinned(void*) override {}
  Result<void*> create_stream() override { return why_; }
  void destroy_stream(void*) override {}
  Result<void*> create_event() override { return why_; }
  void destroy_event(void*) override {}
  Status record_event(void*, void*) override { return why_; }
  Status stream_wait_event(void*, void*) override { return why_; }
  Status event_synchronize(void*) override { return why_; }
  Status stream_synchronize(void*) override { return why_; }
  Status copy_async(void*, const void*, size_t, void*) override { return why_; }
  Status launch_host_func(void*, std::function<void()>) override { return why_; }

 private:
  const Status why_;
};

}  // namespace

std::unique_ptr<DeviceOps> make_unavailable_device_ops(Status why) {
  return std::make_unique<UnavailableDeviceOps>(std::move(why));
}

}  // namespace ina::worker
