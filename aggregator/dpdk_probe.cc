// DPDK probe, compiled when Meson found libdpdk: reports the DPDK version the aggregator was built
// against. Calling rte_version() needs no EAL initialisation (it returns a static string), so the
// probe is safe in any process; whether a port can be driven is decided when the EAL starts.
#include "aggregator/dpdk_probe.h"

#include <rte_version.h>

namespace ina::features {

Probe probe_dpdk() {
  Probe p;
  p.built = true;
  p.usable = true;
  p.detail = rte_version();
  return p;
}

}  // namespace ina::features
