// What optional parts this build has (Meson features) and what the machine offers at run time.
// Each probe lives beside its feature's code and is compiled in only with that feature; without
// it a "not built" probe stands in. Tests use these to report a Meson SKIP with the reason.
#pragma once

#include <string>

namespace ina::features {

struct Probe {
  bool built = false;      // compiled with the feature
  bool usable = false;     // the machine can use it now (a device, a driver, permissions)
  std::string detail;      // why not, or what was found
};

// Each is defined in the library of its component: link that library to call it.
Probe probe_cuda();   // kernels/ (ina_kernels): cudaGetDeviceCount
Probe probe_rdma();   // worker/ (libina): ibv_get_device_list
Probe probe_xdp();    // worker/ (libina): libxdp's version
Probe probe_dpdk();   // aggregator/ (ina_aggregator_core): the DPDK version it was built with

// "cuda: built, not usable (no CUDA driver)"
std::string describe(const char* name, const Probe& p);

}  // namespace ina::features
