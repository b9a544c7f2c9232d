// The probes of libina's optional transports (loaded as plugins): RDMA verbs (ibv_get_device_list)
// and AF_XDP (libxdp's version). Defined by plugin/transports.cc, which loads the plugin and asks
// it, or, without the feature, says how to build it.
#pragma once

#include "ina/base/features.h"

namespace ina::features {

Probe probe_rdma();
Probe probe_xdp();

}  // namespace ina::features
