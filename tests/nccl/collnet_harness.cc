// Drives libnccl-net-ina.so the way NCCL's proxy does, without NCCL and without a GPU: 4 ranks
// (forked processes) dlopen the plugin, look up ncclCollNetPlugin_v8, init, devices,
// getProperties, listen; the parent exchanges the listen handles out of band (pipes, as NCCL's
// bootstrap allgather would); each rank connects, registers host buffers and runs iallreduce,
// iallgather, ireducescatter and iflush with test() loops, several requests in flight at once.
// A real ina-aggregator serves the job. Checks:
//   - reduceSupport: exactly int32/float32/float16/bfloat16 x SUM/MIN/MAX; all other pairs of
//     NCCL's 12 datatypes x 5 ops refused, and iallreduce of a refused pair fails;
//   - iallreduce results bitwise equal to the protocol model (loopback_support: the quantized
//     SUM for floats, exact MIN/MAX and int32) for every supported pair, in place too;
//   - iallgather / ireducescatter over windows that cross slices, into and from scattered parts;
//   - regMr of CUDA or DMA-BUF memory refused; devices() is 0 without INA_AGGREGATOR;
//   - the point-to-point net (ncclNetPlugin_v8, which NCCL needs to take the CollNet): messages
//     of 0, 13 bytes and 3 MiB around a ring, posted together, exact.
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "integrations/nccl/collnet_v8.h"
#include "tests/integration/loopback_support.h"

namespace {

constexpr int kRanks = 4;
constexpr uint32_t kBlock = 256;  // the aggregator's and the worker's default block_elems
int g_rank = -1;
int g_failures = 0;

#define CHECK(cond, ...)                                                         \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "rank %d: FAIL %s:%d: ", g_rank, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                         \
      std::fprintf(stderr, "\n");                                                \
      ++g_failures;                                                              \
    }                                                                            \
  } while (0)

void logger(ncclDebugLogLevel level, unsigned long, const char* file, int line, const char* fmt,
            ...) {
  if (level != NCCL_LOG_WARN) return;
  std::fprintf(stderr, "rank %d: plugin WARN %s:%d: ", g_rank, file, line);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "\n");
}

const ncclCollNet_v8_t* load(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    return nullptr;
  }
  return static_cast<const ncclCollNet_v8_t*>(dlsym(lib, "ncclCollNetPlugin_v8"));
}

// Polls every request until all are done (NCCL's proxy loop); false on an error.
bool wait_all(const ncclCollNet_v8_t* p, std::vector<void*> reqs, std::vector<int> want_bytes) {
  bool ok = true;
  size_t left = reqs.size();
  while (left > 0) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] == nullptr) continue;
      int done = 0;
      int size = -1;
      if (p->test(reqs[i], &done, &size) != ncclSuccess) {
        CHECK(false, "test() failed for request %zu", i);
        ok = false;
        reqs[i] = nullptr;
        --left;
        continue;
      }
      if (done) {
        CHECK(size == want_bytes[i], "request %zu: size %d, expected %d", i, size, want_bytes[i]);
        reqs[i] = nullptr;
        --left;
      }
    }
  }
  return ok;
}

struct Mr {
  const ncclCollNet_v8_t* p;
  void* comm;
  void* h = nullptr;
  Mr(const ncclCollNet_v8_t* plugin, void* c, void* data, size_t size) : p(plugin), comm(c) {
    CHECK(p->regMr(comm, data, size == 0 ? 1 : size, NCCL_PTR_HOST, &h) == ncclSuccess && h,
          "regMr of host memory");
  }
  ~Mr() { p->deregMr(comm, h); }
};

ina::DType ina_dtype(ncclDataType_t t) {
  switch (t) {
    case ncclInt32: return ina::DType::kInt32;
    case ncclFloat16: return ina::DType::kFloat16;
    case ncclBfloat16: return ina::DType::kBFloat16;
    case ncclFloat8e4m3: return ina::DType::kFloat8E4M3;
    case ncclFloat8e5m2: return ina::DType::kFloat8E5M2;
    default: return ina::DType::kFloat32;
  }
}

void check_allreduce(const ncclCollNet_v8_t* p, void* comm) {
  const ncclDataType_t dtypes[] = {ncclInt32,    ncclFloat32,    ncclFloat16,
                                   ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
  const ncclRedOp_t ops[] = {ncclSum, ncclMin, ncclMax};
  const ina::ReduceOp ina_ops[] = {ina::ReduceOp::kSum, ina::ReduceOp::kMin, ina::ReduceOp::kMax};
  const size_t counts[] = {7, 3000};
  int case_index = 0;
  for (ncclDataType_t t : dtypes) {
    for (size_t count : counts) {
      // The three ops of one datatype in flight together; MAX in place.
      std::vector<std::vector<uint8_t>> send(3), recv(3);
      std::vector<ina::testing::Case> cases;
      std::vector<void*> reqs;
      std::vector<int> bytes;
      std::vector<std::unique_ptr<Mr>> mrs;
      for (int k = 0; k < 3; ++k) {
        ina::testing::Case c{ina_dtype(t), ina_ops[k], count};
        cases.push_back(c);
        ina::testing::fill_input(send[k], c, g_rank, case_index + k);
        recv[k].assign(send[k].size(), 0xEE);
        const bool in_place = k == 2;
        void* out = in_place ? send[k].data() : recv[k].data();
        mrs.push_back(std::make_unique<Mr>(p, comm, send[k].data(), send[k].size()));
        mrs.push_back(std::make_unique<Mr>(p, comm, out, send[k].size()));
        void* req = nullptr;
        const ncclResult_t rc = p->iallreduce(comm, send[k].data(), out, static_cast<int>(count), t,
                                              ops[k], mrs[mrs.size() - 2]->h, mrs.back()->h, &req);
        CHECK(rc == ncclSuccess && req != nullptr, "iallreduce dtype %d op %d count %zu posted", t,
              ops[k], count);
        reqs.push_back(req);
        bytes.push_back(static_cast<int>(send[k].size()));
      }
      if (!wait_all(p, reqs, bytes)) return;
      for (int k = 0; k < 3; ++k) {
        std::vector<std::vector<uint8_t>> inputs(kRanks);
        for (int r = 0; r < kRanks; ++r)
          ina::testing::fill_input(inputs[r], cases[k], r, case_index + k);
        const auto want = ina::testing::model_result(inputs, cases[k], kBlock);
        const auto& got = k == 2 ? send[k] : recv[k];
        CHECK(got == want, "iallreduce dtype %d op %d count %zu differs from the model", t, ops[k],
              count);
      }
      case_index += 3;
    }
  }
  std::fprintf(stderr, "rank %d: iallreduce: 6 dtypes x 3 ops x 2 counts match the model\n",
               g_rank);
}

uint8_t slice_byte(int rank, size_t i) { return static_cast<uint8_t>(rank * 37 + i * 11 + 5); }

void check_allgather(const ncclCollNet_v8_t* p, void* comm) {
  const size_t bpr = 1001;    // odd: the plugin pads bytes into words
  const size_t window = 700;  // windows cross slice boundaries
  std::vector<uint8_t> mine(bpr);
  for (size_t i = 0; i < bpr; ++i) mine[i] = slice_byte(g_rank, i);
  std::vector<uint8_t> out(bpr * kRanks, 0);
  Mr mr(p, comm, mine.data(), mine.size());
  std::vector<void*> reqs;
  std::vector<int> bytes;
  for (size_t wo = 0; wo < out.size(); wo += window) {
    const size_t wb = std::min(window, out.size() - wo);
    const size_t my_begin = static_cast<size_t>(g_rank) * bpr;
    uint8_t* send = mine.data();
    if (wo >= my_begin && wo < my_begin + bpr) send += wo - my_begin;
    ncclNetSGE_v8_t parts[2] = {
        {nullptr, out.data() + wo, static_cast<uint32_t>(wb / 3)},
        {nullptr, out.data() + wo + wb / 3, static_cast<uint32_t>(wb - wb / 3)}};
    void* req = nullptr;
    CHECK(p->iallgather(comm, send, 2, parts, bpr, wo, wb, mr.h, &req) == ncclSuccess && req,
          "iallgather window %zu posted", wo);
    reqs.push_back(req);
    bytes.push_back(static_cast<int>(wb));
  }
  if (!wait_all(p, reqs, bytes)) return;
  size_t bad = 0;
  for (int r = 0; r < kRanks; ++r)
    for (size_t i = 0; i < bpr; ++i) bad += out[r * bpr + i] != slice_byte(r, i);
  CHECK(bad == 0, "iallgather: %zu wrong bytes", bad);
  std::fprintf(stderr, "rank %d: iallgather: %zu bytes in %zu windows exact\n", g_rank, out.size(),
               reqs.size());
}

void check_reducescatter(const ncclCollNet_v8_t* p, void* comm) {
  struct RsCase {
    ncclDataType_t t;
    ncclRedOp_t op;
    ina::ReduceOp iop;
  };
  const RsCase rs[] = {{ncclInt32, ncclSum, ina::ReduceOp::kSum},
                       {ncclFloat32, ncclMax, ina::ReduceOp::kMax},
                       {ncclBfloat16, ncclMin, ina::ReduceOp::kMin}};
  int ci = 500;
  for (const RsCase& c : rs) {
    const size_t per_rank = 500;
    ina::testing::Case whole{ina_dtype(c.t), c.iop, per_rank * kRanks};
    const size_t es = ina::dtype_size(whole.dtype);
    std::vector<std::vector<uint8_t>> inputs(kRanks);
    for (int r = 0; r < kRanks; ++r) ina::testing::fill_input(inputs[r], whole, r, ci);
    // int32 SUM and MIN/MAX do not depend on block boundaries: the whole buffer's model holds
    // for any windows.
    const auto want = ina::testing::model_result(inputs, whole, kBlock);
    const size_t bpr = per_rank * es;
    const size_t window = 300 * es;
    std::vector<uint8_t> out(bpr, 0xEE);
    Mr mr(p, comm, out.data(), out.size());
    std::vector<void*> reqs;
    std::vector<int> bytes;
    const size_t my_begin = static_cast<size_t>(g_rank) * bpr;
    for (size_t wo = 0; wo < bpr * kRanks; wo += window) {
      const size_t wb = std::min(window, bpr * kRanks - wo);
      uint8_t* recv = out.data();
      if (wo >= my_begin && wo < my_begin + bpr) recv += wo - my_begin;
      uint8_t* src = inputs[g_rank].data() + wo;
      const size_t split = (wb / es / 2) * es;
      ncclNetSGE_v8_t parts[2] = {{nullptr, src, static_cast<uint32_t>(split)},
                                  {nullptr, src + split, static_cast<uint32_t>(wb - split)}};
      void* req = nullptr;
      CHECK(p->ireducescatter(comm, 2, parts, recv, bpr, wo, wb, c.t, c.op, mr.h, &req) ==
                    ncclSuccess &&
                req,
            "ireducescatter window %zu posted", wo);
      reqs.push_back(req);
      bytes.push_back(static_cast<int>(wb));
    }
    if (!wait_all(p, reqs, bytes)) return;
    CHECK(std::memcmp(out.data(), want.data() + my_begin, bpr) == 0,
          "ireducescatter dtype %d op %d: my slice differs from the model", c.t, c.op);
    ++ci;
  }
  std::fprintf(stderr, "rank %d: ireducescatter: int32 sum, float32 max, bfloat16 min exact\n",
               g_rank);
}

// NCCL's bootstrap allgather of listen handles, through the parent.
bool exchange(int to_parent, int from_parent, const char* mine,
              char (*all)[NCCL_NET_HANDLE_MAXSIZE]) {
  return write(to_parent, mine, NCCL_NET_HANDLE_MAXSIZE) == NCCL_NET_HANDLE_MAXSIZE &&
         read(from_parent, all, kRanks * NCCL_NET_HANDLE_MAXSIZE) ==
             static_cast<ssize_t>(kRanks * NCCL_NET_HANDLE_MAXSIZE);
}

uint8_t message_byte(int from, size_t msg, size_t i) {
  return static_cast<uint8_t>(from * 29 + msg * 7 + i * 13);
}

// The point-to-point net NCCL needs beside the CollNet: a ring, each rank sending three
// messages (0 bytes, 13 bytes, 3 MiB) to the next while receiving from the previous, all posted
// at once and completed by test() loops.
void check_net(const ncclNet_v8_t* n, int to_parent, int from_parent) {
  CHECK(n->init(logger) == ncclSuccess, "net init");
  int ndev = -1;
  CHECK(n->devices(&ndev) == ncclSuccess && ndev == 1, "net devices: %d", ndev);
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {0};
  void* listen_comm = nullptr;
  CHECK(n->listen(0, handle, &listen_comm) == ncclSuccess && listen_comm, "net listen");
  char all[kRanks][NCCL_NET_HANDLE_MAXSIZE];
  if (!exchange(to_parent, from_parent, handle, all)) {
    CHECK(false, "net handle exchange");
    return;
  }
  void* send_comm = nullptr;
  void* recv_comm = nullptr;
  while (send_comm == nullptr || recv_comm == nullptr) {
    if (send_comm == nullptr &&
        n->connect(0, all[(g_rank + 1) % kRanks], &send_comm, nullptr) != ncclSuccess) {
      CHECK(false, "net connect");
      return;
    }
    if (recv_comm == nullptr && n->accept(listen_comm, &recv_comm, nullptr) != ncclSuccess) {
      CHECK(false, "net accept");
      return;
    }
  }
  void* mh = nullptr;
  std::vector<uint8_t> probe(16);
  CHECK(n->regMr(send_comm, probe.data(), probe.size(), NCCL_PTR_CUDA, &mh) != ncclSuccess,
        "net regMr of CUDA memory must be refused");
  const size_t sizes[3] = {0, 13, 3u << 20};
  const int prev = (g_rank + kRanks - 1) % kRanks;
  std::vector<std::vector<uint8_t>> out(3), in(3);
  std::vector<void*> reqs;
  std::vector<void*> mrs;
  for (size_t m = 0; m < 3; ++m) {
    out[m].resize(sizes[m] + 1);
    for (size_t i = 0; i < sizes[m]; ++i) out[m][i] = message_byte(g_rank, m, i);
    in[m].assign(4u << 20, 0);
    void* smh = nullptr;
    void* rmh = nullptr;
    CHECK(n->regMr(send_comm, out[m].data(), out[m].size(), NCCL_PTR_HOST, &smh) == ncclSuccess,
          "net regMr");
    CHECK(n->regMr(recv_comm, in[m].data(), in[m].size(), NCCL_PTR_HOST, &rmh) == ncclSuccess,
          "net regMr");
    mrs.push_back(smh);
    mrs.push_back(rmh);
    void* sreq = nullptr;
    void* rreq = nullptr;
    CHECK(n->isend(send_comm, out[m].data(), static_cast<int>(sizes[m]), 7, smh, &sreq) ==
                  ncclSuccess &&
              sreq,
          "isend %zu", m);
    void* data = in[m].data();
    int cap = static_cast<int>(in[m].size());
    int tag = 7;
    CHECK(n->irecv(recv_comm, 1, &data, &cap, &tag, &rmh, &rreq) == ncclSuccess && rreq,
          "irecv %zu", m);
    reqs.push_back(sreq);
    reqs.push_back(rreq);
  }
  std::vector<int> got(reqs.size(), -1);
  size_t left = reqs.size();
  while (left > 0) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] == nullptr) continue;
      int done = 0;
      if (n->test(reqs[i], &done, &got[i]) != ncclSuccess) {
        CHECK(false, "net test of request %zu", i);
        reqs[i] = nullptr;
        --left;
      } else if (done) {
        reqs[i] = nullptr;
        --left;
      }
    }
  }
  for (size_t m = 0; m < 3; ++m) {
    CHECK(got[2 * m] == static_cast<int>(sizes[m]), "send %zu size %d", m, got[2 * m]);
    CHECK(got[2 * m + 1] == static_cast<int>(sizes[m]), "recv %zu size %d", m, got[2 * m + 1]);
    size_t bad = 0;
    for (size_t i = 0; i < sizes[m]; ++i) bad += in[m][i] != message_byte(prev, m, i);
    CHECK(bad == 0, "message %zu from rank %d: %zu wrong bytes", m, prev, bad);
  }
  for (size_t i = 0; i < mrs.size(); ++i) n->deregMr(i % 2 ? recv_comm : send_comm, mrs[i]);
  CHECK(n->closeSend(send_comm) == ncclSuccess, "closeSend");
  CHECK(n->closeRecv(recv_comm) == ncclSuccess, "closeRecv");
  CHECK(n->closeListen(listen_comm) == ncclSuccess, "net closeListen");
  std::fprintf(stderr, "rank %d: net: 3 messages around the ring exact\n", g_rank);
}

int run_rank(const char* path, int to_parent, int from_parent) {
  alarm(240);  // a hang becomes a failure (SIGALRM), never a stuck test
  const ncclCollNet_v8_t* p = load(path);
  if (p == nullptr) return 2;
  CHECK(std::strcmp(p->name, "ina") == 0, "name %s", p->name);
  CHECK(p->init(logger) == ncclSuccess, "init");
  int ndev = -1;
  CHECK(p->devices(&ndev) == ncclSuccess && ndev == 1, "devices: %d", ndev);
  ncclNetProperties_v8_t props;
  CHECK(p->getProperties(0, &props) == ncclSuccess, "getProperties(0)");
  CHECK(props.ptrSupport == NCCL_PTR_HOST, "ptrSupport %d, expected host only", props.ptrSupport);
  CHECK(p->getProperties(1, &props) != ncclSuccess, "getProperties(1) must fail");

  int n_supported = 0;
  for (int t = 0; t < ncclNumTypes; ++t) {
    for (int op = 0; op < ncclNumOps; ++op) {
      int s = -1;
      CHECK(p->reduceSupport(static_cast<ncclDataType_t>(t), static_cast<ncclRedOp_t>(op), &s) ==
                ncclSuccess,
            "reduceSupport");
      const bool want = (t == ncclInt32 || t == ncclFloat32 || t == ncclFloat16 ||
                         t == ncclBfloat16 || t == ncclFloat8e4m3 || t == ncclFloat8e5m2) &&
                        (op == ncclSum || op == ncclMin || op == ncclMax);
      CHECK(s == (want ? 1 : 0), "reduceSupport(dtype %d, op %d) = %d", t, op, s);
      n_supported += s == 1;
    }
  }
  CHECK(n_supported == 18, "%d supported pairs, expected 18", n_supported);

  char handle[NCCL_NET_HANDLE_MAXSIZE] = {0};
  void* listen_comm = nullptr;
  CHECK(p->listen(0, handle, &listen_comm) == ncclSuccess, "listen");
  char all[kRanks][NCCL_NET_HANDLE_MAXSIZE];
  if (!exchange(to_parent, from_parent, handle, all)) {
    std::fprintf(stderr, "rank %d: handle exchange failed\n", g_rank);
    return 2;
  }
  void* handles[kRanks];
  for (int r = 0; r < kRanks; ++r) handles[r] = all[r];
  void* comm = nullptr;
  if (p->connect(handles, kRanks, g_rank, listen_comm, &comm) != ncclSuccess || comm == nullptr) {
    std::fprintf(stderr, "rank %d: connect failed\n", g_rank);
    return 2;
  }

  std::vector<uint8_t> buf(64);
  void* mh = nullptr;
  CHECK(p->regMr(comm, buf.data(), buf.size(), NCCL_PTR_CUDA, &mh) != ncclSuccess && !mh,
        "regMr of CUDA memory must be refused");
  CHECK(p->regMrDmaBuf(comm, buf.data(), buf.size(), NCCL_PTR_DMABUF, 0, -1, &mh) != ncclSuccess,
        "regMrDmaBuf must be refused");
  void* req = nullptr;
  CHECK(p->iallreduce(comm, buf.data(), buf.data(), 8, ncclInt64, ncclSum, nullptr, nullptr,
                      &req) != ncclSuccess &&
            req == nullptr,
        "iallreduce of int64 must be refused");
  CHECK(p->iallreduce(comm, buf.data(), buf.data(), 8, ncclFloat32, ncclProd, nullptr, nullptr,
                      &req) != ncclSuccess &&
            req == nullptr,
        "iallreduce with PROD must be refused");

  check_allreduce(p, comm);
  check_allgather(p, comm);
  check_reducescatter(p, comm);

  req = nullptr;
  CHECK(p->iflush(comm, buf.data(), 64, nullptr, &req) == ncclSuccess && req, "iflush");
  if (req != nullptr) wait_all(p, {req}, {0});
  CHECK(p->closeColl(comm) == ncclSuccess, "closeColl");
  CHECK(p->closeListen(listen_comm) == ncclSuccess, "closeListen");

  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  const auto* net = static_cast<const ncclNet_v8_t*>(dlsym(lib, "ncclNetPlugin_v8"));
  CHECK(net != nullptr && std::strcmp(net->name, "ina") == 0, "ncclNetPlugin_v8 exported");
  if (net != nullptr) check_net(net, to_parent, from_parent);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main() {
  const char* path = std::getenv("INA_NCCL_PLUGIN");
  if (path == nullptr) {
    std::fprintf(stderr, "INA_NCCL_PLUGIN is not set (run through meson test)\n");
    return 2;
  }
  // Without an aggregator the plugin offers no device, so NCCL leaves CollNet off.
  unsetenv("INA_AGGREGATOR");
  {
    const ncclCollNet_v8_t* p = load(path);
    int ndev = -1;
    if (p == nullptr || p->devices(&ndev) != ncclSuccess || ndev != 0) {
      std::fprintf(stderr, "FAIL: devices() without INA_AGGREGATOR: %d, expected 0\n", ndev);
      return 1;
    }
  }
  ina::testing::AggregatorProcess agg;
  const std::string err = agg.start(kRanks);
  if (!err.empty()) {
    std::fprintf(stderr, "FAIL: aggregator: %s\n", err.c_str());
    return 1;
  }
  const std::string addr = "127.0.0.1:" + std::to_string(agg.port);
  setenv("INA_AGGREGATOR", addr.c_str(), 1);
  setenv("INA_TIMEOUT_MS", "30000", 1);

  int up[kRanks][2], down[kRanks][2];
  pid_t pids[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    if (pipe(up[r]) != 0 || pipe(down[r]) != 0) return 2;
    pids[r] = fork();
    if (pids[r] == 0) {
      g_rank = r;
      _exit(run_rank(path, up[r][1], down[r][0]));
    }
  }
  // NCCL's bootstrap allgather of the listen handles, done here with pipes: once for the
  // CollNet, once for the net.
  bool exchanged = true;
  for (int round = 0; round < 2 && exchanged; ++round) {
    char all[kRanks][NCCL_NET_HANDLE_MAXSIZE];
    for (int r = 0; r < kRanks; ++r)
      exchanged &= read(up[r][0], all[r], sizeof(all[r])) == static_cast<ssize_t>(sizeof(all[r]));
    if (exchanged) {
      for (int r = 0; r < kRanks; ++r)
        exchanged &= write(down[r][1], all, sizeof(all)) == static_cast<ssize_t>(sizeof(all));
    }
  }
  int failed = exchanged ? 0 : 1;
  for (int r = 0; r < kRanks; ++r) {
    if (!exchanged) kill(pids[r], SIGKILL);
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "FAIL: rank %d exited with status 0x%x\n", r, status);
      failed = 1;
    }
  }
  const int agg_status = agg.stop();
  if (agg_status != 0) {
    std::fprintf(stderr, "FAIL: the aggregator exited with %d\n", agg_status);
    failed = 1;
  }
  std::fprintf(stderr, failed ? "FAIL\n" : "PASS: 4 ranks through the CollNet v8 plugin\n");
  return failed;
}
