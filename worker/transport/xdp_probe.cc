// AF_XDP probe, in libina-xdp.so (features::probe_xdp in libina loads the plugin and asks this):
// libxdp and libbpf resolved. Whether a given NIC queue can be bound (driver support, CAP_NET_RAW)
// is only known when a transport opens a socket on it.
#include <bpf/libbpf.h>
#include <xdp/libxdp.h>

#include "worker/transport/xdp_transport.h"

namespace ina::worker {

features::Probe probe_libxdp() {
  features::Probe p;
  p.built = true;
  // Calling into libxdp proves the shared library resolved at load time.
  char buf[32];
  (void)libxdp_strerror(0, buf, sizeof buf);
  p.usable = true;
  p.detail = std::string("libxdp, libbpf ") + libbpf_version_string();
  return p;
}

}  // namespace ina::worker
