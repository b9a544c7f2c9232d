// The DPDK feature's probe (ina_aggregator_core): the DPDK version it was built with. Defined by
// dpdk_probe.cc, or dpdk_probe_none.cc without DPDK.
#pragma once

#include "ina/base/features.h"

namespace ina::features {

Probe probe_dpdk();

}  // namespace ina::features
