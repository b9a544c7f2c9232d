// libina-verbs.so: the RDMA verbs host mesh (INA_HOST_TRANSPORT=verbs or auto) and GPUDirect as
// a plugin (plugin_abi.h).
#include "worker/plugin/plugin_side.h"
#include "worker/rdma/verbs_mesh.h"

namespace ina::worker::plugin {
namespace {

Result<std::unique_ptr<host::Context>> connect(host::Store& store, int rank, int size,
                                               const rdma::VerbsMeshOptions& opts) {
  Result<std::unique_ptr<rdma::VerbsMesh>> m = rdma::VerbsMesh::connect(store, rank, size, opts);
  if (!m.ok()) return m.status();
  return std::unique_ptr<host::Context>(std::move(m).value());
}

const VerbsApi kApi{&rdma::probe_verbs, &connect};

}  // namespace
}  // namespace ina::worker::plugin

INA_DEFINE_PLUGIN("verbs", ina::worker::plugin::kApi)
