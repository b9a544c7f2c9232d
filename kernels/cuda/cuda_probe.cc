// CUDA runtime probe: is there a device this process can use?
#include "ina/kernels/cuda_probe.h"

#include <cuda_runtime_api.h>

#include <string>

namespace ina::features {

Probe probe_cuda() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    return {true, false, std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err)};
  }
  if (n == 0) return {true, false, "no CUDA device"};
  cudaDeviceProp prop{};
  std::string name = cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.name : "?";
  return {true, true, std::to_string(n) + " device(s), first: " + name};
}

}  // namespace ina::features
