// The DPDK backend of ina-aggregator as a plugin: libina-aggregator-dpdk.so holds dpdk_main.cc,
// the DPDK port, lcore and control code and links DPDK's libraries; ina-aggregator loads it with
// dlopen only when --backend dpdk asks for it, so the kernel-UDP aggregator needs no DPDK library
// at load time (libina loads its DPDK transport the same way: worker/plugin/).
//
// The module and the program come from one build: the call carries INA_VERSION and the size of
// DpdkCliOptions, and the module refuses a call from another build (the options cross as a C++
// object, not as a stable ABI). The module has its own copy of the logging state: the call
// carries the program's log level.
#pragma once

#include <atomic>
#include <cstdint>

#include "aggregator/dpdk_main.h"
#include "ina/base/features.h"

namespace ina::agg {

constexpr const char* kDpdkPluginName = "libina-aggregator-dpdk.so";
constexpr const char* kDpdkPluginEntry = "ina_aggregator_dpdk_main";

struct DpdkPluginCall {
  uint32_t size = sizeof(DpdkPluginCall);
  const char* version = nullptr;  // INA_VERSION of the caller
  uint32_t options_size = sizeof(DpdkCliOptions);
  int log_level = 2;  // ina::log::Level
  const DpdkCliOptions* options = nullptr;
  const std::atomic<bool>* stop = nullptr;
};

// The module's entry point (extern "C", the only symbol it exports).
using DpdkPluginEntry = int (*)(const DpdkPluginCall*);

// Program side: loads the module (INA_AGGREGATOR_PLUGIN_DIR when set, else by name through the
// program's run path: the build folder, or libdir once installed) and runs run_dpdk_aggregator() in
// it. Returns the process exit code; a module that cannot be loaded is exit code 1 with an error
// naming the library and dlerror()'s reason (e.g. a missing librte_eal.so).
int run_dpdk_plugin(const DpdkCliOptions& o, const std::atomic<bool>& stop);

// For --version: whether the module loads here, and the DPDK version it was built with.
features::Probe probe_dpdk_plugin();

}  // namespace ina::agg
