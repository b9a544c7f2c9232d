// GPUDirect RDMA for the verbs transport: CUDA device memory registered with the NIC, so that
// the NIC reads and writes GPU memory without a copy through the host.
//
// The CUDA driver API is loaded with dlopen("libcuda.so.1") on first use, never linked: libina
// loads and runs on machines without a driver (every call then reports "no CUDA driver").
//
// register_device_memory tries, in order:
//   1. dmabuf: cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) on the
//      allocation's page-aligned range, then ibv_reg_dmabuf_mr (upstream kernels, no extra module);
//   2. peer memory: ibv_reg_mr on the device pointer (needs the nvidia-peermem module);
//   3. host staging: no memory region; the caller copies through registered host memory
//      (copy_device_to_host / copy_host_to_device).
// The choice and why the earlier ones failed are logged at debug level ("[ina debug rdma]").
//
// Built with the rdma feature; the CUDA parts with the cuda feature as well (INA_HAVE_CUDA),
// otherwise every pointer is a host pointer and registration is always host staging.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <string>

#include "ina/base/status.h"

namespace ina::rdma {

enum class DeviceRegKind { kDmaBuf, kPeerMem, kHostStaging };
const char* device_reg_kind_name(DeviceRegKind k);  // "dmabuf", "peer memory", "host staging"

// Whether the CUDA driver could be loaded and initialised; `why` says why not.
bool cuda_driver_available(std::string* why);
// True for CUDA device memory (not host, pinned host or managed memory). False without a driver.
bool is_device_pointer(const void* p);
Status copy_device_to_host(void* dst, const void* src, size_t bytes);
Status copy_host_to_device(void* dst, const void* src, size_t bytes);

// The allocation holding a device pointer. buffer_id (CU_POINTER_ATTRIBUTE_BUFFER_ID) is never
// reused by a later allocation at the same address, so it keys a registration cache safely.
struct DeviceAllocation {
  void* base = nullptr;
  size_t bytes = 0;
  uint64_t buffer_id = 0;
};
Result<DeviceAllocation> device_allocation(const void* p);

struct DeviceRegistration {
  ibv_mr* mr = nullptr;  // null with kHostStaging
  DeviceRegKind kind = DeviceRegKind::kHostStaging;
  int dmabuf_fd = -1;  // kept open while the region lives (closed by deregister)
  std::string detail;  // why the faster kinds were not used
};

// Registers [ptr, ptr + bytes) of device memory with `pd` (access: IBV_ACCESS_* flags).
// Never fails: the worst case is kHostStaging with `detail` naming each reason.
DeviceRegistration register_device_memory(ibv_pd* pd, void* ptr, size_t bytes, int access);
void deregister_device_memory(DeviceRegistration* reg);

}  // namespace ina::rdma
