// Loading libina's transport plugins (plugin_abi.h) at run time, when the configuration asks for
// their transport, as NCCL loads libibverbs and the CUDA driver.
//
// Where: INA_PLUGIN_DIR when set (that directory only); else beside the module that holds
// libina's code (dladdr: libina.so, libina-mpi.so, libnccl-net-ina.so, or a program linking
// worker_core), then by file name through the dynamic linker's search (LD_LIBRARY_PATH, the
// caller's RUNPATH, ld.so.cache). A plugin found beside libina that fails to load is the answer:
// no other copy is tried behind it. meson install puts the plugins in libdir beside libina.so.
//
// Each plugin is loaded once per process (RTLD_NOW | RTLD_LOCAL), checked (magic, plugin ABI,
// libina version, layout of the types that cross), attached to libina's logging, and never
// unloaded. A failure is a Status, never an abort: kFailedPrecondition naming what wanted the
// plugin, the library and dlerror()'s reason, e.g.
//   "INA_TRANSPORT=dpdk: cannot load the DPDK transport plugin libina-dpdk.so:
//    /usr/lib/libina-dpdk.so: librte_eal.so.23: cannot open shared object file: No such file or
//    directory"
// Failures are not cached: a later call tries again.
#pragma once

#include <string>

#include "worker/plugin/plugin_abi.h"

namespace ina::worker::plugin {

// "libina-dpdk.so" for "dpdk".
std::string library_name(const char* name);

// The plugin `name` ("dpdk", "xdp", "verbs", "cuda"), loaded and checked. `what` prefixes the
// errors ("INA_TRANSPORT=dpdk: ...", none when empty) and `description` names it ("the DPDK
// transport plugin").
Result<const PluginHeader*> load(const char* name, const std::string& what,
                                 const char* description);

template <class Api>
Result<const Api*> api(const char* name, const std::string& what, const char* description) {
  INA_ASSIGN_OR_RETURN(const PluginHeader* h, load(name, what, description));
  return static_cast<const Api*>(h->api);
}

// Checks a plugin's header against this libina; the error names `path` and both sides.
Status check_header(const PluginHeader* h, const char* name, const std::string& path);

}  // namespace ina::worker::plugin

namespace ina::worker {

// The plugin-backed factories libina's communicator uses (transports.cc).
Result<std::unique_ptr<Transport>> create_dpdk_transport(const DpdkTransportOptions& o);
Result<std::unique_ptr<Transport>> create_xdp_transport(const XdpTransportOptions& o);
Result<std::unique_ptr<host::Context>> connect_verbs_mesh(host::Store& store, int rank, int size,
                                                          const rdma::VerbsMeshOptions& o);

}  // namespace ina::worker
