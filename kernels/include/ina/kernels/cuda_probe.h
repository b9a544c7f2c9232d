// The CUDA feature's probe (ina_kernels): built with -Dcuda, and a device this process can use
// (cudaGetDeviceCount). Defined by cuda/cuda_probe.cc, or cuda/cuda_probe_none.cc without CUDA.
#pragma once

#include "ina/base/features.h"

namespace ina::features {

Probe probe_cuda();

}  // namespace ina::features
