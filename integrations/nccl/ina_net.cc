// libnccl-net-ina.so, part 2: the point-to-point net (ncclNetPlugin_v8) NCCL requires beside a
// CollNet: NCCL loads a CollNet only from a library whose net has a device, and then carries the
// communicator's point-to-point traffic (rings, trees, proxies) over that net too.
//
// A plain TCP net on INA_MESH_ADDR (default 127.0.0.1), one connection per send/recv comm.
// Every message is an 8-byte length then the payload. Requests of a comm complete in the order
// they were posted (NCCL posts sends and receives of a connection in the same order on both
// ends, so tags are not matched); test() drives the non-blocking sockets, so nothing runs in
// the background. Host memory only. One device when INA_AGGREGATOR is set, else none, so NCCL
// keeps its own transports when INA is not configured.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>

#include "integrations/nccl/collnet_v8.h"
#include "integrations/nccl/plugin_log.h"
#include "worker/host/socket.h"

namespace {

constexpr uint32_t kNetMagic = 0x494e414e;  // "INAN"

struct NetHandle {
  uint32_t magic;
  sockaddr_in addr;
};
static_assert(sizeof(NetHandle) <= NCCL_NET_HANDLE_MAXSIZE, "the handle must fit NCCL's");

struct NetListen {
  int fd = -1;
};

struct Comm;

struct NetRequest {
  Comm* comm = nullptr;
  bool send = false;
  char* data = nullptr;
  size_t capacity = 0;      // receive: the posted buffer's size; send: the message's size
  uint64_t header = 0;      // the length on the wire
  size_t header_done = 0;   // bytes of the header moved
  size_t payload_done = 0;  // bytes of the payload moved
  bool done = false;
  bool failed = false;
};

struct Comm {
  int fd = -1;
  bool send = false;
  std::deque<NetRequest*> pending;  // posted, not yet complete, in order
  bool broken = false;
};

struct NetMr {
  int type;
};

bool aggregator_configured() {
  const char* a = std::getenv("INA_AGGREGATOR");
  return a != nullptr && a[0] != '\0';
}

// Sends as much of r (its 8-byte length, then its payload, in one sendmsg) as the socket takes
// now. False on a broken connection.
bool advance_send(NetRequest* r) {
  Comm* c = r->comm;
  const size_t total = static_cast<size_t>(r->header);
  while (r->payload_done < total || r->header_done < sizeof(r->header)) {
    iovec iov[2];
    int n = 0;
    if (r->header_done < sizeof(r->header))
      iov[n++] = {reinterpret_cast<char*>(&r->header) + r->header_done,
                  sizeof(r->header) - r->header_done};
    if (r->payload_done < total) iov[n++] = {r->data + r->payload_done, total - r->payload_done};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t k = ::sendmsg(c->fd, &msg, MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    if (k <= 0) {
      INA_NCCL_WARN("ina net: connection failed%s (%s)",
                    r->header_done + r->payload_done > 0 ? " mid-message" : "",
                    k == 0 ? "no progress" : std::strerror(errno));
      return false;
    }
    const size_t moved = static_cast<size_t>(k);
    const size_t head = std::min(moved, sizeof(r->header) - r->header_done);
    r->header_done += head;
    r->payload_done += moved - head;
  }
  // Its tail out now, as the host mesh does (worker/host/socket.h flush_tcp). AllToAll over this
  // net (ina-nccl-net-bench), 8 ranks on 1 Gbit/s links (tbf), medians: 64 KiB per pair 4.2-4.4
  // ms flushed against 6.2 unflushed (the bound 3.8), 128 KiB 8.0 against 11.1; 256 KiB 1.01-1.13x
  // in five sittings (a slow mode hit a little more often, unexplained), 1 MiB and 4 ranks within
  // the noise (testbed/results/alltoall-large-20261206/).
  if (total >= ina::host::kFlushFrom) ina::host::flush_tcp(c->fd);
  r->done = true;
  return true;
}

// Receives as much of r (its length, then that many bytes) as the socket has now. False on a
// broken connection or a message larger than the posted buffer.
bool advance_recv(NetRequest* r) {
  Comm* c = r->comm;
  auto* hdr = reinterpret_cast<char*>(&r->header);
  while (r->header_done < sizeof(r->header)) {
    const ssize_t n = ::recv(c->fd, hdr + r->header_done, sizeof(r->header) - r->header_done, 0);
    if (n > 0) {
      r->header_done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    INA_NCCL_WARN("ina net: connection %s (%s)", n == 0 ? "closed by the peer" : "failed",
                  n == 0 ? "end of stream" : std::strerror(errno));
    return false;
  }
  if (r->header > r->capacity) {
    INA_NCCL_WARN("ina net: a %llu-byte message for a %zu-byte receive buffer",
                  static_cast<unsigned long long>(r->header), r->capacity);
    return false;
  }
  const size_t total = static_cast<size_t>(r->header);
  while (r->payload_done < total) {
    const ssize_t n = ::recv(c->fd, r->data + r->payload_done, total - r->payload_done, 0);
    if (n > 0) {
      r->payload_done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    INA_NCCL_WARN("ina net: connection %s mid-message", n == 0 ? "closed by the peer" : "failed");
    return false;
  }
  r->done = true;
  return true;
}

// Moves as much of r as the socket takes now. False on a broken connection or bad message.
bool advance(NetRequest* r) { return r->send ? advance_send(r) : advance_recv(r); }

// Progresses the comm's requests in order.
void progress(Comm* c) {
  while (!c->pending.empty()) {
    NetRequest* r = c->pending.front();
    if (c->broken || !advance(r)) {
      c->broken = true;
      r->failed = true;
      r->done = true;
    }
    if (!r->done) return;
    c->pending.pop_front();
  }
}

int make_socket() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

bool set_nonblocking(int fd) {
  const int fl = fcntl(fd, F_GETFL, 0);
  return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0;
}

ncclResult_t net_init(ncclDebugLogger_t log) {
  ina::nccl::nccl_logger() = log;
  return ncclSuccess;
}

ncclResult_t net_devices(int* ndev) {
  *ndev = aggregator_configured() ? 1 : 0;
  return ncclSuccess;
}

ncclResult_t net_get_properties(int dev, ncclNetProperties_v8_t* props) {
  if (dev != 0) return ncclInvalidArgument;
  static char name[] = "ina";
  std::memset(props, 0, sizeof(*props));
  props->name = name;
  props->guid = 0x494e41;
  props->ptrSupport = NCCL_PTR_HOST;
  props->speed = 10000;
  props->port = 0;
  props->maxComms = 65536;
  props->maxRecvs = 1;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  return ncclSuccess;
}

ncclResult_t net_listen(int dev, void* handle, void** listen_comm) {
  *listen_comm = nullptr;
  if (dev != 0) return ncclInvalidArgument;
  const char* env = std::getenv("INA_MESH_ADDR");
  const std::string addr = (env != nullptr && env[0] != '\0') ? env : "127.0.0.1";
  NetHandle h{};
  h.magic = kNetMagic;
  h.addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, addr.c_str(), &h.addr.sin_addr) != 1) {
    INA_NCCL_WARN("ina net: INA_MESH_ADDR=\"%s\" is not valid: expected an IPv4 address",
                  addr.c_str());
    return ncclInvalidArgument;
  }
  const int fd = make_socket();
  socklen_t len = sizeof(h.addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&h.addr), sizeof(h.addr)) != 0 ||
      listen(fd, 64) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&h.addr), &len) != 0 ||
      !set_nonblocking(fd)) {
    INA_NCCL_WARN("ina net: cannot listen on %s: %s", addr.c_str(), std::strerror(errno));
    if (fd >= 0) close(fd);
    return ncclSystemError;
  }
  std::memcpy(handle, &h, sizeof(h));
  *listen_comm = new NetListen{fd};
  return ncclSuccess;
}

ncclResult_t net_connect(int dev, void* handle, void** send_comm, ncclNetDeviceHandle_v8_t**) {
  *send_comm = nullptr;
  NetHandle h;
  std::memcpy(&h, handle, sizeof(h));
  if (dev != 0 || h.magic != kNetMagic) {
    INA_NCCL_WARN("ina net: connect: not an INA net handle (magic 0x%x)", h.magic);
    return ncclInvalidArgument;
  }
  // The peer listens already (its handle exists), so the kernel completes the handshake from
  // its backlog: this does not wait for the peer's accept().
  const int fd = make_socket();
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&h.addr), sizeof(h.addr)) != 0 ||
      !set_nonblocking(fd)) {
    char a[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &h.addr.sin_addr, a, sizeof(a));
    INA_NCCL_WARN("ina net: connect to %s:%u: %s", a, ntohs(h.addr.sin_port), std::strerror(errno));
    if (fd >= 0) close(fd);
    return ncclSystemError;
  }
  auto* c = new Comm();
  c->fd = fd;
  c->send = true;
  *send_comm = c;
  return ncclSuccess;
}

ncclResult_t net_accept(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_v8_t**) {
  *recv_comm = nullptr;
  auto* l = static_cast<NetListen*>(listen_comm);
  const int fd = accept4(l->fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return ncclSuccess;  // again
    INA_NCCL_WARN("ina net: accept: %s", std::strerror(errno));
    return ncclSystemError;
  }
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  auto* c = new Comm();
  c->fd = fd;
  *recv_comm = c;
  return ncclSuccess;
}

ncclResult_t net_reg_mr(void*, void*, size_t, int type, void** mhandle) {
  *mhandle = nullptr;
  if (type != NCCL_PTR_HOST) {
    INA_NCCL_WARN("ina net: regMr: memory type %d is not supported (host memory only)", type);
    return ncclInvalidUsage;
  }
  *mhandle = new NetMr{type};
  return ncclSuccess;
}

ncclResult_t net_reg_mr_dmabuf(void*, void*, size_t, int, uint64_t, int, void** mhandle) {
  *mhandle = nullptr;
  INA_NCCL_WARN("ina net: regMrDmaBuf: DMA-BUF memory is not supported (host memory only)");
  return ncclInvalidUsage;
}

ncclResult_t net_dereg_mr(void*, void* mhandle) {
  delete static_cast<NetMr*>(mhandle);
  return ncclSuccess;
}

ncclResult_t net_isend(void* send_comm, void* data, int size, int, void*, void** request) {
  *request = nullptr;
  auto* c = static_cast<Comm*>(send_comm);
  if (c == nullptr || !c->send || size < 0) return ncclInvalidArgument;
  auto* r = new NetRequest();
  r->comm = c;
  r->send = true;
  r->data = static_cast<char*>(data);
  r->capacity = static_cast<size_t>(size);
  r->header = static_cast<uint64_t>(size);
  c->pending.push_back(r);
  progress(c);
  *request = r;
  return ncclSuccess;
}

ncclResult_t net_irecv(void* recv_comm, int n, void** data, int* sizes, int*, void**,
                       void** request) {
  *request = nullptr;
  auto* c = static_cast<Comm*>(recv_comm);
  if (c == nullptr || c->send || n != 1 || sizes[0] < 0) {
    INA_NCCL_WARN("ina net: irecv: %d grouped receives (maxRecvs is 1)", n);
    return ncclInvalidArgument;
  }
  auto* r = new NetRequest();
  r->comm = c;
  r->data = static_cast<char*>(data[0]);
  r->capacity = static_cast<size_t>(sizes[0]);
  c->pending.push_back(r);
  progress(c);
  *request = r;
  return ncclSuccess;
}

ncclResult_t net_iflush(void*, int, void**, int*, void**, void** request) {
  *request = nullptr;  // host memory: nothing to flush (NCCL treats NULL as done)
  return ncclSuccess;
}

ncclResult_t net_test(void* request, int* done, int* sizes) {
  auto* r = static_cast<NetRequest*>(request);
  if (r == nullptr) return ncclInvalidArgument;
  if (!r->done) {
    if (r->comm != nullptr) {
      progress(r->comm);
    } else {  // its comm was closed under it
      r->done = true;
      r->failed = true;
    }
  }
  *done = r->done ? 1 : 0;
  if (!r->done) return ncclSuccess;
  const bool failed = r->failed;
  if (sizes != nullptr) sizes[0] = failed ? 0 : static_cast<int>(r->header);
  delete r;
  return failed ? ncclSystemError : ncclSuccess;
}

ncclResult_t net_close(void* comm) {
  auto* c = static_cast<Comm*>(comm);
  if (c == nullptr) return ncclSuccess;
  for (NetRequest* r : c->pending) r->comm = nullptr;  // NCCL drains before closing
  if (c->fd >= 0) close(c->fd);
  delete c;
  return ncclSuccess;
}

ncclResult_t net_close_listen(void* listen_comm) {
  auto* l = static_cast<NetListen*>(listen_comm);
  if (l == nullptr) return ncclSuccess;
  if (l->fd >= 0) close(l->fd);
  delete l;
  return ncclSuccess;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const ncclNet_v8_t ncclNetPlugin_v8 = {
    "ina",      net_init,   net_devices,       net_get_properties, net_listen,       net_connect,
    net_accept, net_reg_mr, net_reg_mr_dmabuf, net_dereg_mr,       net_isend,        net_irecv,
    net_iflush, net_test,   net_close,         net_close,          net_close_listen,
    nullptr,  // getDeviceMr: no device offload
    nullptr,  // irecvConsumed: no device offload
};
