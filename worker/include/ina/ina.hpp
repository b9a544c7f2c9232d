// libina: the INA worker library, C++ API. (The C ABI is ina/ina.h.)
//
//   auto cfg = ina::Config::from_env();                // INA_RANK, INA_WORLD_SIZE, INA_AGGREGATOR..
//   auto comm = ina::Communicator::create(*cfg);       // joins the job: a barrier with all ranks
//   ina::Status s = (*comm)->allreduce(grad, grad, n, ina::DType::kFloat32, ina::ReduceOp::kSum);
//
// Errors come back as Status (no exceptions): kInvalidArgument for bad arguments,
// kDeadlineExceeded with the missing ranks named when a collective cannot finish in time,
// kUnavailable when the aggregator never answers. With a host mesh (Config::store) a lost or
// missing aggregator is not an error: AllReduce completes on the host path (fallback) and the
// communicator probes the aggregator again with backoff; see communicator.cc.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ina/protocol/key.h"
#include "ina/base/status.h"
#include "ina/protocol/types.h"

namespace ina {

// Test hooks for the worker's I/O: drop or duplicate datagrams at random (seeded), and delay
// this rank before each AllReduce (a straggler): always by delay_us, and by straggle_delay_us
// more in straggle_percent of the collectives (an intermittent straggler, seeded). Read from
// INA_TEST_DROP_PERCENT, INA_TEST_DUP_PERCENT, INA_TEST_DELAY_US and
// INA_TEST_STRAGGLE=prob_percent:delay_us by Config::from_env.
struct FaultInjection {
  double drop_send_percent = 0;
  double drop_recv_percent = 0;
  double dup_send_percent = 0;
  uint32_t delay_us = 0;
  double straggle_percent = 0;
  uint32_t straggle_delay_us = 0;
  uint64_t seed = 0;  // 0: derived from the rank
};

// How an AllReduce that runs on the host path (no aggregator) reduces floats.
//   kExact  the host reduces the same quantized int32 words the aggregator would (per block of
//           block_elems: the MAX of the ranks' exponents, encode, int32 sum/min/max, decode), so
//           the output is bitwise identical to the in-network one. Costs an extra small
//           AllReduce of per-block exponents and flags, and int32 scratch of the buffer's count.
//   kFloat  the host reduces the floats themselves in IEEE float32 arithmetic along its
//           algorithm's chain (float16/bfloat16/float8 widened to float32 and rounded once at
//           the end: float32 words on the wire). Not bitwise identical, and not more precise in general:
//           when ranks cancel, float32's partial-sum roundings can exceed the in-network bound
//           (docs/integrating.md, INA_FALLBACK).
// int32 is reduced the same way in both.
enum class FallbackMode : uint8_t { kExact = 0, kFloat = 1 };

// A rendezvous store the application already has (PyTorch's c10d::Store, an MPI job's own
// exchange). With Config::external_store set, the host mesh meets through it instead of through
// libina's TcpStore, which would otherwise serve INA_STORE / MASTER_ADDR:MASTER_PORT itself and
// collide with the launcher's store on the same port. libina writes keys under "ina/job<J>/"
// (mesh addresses, the host-transport vote, verbs queue pair info). It calls the store only
// inside Communicator::create, from the creating thread.
// The C ABI's form is ina_store_t (ina.h).
class ExternalStore {
 public:
  virtual ~ExternalStore() = default;
  virtual Status set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Waits up to `timeout` for `key` (kDeadlineExceeded if it never appears), returns its value.
  virtual Result<std::vector<uint8_t>> get(const std::string& key,
                                           std::chrono::milliseconds timeout) = 0;
};
// The peer transport of the host collectives (INA_HOST_TRANSPORT=auto|tcp|verbs):
//   kAuto   RDMA verbs when libina was built with the rdma feature and the machine has an RDMA
//           device, else TCP.
//   kTcp    the TCP mesh.
//   kVerbs  RC queue pairs over RDMA verbs; creating the communicator fails naming the reason
//           when the feature is not built or no device exists.
enum class HostTransport : uint8_t { kAuto = 0, kTcp = 1, kVerbs = 2 };

// The in-network path's transport (INA_TRANSPORT=auto|udp|dpdk|xdp|host):
//   kAuto, kUdp  kernel UDP sockets, one per aggregator (auto is udp today).
//   kDpdk, kXdp  the kernel-bypass transports (libina-dpdk.so, libina-xdp.so), configured by their
//                own fields (Config::local_ip ..., from INA_LOCAL_*, INA_DPDK_*, INA_XDP_*); one
//                aggregator per process.
//   kHost        no aggregator: every collective on the host mesh (sets Config::host_only).
// A Config built in code keeps kAuto, so it never starts DPDK or binds AF_XDP by surprise.
enum class AggregatorTransport : uint8_t { kAuto = 0, kUdp = 1, kDpdk = 2, kXdp = 3, kHost = 4 };

// One aggregator's data-plane address (Config::aggregators).
struct AggregatorAddress {
  std::string host;
  uint16_t port = 0;
};

struct Config {
  int rank = -1;
  int world_size = 0;
  std::string aggregator_host = "127.0.0.1";
  uint16_t aggregator_port = 47474;
  JobId job = 1;
  // The job's 128-bit key (INA_JOB_KEY: 32 hex digits; or the controller's): every packet is
  // sealed with it and every reply verified. Zero: none configured (sealed with the zero key).
  Key128 job_key;
  uint32_t block_elems = 2048;   // 4-byte elements per packet, 1 .. 16384 (lowered to one
                                 // datagram on the path to the aggregator, and by the aggregator)
  uint32_t window = 128;         // slots in flight, 1 .. 32768 (the aggregator may lower it)
  std::chrono::milliseconds timeout{30000};       // deadline of one collective (and of joining)
  std::chrono::microseconds retransmit{2000};     // first retransmission timeout
  FaultInjection fault;

  // Host path (host collectives over a TCP mesh, and the fallback of AllReduce).
  // store: the rendezvous "host:port" (INA_STORE, else MASTER_ADDR:MASTER_PORT); rank 0 serves
  // it. Empty: no host mesh, so no fallback and no host-only collectives (allgather, ...).
  std::string store;
  // This rank listens on and publishes it (INA_MESH_ADDR). Empty: found when the mesh forms, as
  // Gloo and NCCL find theirs: mesh_interface's address (INA_SOCKET_IFNAME, below), else the
  // local address that routes to the store's host, else 127.0.0.1.
  std::string mesh_address;
  FallbackMode fallback = FallbackMode::kExact;  // INA_FALLBACK=exact|float
  // Never use the aggregator: every collective runs on the host mesh (needs `store`).
  // INA_TRANSPORT=host, or INA_AGGREGATOR and INA_CONTROLLER unset while a store is set.
  bool host_only = false;
  // Borrowed, must outlive Communicator::create; null: the mesh uses `store` as above. When set,
  // it replaces `store` for the rendezvous (no TcpStore is started) and enables the host mesh.
  ExternalStore* external_store = nullptr;
  HostTransport host_transport = HostTransport::kAuto;  // INA_HOST_TRANSPORT=auto|tcp|verbs

  // Device buffers (CUDA): elements per chunk of the staging pipeline (0: 512 blocks; rounded up
  // to whole blocks; INA_DEVICE_CHUNK_ELEMS) and pinned staging buffers in rotation (1 .. 16;
  // INA_DEVICE_BUFFERS). 3, one per stage (copy in, network, copy out), overlaps all three when
  // they take equally long; 2 (double buffering) leaves a stage idle then.
  uint64_t device_chunk_elems = 0;
  uint32_t device_buffers = 3;
  // The host algorithms' cost model, "alpha_us,beta_ns_per_byte[,gamma_ns_per_byte]"
  // (INA_COST_MODEL, e.g. "25,0.5"). Empty: measured when the mesh comes up (a short exchange
  // with the ring neighbours; the slowest rank's figures, agreed by every rank).
  std::string cost_model;

  // Admission through ina-controller (INA_CONTROLLER=host:port, default port 47480): the
  // controller gives the job id, key and aggregator, overriding aggregator_host/port, job and
  // job_key; a refusal (no capacity) runs every collective on the host mesh. Every rank asks
  // with the same job_name (INA_JOB_NAME, else the rendezvous `store` address), and gets the
  // same admission. Empty controller_host: static configuration.
  std::string controller_host;
  uint16_t controller_port = 0;
  // Controller replicas (INA_CONTROLLER=h1:p1,h2:p2,...): admission asks them in turn until one
  // answers (any replica forwards to the leader; a failover is waited out within the admission
  // timeout). The first is controller_host:controller_port. Empty: that one alone.
  std::vector<AggregatorAddress> controllers;
  std::string job_name;

  // A job sharded over several aggregators (INA_AGGREGATOR=h1:p1,h2:p2,...; a controller's
  // "shards K" admission): 2 .. 64 distinct addresses in shard order, each serving the job (same
  // id and key). A collective of n blocks is split into K contiguous block ranges, range k =
  // blocks [floor(k n / K), floor((k + 1) n / K)), each an ordinary in-network AllReduce on
  // aggregators[k], the ranges concurrently; float SUM results are bitwise those of one
  // aggregator. Empty: the job's one aggregator is aggregator_host:aggregator_port (a single
  // entry is used instead of them). The last field, so the others keep their offsets.
  std::vector<AggregatorAddress> aggregators;

  // Read by from_env like every other field (and checked by validate), so that a bad value is an
  // error naming the variable instead of a silent default. After `aggregators`, so the fields
  // above keep their offsets.
  AggregatorTransport transport = AggregatorTransport::kAuto;  // INA_TRANSPORT
  std::string host_algorithm;  // INA_ALGO=ring|hd|tree: the host AllReduce; empty: cost model
  std::string verbs_device;    // INA_VERBS_DEVICE=name[:port]; empty: the first active port
  int verbs_gid_index = 0;     // INA_VERBS_GID_INDEX, 0 .. 255

  // The kernel-bypass transports (transport kDpdk or kXdp; README). from_env rejects a malformed
  // value, validate a missing required one: local_ip for both, dpdk_args for dpdk, xdp_iface for
  // xdp. Unused by the other transports. Not in the C ABI's ina_config_t: the environment only.
  uint32_t local_ip = 0;  // INA_LOCAL_IP: this worker's IPv4 address, host order; 0: unset
  std::optional<std::array<uint8_t, 6>> local_mac;       // INA_LOCAL_MAC; unset: the port's
  std::optional<std::array<uint8_t, 6>> aggregator_mac;  // INA_AGGREGATOR_MAC; unset: ARP
  uint16_t local_port = 47500;  // INA_LOCAL_PORT: the UDP port base, rank r uses local_port + r
  std::vector<std::string> dpdk_args;  // INA_DPDK_ARGS, split at blanks: the EAL's arguments
  std::string dpdk_port;               // INA_DPDK_PORT: name or number; empty: the first port
  std::string xdp_iface;               // INA_XDP_IFACE: the interface to bind
  uint32_t xdp_queue = 0;              // INA_XDP_QUEUE
  bool xdp_copy = false;               // INA_XDP_COPY=1: skip the zero-copy attempt

  // Host AllToAll (after the fields above, which keep their offsets): INA_A2A_ALGO=pairwise|
  // bruck|hier forces the algorithm (empty: the cost model picks by block size and world size);
  // INA_A2A_GROUP=G groups consecutive ranks in nodes of G for the hierarchical algorithm (0:
  // LOCAL_WORLD_SIZE when the launcher sets it, as torchrun does; else no grouping). A group that
  // does not divide the world size leaves AllToAll flat.
  std::string alltoall_algorithm;
  int alltoall_group = 0;

  // INA_SOCKET_IFNAME: the interface whose address the host mesh uses when mesh_address is
  // empty (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME). Empty: the route to the store's host.
  std::string mesh_interface;
  // INA_REQUIRE_INC=1: an aggregator or controller that is configured but cannot serve (no
  // answer, a refused admission, a dead controller, a lost aggregator) is an error returned on
  // every rank, instead of a warning and the host path.
  bool require_inc = false;

  // Defaults overlaid with the environment (see ina/ina.h). A malformed variable is an
  // kInvalidArgument naming it and the expected form.
  static Result<Config> from_env();
  // from_env for an application that brings the host mesh's rendezvous itself (sets
  // external_store, or store, afterwards: PyTorch's backend, the MPI shim, the C ABI's
  // ina_comm_create_with_store): that store counts for the rules that depend on one, so without
  // INA_AGGREGATOR and INA_CONTROLLER every collective runs on the host mesh (host_only), as with
  // INA_STORE set.
  static Result<Config> from_env_with_store();
  // Checks ranges; names the first bad field.
  Status validate() const;
};

// Why Communicator::create(cfg) runs every collective on the host mesh without asking an
// aggregator or a controller (cfg.host_only: INA_TRANSPORT=host, a store without INA_AGGREGATOR
// and INA_CONTROLLER, or the application's choice); empty when cfg.host_only is false.
// Communicator::create logs it at info level.
std::string host_only_reason(const Config& cfg);

struct CommStats {
  uint64_t collectives = 0;
  uint64_t packets_sent = 0;
  uint64_t packets_received = 0;
  uint64_t retransmits = 0;
  uint64_t duplicate_results = 0;   // results for blocks already done
  uint64_t malformed = 0;           // datagrams that failed validation
  uint64_t nonfinite_blocks = 0;
  uint64_t error_reports = 0;
  uint64_t spurious_retransmits = 0; // resends whose original result arrived after all
  uint64_t rto_us = 0;              // current adaptive retransmission timeout
  uint64_t host_collectives = 0;    // collectives that ran on the host mesh (fallbacks included)
  uint64_t fallbacks = 0;           // in-network AllReduces redone on the host path
  uint64_t probes = 0;              // re-joins of a lost aggregator attempted
  uint64_t bad_tag = 0;             // replies whose tag the job's key does not give: dropped
  // In-network collectives that completed after this rank's deadline: the aggregator completed
  // every round this rank gave up on before its abort arrived (a late rank's block came first),
  // so this rank returns the result, as the late rank does.
  uint64_t late_completions = 0;
  // Resends of rounds presumed lost because a round sent after them got its result first (the
  // rest waited for their retransmission timer); included in `retransmits`. (New fields go at
  // the end: the earlier ones keep their offsets.)
  uint64_t fast_retransmits = 0;
};

// An asynchronous collective in flight (Communicator::allreduce_async). Destroying a request
// that has not completed detaches it: the collective still runs (its buffers stay in use until
// it completes, which the stream it was given orders), and a failure is only logged.
class Request {
 public:
  virtual ~Request() = default;
  // *done = true once the collective completed; then returns its Status (OK while pending).
  virtual Status test(bool* done) = 0;
  // Blocks until the collective completed and returns its Status.
  virtual Status wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  static Result<std::unique_ptr<Communicator>> create(const Config& cfg);

  // recv may equal send. Any count (0 allowed). float32/float16/bfloat16/int32 and float8
  // e4m3/e5m2 (ina/protocol/fp8.h; e4m3 results saturate at +-448); sum/min/max. float8 is not
  // carried in-network yet: it runs on the host mesh (kUnimplemented without one).
  // A call that fails may have written part of recv (blocks whose results had arrived): in
  // place, that part of the input is gone, as after a failed NCCL call. The communicator stays
  // usable (the next collective, called alike, works), but the failed call's buffer must be
  // refilled before it is reduced again.
  virtual Status allreduce(const void* send, void* recv, size_t count, DType dtype,
                           ReduceOp op) = 0;

  // AllReduce that returns at once; Request::wait (or test) gives its Status. send and recv
  // may be host or CUDA device memory (cudaPointerGetAttributes decides; device buffers need
  // the cuda feature). `cuda_stream` (a cudaStream_t; null: none) orders it as NCCL does: it
  // starts after the work enqueued on the stream before the call, and work enqueued on the stream
  // after the call waits for it. Asynchronous collectives run one at a time, in call order, on
  // the communicator's progress thread; the blocking calls wait for those already submitted.
  // allreduce itself also accepts device pointers (ordered after the default stream's work).
  virtual Result<std::unique_ptr<Request>> allreduce_async(const void* send, void* recv,
                                                           size_t count, DType dtype, ReduceOp op,
                                                           void* cuda_stream) = 0;

  // Host collectives, on the TCP mesh (they need Config::store; without it they return
  // kFailedPrecondition). Counts are in elements; every rank calls them in the same order.
  // allgather: recv holds size() * count elements, block i from rank i (send may be block rank()).
  virtual Status allgather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // reduce_scatter: send holds size() blocks of count; recv (count) gets the reduction of block
  // rank() (NCCL's ncclReduceScatter).
  virtual Status reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                ReduceOp op) = 0;
  // broadcast: count elements of root's buf into buf on every rank.
  virtual Status broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  virtual Status barrier() = 0;
  // alltoall: block j of send (count elements) goes to rank j; block i of recv is from rank i.
  // send and recv must not overlap.
  virtual Status alltoall(const void* send, void* recv, size_t count, DType dtype) = 0;
  // alltoallv: size() counts and displacements each, in elements; zero counts allowed;
  // recv_counts[i] must equal rank i's send_counts[rank()].
  virtual Status alltoallv(const void* send, const size_t* send_counts, const size_t* send_displs,
                           void* recv, const size_t* recv_counts, const size_t* recv_displs,
                           DType dtype) = 0;

  // True while AllReduce runs on the host mesh (host only, or after losing the aggregator).
  virtual bool on_host_path() const = 0;

  // Elements per block (packet) in use: the configured one, lowered to the aggregator's at join.
  virtual uint32_t block_elems() const = 0;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const CommStats& stats() const = 0;
};

}  // namespace ina
