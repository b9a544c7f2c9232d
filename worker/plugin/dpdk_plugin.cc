// libina-dpdk.so: the DPDK transport (INA_TRANSPORT=dpdk) as a plugin (plugin_abi.h).
#include "worker/plugin/plugin_side.h"
#include "worker/transport/dpdk_transport.h"

namespace ina::worker::plugin {
namespace {

Result<std::unique_ptr<Transport>> create(const DpdkTransportOptions& opts) {
  Result<std::unique_ptr<DpdkTransport>> t = DpdkTransport::create(opts);
  if (!t.ok()) return t.status();
  return std::unique_ptr<Transport>(std::move(t).value());
}

const DpdkApi kApi{&create};

}  // namespace
}  // namespace ina::worker::plugin

INA_DEFINE_PLUGIN("dpdk", ina::worker::plugin::kApi)
