/* libina: the INA worker library, C ABI.
 *
 * A communicator joins one job of an aggregator; ina_allreduce() sums (or takes the MIN/MAX of)
 * a buffer over all ranks of the job in the network. Every call returns an ina_result_t; a call
 * that fails leaves a message in ina_comm_last_error(). Nothing here aborts, throws or keeps
 * global state: communicators are independent and may be used from different threads (one
 * thread per communicator at a time).
 *
 * Example (tests/ops/ina_h_doc.py compiles and links it against libina):
 *
 *   ina_config_t cfg = INA_CONFIG_INITIALIZER;  // every field from the environment
 *   ina_comm_t* comm = NULL;
 *   if (ina_comm_create(&cfg, &comm) != INA_SUCCESS) {
 *     fprintf(stderr, "ina: %s\n", ina_last_create_error());
 *     return 1;
 *   }
 *   float grad[1000] = {0};
 *   ina_result_t r = ina_allreduce(comm, grad, grad, 1000, INA_FLOAT32, INA_SUM);
 *   if (r != INA_SUCCESS) fprintf(stderr, "ina: %s\n", ina_comm_last_error(comm));
 *   ina_comm_destroy(comm);
 *
 * Environment (read by ina_comm_create and ina_comm_create_with_store for the fields a config
 * leaves unset: 0, -1 or NULL; tests/ops/ina_h_doc.py checks this list against the code):
 *   INA_RANK, INA_WORLD_SIZE     this rank and the job's size
 *   INA_AGGREGATOR=host:port     the aggregator (default port 47474); a comma-separated list
 *                                (h1:p1,h2:p2,...) shards the job over those aggregators: each
 *                                AllReduce is split into contiguous block ranges, one per
 *                                aggregator in list order, run concurrently
 *   INA_CONTROLLER=host:port     ask ina-controller for the job instead (admission): the
 *                                aggregator(s), job id, key, slots and block come from its answer;
 *                                refused or unreachable, the job runs on the host mesh when a
 *                                store is set (else ina_comm_create fails naming the reason)
 *   INA_JOB_NAME                 the job's name at the controller, the same on every rank
 *                                (default: derived from INA_STORE or MASTER_ADDR:MASTER_PORT)
 *   INA_JOB, INA_JOB_KEY         job id (default 1) and its 128-bit key, 32 hex digits (default:
 *                                none, the all-zero key, which authenticates nothing)
 *   INA_BLOCK_ELEMS, INA_WINDOW  elements per packet (default 2048, lowered to what the path
 *                                carries), slots in flight (default 128)
 *   INA_TIMEOUT_MS               deadline of one collective (default 30000)
 *   INA_RETRANSMIT_US            first retransmission timeout (default 2000, doubles, capped)
 *   INA_LOG_LEVEL                error, warn, info (default) or debug
 *   INA_PLUGIN_DIR               the folder of the optional transports' plugins (libina-dpdk.so,
 *                                libina-xdp.so, libina-verbs.so, libina-cuda.so), loaded when
 *                                asked for; default: beside libina.so, then by name (ld.so)
 *   INA_STORE=host:port          rendezvous of the host TCP mesh, the port required (else
 *                                MASTER_ADDR and MASTER_PORT); rank 0 serves it. Without it: no
 *                                host mesh, so no fallback and no host collectives below.
 *   INA_MESH_ADDR                this rank's address on the mesh (default: found as Gloo and
 *                                NCCL find theirs: INA_SOCKET_IFNAME's address, else the local
 *                                address that routes to the store's host, else 127.0.0.1)
 *   INA_SOCKET_IFNAME            the interface whose address the mesh uses (e.g. eth1)
 *   INA_REQUIRE_INC=1            an aggregator or controller that is configured but cannot serve
 *                                (no answer, refused, unreachable, lost) is an error returned on
 *                                every rank instead of a warning and the host path (default 0)
 *   INA_TRANSPORT=host           every collective on the host mesh (also when INA_AGGREGATOR and
 *                                INA_CONTROLLER are unset and a store is set); auto/udp
 *                                (default): the aggregator,
 *                                falling back to the host mesh when it is lost; dpdk or xdp: the
 *                                aggregator over a kernel-bypass transport, configured by
 *                                INA_LOCAL_IP, INA_LOCAL_MAC, INA_LOCAL_PORT, INA_AGGREGATOR_MAC,
 *                                INA_DPDK_ARGS, INA_DPDK_PORT, INA_XDP_IFACE, INA_XDP_QUEUE,
 *                                INA_XDP_COPY (README)
 *   INA_FALLBACK=exact|float     exact (default; float when every collective runs on the host
 *                                mesh): the host path reduces the same quantized
 *                                integers, bitwise identical to the aggregator's result;
 *                                float: IEEE float32 arithmetic (16-bit types widened to
 *                                float32, rounded once); not more precise in general (README)
 *   INA_ALGO=ring|hd|tree        host AllReduce algorithm (default: a cost model picks)
 *   INA_A2A_ALGO=pairwise|bruck|hier  host AllToAll algorithm (default: the cost model picks by
 *                                block size); INA_A2A_GROUP=G: ranks per node for hier
 *                                (default LOCAL_WORLD_SIZE when set)
 *   INA_HOST_TRANSPORT=auto|tcp|verbs  the host mesh's transport: auto (default) RDMA verbs when
 *                                libina has the rdma feature, libina-verbs.so loads and the
 *                                machine has an RDMA device, else TCP; verbs without them fails
 *                                naming the reason
 *   INA_VERBS_DEVICE=name[:port], INA_VERBS_GID_INDEX=n  the verbs device, port and GID index
 *   INA_DEVICE_CHUNK_ELEMS       device buffers: elements per staged chunk (default 512 blocks,
 *                                rounded up to whole blocks)
 *   INA_DEVICE_BUFFERS           device buffers: pinned staging buffers in rotation (default 3)
 *   INA_COST_MODEL=a,b[,g]       the cost model's alpha (us per message), beta and gamma (ns per
 *                                byte sent, reduced), e.g. 25,0.5; default: measured at startup
 * The host-path settings (INA_STORE .. INA_COST_MODEL) and the kernel-bypass ones (INA_LOCAL_*,
 * INA_DPDK_*, INA_XDP_*) come from the environment only: ina_config_t has no fields for them (a
 * new version of the struct could add them; the C++ Config has them).
 */
#ifndef INA_INA_H_
#define INA_INA_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define INA_VERSION_MAJOR 0
#define INA_VERSION_MINOR 1
#define INA_VERSION_PATCH 0

typedef enum {
  INA_SUCCESS = 0,
  INA_INVALID_ARGUMENT = 1, /* bad argument or config; the message names it */
  INA_TIMEOUT = 2,      /* the collective missed its deadline; the message names missing ranks */
  INA_UNAVAILABLE = 3,  /* the aggregator cannot be reached */
  INA_REMOTE_ERROR = 4, /* the aggregator reported an error */
  INA_NO_MEMORY = 5,
  INA_NOT_SUPPORTED = 6,
  INA_INTERNAL_ERROR = 7,
} ina_result_t;

/* Values equal the wire format's. */
typedef enum {
  INA_INT32 = 1,
  INA_FLOAT32 = 2,
  INA_FLOAT16 = 3,
  INA_BFLOAT16 = 4,
  /* OCP FP8, one byte per element (ina/protocol/fp8.h): E4M3FN (no Inf; results saturate at
     +-448, as NVIDIA's satfinite conversion) and E5M2 (IEEE-like, overflows to Inf). One byte per
     element on the wire in-network (SUM quantized as the other float types, the result rounded
     once); on the host mesh reduced in float32 and rounded once. */
  INA_FLOAT8_E4M3 = 5,
  INA_FLOAT8_E5M2 = 6,
} ina_dtype_t;

typedef enum {
  INA_SUM = 1,
  INA_MIN = 2,
  INA_MAX = 3,
} ina_op_t;

typedef struct ina_comm ina_comm_t;

/* A sized, versioned config: initialize with INA_CONFIG_INITIALIZER or ina_config_init(), then
 * set fields. Zero / NULL fields take the environment's value, then the default. */
typedef struct {
  size_t struct_size;     /* sizeof(ina_config_t) */
  uint32_t version;       /* INA_CONFIG_VERSION */
  int32_t rank;           /* -1: INA_RANK */
  int32_t world_size;     /* 0: INA_WORLD_SIZE */
  const char* aggregator; /* "host:port" or "h1:p1,h2:p2,..." (sharded); NULL: INA_AGGREGATOR */
  uint32_t job;           /* 0: INA_JOB or 1 */
  const char* job_key;    /* 32 hex digits, the job's 128-bit key; NULL: INA_JOB_KEY or none
                             (version 2: was a uint64_t in version 1) */
  uint32_t block_elems;   /* 0: INA_BLOCK_ELEMS or 2048 (lowered to the path's datagram) */
  uint32_t window;        /* 0: INA_WINDOW or 128 */
  uint32_t timeout_ms;    /* 0: INA_TIMEOUT_MS or 30000 */
  uint32_t retransmit_us; /* 0: INA_RETRANSMIT_US or 2000 */
} ina_config_t;

#define INA_CONFIG_VERSION 2
#define INA_CONFIG_INITIALIZER \
  { sizeof(ina_config_t), INA_CONFIG_VERSION, -1, 0, NULL, 0, NULL, 0, 0, 0, 0 }

void ina_config_init(ina_config_t* config);

/* An external rendezvous store (the application's own: an MPI exchange, a launcher's store). With
 * ina_comm_create_with_store the host mesh meets through it instead of starting libina's TCP store
 * on INA_STORE / MASTER_ADDR:MASTER_PORT. libina calls it only inside that call, from the calling
 * thread, and writes keys "ina/job<J>/mesh/addr/<rank>".
 *   set  stores `size` bytes under `key` (visible to every rank); returns INA_SUCCESS or an error.
 *   get  waits up to timeout_ms for `key`; returns INA_TIMEOUT if it never appears, else stores
 *        the value's size in *size and, when it fits in `capacity`, the value in `value` (libina
 *        calls again with a larger buffer when *size > capacity). */
typedef struct {
  void* ctx; /* passed back to every callback */
  ina_result_t (*set)(void* ctx, const char* key, const void* value, size_t size);
  ina_result_t (*get)(void* ctx, const char* key, uint32_t timeout_ms, void* value, size_t capacity,
                      size_t* size);
} ina_store_t;

/* Creates a communicator and joins the job (a barrier with every rank, within the deadline).
 * config may be NULL (everything from the environment). On failure *comm is NULL and the
 * message is in ina_last_create_error(). */
ina_result_t ina_comm_create(const ina_config_t* config, ina_comm_t** comm);
/* ina_comm_create with the host mesh's rendezvous through `store` (borrowed for the call; both
 * callbacks required). With no aggregator (config->aggregator NULL and INA_AGGREGATOR unset)
 * every collective runs on the host mesh. */
ina_result_t ina_comm_create_with_store(const ina_config_t* config, const ina_store_t* store,
                                        ina_comm_t** comm);
void ina_comm_destroy(ina_comm_t* comm);

int ina_comm_rank(const ina_comm_t* comm);
int ina_comm_size(const ina_comm_t* comm);

/* recv may equal send (in place). count may be 0. Returns when the result is in recv.
 * A call that fails may have written part of recv: in place, that part of the input is gone.
 * send and recv may be CUDA device memory (libina built with the cuda feature; detected with
 * cudaPointerGetAttributes): the call then starts after the work already enqueued on the
 * default stream and stages the buffer through pinned host memory (see ina_allreduce_async). */
ina_result_t ina_allreduce(ina_comm_t* comm, const void* send, void* recv, size_t count,
                           ina_dtype_t dtype, ina_op_t op);

/* Asynchronous AllReduce. Returns at once with *req set (NULL on failure); ina_wait or ina_test
 * gives the collective's result, ina_request_free releases the handle.
 *   send, recv   host or CUDA device memory (either or both). Device buffers move in chunks
 *                through a rotation of pinned host buffers (INA_DEVICE_CHUNK_ELEMS,
 *                INA_DEVICE_BUFFERS), so device-to-host copies, the network and host-to-device
 *                copies overlap; the result is bitwise the one of the same call on host memory.
 *   cuda_stream  a cudaStream_t, or NULL. As in NCCL: the collective starts after the work
 *                enqueued on the stream before the call, and work enqueued on the stream after
 *                the call waits for the collective (the stream is held by a host function).
 * The buffers must stay valid until the request completes. Asynchronous collectives of a
 * communicator run in call order on its progress thread (started at the first call); blocking
 * calls on the communicator first wait for those submitted before them. Built without CUDA, a
 * non-NULL stream gives INA_NOT_SUPPORTED ("built without CUDA") and pointers are host memory. */
typedef struct ina_request ina_request_t;
ina_result_t ina_allreduce_async(ina_comm_t* comm, const void* send, void* recv, size_t count,
                                 ina_dtype_t dtype, ina_op_t op, void* cuda_stream,
                                 ina_request_t** req);
/* *done = 1 once the collective completed (the return value is then its result), else 0 and
 * INA_SUCCESS. A failure's message: ina_request_error. */
ina_result_t ina_test(ina_request_t* req, int* done);
/* Blocks until the collective completed; returns its result. */
ina_result_t ina_wait(ina_request_t* req);
/* The message of the request's failed collective ("" if none or not complete). */
const char* ina_request_error(const ina_request_t* req);
/* Releases the handle. A request that has not completed is detached: the collective still
 * runs, its buffers stay in use until it completes, and a failure is only logged. NULL is a
 * no-op. */
void ina_request_free(ina_request_t* req);
/* 1 when device buffers are usable (built with CUDA and a device present), else 0 with the
 * reason in *why (a static or per-thread string; why may be NULL). */
int ina_cuda_available(const char** why);

/* Host collectives, on the TCP mesh (NCCL's shapes; counts and displacements in elements). They
 * need the mesh: without INA_STORE (or MASTER_ADDR/MASTER_PORT) they return INA_INVALID_ARGUMENT
 * with a message saying so. Every rank calls them in the same order.
 *   allgather       recv: size * count elements, block i from rank i
 *   reduce_scatter  send: size blocks of count; recv (count) gets the reduction of block rank
 *   broadcast       count elements of root's buf into buf on every rank
 *   alltoall        block j (count elements) of send goes to rank j; block i of recv is rank i's;
 *                   send and recv must not overlap
 *   alltoallv       size counts and displacements each; zero counts allowed; recv_counts[i] must
 *                   equal rank i's send_counts[rank] */
ina_result_t ina_allgather(ina_comm_t* comm, const void* send, void* recv, size_t count,
                           ina_dtype_t dtype);
ina_result_t ina_reduce_scatter(ina_comm_t* comm, const void* send, void* recv, size_t count,
                                ina_dtype_t dtype, ina_op_t op);
ina_result_t ina_broadcast(ina_comm_t* comm, void* buf, size_t count, ina_dtype_t dtype, int root);
ina_result_t ina_barrier(ina_comm_t* comm);
ina_result_t ina_alltoall(ina_comm_t* comm, const void* send, void* recv, size_t count,
                          ina_dtype_t dtype);
ina_result_t ina_alltoallv(ina_comm_t* comm, const void* send, const size_t* send_counts,
                           const size_t* send_displs, void* recv, const size_t* recv_counts,
                           const size_t* recv_displs, ina_dtype_t dtype);
/* 1 while ina_allreduce runs on the host mesh (host only, or after losing the aggregator), 0 when
 * in-network, -1 for a NULL comm. */
int ina_comm_on_host_path(const ina_comm_t* comm);

/* A static description of a result code. */
const char* ina_result_string(ina_result_t result);
/* The message of the communicator's last failed call ("" if none); valid until its next call. */
const char* ina_comm_last_error(const ina_comm_t* comm);
/* The message of this thread's last failed ina_comm_create. */
const char* ina_last_create_error(void);
/* "0.1.0" */
const char* ina_version(void);

#ifdef __cplusplus
}
#endif

#endif /* INA_INA_H_ */
