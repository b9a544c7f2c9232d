// Test plugins for plugin_loader_test: libina-fake.so, a well-formed plugin whose "transport"
// only logs (at info) and fails, and libina-stale.so (FAKE_STALE), the same with another plugin
// ABI, as a plugin left from an older libina would be.
#include "ina/base/log.h"
#include "worker/plugin/plugin_side.h"

namespace ina::worker::plugin {
namespace {

Result<std::unique_ptr<Transport>> create(const DpdkTransportOptions& o) {
  INA_INFO("fake", "fake plugin create, local port %u", static_cast<unsigned>(o.local_port));
  return unavailable("the fake plugin has no transport");
}

const DpdkApi kApi{&create};

const PluginHeader* header() {
#ifdef FAKE_STALE
  static const PluginHeader h{kPluginMagic, kPluginAbi + 1, INA_VERSION, kLayout,
                              "stale",      &attach_host,   &kApi};
#else
  static const PluginHeader h{kPluginMagic, kPluginAbi,   INA_VERSION, kLayout,
                              "fake",       &attach_host, &kApi};
#endif
  return &h;
}

}  // namespace
}  // namespace ina::worker::plugin

extern "C" __attribute__((visibility("default"))) const ina::worker::plugin::PluginHeader*
ina_plugin_entry() {
  return ina::worker::plugin::header();
}
