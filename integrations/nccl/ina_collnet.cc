// libnccl-net-ina.so: NCCL's CollNet v8 plugin over INA (exports ncclCollNetPlugin_v8; the
// point-to-point net NCCL also needs from the same library is ina_net.cc).
//
// One device ("ina") when INA_AGGREGATOR is set, none otherwise (NCCL then leaves CollNet off).
// listen() reserves a TCP port on INA_MESH_ADDR (default 127.0.0.1) and puts "host:port" in the
// handle; connect() gets every rank's handle from NCCL and builds an ina::Communicator (job and
// tuning from the INA_* environment) whose host mesh meets at rank 0's address, so the
// rendezvous needs nothing but what NCCL already exchanges. Each collective communicator owns a
// progress thread that runs the queued collectives in issue order; iallreduce / iallgather /
// ireducescatter / iflush return at once with a request, and test() polls it.
//
//   iallreduce      in-network AllReduce (int32, float32, float16, bfloat16; SUM, MIN, MAX)
//   iallgather      one broadcast per slice the window overlaps, on INA's host mesh
//   ireducescatter  an in-network AllReduce of the window; the owners keep their parts
//   iflush          nothing to flush for host memory: a completed request
// Memory: host only (ptrSupport NCCL_PTR_HOST); regMr of CUDA or DMA-BUF memory is refused.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ina/ina.hpp"
#include "ina_config.h"
#include "integrations/nccl/collnet_logic.h"
#include "integrations/nccl/collnet_v8.h"
#include "integrations/nccl/plugin_log.h"

namespace {

using ina::nccl::Segment;

constexpr uint32_t kHandleMagic = 0x494e4131;  // "INA1"

// What listen() writes into NCCL's handle.
struct Handle {
  uint32_t magic;
  char store[NCCL_NET_HANDLE_MAXSIZE - sizeof(uint32_t)];  // "host:port", NUL terminated
};
static_assert(sizeof(Handle) <= NCCL_NET_HANDLE_MAXSIZE, "the handle must fit NCCL's");

struct ListenComm {
  int hold_fd = -1;  // keeps the reserved port ours until rank 0's store binds it
};

struct MemoryRegion {
  const char* data;
  size_t size;
};

struct Request {
  std::atomic<int> state{0};  // 0 pending, 1 done, 2 failed
  int bytes = 0;
  std::string error;
};

class CollComm {
 public:
  CollComm(std::unique_ptr<ina::Communicator> comm, int rank, int nranks)
      : comm_(std::move(comm)), rank_(rank), nranks_(nranks) {
    worker_ = std::thread([this] { run(); });
  }
  ~CollComm() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    worker_.join();
  }

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  ina::Communicator& comm() { return *comm_; }

  // Queues `op`; the request completes with `bytes` when it returns OK.
  Request* post(int bytes, std::function<ina::Status()> op) {
    auto* r = new Request();
    r->bytes = bytes;
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(Item{r, std::move(op)});
    cv_.notify_all();
    return r;
  }

 private:
  struct Item {
    Request* request;
    std::function<ina::Status()> op;
  };

  void run() {
    for (;;) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      Item it = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      ina::Status s = it.op();
      if (s.ok()) {
        it.request->state.store(1, std::memory_order_release);
      } else {
        it.request->error = s.message();
        it.request->state.store(2, std::memory_order_release);
      }
    }
  }

  std::unique_ptr<ina::Communicator> comm_;
  int rank_;
  int nranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::thread worker_;
};

bool aggregator_configured() {
  const char* a = std::getenv("INA_AGGREGATOR");
  return a != nullptr && a[0] != '\0';
}

std::string mesh_address() {
  const char* a = std::getenv("INA_MESH_ADDR");
  return (a != nullptr && a[0] != '\0') ? a : "127.0.0.1";
}

// Checks that [p, p + bytes) lies in the registered region (when one is given).
bool in_region(const void* mhandle, const void* p, size_t bytes) {
  if (mhandle == nullptr || bytes == 0) return true;
  const auto* mr = static_cast<const MemoryRegion*>(mhandle);
  const char* c = static_cast<const char*>(p);
  return c >= mr->data && bytes <= mr->size &&
         c - mr->data <= static_cast<ptrdiff_t>(mr->size - bytes);
}

// Broadcasts `bytes` bytes from root's `data` into every rank's `data` (INA's host broadcast
// moves int32 words: the bytes travel padded in an aligned buffer).
ina::Status broadcast_bytes(ina::Communicator& comm, void* data, size_t bytes, int root) {
  std::vector<int32_t> words((bytes + 3) / 4);
  if (comm.rank() == root && bytes > 0) std::memcpy(words.data(), data, bytes);
  INA_RETURN_IF_ERROR(comm.broadcast(words.data(), words.size(), ina::DType::kInt32, root));
  if (bytes > 0) std::memcpy(data, words.data(), bytes);
  return ina::ok_status();
}

// --- the plugin's entry points ---

ncclResult_t ina_init(ncclDebugLogger_t log) {
  ina::nccl::nccl_logger() = log;
  INA_NCCL_INFO("ina: INA CollNet plugin %s (aggregator %s)", INA_VERSION,
                aggregator_configured() ? std::getenv("INA_AGGREGATOR") : "unset: no device");
  return ncclSuccess;
}

ncclResult_t ina_devices(int* ndev) {
  *ndev = aggregator_configured() ? 1 : 0;
  return ncclSuccess;
}

ncclResult_t ina_get_properties(int dev, ncclNetProperties_v8_t* props) {
  if (dev != 0) {
    INA_NCCL_WARN("ina: getProperties: no device %d (the plugin has device 0 only)", dev);
    return ncclInvalidArgument;
  }
  static char name[] = "ina";
  std::memset(props, 0, sizeof(*props));
  props->name = name;
  props->pciPath = nullptr;
  props->guid = 0x494e41;
  props->ptrSupport = NCCL_PTR_HOST;
  props->regIsGlobal = 0;
  props->speed = 100000;
  props->port = 1;
  props->latency = 0;
  props->maxComms = 1024;
  props->maxRecvs = 1;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = 0;
  return ncclSuccess;
}

ncclResult_t ina_listen(int dev, void* handle, void** listen_comm) {
  if (dev != 0) return ncclInvalidArgument;
  const std::string addr = mesh_address();
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) {
    INA_NCCL_WARN("ina: INA_MESH_ADDR=\"%s\" is not valid: expected an IPv4 address", addr.c_str());
    return ncclInvalidArgument;
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ncclSystemError;
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len = sizeof(sa);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    INA_NCCL_WARN("ina: cannot reserve a TCP port on %s: %s", addr.c_str(), std::strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  auto* h = static_cast<Handle*>(handle);
  std::memset(h, 0, sizeof(*h));
  h->magic = kHandleMagic;
  std::snprintf(h->store, sizeof(h->store), "%s:%u", addr.c_str(), ntohs(sa.sin_port));
  auto* lc = new ListenComm();
  lc->hold_fd = fd;
  *listen_comm = lc;
  return ncclSuccess;
}

ncclResult_t ina_connect(void* handles[], int nranks, int rank, void* listen_comm,
                         void** coll_comm) {
  *coll_comm = nullptr;
  if (handles == nullptr || nranks < 1 || rank < 0 || rank >= nranks || listen_comm == nullptr) {
    INA_NCCL_WARN("ina: connect: bad arguments (nranks %d, rank %d)", nranks, rank);
    return ncclInvalidArgument;
  }
  const auto* h0 = static_cast<const Handle*>(handles[0]);
  if (h0 == nullptr || h0->magic != kHandleMagic ||
      std::memchr(h0->store, '\0', sizeof(h0->store)) == nullptr) {
    INA_NCCL_WARN("ina: connect: rank 0's handle is not an INA handle (magic 0x%x)",
                  h0 == nullptr ? 0u : h0->magic);
    return ncclInvalidArgument;
  }
  ina::Result<ina::Config> cfg = ina::Config::from_env();
  if (!cfg.ok()) {
    INA_NCCL_WARN("ina: %s", cfg.status().message().c_str());
    return ncclInvalidArgument;
  }
  cfg->rank = rank;
  cfg->world_size = nranks;
  cfg->store = h0->store;
  cfg->host_only = false;
  ina::Result<std::unique_ptr<ina::Communicator>> comm = ina::Communicator::create(*cfg);
  if (!comm.ok()) {
    INA_NCCL_WARN("ina: rank %d of %d cannot join INA job %u: %s", rank, nranks, cfg->job,
                  comm.status().message().c_str());
    return ncclSystemError;
  }
  INA_NCCL_INFO("ina: rank %d of %d joined INA job %u at %s:%u (store %s)%s", rank, nranks,
                cfg->job, cfg->aggregator_host.c_str(), cfg->aggregator_port, h0->store,
                (*comm)->on_host_path() ? ", host path" : "");
  *coll_comm = new CollComm(std::move(comm.value()), rank, nranks);
  return ncclSuccess;
}

ncclResult_t ina_reduce_support(ncclDataType_t dtype, ncclRedOp_t op, int* supported) {
  *supported = ina::nccl::supported(dtype, op) ? 1 : 0;
  return ncclSuccess;
}

ncclResult_t ina_reg_mr(void* coll_comm, void* data, size_t size, int type, void** mhandle) {
  *mhandle = nullptr;
  if (coll_comm == nullptr) return ncclInvalidArgument;
  if (type != NCCL_PTR_HOST) {
    INA_NCCL_WARN(
        "ina: regMr: memory type %d is not supported (host memory only: "
        "ptrSupport is NCCL_PTR_HOST)",
        type);
    return ncclInvalidUsage;
  }
  *mhandle = new MemoryRegion{static_cast<const char*>(data), size};
  return ncclSuccess;
}

ncclResult_t ina_reg_mr_dmabuf(void*, void*, size_t, int, uint64_t, int, void** mhandle) {
  *mhandle = nullptr;
  INA_NCCL_WARN("ina: regMrDmaBuf: DMA-BUF memory is not supported (host memory only)");
  return ncclInvalidUsage;
}

ncclResult_t ina_dereg_mr(void*, void* mhandle) {
  delete static_cast<MemoryRegion*>(mhandle);
  return ncclSuccess;
}

ncclResult_t ina_iallreduce(void* coll_comm, void* send, void* recv, int count,
                            ncclDataType_t dtype, ncclRedOp_t op, void* send_mh, void* recv_mh,
                            void** request) {
  *request = nullptr;
  auto* cc = static_cast<CollComm*>(coll_comm);
  ina::DType d;
  ina::ReduceOp o;
  if (cc == nullptr || count < 0 || !ina::nccl::map_dtype(dtype, &d) ||
      !ina::nccl::map_op(op, &o)) {
    INA_NCCL_WARN(
        "ina: iallreduce: datatype %d with op %d is not supported (reduceSupport says "
        "which are)",
        static_cast<int>(dtype), static_cast<int>(op));
    return ncclInvalidArgument;
  }
  const size_t bytes = static_cast<size_t>(count) * ina::dtype_size(d);
  if (!in_region(send_mh, send, bytes) || !in_region(recv_mh, recv, bytes)) {
    INA_NCCL_WARN("ina: iallreduce: buffer outside its registered region");
    return ncclInvalidArgument;
  }
  *request = cc->post(static_cast<int>(bytes), [cc, send, recv, count, d, o] {
    return cc->comm().allreduce(send, recv, static_cast<size_t>(count), d, o);
  });
  return ncclSuccess;
}

ncclResult_t ina_iallgather(void* coll_comm, void* send, int n_recv_parts,
                            ncclNetSGE_v8_t* recv_parts, size_t bytes_per_rank,
                            size_t window_offset, size_t window_bytes, void* send_mh,
                            void** request) {
  *request = nullptr;
  auto* cc = static_cast<CollComm*>(coll_comm);
  std::vector<Segment> segs;
  if (cc == nullptr || n_recv_parts < 0 ||
      !ina::nccl::split_window(bytes_per_rank, window_offset, window_bytes, cc->nranks(), &segs)) {
    INA_NCCL_WARN("ina: iallgather: window [%zu, +%zu) outside %d slices of %zu bytes",
                  window_offset, window_bytes, cc == nullptr ? 0 : cc->nranks(), bytes_per_rank);
    return ncclInvalidArgument;
  }
  std::vector<ncclNetSGE_v8_t> parts(recv_parts, recv_parts + n_recv_parts);
  size_t part_bytes = 0;
  for (const auto& p : parts) part_bytes += p.size;
  if (part_bytes < window_bytes || window_bytes > static_cast<size_t>(INT32_MAX)) {
    INA_NCCL_WARN("ina: iallgather: %zu bytes of receive parts for a %zu-byte window", part_bytes,
                  window_bytes);
    return ncclInvalidArgument;
  }
  for (const Segment& s : segs) {
    if (s.owner == cc->rank() && !in_region(send_mh, send, s.bytes)) {
      INA_NCCL_WARN("ina: iallgather: send buffer outside its registered region");
      return ncclInvalidArgument;
    }
  }
  *request = cc->post(static_cast<int>(window_bytes), [cc, send, parts, segs, window_bytes] {
    std::vector<char> window(window_bytes);
    for (const Segment& s : segs) {
      char* at = window.data() + s.window_pos;
      if (s.owner == cc->rank()) std::memcpy(at, send, s.bytes);
      INA_RETURN_IF_ERROR(broadcast_bytes(cc->comm(), at, s.bytes, s.owner));
    }
    size_t pos = 0;
    for (const auto& p : parts) {
      const size_t n = std::min<size_t>(p.size, window_bytes - pos);
      if (n > 0) std::memcpy(p.address, window.data() + pos, n);
      pos += n;
    }
    return ina::ok_status();
  });
  return ncclSuccess;
}

ncclResult_t ina_ireducescatter(void* coll_comm, int n_send_parts, ncclNetSGE_v8_t* send_parts,
                                void* recv, size_t bytes_per_rank, size_t window_offset,
                                size_t window_bytes, ncclDataType_t dtype, ncclRedOp_t op,
                                void* recv_mh, void** request) {
  *request = nullptr;
  auto* cc = static_cast<CollComm*>(coll_comm);
  ina::DType d;
  ina::ReduceOp o;
  if (cc == nullptr || !ina::nccl::map_dtype(dtype, &d) || !ina::nccl::map_op(op, &o)) {
    INA_NCCL_WARN("ina: ireducescatter: datatype %d with op %d is not supported",
                  static_cast<int>(dtype), static_cast<int>(op));
    return ncclInvalidArgument;
  }
  const size_t esize = ina::dtype_size(d);
  std::vector<Segment> segs;
  if (n_send_parts < 0 || bytes_per_rank % esize != 0 || window_offset % esize != 0 ||
      window_bytes % esize != 0 || window_bytes > static_cast<size_t>(INT32_MAX) ||
      !ina::nccl::split_window(bytes_per_rank, window_offset, window_bytes, cc->nranks(), &segs)) {
    INA_NCCL_WARN(
        "ina: ireducescatter: window [%zu, +%zu) of %d slices of %zu bytes is not "
        "whole %zu-byte elements inside the buffer",
        window_offset, window_bytes, cc->nranks(), bytes_per_rank, esize);
    return ncclInvalidArgument;
  }
  std::vector<ncclNetSGE_v8_t> parts(send_parts, send_parts + n_send_parts);
  size_t part_bytes = 0;
  for (const auto& p : parts) part_bytes += p.size;
  if (part_bytes < window_bytes) {
    INA_NCCL_WARN("ina: ireducescatter: %zu bytes of send parts for a %zu-byte window", part_bytes,
                  window_bytes);
    return ncclInvalidArgument;
  }
  for (const Segment& s : segs) {
    if (s.owner == cc->rank() && !in_region(recv_mh, recv, s.bytes)) {
      INA_NCCL_WARN("ina: ireducescatter: receive buffer outside its registered region");
      return ncclInvalidArgument;
    }
  }
  *request =
      cc->post(static_cast<int>(window_bytes), [cc, parts, recv, segs, window_bytes, esize, d, o] {
        std::vector<char> window(window_bytes);
        size_t pos = 0;
        for (const auto& p : parts) {
          const size_t n = std::min<size_t>(p.size, window_bytes - pos);
          if (n > 0) std::memcpy(window.data() + pos, p.address, n);
          pos += n;
        }
        INA_RETURN_IF_ERROR(
            cc->comm().allreduce(window.data(), window.data(), window_bytes / esize, d, o));
        for (const Segment& s : segs) {
          if (s.owner == cc->rank()) std::memcpy(recv, window.data() + s.window_pos, s.bytes);
        }
        return ina::ok_status();
      });
  return ncclSuccess;
}

ncclResult_t ina_iflush(void* coll_comm, void*, int, void*, void** request) {
  *request = nullptr;
  if (coll_comm == nullptr) return ncclInvalidArgument;
  auto* r = new Request();  // host memory: nothing to make visible
  r->state.store(1, std::memory_order_release);
  *request = r;
  return ncclSuccess;
}

ncclResult_t ina_test(void* request, int* done, int* size) {
  auto* r = static_cast<Request*>(request);
  if (r == nullptr) return ncclInvalidArgument;
  const int state = r->state.load(std::memory_order_acquire);
  *done = state != 0 ? 1 : 0;
  if (state == 0) return ncclSuccess;
  if (size != nullptr) *size = state == 1 ? r->bytes : 0;
  if (state == 2) {
    INA_NCCL_WARN("ina: collective failed: %s", r->error.c_str());
    delete r;
    return ncclRemoteError;
  }
  delete r;
  return ncclSuccess;
}

ncclResult_t ina_close_coll(void* coll_comm) {
  delete static_cast<CollComm*>(coll_comm);  // drains the queue first
  return ncclSuccess;
}

ncclResult_t ina_close_listen(void* listen_comm) {
  auto* lc = static_cast<ListenComm*>(listen_comm);
  if (lc == nullptr) return ncclSuccess;
  if (lc->hold_fd >= 0) close(lc->hold_fd);
  delete lc;
  return ncclSuccess;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const ncclCollNet_v8_t ncclCollNetPlugin_v8 = {
    "ina",          ina_init,           ina_devices,        ina_get_properties, ina_listen,
    ina_connect,    ina_reduce_support, ina_reg_mr,         ina_reg_mr_dmabuf,  ina_dereg_mr,
    ina_iallreduce, ina_iallgather,     ina_ireducescatter, ina_iflush,         ina_test,
    ina_close_coll, ina_close_listen,
};
