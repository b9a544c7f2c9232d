// What optional parts this build has (Meson features) and what the machine offers at run time: the
// result of a probe. Each probe is declared and defined by its own component, beside its feature's
// code, and compiled in only with that feature; without it a "not built" probe stands in:
// probe_cuda (kernels: ina/kernels/cuda_probe.h), probe_rdma and probe_xdp (worker:
// worker/plugin/probes.h), probe_dpdk (aggregator: aggregator/dpdk_probe.h). Tests use them to
// report a Meson SKIP with the reason.
#pragma once

#include <string>

namespace ina::features {

struct Probe {
  bool built = false;   // compiled with the feature
  bool usable = false;  // the machine can use it now (a device, a driver, permissions)
  std::string detail;   // why not, or what was found
};

// "cuda: built, not usable (no CUDA driver)"
std::string describe(const char* name, const Probe& p);

}  // namespace ina::features
