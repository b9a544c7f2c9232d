// libina-cuda.so: DeviceOps on the CUDA runtime (device buffers, CUDA streams) as a plugin
// (plugin_abi.h). The runtime is linked statically and stays local to the plugin (plugin.map).
#include "worker/device/device_ops.h"
#include "worker/plugin/plugin_side.h"

namespace ina::worker::plugin {
namespace {

const CudaApi kApi{&make_cuda_runtime_device_ops};

}  // namespace
}  // namespace ina::worker::plugin

INA_DEFINE_PLUGIN("cuda", ina::worker::plugin::kApi)
