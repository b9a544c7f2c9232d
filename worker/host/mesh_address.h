// The address a rank listens on and publishes for the host mesh, found as Gloo and NCCL find
// theirs, so that a job across hosts forms its mesh with the launcher's variables alone:
//
//   1. INA_MESH_ADDR, when set: used as given.
//   2. INA_SOCKET_IFNAME=<interface>: that interface's first IPv4 address (else its first IPv6
//      address that is not link-local); an interface that does not exist or has no address is an
//      error naming it (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME).
//   3. The rendezvous store's host (INA_STORE, MASTER_ADDR): the local address the kernel routes
//      to it from, read back from a UDP socket connect()ed to it (no datagram is sent; Gloo's
//      tcp::attr from the store's address, NCCL's ncclFindInterfaceMatchSubnet). A store on
//      127.0.0.1 gives 127.0.0.1; on 10.0.0.1 across hosts, this host's address on that network.
//   4. Else 127.0.0.1 (a job on one host).
#pragma once

#include <cstdint>
#include <string>

#include "ina/base/status.h"

namespace ina::host {

// The local address that routes to host:port (numeric text, IPv4 or IPv6).
Result<std::string> source_address_towards(const std::string& host, uint16_t port);
// The interface's first IPv4 address, else its first IPv6 address that is not link-local.
Result<std::string> interface_address(const std::string& ifname);

struct MeshAddressInputs {
  std::string mesh_addr;   // INA_MESH_ADDR ("" when unset)
  std::string ifname;      // INA_SOCKET_IFNAME ("" when unset)
  std::string store_host;  // the rendezvous store's host ("" when none)
  uint16_t store_port = 0;
};
struct MeshAddress {
  std::string address;
  std::string how;  // "INA_MESH_ADDR", "INA_SOCKET_IFNAME=eth1", "the route to 10.0.0.1", ...
};
// Steps 1 to 4 above. A route that cannot be found (no route to the store's host, a name that
// does not resolve) keeps 127.0.0.1 and says why in `how`: the store's own connect reports it.
Result<MeshAddress> find_mesh_address(const MeshAddressInputs& in);

}  // namespace ina::host
