// The host mesh through the job's rendezvous store (mesh_connect.h).
#include "worker/mesh_connect.h"

#include <optional>
#include <string>
#include <vector>

#include "ina/base/features.h"
#include "ina/base/log.h"
#include "worker/config_internal.h"
#include "worker/host/mesh_address.h"
#include "worker/host/tcp_mesh.h"
#include "worker/plugin/plugin_loader.h"
#include "worker/plugin/probes.h"
#include "worker/rdma/verbs_proto.h"

namespace ina::worker {

Result<std::unique_ptr<host::Context>> connect_mesh(const Config& cfg,
                                                    std::unique_ptr<host::TcpStore>* store) {
  const features::Probe rdma_probe = features::probe_rdma();
  INA_ASSIGN_OR_RETURN(HostTransport transport,
                       rdma::choose_host_transport(cfg.host_transport, rdma_probe.built,
                                                   rdma_probe.usable, rdma_probe.detail));
  // The rendezvous: the application's store (no TcpStore of our own), or INA_STORE's TcpStore,
  // served by rank 0 while the communicator lives.
  std::optional<host::ExternalStoreAdapter> external;
  host::Store* base = nullptr;
  if (cfg.external_store != nullptr) {
    external.emplace(*cfg.external_store);
    base = &*external;
  } else {
    std::string host;
    uint16_t port = 0;
    INA_RETURN_IF_ERROR(parse_host_port(cfg.store, "INA_STORE", &host, &port));
    host::TcpStoreOptions so;
    so.host = host;
    so.port = port;
    so.is_server = cfg.rank == 0;
    so.connect_timeout = cfg.timeout;
    Result<std::unique_ptr<host::TcpStore>> ts = host::TcpStore::create(so);
    if (!ts.ok()) {
      return Status(ts.status().code(),
                    "the rendezvous store " + cfg.store +
                        " (INA_STORE, or MASTER_ADDR:MASTER_PORT): " + ts.status().message());
    }
    *store = std::move(ts).value();
    base = store->get();
  }
  host::PrefixStore prefixed("ina/job" + std::to_string(cfg.job), *base);
  // The ranks agree on one transport (their machines may differ): see agree_host_transport.
  if (cfg.world_size > 1) {
    const rdma::TransportVote mine{transport, cfg.host_transport};
    INA_RETURN_IF_ERROR(prefixed.set("transport/" + std::to_string(cfg.rank),
                                     host::to_bytes(rdma::encode_vote(mine))));
    std::vector<rdma::TransportVote> votes;
    for (int r = 0; r < cfg.world_size; ++r) {
      INA_ASSIGN_OR_RETURN(host::Bytes b,
                           prefixed.get("transport/" + std::to_string(r), cfg.timeout));
      INA_ASSIGN_OR_RETURN(
          rdma::TransportVote v,
          rdma::decode_vote(host::to_string(b), "rank " + std::to_string(r) + "'s host transport"));
      votes.push_back(v);
    }
    INA_ASSIGN_OR_RETURN(transport, rdma::agree_host_transport(votes));
  }
  INA_DEBUG("worker", "rank %d: host transport %s (INA_HOST_TRANSPORT=%s; rdma: %s)", cfg.rank,
            rdma::host_transport_name(transport), rdma::host_transport_name(cfg.host_transport),
            rdma_probe.detail.c_str());
  if (transport == HostTransport::kVerbs) {  // libina-verbs.so (plugin_loader.h)
    INA_ASSIGN_OR_RETURN(rdma::VerbsSelection sel,
                         rdma::parse_verbs_selection(cfg.verbs_device.c_str(), nullptr));
    rdma::VerbsMeshOptions vo;
    vo.device = sel.device;
    vo.port = sel.port;
    vo.gid_index = cfg.verbs_gid_index;
    vo.timeout = cfg.timeout;
    return connect_verbs_mesh(prefixed, cfg.rank, cfg.world_size, vo);
  }
  host::MeshAddressInputs mi;
  mi.mesh_addr = cfg.mesh_address;
  mi.ifname = cfg.mesh_interface;
  if (cfg.external_store == nullptr || !cfg.store.empty()) {
    std::string host;
    uint16_t port = 0;
    if (parse_host_port(cfg.store, "INA_STORE", &host, &port).ok()) {
      mi.store_host = host;
      mi.store_port = port;
    }
  }
  INA_ASSIGN_OR_RETURN(host::MeshAddress where, host::find_mesh_address(mi));
  INA_DEBUG("worker", "rank %d: mesh address %s (%s)", cfg.rank, where.address.c_str(),
            where.how.c_str());
  host::TcpMeshOptions mo;
  mo.address = where.address;
  mo.timeout = cfg.timeout;
  INA_ASSIGN_OR_RETURN(std::unique_ptr<host::TcpMesh> tm,
                       host::TcpMesh::connect(prefixed, cfg.rank, cfg.world_size, mo));
  return std::unique_ptr<host::Context>(std::move(tm));
}

}  // namespace ina::worker
