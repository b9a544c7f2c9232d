// Program side of the DPDK backend's plugin (see dpdk_plugin.h).
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "aggregator/dpdk_plugin.h"
#include "ina/base/log.h"
#include "ina_config.h"

namespace ina::agg {
namespace {

// dlopen of the module: INA_AGGREGATOR_PLUGIN_DIR/<name> when set, else <name> through the dynamic
// linker (the program's RUNPATH: the build folder, or libdir once installed; LD_LIBRARY_PATH).
void* open_module(std::string* path, std::string* error) {
  const char* dir = std::getenv("INA_AGGREGATOR_PLUGIN_DIR");
  *path = dir != nullptr && *dir != '\0' ? std::string(dir) + "/" + kDpdkPluginName
                                         : std::string(kDpdkPluginName);
  void* h = ::dlopen(path->c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = ::dlerror();
    *error = e != nullptr ? e : "unknown dlopen error";
  }
  return h;
}

}  // namespace

int run_dpdk_plugin(const DpdkCliOptions& o, const std::atomic<bool>& stop) {
  std::string path, error;
  void* h = open_module(&path, &error);
  if (h == nullptr) {
    INA_ERROR("aggregator",
              "--backend dpdk: cannot load the DPDK backend plugin %s: %s (install DPDK's "
              "libraries, e.g. Debian's dpdk, or use --backend udp)",
              path.c_str(), error.c_str());
    return 1;
  }
  auto entry = reinterpret_cast<DpdkPluginEntry>(::dlsym(h, kDpdkPluginEntry));
  if (entry == nullptr) {
    INA_ERROR("aggregator", "--backend dpdk: %s has no %s: not an ina-aggregator DPDK plugin",
              path.c_str(), kDpdkPluginEntry);
    return 1;
  }
  DpdkPluginCall call;
  call.version = INA_VERSION;
  call.log_level = static_cast<int>(ina::log::level());
  call.options = &o;
  call.stop = &stop;
  return entry(&call);  // the module stays loaded: DPDK's drivers are never unloaded
}

features::Probe probe_dpdk_plugin() {
  features::Probe p;
  p.built = true;
  std::string path, error;
  void* h = open_module(&path, &error);
  p.usable = h != nullptr && ::dlsym(h, kDpdkPluginEntry) != nullptr;
  p.detail = std::string("DPDK ") + INA_DPDK_VERSION + ", " + kDpdkPluginName +
             (p.usable ? " loads" : ": " + error) + "; loaded by --backend dpdk only";
  return p;
}

}  // namespace ina::agg
