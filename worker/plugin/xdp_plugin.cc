// libina-xdp.so: the AF_XDP transport (INA_TRANSPORT=xdp) as a plugin (plugin_abi.h).
#include "worker/plugin/plugin_side.h"
#include "worker/transport/xdp_transport.h"

namespace ina::worker::plugin {
namespace {

Result<std::unique_ptr<Transport>> create(const XdpTransportOptions& opts) {
  Result<std::unique_ptr<XdpTransport>> t = XdpTransport::create(opts);
  if (!t.ok()) return t.status();
  return std::unique_ptr<Transport>(std::move(t).value());
}

const XdpApi kApi{&probe_libxdp, &create};

}  // namespace
}  // namespace ina::worker::plugin

INA_DEFINE_PLUGIN("xdp", ina::worker::plugin::kApi)
