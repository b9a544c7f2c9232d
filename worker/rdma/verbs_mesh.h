// VerbsMesh: a host::Context over RDMA verbs, one reliable-connected (RC) queue pair per peer,
// built through a rendezvous Store (the same role as TcpMesh, with the same semantics: see
// worker/host/context.h). Built with the rdma feature (libibverbs from rdma-core).
//
// Setup: open the device (VerbsMeshOptions::device, else the first with an active port), one
// protection domain, one completion queue, and per peer an RC queue pair and a slot ring in one
// registered region. The incarnation of the mesh is the store counter "verbs/incarnation/<rank>"
// (each rank's n-th mesh of a job meets the others' n-th), so a rebuilt mesh never reads stale
// keys; the store given should already be scoped to the job (PrefixStore "ina/job<N>").
// Each rank publishes one VerbsPeerInfo per peer ("verbs/<inc>/qp/<from>/<to>": LID/GID, QPN,
// PSN, MTU, the rkeys of its receive slots and credit word), reads the peers' ones, moves its
// queue pairs to RTR then RTS (path MTU: the smaller of the two ports), then publishes
// "verbs/<inc>/ready/<rank>" and waits for every peer's, so no write reaches a queue pair not yet
// ready to receive it. A rank missing within the timeout is named by the store's error.
//
// Device buffers: a CUDA device pointer passed to isend is read by the NIC straight from GPU
// memory when its allocation registers (gpudirect.h: dmabuf, else peer memory); registrations are
// cached per allocation (keyed by CUDA's buffer id, at most kMaxCachedMrs, the least recently
// used one unused by a pending send evicted) and released with the mesh. Otherwise, and for
// every irecv into device memory, chunks are staged through the host slots with cuMemcpy.
//
// Data: messages are cut into chunks of at most slot_bytes (verbs_proto.h). A chunk is copied into
// the local staging slot (or, for a CUDA device buffer registered through GPUDirect, read by the
// NIC straight from GPU memory) and written with RDMA WRITE WITH IMMEDIATE into the peer's
// receive slot of the same index; the immediate carries its length and a last flag. The receiver
// copies a chunk into the posted irecv buffer in order, then RDMA-writes its cumulative consumed
// counter into the sender's credit word; the sender posts a chunk only while that slot is free on
// both sides (credit-based flow control), so messages of any size stream through `slots` slots.
// Progress happens in wait(), which polls the completion queue and the credit words (busy polling,
// yielding the CPU between empty rounds) until the awaited operation completes or the timeout
// expires: "rank 3 did not send within 5000 ms". A failed completion names the peer of its queue
// pair ("rank 3: RDMA write failed: transport retry counter exceeded").
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ina/base/features.h"
#include "ina/base/status.h"
#include "worker/host/context.h"
#include "worker/host/store.h"
#include "worker/rdma/verbs_proto.h"

struct ibv_context;
struct ibv_pd;
struct ibv_cq;
struct ibv_qp;
struct ibv_mr;
struct ibv_wc;

namespace ina::rdma {

struct VerbsMeshOptions {
  std::string device;  // ibv device name ("mlx5_0"); empty: the first with an active port
  uint8_t port = 0;    // HCA port; 0: the first active one
  int gid_index = 0;   // GID table index (RoCE v2 usually wants the IPv4-mapped entry)
  uint32_t slot_bytes = 256 * 1024;          // chunk size
  uint32_t slots = 16;                       // receive slots per peer (credits)
  std::chrono::milliseconds timeout{30000};  // setup, and every wait
};

// Number of verbs devices, and why none can be used (empty when some exists):
// "no RDMA device: ibv_get_device_list found 0".
int verbs_device_count(std::string* why);

// The verbs devices of this machine (in libina-verbs.so; libina's features::probe_rdma asks it).
features::Probe probe_verbs();

class VerbsMesh final : public host::Context {
 public:
  static Result<std::unique_ptr<VerbsMesh>> connect(host::Store& store, int rank, int size,
                                                    const VerbsMeshOptions& opts);
  ~VerbsMesh() override;
  VerbsMesh(const VerbsMesh&) = delete;
  VerbsMesh& operator=(const VerbsMesh&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) override { timeout_ = t; }

  // Host or CUDA device buffers (device ones through GPUDirect when the NIC can register them,
  // else staged through host memory; see gpudirect.h).
  Handle isend(int peer, const void* buf, size_t bytes) override;
  Handle irecv(int peer, void* buf, size_t bytes) override;
  Status wait(Handle h) override;

  const Status& error() const { return broken_; }
  const std::string& device_name() const { return device_name_; }

 private:
  struct Op;
  struct Peer;
  struct Resources;

  VerbsMesh(int rank, int size, const VerbsMeshOptions& opts);
  Handle post(int peer, bool is_send, uint8_t* buf, size_t bytes);
  Status progress();
  Status progress_sends(int peer);
  Status progress_recvs(int peer);
  Status post_credit(int peer);
  Status handle_completion(const ibv_wc& wc);
  Status fail(Status s);
  Status timeout_error(const Op& op) const;
  void release_op(Op* op);
  // A cached registration of the allocation holding device buffer `p` (GPUDirect), or null when
  // the NIC cannot register it (the op is staged through host memory).
  ibv_mr* device_mr(const void* p, uint64_t* cache_key);

  struct CachedMr;

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  uint32_t slot_bytes_;
  uint32_t slots_;
  std::string device_name_;
  std::unique_ptr<Resources> res_;
  std::vector<Peer> peers_;
  std::unordered_map<Handle, std::unique_ptr<Op>> ops_;
  std::vector<CachedMr> mr_cache_;  // device allocations registered with the NIC
  uint64_t mr_clock_ = 0;           // for least-recently-used eviction
  Handle next_handle_ = 1;
  Status broken_;
};

}  // namespace ina::rdma
