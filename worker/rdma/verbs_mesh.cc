// VerbsMesh: the host collectives' Context over RDMA verbs RC queue pairs (see verbs_mesh.h).
//
// Length: queue-pair setup (the RC state machine over the store) and the data path share the
// QP table and its memory registrations; split them if a second verbs Context appears.
#include "worker/rdma/verbs_mesh.h"

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "ina/base/log.h"
#include "worker/host/socket.h"
#include "worker/rdma/gpudirect.h"

namespace ina::rdma {

namespace {

using Clock = std::chrono::steady_clock;

// wr_id: the peer in the upper bits, the kind of work request in the low byte.
enum WrKind : uint64_t { kData = 1, kCredit = 2, kRecv = 3 };
uint64_t wr_id(int peer, WrKind k) { return (static_cast<uint64_t>(peer) << 8) | k; }
int wr_peer(uint64_t id) { return static_cast<int>(id >> 8); }
WrKind wr_kind(uint64_t id) { return static_cast<WrKind>(id & 0xFF); }

std::string rank_name(int r) { return "rank " + std::to_string(r); }

Status verbs_errno(const std::string& what, int err) {
  return unavailable(what + ": " + std::strerror(err != 0 ? err : EIO));
}

int mtu_bytes(int mtu) { return 128 << mtu; }  // IBV_MTU_256 = 1

// Per-peer layout of the registered region: the credit word (written by the peer), the source
// of our own credit writes, then `slots` staging slots and `slots` receive slots.
constexpr size_t kHeaderBytes = 64;

}  // namespace

int verbs_device_count(std::string* why) {
  int n = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) {
    if (why != nullptr)
      *why = errno == ENOSYS || errno == 0
                 ? std::string("no RDMA device: ibv_get_device_list found 0 (kernel has no RDMA)")
                 : std::string("no RDMA device: ibv_get_device_list: ") + std::strerror(errno);
    return 0;
  }
  ibv_free_device_list(list);
  if (n == 0 && why != nullptr) *why = "no RDMA device: ibv_get_device_list found 0";
  return n;
}

struct VerbsMesh::Op {
  int peer = -1;
  bool is_send = false;
  bool complete = false;
  bool device = false;  // a CUDA device buffer
  uint8_t* buf = nullptr;
  size_t bytes = 0;
  size_t chunks = 0;       // chunk_count(bytes)
  size_t chunks_done = 0;  // sends: posted; receives: copied out
  uint64_t last_seq = 0;   // sends: the ring sequence of the last chunk
  ibv_mr* mr = nullptr;    // zero-copy device sends: the cached registration it uses
  uint64_t mr_key = 0;     // its cache key (CUDA buffer id)
};

struct VerbsMesh::CachedMr {
  uint64_t key = 0;
  DeviceRegistration reg;
  int in_use = 0;  // pending sends reading through it
  uint64_t last_use = 0;
};

namespace {
constexpr size_t kMaxCachedMrs = 32;
}  // namespace

struct VerbsMesh::Peer {
  ibv_qp* qp = nullptr;
  uint32_t psn = 0;
  uint8_t* header = nullptr;  // in the region: credit word at +0, credit source at +8
  uint8_t* send_slots = nullptr;
  uint8_t* recv_slots = nullptr;
  VerbsPeerInfo remote;
  SendWindow send_window{1};
  RecvWindow recv_window{1};
  int sq_outstanding = 0;  // signalled work requests not yet completed
  bool credit_inflight = false;
  std::deque<Op*> sends;      // posted, chunks left to post
  std::deque<Op*> zero_copy;  // all chunks posted from device memory, awaiting completions
  std::deque<Op*> recvs;
  std::deque<uint32_t> arrived;  // immediates of chunks landed, not yet consumed
  volatile uint64_t* credit_word() { return reinterpret_cast<volatile uint64_t*>(header); }
  uint64_t* credit_src() { return reinterpret_cast<uint64_t*>(header + 8); }
};

struct VerbsMesh::Resources {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  uint8_t* region = nullptr;
  size_t region_bytes = 0;
  uint8_t port = 0;
  ibv_port_attr port_attr{};
  ibv_gid gid{};
  int sq_cap = 0;

  ~Resources() {
    if (mr != nullptr) ibv_dereg_mr(mr);
    std::free(region);
    if (cq != nullptr) ibv_destroy_cq(cq);
    if (pd != nullptr) ibv_dealloc_pd(pd);
    if (ctx != nullptr) ibv_close_device(ctx);
  }
};

VerbsMesh::VerbsMesh(int rank, int size, const VerbsMeshOptions& opts)
    : rank_(rank),
      size_(size),
      timeout_(opts.timeout),
      slot_bytes_(opts.slot_bytes),
      slots_(opts.slots),
      res_(std::make_unique<Resources>()),
      peers_(static_cast<size_t>(size)) {}

VerbsMesh::~VerbsMesh() {
  for (Peer& p : peers_)
    if (p.qp != nullptr) ibv_destroy_qp(p.qp);  // no more DMA into or out of any buffer
  for (auto& [h, op] : ops_) release_op(op.get());
  for (CachedMr& c : mr_cache_) deregister_device_memory(&c.reg);
  res_.reset();  // memory region, CQ, PD, device (in that order)
}

namespace {

// Opens the named device, or the first with an active port; fills the port and its attributes.
Status open_device(const VerbsMeshOptions& opts, ibv_context** ctx, uint8_t* port,
                   ibv_port_attr* attr, std::string* name) {
  std::string why;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) {
    if (list != nullptr) ibv_free_device_list(list);
    (void)verbs_device_count(&why);
    return failed_precondition("VerbsMesh: " + why);
  }
  std::string tried;
  for (int i = 0; i < n && *ctx == nullptr; ++i) {
    const std::string dev = ibv_get_device_name(list[i]);
    if (!opts.device.empty() && dev != opts.device) continue;
    ibv_context* c = ibv_open_device(list[i]);
    if (c == nullptr) {
      tried += " " + dev + " (open: " + std::strerror(errno) + ")";
      continue;
    }
    ibv_device_attr da{};
    if (ibv_query_device(c, &da) != 0) da.phys_port_cnt = 1;
    for (uint8_t p = 1; p <= da.phys_port_cnt; ++p) {
      if (opts.port != 0 && p != opts.port) continue;
      ibv_port_attr pa{};
      if (ibv_query_port(c, p, &pa) == 0 && pa.state == IBV_PORT_ACTIVE) {
        *ctx = c;
        *port = p;
        *attr = pa;
        *name = dev;
        break;
      }
    }
    if (*ctx == nullptr) {
      tried += " " + dev + " (no active port)";
      ibv_close_device(c);
    }
  }
  ibv_free_device_list(list);
  if (*ctx != nullptr) return ok_status();
  if (!opts.device.empty() && tried.empty())
    return failed_precondition("VerbsMesh: no RDMA device named \"" + opts.device + "\"");
  return failed_precondition("VerbsMesh: no usable RDMA device:" + tried);
}

Status to_init(ibv_qp* qp, uint8_t port) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  const int r =
      ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  return r == 0 ? ok_status() : verbs_errno("ibv_modify_qp(INIT)", r);
}

Status to_rtr_rts(ibv_qp* qp, uint8_t port, const ibv_port_attr& pa, int gid_index, uint32_t my_psn,
                  const VerbsPeerInfo& peer, const std::string& name) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<int>(pa.active_mtu, peer.mtu));
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = port;
  a.ah_attr.dlid = peer.lid;
  // RoCE (and IB without LIDs) route by GID in the global route header.
  if (peer.has_gid() && (pa.link_layer == IBV_LINK_LAYER_ETHERNET || peer.lid == 0)) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
    a.ah_attr.grh.hop_limit = 64;
  }
  int r = ibv_modify_qp(qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (r != 0) return verbs_errno(name + ": ibv_modify_qp(RTR)", r);
  ibv_qp_attr s{};
  s.qp_state = IBV_QPS_RTS;
  s.timeout = 14;  // 4.096 us * 2^14 = 67 ms per try
  s.retry_cnt = 7;
  s.rnr_retry = 7;  // infinite: the receive ring is always posted, RNR only while reposting
  s.sq_psn = my_psn;
  s.max_rd_atomic = 1;
  r = ibv_modify_qp(qp, &s,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  return r == 0 ? ok_status() : verbs_errno(name + ": ibv_modify_qp(RTS)", r);
}

Status post_recv(ibv_qp* qp, int peer) {
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = wr_id(peer, kRecv);
  wr.num_sge = 0;  // RDMA WRITE WITH IMMEDIATE: the data goes to the slot, the WR carries the imm
  const int r = ibv_post_recv(qp, &wr, &bad);
  return r == 0 ? ok_status() : verbs_errno(rank_name(peer) + ": ibv_post_recv", r);
}

}  // namespace

Result<std::unique_ptr<VerbsMesh>> VerbsMesh::connect(host::Store& store, int rank, int size,
                                                      const VerbsMeshOptions& opts) {
  if (size < 1 || rank < 0 || rank >= size)
    return invalid_argument("VerbsMesh: rank " + std::to_string(rank) + " outside world of " +
                            std::to_string(size));
  if (opts.slot_bytes < 1 || opts.slot_bytes > VerbsPeerInfo::kMaxSlotBytes)
    return invalid_argument("VerbsMesh: slot_bytes " + std::to_string(opts.slot_bytes) +
                            " out of range [1, " + std::to_string(VerbsPeerInfo::kMaxSlotBytes) +
                            "]");
  if (opts.slots < 1 || opts.slots > VerbsPeerInfo::kMaxSlots)
    return invalid_argument("VerbsMesh: slots " + std::to_string(opts.slots) +
                            " out of range [1, " + std::to_string(VerbsPeerInfo::kMaxSlots) + "]");
  auto mesh = std::unique_ptr<VerbsMesh>(new VerbsMesh(rank, size, opts));
  Resources& res = *mesh->res_;
  INA_RETURN_IF_ERROR(open_device(opts, &res.ctx, &res.port, &res.port_attr, &mesh->device_name_));
  if (size == 1) return mesh;
  const auto deadline = Clock::now() + opts.timeout;
  auto left = [&] {
    return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                    std::chrono::milliseconds(1));
  };

  if (ibv_query_gid(res.ctx, res.port, opts.gid_index, &res.gid) != 0)
    std::memset(&res.gid, 0, sizeof(res.gid));
  res.pd = ibv_alloc_pd(res.ctx);
  if (res.pd == nullptr) return verbs_errno("ibv_alloc_pd", errno);
  const int peers = size - 1;
  res.sq_cap = static_cast<int>(opts.slots) + 2;  // data writes in flight + one credit write
  res.cq = ibv_create_cq(res.ctx, peers * (res.sq_cap + static_cast<int>(opts.slots)), nullptr,
                         nullptr, 0);
  if (res.cq == nullptr) return verbs_errno("ibv_create_cq", errno);

  // Rounded to 64 bytes so that every peer's credit word is aligned for 8-byte RDMA writes.
  const size_t per_peer =
      (kHeaderBytes + 2 * static_cast<size_t>(opts.slots) * opts.slot_bytes + 63) & ~size_t{63};
  res.region_bytes = ((per_peer * static_cast<size_t>(size)) + 4095) & ~size_t{4095};
  res.region = static_cast<uint8_t*>(std::aligned_alloc(4096, res.region_bytes));
  if (res.region == nullptr)
    return resource_exhausted("VerbsMesh: cannot allocate " + std::to_string(res.region_bytes) +
                              " bytes of slots");
  std::memset(res.region, 0, res.region_bytes);
  res.mr = ibv_reg_mr(res.pd, res.region, res.region_bytes,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (res.mr == nullptr) return verbs_errno("ibv_reg_mr(slots)", errno);

  // Each rank's n-th mesh of this job meets the others' n-th.
  INA_ASSIGN_OR_RETURN(int64_t incarnation,
                       store.add("verbs/incarnation/" + std::to_string(rank), 1));
  std::random_device rd;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    Peer& peer = mesh->peers_[static_cast<size_t>(p)];
    peer.header = res.region + per_peer * static_cast<size_t>(p);
    peer.send_slots = peer.header + kHeaderBytes;
    peer.recv_slots = peer.send_slots + static_cast<size_t>(opts.slots) * opts.slot_bytes;
    peer.send_window = SendWindow(opts.slots);
    peer.recv_window = RecvWindow(opts.slots);
    peer.psn = rd() & 0xFFFFFF;
    ibv_qp_init_attr qa{};
    qa.send_cq = res.cq;
    qa.recv_cq = res.cq;
    qa.qp_type = IBV_QPT_RC;
    qa.sq_sig_all = 1;
    qa.cap.max_send_wr = static_cast<uint32_t>(res.sq_cap);
    qa.cap.max_recv_wr = opts.slots;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    peer.qp = ibv_create_qp(res.pd, &qa);
    if (peer.qp == nullptr) return verbs_errno(rank_name(p) + ": ibv_create_qp", errno);
    INA_RETURN_IF_ERROR(to_init(peer.qp, res.port));
    for (uint32_t i = 0; i < opts.slots; ++i) INA_RETURN_IF_ERROR(post_recv(peer.qp, p));

    VerbsPeerInfo me;
    me.world_size = static_cast<uint32_t>(size);
    me.from_rank = static_cast<uint32_t>(rank);
    me.to_rank = static_cast<uint32_t>(p);
    me.lid = res.port_attr.lid;
    std::memcpy(me.gid, res.gid.raw, 16);
    me.port = res.port;
    me.mtu = static_cast<uint8_t>(res.port_attr.active_mtu);
    me.qpn = peer.qp->qp_num;
    me.psn = peer.psn;
    me.slots_addr = reinterpret_cast<uintptr_t>(peer.recv_slots);
    me.slots_rkey = res.mr->rkey;
    me.slot_bytes = opts.slot_bytes;
    me.slot_count = opts.slots;
    me.credit_addr = reinterpret_cast<uintptr_t>(peer.header);
    me.credit_rkey = res.mr->rkey;
    INA_RETURN_IF_ERROR(
        store.set(peer_info_key(static_cast<uint64_t>(incarnation), rank, p), me.serialize()));
  }
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    Peer& peer = mesh->peers_[static_cast<size_t>(p)];
    const std::string name = rank_name(p);
    Result<host::Bytes> b =
        store.get(peer_info_key(static_cast<uint64_t>(incarnation), p, rank), left());
    if (!b.ok())
      return Status(b.status().code(), "VerbsMesh: rank " + std::to_string(rank) + ": " + name +
                                           " did not publish its queue pair info (" +
                                           b.status().message() + ")");
    INA_ASSIGN_OR_RETURN(peer.remote, VerbsPeerInfo::parse(*b, name + "'s queue pair info"));
    const VerbsPeerInfo& r = peer.remote;
    if (r.world_size != static_cast<uint32_t>(size) || r.from_rank != static_cast<uint32_t>(p) ||
        r.to_rank != static_cast<uint32_t>(rank))
      return invalid_argument(
          name + "'s queue pair info is for rank " + std::to_string(r.from_rank) + " -> " +
          std::to_string(r.to_rank) + " of " + std::to_string(r.world_size) + ", expected " +
          std::to_string(p) + " -> " + std::to_string(rank) + " of " + std::to_string(size));
    if (r.slot_bytes != opts.slot_bytes || r.slot_count != opts.slots)
      return invalid_argument(name + " uses " + std::to_string(r.slot_count) + " slots of " +
                              std::to_string(r.slot_bytes) + " bytes, this rank " +
                              std::to_string(opts.slots) + " of " +
                              std::to_string(opts.slot_bytes));
    INA_RETURN_IF_ERROR(
        to_rtr_rts(peer.qp, res.port, res.port_attr, opts.gid_index, peer.psn, r, name));
    INA_DEBUG("rdma", "rank %d -> rank %d: qpn %u -> %u, mtu %d, %s", rank, p, peer.qp->qp_num,
              r.qpn, mtu_bytes(std::min<int>(res.port_attr.active_mtu, r.mtu)),
              r.lid != 0 ? "lid" : "gid");
  }
  INA_RETURN_IF_ERROR(
      store.set(ready_key(static_cast<uint64_t>(incarnation), rank), host::to_bytes("1")));
  std::vector<std::string> ready;
  for (int p = 0; p < size; ++p)
    if (p != rank) ready.push_back(ready_key(static_cast<uint64_t>(incarnation), p));
  INA_RETURN_IF_ERROR(store.wait(ready, left()));
  INA_DEBUG("rdma", "rank %d: verbs mesh of %d ranks on %s port %u, %u slots of %u bytes per peer",
            rank, size, mesh->device_name_.c_str(), res.port, opts.slots, opts.slot_bytes);
  return mesh;
}

void VerbsMesh::release_op(Op* op) {
  if (op->mr == nullptr) return;
  for (CachedMr& c : mr_cache_)
    if (c.key == op->mr_key) --c.in_use;
  op->mr = nullptr;
}

ibv_mr* VerbsMesh::device_mr(const void* p, uint64_t* cache_key) {
  Result<DeviceAllocation> a = device_allocation(p);
  if (!a.ok()) {
    INA_DEBUG("rdma", "device buffer %p: host staging (%s)", p, a.status().message().c_str());
    return nullptr;
  }
  for (CachedMr& c : mr_cache_) {
    if (c.key == a->buffer_id) {
      if (c.reg.mr == nullptr) return nullptr;  // known not to register: staged
      ++c.in_use;
      c.last_use = ++mr_clock_;
      *cache_key = c.key;
      return c.reg.mr;
    }
  }
  if (mr_cache_.size() >= kMaxCachedMrs) {
    auto victim = mr_cache_.end();
    for (auto it = mr_cache_.begin(); it != mr_cache_.end(); ++it)
      if (it->in_use == 0 && (victim == mr_cache_.end() || it->last_use < victim->last_use))
        victim = it;
    if (victim == mr_cache_.end()) return nullptr;  // all in use: stage this one
    deregister_device_memory(&victim->reg);
    mr_cache_.erase(victim);
  }
  CachedMr c;
  c.key = a->buffer_id;
  c.reg = register_device_memory(res_->pd, a->base, a->bytes, IBV_ACCESS_LOCAL_WRITE);
  c.last_use = ++mr_clock_;
  if (c.reg.mr != nullptr) c.in_use = 1;
  mr_cache_.push_back(std::move(c));
  if (mr_cache_.back().reg.mr == nullptr) return nullptr;
  *cache_key = a->buffer_id;
  return mr_cache_.back().reg.mr;
}

host::Context::Handle VerbsMesh::post(int peer, bool is_send, uint8_t* buf, size_t bytes) {
  const Handle h = next_handle_++;
  if (!broken_.ok()) return h;  // not in ops_: wait() reports broken_
  if (peer < 0 || peer >= size_ || peer == rank_) {
    (void)fail(invalid_argument("VerbsMesh: bad peer " + std::to_string(peer)));
    return h;
  }
  auto op = std::make_unique<Op>();
  op->peer = peer;
  op->is_send = is_send;
  op->buf = buf;
  op->bytes = bytes;
  op->chunks = chunk_count(bytes, slot_bytes_);
  op->device = bytes > 0 && is_device_pointer(buf);
  if (op->device && is_send) {
    // GPUDirect: the NIC reads the chunks from GPU memory (else they are staged through host).
    op->mr = device_mr(buf, &op->mr_key);
  }
  Peer& p = peers_[static_cast<size_t>(peer)];
  (is_send ? p.sends : p.recvs).push_back(op.get());
  ops_.emplace(h, std::move(op));
  if (is_send) {
    // Start streaming at once: the peer can progress while this rank computes.
    Status s = progress_sends(peer);
    if (!s.ok()) (void)fail(std::move(s));
  }
  return h;
}

host::Context::Handle VerbsMesh::isend(int peer, const void* buf, size_t bytes) {
  return post(peer, true, static_cast<uint8_t*>(const_cast<void*>(buf)), bytes);
}

host::Context::Handle VerbsMesh::irecv(int peer, void* buf, size_t bytes) {
  return post(peer, false, static_cast<uint8_t*>(buf), bytes);
}

Status VerbsMesh::fail(Status s) {
  if (broken_.ok()) broken_ = std::move(s);
  // Stop the NIC from touching user buffers (zero-copy sends) before they are forgotten.
  for (Peer& p : peers_) {
    if (p.qp != nullptr) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      (void)ibv_modify_qp(p.qp, &a, IBV_QP_STATE);
    }
    p.sends.clear();
    p.zero_copy.clear();
    p.recvs.clear();
  }
  for (auto& [h, op] : ops_) release_op(op.get());
  ops_.clear();
  return broken_;
}

// Posts the next chunks of the queued sends while credits and send-queue room allow.
Status VerbsMesh::progress_sends(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.sends.empty()) return ok_status();
  INA_RETURN_IF_ERROR(
      p.send_window.on_remote_consumed(__atomic_load_n(p.credit_word(), __ATOMIC_ACQUIRE)));
  while (!p.sends.empty() && p.send_window.can_post() && p.sq_outstanding < res_->sq_cap - 1) {
    Op* op = p.sends.front();
    const size_t i = op->chunks_done;
    const size_t len = chunk_length(op->bytes, slot_bytes_, i);
    const bool last = i + 1 == op->chunks;
    const uint32_t slot = p.send_window.next_slot();
    ibv_sge sge{};
    if (op->mr != nullptr) {
      sge.addr = reinterpret_cast<uintptr_t>(op->buf + i * slot_bytes_);
      sge.lkey = op->mr->lkey;
    } else {
      uint8_t* staging = p.send_slots + static_cast<size_t>(slot) * slot_bytes_;
      if (op->device) {
        INA_RETURN_IF_ERROR(copy_device_to_host(staging, op->buf + i * slot_bytes_, len));
      } else if (len > 0) {
        std::memcpy(staging, op->buf + i * slot_bytes_, len);
      }
      sge.addr = reinterpret_cast<uintptr_t>(staging);
      sge.lkey = res_->mr->lkey;
    }
    sge.length = static_cast<uint32_t>(len);
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = wr_id(peer, kData);
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(encode_imm(len, last));
    wr.sg_list = &sge;
    wr.num_sge = len > 0 ? 1 : 0;
    wr.wr.rdma.remote_addr = p.remote.slots_addr + static_cast<uint64_t>(slot) * slot_bytes_;
    wr.wr.rdma.rkey = p.remote.slots_rkey;
    const int r = ibv_post_send(p.qp, &wr, &bad);
    if (r != 0) return verbs_errno(rank_name(peer) + ": ibv_post_send", r);
    const uint64_t seq = p.send_window.on_post();
    ++p.sq_outstanding;
    ++op->chunks_done;
    if (last) {
      p.sends.pop_front();
      op->last_seq = seq;
      if (op->mr != nullptr) {
        p.zero_copy.push_back(op);  // the NIC still reads the user's buffer
      } else {
        op->complete = true;  // the data is in the staging slots
      }
    }
  }
  return ok_status();
}

// Writes our consumed counter into the peer's credit word (one such write in flight per peer).
Status VerbsMesh::post_credit(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.recv_window.credit_due() || p.credit_inflight || p.sq_outstanding >= res_->sq_cap)
    return ok_status();
  *p.credit_src() = p.recv_window.on_credit_posted();
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(p.credit_src());
  sge.length = 8;
  sge.lkey = res_->mr->lkey;
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = wr_id(peer, kCredit);
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;  // the source stays unchanged until this completes
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = p.remote.credit_addr;
  wr.wr.rdma.rkey = p.remote.credit_rkey;
  const int r = ibv_post_send(p.qp, &wr, &bad);
  if (r != 0) return verbs_errno(rank_name(peer) + ": ibv_post_send(credit)", r);
  p.credit_inflight = true;
  ++p.sq_outstanding;
  return ok_status();
}

// Copies the landed chunks into the posted receives, in order, checking their sizes.
Status VerbsMesh::progress_recvs(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  while (!p.recvs.empty() && !p.arrived.empty()) {
    Op* op = p.recvs.front();
    const ChunkImm c = decode_imm(p.arrived.front());
    INA_RETURN_IF_ERROR(check_chunk(c, op->bytes, slot_bytes_, op->chunks_done, rank_name(peer)));
    const uint8_t* slot =
        p.recv_slots + static_cast<size_t>(p.recv_window.next_slot()) * slot_bytes_;
    uint8_t* dst = op->buf + op->chunks_done * slot_bytes_;
    if (op->device) {
      INA_RETURN_IF_ERROR(copy_host_to_device(dst, slot, c.length));
    } else if (c.length > 0) {
      std::memcpy(dst, slot, c.length);
    }
    p.arrived.pop_front();
    p.recv_window.on_consume();
    ++op->chunks_done;
    if (c.last) {
      op->complete = true;
      p.recvs.pop_front();
    }
  }
  return post_credit(peer);
}

Status VerbsMesh::handle_completion(const ibv_wc& wc) {
  const int peer = wr_peer(wc.wr_id);
  const WrKind kind = wr_kind(wc.wr_id);
  if (peer < 0 || peer >= size_ || peer == rank_)
    return internal_error("VerbsMesh: completion with a bad wr_id " + std::to_string(wc.wr_id));
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (wc.status != IBV_WC_SUCCESS) {
    const char* what = kind == kData ? "RDMA write" : kind == kCredit ? "credit write" : "receive";
    return unavailable(rank_name(peer) + ": " + what + " failed: " + ibv_wc_status_str(wc.status));
  }
  switch (kind) {
    case kData: {
      --p.sq_outstanding;
      INA_RETURN_IF_ERROR(p.send_window.on_local_complete());
      while (!p.zero_copy.empty() && p.zero_copy.front()->last_seq < p.send_window.local_done()) {
        Op* op = p.zero_copy.front();
        p.zero_copy.pop_front();
        release_op(op);
        op->complete = true;
      }
      return ok_status();
    }
    case kCredit:
      --p.sq_outstanding;
      p.credit_inflight = false;
      return ok_status();
    case kRecv:
      if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || (wc.wc_flags & IBV_WC_WITH_IMM) == 0)
        return internal_error(rank_name(peer) + ": a receive completed without an immediate");
      if (decode_imm(ntohl(wc.imm_data)).length != wc.byte_len)
        return internal_error(rank_name(peer) + ": a chunk of " + std::to_string(wc.byte_len) +
                              " bytes announced " +
                              std::to_string(decode_imm(ntohl(wc.imm_data)).length));
      INA_RETURN_IF_ERROR(p.recv_window.on_arrival());
      p.arrived.push_back(ntohl(wc.imm_data));
      return post_recv(p.qp, peer);
  }
  return internal_error("VerbsMesh: completion of unknown kind");
}

Status VerbsMesh::progress() {
  ibv_wc wcs[32];
  const int n = ibv_poll_cq(res_->cq, 32, wcs);
  if (n < 0) return internal_error("ibv_poll_cq failed");
  for (int i = 0; i < n; ++i) INA_RETURN_IF_ERROR(handle_completion(wcs[i]));
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    INA_RETURN_IF_ERROR(progress_recvs(r));
    INA_RETURN_IF_ERROR(progress_sends(r));
  }
  return ok_status();
}

Status VerbsMesh::timeout_error(const Op& op) const {
  return deadline_exceeded(rank_name(op.peer) +
                           (op.is_send ? " did not receive" : " did not send") + " within " +
                           std::to_string(timeout_.count()) + " ms");
}

Status VerbsMesh::wait(Handle h) {
  if (h == 0) return ok_status();
  if (!broken_.ok()) return broken_;
  auto it = ops_.find(h);
  if (it == ops_.end()) return ok_status();  // already waited
  Op* op = it->second.get();
  const auto deadline = Clock::now() + timeout_;
  unsigned idle = 0;
  while (!op->complete) {
    Status s = progress();
    if (!s.ok()) return fail(std::move(s));
    if (op->complete) break;
    if (Clock::now() >= deadline) return fail(timeout_error(*op));
    // Busy-poll for the latency; yield the core after a while (the CPU is shared with training).
    if (++idle > 256) sched_yield();
  }
  ops_.erase(it);
  return ok_status();
}

}  // namespace ina::rdma
