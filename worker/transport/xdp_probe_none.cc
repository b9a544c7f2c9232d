// Stand-in when the xdp feature is off.
#include "worker/plugin/probes.h"

namespace ina::features {

Probe probe_xdp() {
  return {false, false, "configure with -Dxdp=enabled, libxdp-dev and libbpf-dev"};
}

}  // namespace ina::features
