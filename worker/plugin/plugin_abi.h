// The optional transports as plugin libraries, loaded at run time (plugin_loader.h): libina itself
// needs only libc, libstdc++, libm and libgcc_s, and a node without DPDK, rdma-core, libxdp or CUDA
// loads it and runs the kernel-UDP path and the host mesh over TCP.
//
//   libina-dpdk.so   INA_TRANSPORT=dpdk     links DPDK's shared libraries
//   libina-xdp.so    INA_TRANSPORT=xdp      links libxdp and libbpf
//   libina-verbs.so  INA_HOST_TRANSPORT    links libibverbs (the CUDA driver by dlopen, GPUDirect)
//   libina-cuda.so   device buffers         links the CUDA runtime statically (cudart_static)
//
// Why plugins and not dlopen of the system libraries (NCCL's ibvwrap): DPDK's fast path
// (rte_eth_rx_burst, rte_pktmbuf_alloc, rte_ring_*) and xsk's rings are static inline functions
// over exported data (rte_eth_fp_ops, the mempool ops table, per-lcore TLS), and the PMDs register
// from constructors of their own libraries: no table of dlsym'd function pointers can stand in
// for them. A plugin compiles the transport against the real headers and links the real libraries,
// as before; only where it is linked changes. One mechanism serves all four.
//
// The contract. Each plugin exports one symbol, ina_plugin_entry (plugin.map hides the rest: no
// copy of DPDK glue, of the CUDA runtime or of the protocol code it carries can clash with the
// application's). It returns a PluginHeader whose first four fields never move: libina checks
// magic, abi, version and layout before reading further. C++ objects cross the boundary (Status,
// Config, the option structs, Transport, host::Context, DeviceOps), so a plugin is only accepted
// from the same libina version, the same kPluginAbi and the same layout fingerprint of those
// types: meson install puts the four beside libina.so together.
//
// What plugins link, and global state. A plugin links its transport's sources and the stateless
// protocol code they use (Status, frame parsing: copies, hidden, harmless). The one piece of
// global state they touch, the log level, is not copied: plugin_log.cc replaces protocol/log.cc in
// every plugin and forwards INA_LOG's level() and write() to libina's through PluginHost, passed
// at attach, so INA_LOG_LEVEL and log::set_level act on plugin messages too. Per-transport state
// (the EAL, DpdkPort, the CUDA driver handle of GPUDirect, the CUDA runtime) lives in its plugin
// only: one copy per process. Objects a plugin creates are destroyed through their virtual
// destructors, i.e. by plugin code; plugins are never unloaded. A plugin imports no libina
// symbol: libina's objects it is given (the rendezvous host::Store, Config, option structs) are
// reached through their virtual functions or plain fields, logging through PluginHost.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>

#include "ina/base/features.h"
#include "ina/base/log.h"
#include "ina/base/status.h"
#include "ina/ina.hpp"
#include "worker/device/device_ops.h"
#include "worker/host/context.h"
#include "worker/host/store.h"
#include "worker/rdma/verbs_mesh.h"
#include "worker/transport/dpdk_transport.h"
#include "worker/transport/transport.h"
#include "worker/transport/xdp_transport.h"

namespace ina::worker::plugin {

inline constexpr uint32_t kPluginMagic = 0x50414e49;  // "INAP"
// Bump on any change to the structs below or to the types they pass (a Transport virtual added,
// a field of an option struct, ...).
inline constexpr uint32_t kPluginAbi = 1;

// sizeof of the C++ types that cross, folded: a cheap guard against a plugin compiled against
// other headers than this libina (the version and kPluginAbi catch the rest).
constexpr uint64_t layout_fingerprint(std::initializer_list<uint64_t> sizes) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t s : sizes) h = (h ^ s) * 1099511628211ull;
  return h;
}
inline constexpr uint64_t kLayout = layout_fingerprint(
    {sizeof(Config), sizeof(Status), sizeof(Result<int>), sizeof(features::Probe),
     sizeof(DpdkTransportOptions), sizeof(XdpTransportOptions), sizeof(rdma::VerbsMeshOptions),
     sizeof(std::string), sizeof(std::unique_ptr<Transport>)});

// libina's services for its plugins.
struct PluginHost {
  uint32_t size;  // sizeof(PluginHost)
  log::Level (*log_level)();
  void (*log_write)(log::Level, const char* component, const char* fmt, ...)
      __attribute__((format(printf, 3, 4)));
};

struct DpdkApi {
  Result<std::unique_ptr<Transport>> (*create)(const DpdkTransportOptions& opts);
};
struct XdpApi {
  features::Probe (*probe)();
  Result<std::unique_ptr<Transport>> (*create)(const XdpTransportOptions& opts);
};
struct VerbsApi {
  features::Probe (*probe)();
  Result<std::unique_ptr<host::Context>> (*connect)(host::Store& store, int rank, int size,
                                                    const rdma::VerbsMeshOptions& opts);
};
struct CudaApi {
  std::unique_ptr<DeviceOps> (*make_device_ops)();
};

struct PluginHeader {
  // Fixed for every ABI: read before anything else.
  uint32_t magic;       // kPluginMagic
  uint32_t abi;         // kPluginAbi
  const char* version;  // INA_VERSION
  uint64_t layout;      // kLayout of the plugin's headers
  // Valid once the checks passed.
  const char* name;                        // "dpdk", "xdp", "verbs", "cuda"
  void (*attach)(const PluginHost* host);  // called once, before the api is used
  const void* api;                         // DpdkApi, XdpApi, VerbsApi or CudaApi
};

}  // namespace ina::worker::plugin

// The plugin's only export.
extern "C" const ina::worker::plugin::PluginHeader* ina_plugin_entry();
