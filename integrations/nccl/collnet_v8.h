/* The NCCL CollNet plugin interface, version 8, as libnccl-net-ina.so implements it.
 *
 * NCCL does not install its plugin headers, so the ABI is declared here from NCCL's ext-net
 * documentation (the struct of function pointers NCCL finds with dlsym("ncclCollNetPlugin_v8"),
 * loaded by NCCL 2.19 and later, 2.28 included). Field order and types are the ABI: never reorder.
 * The base enums are NCCL's public values (nccl.h); when nccl.h is included first its own
 * definitions are used.
 *
 * Windows of iallgather / ireducescatter, as this plugin implements them (NCCL's proxy passes
 * pointers this way, src/transport/coll_net.cc): the collective's buffer is nranks slices of
 * bytesPerRank bytes, slice i belonging to rank i. One call covers the bytes [windowOffset,
 * windowOffset + windowBytes) of that buffer.
 *   iallgather      every rank receives the window into recvParts (filled in order). A rank whose
 *                   slice the window overlaps supplies those bytes at sendData: from its slice's
 *                   offset windowOffset - rank * bytesPerRank when the window starts inside its
 *                   slice, else from the start of its slice.
 *   ireducescatter  every rank supplies its own copy of the window in sendParts (in order); the
 *                   window's reduction over all ranks goes to the ranks whose slices it overlaps,
 *                   at recvData with the same offset rule as iallgather's sendData.
 */
#ifndef INA_INTEGRATIONS_NCCL_COLLNET_V8_H_
#define INA_INTEGRATIONS_NCCL_COLLNET_V8_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef NCCL_H_
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* 32 bits wide like NCCL's (whose largest value is 0x7fffffff). */
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;
#endif /* NCCL_H_ */

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

#define NCCL_INIT 0x1
#define NCCL_NET 0x10
#define NCCL_COLL 0x2

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file,
                                  int line, const char* fmt, ...);

typedef enum { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 } ncclNetDeviceType;

typedef struct {
  char* name;      /* for logs */
  char* pciPath;   /* the device's PCI path in /sys */
  uint64_t guid;   /* identifies the NIC chip */
  int ptrSupport;  /* NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF */
  int regIsGlobal; /* regMr not tied to a comm */
  int speed;       /* Mbps */
  int port;
  float latency; /* us */
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType; /* offload type: host */
  int netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
  void* mhandle;
  void* address;
  uint32_t size;
} ncclNetSGE_v8_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  /* Devices able to run collectives; 0 disables CollNet. */
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  /* Fills a handle (up to NCCL_NET_HANDLE_MAXSIZE bytes) that NCCL exchanges between ranks. */
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  /* Creates the group from every rank's handle; rank is the caller's rank in it. */
  ncclResult_t (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);
  /* *supported = 1 when the reduction of dataType with redOp is offloaded. */
  ncclResult_t (*reduceSupport)(ncclDataType_t dataType, ncclRedOp_t redOp, int* supported);
  ncclResult_t (*regMr)(void* collComm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* collComm, void* mhandle);
  ncclResult_t (*iallreduce)(void* collComm, void* sendData, void* recvData, int count,
                             ncclDataType_t dataType, ncclRedOp_t redOp, void* sendMhandle,
                             void* recvMhandle, void** request);
  ncclResult_t (*iallgather)(void* collComm, void* sendData, int nRecvParts,
                             ncclNetSGE_v8_t* recvParts, size_t bytesPerRank, size_t windowOffset,
                             size_t windowBytes, void* sendMhandle, void** request);
  ncclResult_t (*ireducescatter)(void* collComm, int nSendParts, ncclNetSGE_v8_t* sendParts,
                                 void* recvData, size_t bytesPerRank, size_t windowOffset,
                                 size_t windowBytes, ncclDataType_t dataType, ncclRedOp_t redOp,
                                 void* recvMhandle, void** request);
  /* Makes data received into CUDA memory visible to the GPU. */
  ncclResult_t (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request);
  /* *done = 1 once the request completed (it is then freed); *size: bytes received. */
  ncclResult_t (*test)(void* request, int* done, int* size);
  ncclResult_t (*closeColl)(void* collComm);
  ncclResult_t (*closeListen)(void* listenComm);
} ncclCollNet_v8_t;

/* The point-to-point network of the same version. NCCL takes a CollNet only from a library that
 * also provides a net with at least one device, and then uses that net for the communicator's
 * point-to-point traffic too. Device offload handles are opaque here (this plugin offers none). */
typedef struct ncclNetDeviceHandle_v8 ncclNetDeviceHandle_v8_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  /* Must not block: may return *sendComm == NULL, to be called again. */
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v8_t** sendDevComm);
  /* Must not block: may return *recvComm == NULL, to be called again. */
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle,
                        void** request);
  /* n grouped receives (at most maxRecvs); sizes are the buffers' capacities. */
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  /* *done = 1 once complete (the request is then freed); sizes: bytes of each receive. */
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v8_t;

#ifdef __cplusplus
}
#endif

#endif /* INA_INTEGRATIONS_NCCL_COLLNET_V8_H_ */
