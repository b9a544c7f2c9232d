// DeviceOps on the CUDA runtime (cuda feature), the code of libina-cuda.so. The plugin links the
// static cudart, which loads the driver (libcuda.so.1) at the first call, not at load: on a
// machine without a GPU or driver the plugin loads and available() says why the device path is
// off. The runtime's state is the plugin's own (plugin.map keeps its symbols local).
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <string>

#include "worker/device/device_ops.h"

namespace ina::worker {
namespace {

Status cuda_status(const char* what, cudaError_t err) {
  if (err == cudaSuccess) return ok_status();
  // Clear a non-sticky error so it does not resurface in the application's next CUDA call.
  (void)cudaGetLastError();
  std::string m = std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  if (err == cudaErrorMemoryAllocation) return resource_exhausted(std::move(m));
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
    return unavailable(std::move(m));
  return internal_error(std::move(m));
}

class CudaDeviceOps final : public DeviceOps {
 public:
  const char* name() const override { return "cuda"; }

  Status available() override {
    std::call_once(probe_once_, [this] {
      int n = 0;
      const cudaError_t err = cudaGetDeviceCount(&n);
      if (err != cudaSuccess) {
        available_ = cuda_status("cudaGetDeviceCount", err);
      } else if (n == 0) {
        available_ = unavailable("no CUDA device");
      }
    });
    return available_;
  }

  bool is_device_pointer(const void* p) override {
    if (p == nullptr || !available().ok()) return false;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  Status use_device_of(const void* p) override {
    if (p == nullptr || !available().ok()) return ok_status();
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return ok_status();
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) return ok_status();
    return cuda_status("cudaSetDevice", cudaSetDevice(a.device));
  }

  Result<void*> alloc_pinned(size_t bytes) override {
    void* p = nullptr;
    INA_RETURN_IF_ERROR(
        cuda_status("cudaHostAlloc", cudaHostAlloc(&p, bytes, cudaHostAllocPortable)));
    return p;
  }
  void free_pinned(void* p) override {
    if (p != nullptr) (void)cudaFreeHost(p);
  }

  Result<void*> create_stream() override {
    cudaStream_t s = nullptr;
    INA_RETURN_IF_ERROR(cuda_status("cudaStreamCreateWithFlags",
                                    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
    return static_cast<void*>(s);
  }
  void destroy_stream(void* s) override {
    if (s != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(s));
  }
  Result<void*> create_event() override {
    cudaEvent_t e = nullptr;
    INA_RETURN_IF_ERROR(cuda_status("cudaEventCreateWithFlags",
                                    cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
    return static_cast<void*>(e);
  }
  void destroy_event(void* e) override {
    if (e != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }

  Status record_event(void* e, void* s) override {
    return cuda_status("cudaEventRecord",
                       cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)));
  }
  Status stream_wait_event(void* s, void* e) override {
    return cuda_status("cudaStreamWaitEvent", cudaStreamWaitEvent(static_cast<cudaStream_t>(s),
                                                                  static_cast<cudaEvent_t>(e), 0));
  }
  Status event_synchronize(void* e) override {
    return cuda_status("cudaEventSynchronize", cudaEventSynchronize(static_cast<cudaEvent_t>(e)));
  }
  Status stream_synchronize(void* s) override {
    return cuda_status("cudaStreamSynchronize",
                       cudaStreamSynchronize(static_cast<cudaStream_t>(s)));
  }
  Status copy_async(void* dst, const void* src, size_t bytes, void* s) override {
    return cuda_status("cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                                          static_cast<cudaStream_t>(s)));
  }
  Status launch_host_func(void* s, std::function<void()> fn) override {
    auto* heap = new std::function<void()>(std::move(fn));
    const cudaError_t err = cudaLaunchHostFunc(
        static_cast<cudaStream_t>(s),
        [](void* arg) {
          std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(arg));
          (*f)();
        },
        heap);
    if (err != cudaSuccess) delete heap;
    return cuda_status("cudaLaunchHostFunc", err);
  }

 private:
  std::once_flag probe_once_;
  Status available_;
};

}  // namespace

std::unique_ptr<DeviceOps> make_cuda_runtime_device_ops() {
  return std::make_unique<CudaDeviceOps>();
}

}  // namespace ina::worker
