// The plugin side of plugin_abi.h: the entry point every plugin defines with INA_DEFINE_PLUGIN,
// and the logging that forwards to libina (plugin_log.cc, which replaces protocol/log.cc in the
// plugins: no second log level).
#pragma once

#include "ina_config.h"
#include "worker/plugin/plugin_abi.h"

namespace ina::worker::plugin {

// Remembers libina's services; INA_LOG in the plugin goes through them from then on.
void attach_host(const PluginHost* host);

}  // namespace ina::worker::plugin

// Defines ina_plugin_entry for the plugin `name` with `api` (a DpdkApi, XdpApi, ... object).
#define INA_DEFINE_PLUGIN(name, api)                                                             \
  extern "C" __attribute__((visibility("default"))) const ::ina::worker::plugin::PluginHeader*   \
  ina_plugin_entry() {                                                                           \
    static const ::ina::worker::plugin::PluginHeader header{::ina::worker::plugin::kPluginMagic, \
                                                            ::ina::worker::plugin::kPluginAbi,   \
                                                            INA_VERSION,                         \
                                                            ::ina::worker::plugin::kLayout,      \
                                                            name,                                \
                                                            &::ina::worker::plugin::attach_host, \
                                                            &(api)};                             \
    return &header;                                                                              \
  }
