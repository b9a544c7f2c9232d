// GPUDirect RDMA registration of CUDA device memory (see gpudirect.h): the CUDA driver API
// loaded with dlopen, dmabuf first, then peer memory, else host staging.
#include "worker/rdma/gpudirect.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ina/base/log.h"
#include "ina_config.h"

#if INA_HAVE_CUDA
#include <cuda.h>
#include <dlfcn.h>

#include <mutex>
#endif

namespace ina::rdma {

const char* device_reg_kind_name(DeviceRegKind k) {
  switch (k) {
    case DeviceRegKind::kDmaBuf: return "dmabuf";
    case DeviceRegKind::kPeerMem: return "peer memory";
    case DeviceRegKind::kHostStaging: return "host staging";
  }
  return "?";
}

#if INA_HAVE_CUDA

namespace {

// The driver entry points used here, resolved from libcuda.so.1 (the versioned names that
// cuda.h's macros map the plain ones to).
struct Driver {
  bool ok = false;
  std::string why;
  void* lib = nullptr;
  CUresult (*Init)(unsigned int) = nullptr;
  CUresult (*PointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
  CUresult (*MemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*MemGetHandleForAddressRange)(void*, CUdeviceptr, size_t, CUmemRangeHandleType,
                                          unsigned long long) = nullptr;
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*CtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*CtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
};

template <typename F>
bool resolve(void* lib, const char* name, F* out, std::string* why) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr) *why = std::string("libcuda.so.1 lacks ") + name;
  return *out != nullptr;
}

// Loaded once per process; the handle stays open (as PyTorch's own load of the driver does).
const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    d.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (d.lib == nullptr) {
      const char* e = dlerror();
      d.why = std::string("no CUDA driver (dlopen libcuda.so.1: ") + (e ? e : "?") + ")";
      return;
    }
    if (!resolve(d.lib, "cuInit", &d.Init, &d.why) ||
        !resolve(d.lib, "cuPointerGetAttribute", &d.PointerGetAttribute, &d.why) ||
        !resolve(d.lib, "cuMemGetAddressRange_v2", &d.MemGetAddressRange, &d.why) ||
        !resolve(d.lib, "cuMemGetHandleForAddressRange", &d.MemGetHandleForAddressRange, &d.why) ||
        !resolve(d.lib, "cuMemcpyDtoH_v2", &d.MemcpyDtoH, &d.why) ||
        !resolve(d.lib, "cuMemcpyHtoD_v2", &d.MemcpyHtoD, &d.why) ||
        !resolve(d.lib, "cuCtxPushCurrent_v2", &d.CtxPushCurrent, &d.why) ||
        !resolve(d.lib, "cuCtxPopCurrent_v2", &d.CtxPopCurrent, &d.why) ||
        !resolve(d.lib, "cuGetErrorString", &d.GetErrorString, &d.why))
      return;
    const CUresult r = d.Init(0);
    if (r != CUDA_SUCCESS) {
      const char* s = nullptr;
      d.GetErrorString(r, &s);
      d.why = std::string("cuInit: ") + (s ? s : "error " + std::to_string(r));
      return;
    }
    d.ok = true;
  });
  return d;
}

std::string cu_error(const char* call, CUresult r) {
  const char* s = nullptr;
  if (driver().GetErrorString != nullptr) driver().GetErrorString(r, &s);
  return std::string(call) + ": " + (s ? s : "error " + std::to_string(r));
}

CUdeviceptr dev(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }

// Runs `f` with the context that owns device pointer `p` current.
template <typename F>
Status in_context_of(const void* p, F f) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  CUresult r = d.PointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, dev(p));
  if (r != CUDA_SUCCESS) return internal_error(cu_error("cuPointerGetAttribute(CONTEXT)", r));
  r = d.CtxPushCurrent(ctx);
  if (r != CUDA_SUCCESS) return internal_error(cu_error("cuCtxPushCurrent", r));
  const Status s = f();
  CUcontext popped = nullptr;
  (void)d.CtxPopCurrent(&popped);
  return s;
}

}  // namespace

bool cuda_driver_available(std::string* why) {
  const Driver& d = driver();
  if (!d.ok && why != nullptr) *why = d.why;
  return d.ok;
}

bool is_device_pointer(const void* p) {
  const Driver& d = driver();
  if (!d.ok || p == nullptr) return false;
  unsigned int type = 0;
  if (d.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev(p)) != CUDA_SUCCESS)
    return false;  // not known to CUDA: ordinary host memory
  if (type != CU_MEMORYTYPE_DEVICE) return false;
  unsigned int managed = 0;
  if (d.PointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, dev(p)) == CUDA_SUCCESS &&
      managed != 0)
    return false;  // managed memory is addressable from the host
  return true;
}

Result<DeviceAllocation> device_allocation(const void* p) {
  const Driver& d = driver();
  if (!d.ok) return failed_precondition(d.why);
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = d.MemGetAddressRange(&base, &size, dev(p));
  if (r != CUDA_SUCCESS) return invalid_argument(cu_error("cuMemGetAddressRange", r));
  unsigned long long id = 0;
  r = d.PointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, dev(p));
  if (r != CUDA_SUCCESS) return invalid_argument(cu_error("cuPointerGetAttribute(BUFFER_ID)", r));
  DeviceAllocation a;
  a.base = reinterpret_cast<void*>(static_cast<uintptr_t>(base));
  a.bytes = size;
  a.buffer_id = id;
  return a;
}

Status copy_device_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return ok_status();
  if (!driver().ok) return failed_precondition(driver().why);
  return in_context_of(src, [&] {
    const CUresult r = driver().MemcpyDtoH(dst, dev(src), bytes);
    return r == CUDA_SUCCESS ? ok_status() : internal_error(cu_error("cuMemcpyDtoH", r));
  });
}

Status copy_host_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return ok_status();
  if (!driver().ok) return failed_precondition(driver().why);
  return in_context_of(dst, [&] {
    const CUresult r = driver().MemcpyHtoD(dev(dst), src, bytes);
    return r == CUDA_SUCCESS ? ok_status() : internal_error(cu_error("cuMemcpyHtoD", r));
  });
}

DeviceRegistration register_device_memory(ibv_pd* pd, void* ptr, size_t bytes, int access_flags) {
  DeviceRegistration reg;
  const Driver& d = driver();
  if (!d.ok) {
    reg.detail = d.why;
  } else {
    // 1. dmabuf of the allocation's range, rounded out to host pages.
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = d.MemGetAddressRange(&base, &size, dev(ptr));
    if (r != CUDA_SUCCESS) {
      reg.detail = "dmabuf: " + cu_error("cuMemGetAddressRange", r);
    } else {
      const auto page = static_cast<CUdeviceptr>(sysconf(_SC_PAGESIZE));
      const CUdeviceptr aligned = base & ~(page - 1);
      const size_t span = ((base + size - aligned) + page - 1) & ~(page - 1);
      int fd = -1;
      r = d.MemGetHandleForAddressRange(&fd, aligned, span, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
      if (r != CUDA_SUCCESS) {
        reg.detail = "dmabuf: " + cu_error("cuMemGetHandleForAddressRange", r);
      } else {
        const uint64_t offset = dev(ptr) - aligned;
        reg.mr = ibv_reg_dmabuf_mr(pd, offset, bytes, dev(ptr), fd, access_flags);
        if (reg.mr != nullptr) {
          reg.kind = DeviceRegKind::kDmaBuf;
          reg.dmabuf_fd = fd;
        } else {
          reg.detail = std::string("dmabuf: ibv_reg_dmabuf_mr: ") + std::strerror(errno);
          close(fd);
        }
      }
    }
    // 2. peer memory (nvidia-peermem resolves the device address inside ibv_reg_mr).
    if (reg.mr == nullptr) {
      reg.mr = ibv_reg_mr(pd, ptr, bytes, access_flags);
      if (reg.mr != nullptr) {
        reg.kind = DeviceRegKind::kPeerMem;
      } else {
        reg.detail +=
            std::string("; peer memory: ibv_reg_mr: ") + std::strerror(errno) +
            (::access("/sys/module/nvidia_peermem", F_OK) == 0 ? ""
                                                               : " (nvidia-peermem not loaded)");
      }
    }
  }
  INA_DEBUG("rdma", "device buffer %p (%zu bytes): %s%s%s", ptr, bytes,
            device_reg_kind_name(reg.kind), reg.detail.empty() ? "" : " after ",
            reg.detail.c_str());
  return reg;
}

#else  // !INA_HAVE_CUDA

bool cuda_driver_available(std::string* why) {
  if (why != nullptr) *why = "libina built without the cuda feature";
  return false;
}
bool is_device_pointer(const void*) { return false; }
Result<DeviceAllocation> device_allocation(const void*) {
  return failed_precondition("libina built without the cuda feature");
}
Status copy_device_to_host(void*, const void*, size_t) {
  return failed_precondition("libina built without the cuda feature");
}
Status copy_host_to_device(void*, const void*, size_t) {
  return failed_precondition("libina built without the cuda feature");
}
DeviceRegistration register_device_memory(ibv_pd*, void* ptr, size_t bytes, int) {
  DeviceRegistration reg;
  reg.detail = "libina built without the cuda feature";
  INA_DEBUG("rdma", "device buffer %p (%zu bytes): host staging (%s)", ptr, bytes,
            reg.detail.c_str());
  return reg;
}

#endif  // INA_HAVE_CUDA

void deregister_device_memory(DeviceRegistration* reg) {
  if (reg->mr != nullptr) ibv_dereg_mr(reg->mr);
  if (reg->dmabuf_fd >= 0) close(reg->dmabuf_fd);
  reg->mr = nullptr;
  reg->dmabuf_fd = -1;
}

}  // namespace ina::rdma
