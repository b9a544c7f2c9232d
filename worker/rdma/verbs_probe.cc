// RDMA probe, in libina-verbs.so (features::probe_rdma in libina loads the plugin and asks this):
// lists the verbs devices this machine offers.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>

#include "worker/rdma/verbs_mesh.h"

namespace ina::rdma {

features::Probe probe_verbs() {
  features::Probe p;
  p.built = true;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) {
    // ENOSYS: the kernel has no RDMA support (no /sys/class/infiniband_verbs).
    p.detail = errno == ENOSYS
                   ? std::string("no RDMA device: ibv_get_device_list found 0 (kernel has no RDMA)")
                   : std::string("ibv_get_device_list: ") + std::strerror(errno);
    return p;
  }
  if (n == 0) {
    p.detail = "no RDMA device: ibv_get_device_list found 0";
  } else {
    p.usable = true;
    p.detail = "devices:";
    for (int i = 0; i < n; ++i) {
      p.detail += ' ';
      p.detail += ibv_get_device_name(list[i]);
    }
  }
  ibv_free_device_list(list);
  return p;
}

}  // namespace ina::rdma
