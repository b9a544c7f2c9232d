// The host mesh of a communicator: the rendezvous store (the application's, or INA_STORE's
// TcpStore served by rank 0), the host transport every rank agrees on (INA_HOST_TRANSPORT: TCP or
// RDMA verbs), and the mesh connected over it.
#pragma once

#include <memory>

#include "ina/base/status.h"
#include "ina/ina.hpp"
#include "worker/host/context.h"
#include "worker/host/store.h"

namespace ina::worker {

// Connects the host mesh of `cfg`'s job; *store receives the TcpStore when this rank serves or
// uses INA_STORE's (it must outlive the mesh), and stays null with an external store.
Result<std::unique_ptr<host::Context>> connect_mesh(const Config& cfg,
                                                    std::unique_ptr<host::TcpStore>* store);

}  // namespace ina::worker
