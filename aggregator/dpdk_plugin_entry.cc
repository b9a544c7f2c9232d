// libina-aggregator-dpdk.so's entry point (see dpdk_plugin.h).
#include <cstdio>
#include <cstring>

#include "aggregator/dpdk_plugin.h"
#include "ina/base/log.h"
#include "ina_config.h"

extern "C" __attribute__((visibility("default"))) int ina_aggregator_dpdk_main(
    const ina::agg::DpdkPluginCall* call) {
  if (call == nullptr || call->size != sizeof(ina::agg::DpdkPluginCall) ||
      call->version == nullptr || std::strcmp(call->version, INA_VERSION) != 0 ||
      call->options_size != sizeof(ina::agg::DpdkCliOptions) || call->options == nullptr ||
      call->stop == nullptr) {
    std::fprintf(stderr,
                 "ina-aggregator: %s is from another build (ina %s) than the program (ina %s): "
                 "install both from one build\n",
                 ina::agg::kDpdkPluginName, INA_VERSION,
                 call != nullptr && call->version != nullptr ? call->version : "?");
    return 1;
  }
  ina::log::set_level(static_cast<ina::log::Level>(call->log_level));
  return ina::agg::run_dpdk_aggregator(*call->options, *call->stop);
}
