// Stand-in when the cuda feature is off.
#include "ina/kernels/cuda_probe.h"

namespace ina::features {

Probe probe_cuda() { return {false, false, "configure with -Dcuda=enabled and the CUDA toolkit"}; }

}  // namespace ina::features
