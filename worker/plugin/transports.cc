// The optional transports in libina: each a call into its plugin (plugin_loader.h), made only
// when the configuration asks for the transport (INA_TRANSPORT=dpdk|xdp, INA_HOST_TRANSPORT,
// device buffers). Without the Meson feature, the probes and factories say how to build it.
#include "ina_config.h"
#include "worker/plugin/plugin_loader.h"
#include "worker/plugin/probes.h"

namespace ina {
namespace worker {
namespace {

[[maybe_unused]] Status not_built(const char* what, const char* feature, const char* how) {
  return invalid_argument(std::string(what) + ": this libina was built without " + feature + " (" +
                          how + ")");
}

}  // namespace

Result<std::unique_ptr<Transport>> create_dpdk_transport(const DpdkTransportOptions& o) {
#if INA_HAVE_DPDK
  INA_ASSIGN_OR_RETURN(
      const plugin::DpdkApi* api,
      plugin::api<plugin::DpdkApi>("dpdk", "INA_TRANSPORT=dpdk", "the DPDK transport plugin"));
  return api->create(o);
#else
  (void)o;
  return not_built("INA_TRANSPORT=dpdk", "DPDK", "meson -Ddpdk=enabled, libdpdk-dev");
#endif
}

Result<std::unique_ptr<Transport>> create_xdp_transport(const XdpTransportOptions& o) {
#if INA_HAVE_XDP
  INA_ASSIGN_OR_RETURN(
      const plugin::XdpApi* api,
      plugin::api<plugin::XdpApi>("xdp", "INA_TRANSPORT=xdp", "the AF_XDP transport plugin"));
  return api->create(o);
#else
  (void)o;
  return not_built("INA_TRANSPORT=xdp", "AF_XDP", "meson -Dxdp=enabled, libxdp-dev libbpf-dev");
#endif
}

Result<std::unique_ptr<host::Context>> connect_verbs_mesh(host::Store& store, int rank, int size,
                                                          const rdma::VerbsMeshOptions& o) {
#if INA_HAVE_RDMA
  INA_ASSIGN_OR_RETURN(
      const plugin::VerbsApi* api,
      plugin::api<plugin::VerbsApi>("verbs", "INA_HOST_TRANSPORT=verbs", "the RDMA verbs plugin"));
  return api->connect(store, rank, size, o);
#else
  (void)store, (void)rank, (void)size, (void)o;
  return not_built("INA_HOST_TRANSPORT=verbs", "RDMA verbs",
                   "meson -Drdma=enabled, libibverbs-dev");
#endif
}

std::unique_ptr<DeviceOps> make_cuda_device_ops() {
#if INA_HAVE_CUDA
  Result<const plugin::CudaApi*> api =
      plugin::api<plugin::CudaApi>("cuda", "device buffers", "the CUDA plugin");
  if (!api.ok()) return make_unavailable_device_ops(unavailable(api.status().message()));
  return api.value()->make_device_ops();
#else
  return make_unavailable_device_ops(unimplemented(
      "libina was built without CUDA (configure with -Dcuda=enabled and the CUDA toolkit): "
      "device buffers and CUDA streams are not supported"));
#endif
}

}  // namespace worker

namespace features {

#if INA_HAVE_RDMA
Probe probe_rdma() {
  Result<const worker::plugin::VerbsApi*> api =
      worker::plugin::api<worker::plugin::VerbsApi>("verbs", "", "the RDMA verbs plugin");
  if (!api.ok()) return {true, false, api.status().message()};
  return api.value()->probe();
}
#else
Probe probe_rdma() { return {false, false, "configure with -Drdma=enabled and libibverbs-dev"}; }
#endif

#if INA_HAVE_XDP
Probe probe_xdp() {
  Result<const worker::plugin::XdpApi*> api =
      worker::plugin::api<worker::plugin::XdpApi>("xdp", "", "the AF_XDP transport plugin");
  if (!api.ok()) return {true, false, api.status().message()};
  return api.value()->probe();
}
#else
Probe probe_xdp() {
  return {false, false, "configure with -Dxdp=enabled, libxdp-dev and libbpf-dev"};
}
#endif

}  // namespace features
}  // namespace ina
