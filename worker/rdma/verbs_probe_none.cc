// Stand-in when the rdma feature is off.
#include "worker/plugin/probes.h"

namespace ina::features {

Probe probe_rdma() { return {false, false, "configure with -Drdma=enabled and libibverbs-dev"}; }

}  // namespace ina::features
