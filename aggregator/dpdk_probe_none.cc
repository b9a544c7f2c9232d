// DPDK probe of a build without DPDK (Meson did not find libdpdk): the feature is not built.
#include "aggregator/dpdk_probe.h"

namespace ina::features {

Probe probe_dpdk() {
  Probe p;
  p.built = false;
  p.usable = false;
  p.detail = "configure with -Ddpdk=enabled and libdpdk-dev";
  return p;
}

}  // namespace ina::features
