// AF_XDP probe (xdp feature built): libxdp and libbpf are linked. Whether a given NIC queue can
// be bound (driver support, CAP_NET_RAW) is only known when a transport opens a socket on it.
#include <bpf/libbpf.h>
#include <xdp/libxdp.h>

#include "ina/protocol/features.h"

namespace ina::features {

Probe probe_xdp() {
  Probe p;
  p.built = true;
  // Calling into libxdp proves the shared library resolved at load time.
  char buf[32];
  (void)libxdp_strerror(0, buf, sizeof buf);
  p.usable = true;
  p.detail = std::string("libxdp, libbpf ") + libbpf_version_string();
  return p;
}

}  // namespace ina::features
