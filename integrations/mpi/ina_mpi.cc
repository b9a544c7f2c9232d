// libina-mpi: the PMPI interposer. MPI_Allreduce and MPI_Iallreduce on MPI_COMM_WORLD with a
// supported (datatype, op) run through an INA communicator; every other call goes to PMPI_*.
//
// Bootstrap (inside MPI_Init / MPI_Init_thread, after PMPI_Init*): rank and size come from
// MPI_COMM_WORLD, the aggregator from INA_AGGREGATOR or an admission by INA_CONTROLLER (libina's
// Config::from_env_with_store: the rest of INA_* as for libina). The host
// mesh (INA's fallback when the aggregator is lost) meets at a TCP store served by rank 0 on a
// port it reserves and broadcasts with PMPI_Bcast, so no INA_STORE / MASTER_ADDR is needed (an
// INA_STORE that is set wins). Every rank must agree on using INA, so the decision is an
// allreduce (MIN) over "my communicator is up and in-network": if any rank fails, all pass
// through, and rank 0 says why on stderr once.
//
// What goes through INA (see README.md for why):
//   MPI_INT, MPI_INT32_T   SUM (wraps mod 2^32), MIN, MAX: exact
//   MPI_FLOAT              MIN, MAX: exact; SUM: quantized (protocol/QUANTIZATION.md), bounded
//                          by N * M * 2^-B + ulp(s); INA_MPI_EXACT=1 passes float SUM through
//   MPI_DOUBLE and others  pass through (the wire carries 32-bit words: a double would lose
//                          precision nobody asked to lose)
// Only the MPI_COMM_WORLD handle itself is mapped: the aggregator holds one job, whose ranks are
// the world's, and sharing one INA stream between communicators would pair calls that MPI lets
// ranks issue in different orders on different communicators.
//
// MPI_Iallreduce: a generalized request (MPI_Grequest_start) completed by this library's worker
// thread, which runs the queued INA collectives in issue order; blocking calls wait for the
// queue to drain first, so INA sees every rank's calls in the same order.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include "integrations/mpi/ina_mpi.h"

#include <arpa/inet.h>
#include <mpi.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ina/ina.hpp"

static_assert(sizeof(int) == 4, "MPI_INT is mapped to int32");
static_assert(sizeof(float) == 4, "MPI_FLOAT is mapped to float32");

namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// One queued MPI_Iallreduce; owned by its generalized request (freed by grequest_free).
struct Pending {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ina::DType dtype = ina::DType::kFloat32;
  ina::ReduceOp op = ina::ReduceOp::kSum;
  MPI_Request request = MPI_REQUEST_NULL;
  int error = MPI_SUCCESS;
};

class Interposer {
 public:
  std::unique_ptr<ina::Communicator> comm;
  bool exact_only = false;
  std::atomic<uint64_t> served_blocking{0};
  std::atomic<uint64_t> served_nonblocking{0};
  std::atomic<uint64_t> passed{0};
  std::atomic<uint64_t> errors{0};

  void start_worker() {
    worker_ = std::thread([this] { run(); });
  }

  // Runs one collective on the caller's thread, after everything queued before it.
  ina::Status run_blocking(const void* send, void* recv, size_t count, ina::DType dtype,
                           ina::ReduceOp op) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return queue_.empty() && !busy_; });
    busy_ = true;
    lk.unlock();
    ina::Status s = comm->allreduce(send, recv, count, dtype, op);
    lk.lock();
    busy_ = false;
    cv_.notify_all();
    return s;
  }

  void enqueue(Pending* p) {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(p);
    cv_.notify_all();
  }

  // Drains the queue and joins the worker.
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (worker_.joinable()) worker_.join();
  }

 private:
  void run() {
    for (;;) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return (!queue_.empty() && !busy_) || (stop_ && queue_.empty()); });
      if (queue_.empty()) return;
      Pending* p = queue_.front();
      queue_.pop_front();
      busy_ = true;
      lk.unlock();
      ina::Status s = comm->allreduce(p->send, p->recv, p->count, p->dtype, p->op);
      if (!s.ok()) {
        errors.fetch_add(1, std::memory_order_relaxed);
        std::fprintf(stderr, "ina-mpi: rank %d: MPI_Iallreduce through INA failed: %s\n",
                     comm->rank(), s.message().c_str());
        p->error = MPI_ERR_OTHER;
      }
      // p belongs to the request from here on: MPI may free it once it is complete.
      MPI_Request r = p->request;
      lk.lock();
      busy_ = false;
      cv_.notify_all();
      lk.unlock();
      PMPI_Grequest_complete(r);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending*> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;
};

// The interposer's state: one per process by nature (MPI itself is). Null: pass everything.
Interposer* g_ina = nullptr;
std::atomic<uint64_t> g_passed_inactive{0};

bool map_call(MPI_Datatype datatype, MPI_Op mpi_op, bool exact_only, ina::DType* dtype,
              ina::ReduceOp* op) {
  if (mpi_op == MPI_SUM) {
    *op = ina::ReduceOp::kSum;
  } else if (mpi_op == MPI_MIN) {
    *op = ina::ReduceOp::kMin;
  } else if (mpi_op == MPI_MAX) {
    *op = ina::ReduceOp::kMax;
  } else {
    return false;
  }
  if (datatype == MPI_INT || datatype == MPI_INT32_T) {
    *dtype = ina::DType::kInt32;
  } else if (datatype == MPI_FLOAT) {  // (MPI has no float8 type: libina's fp8 has no mapping)
    if (exact_only && *op == ina::ReduceOp::kSum) return false;
    *dtype = ina::DType::kFloat32;
  } else {
    return false;
  }
  return true;
}

// Rank 0 reserves a TCP port for the store: a socket bound with SO_REUSEADDR and kept (not
// listening) until the store's own listener, also SO_REUSEADDR, has bound the same port. Returns
// the port (0 on failure) and the holding socket in *fd.
uint16_t reserve_port(const std::string& address, int* fd) {
  *fd = -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1) return 0;
  const int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return 0;
  int one = 1;
  (void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len = sizeof(sa);
  if (bind(s, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      getsockname(s, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    close(s);
    return 0;
  }
  *fd = s;
  return ntohs(sa.sin_port);
}

bool all_ranks(bool mine) {
  int v = mine ? 1 : 0;
  int all = 0;
  if (PMPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS) return false;
  return all == 1;
}

// Collective over MPI_COMM_WORLD. Leaves g_ina set when every rank is in-network.
void bootstrap() {
  int rank = 0;
  int size = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  PMPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string why;  // this rank's reason not to use INA ("" while fine)
  bool config_error = false;

  // libina's rules, with this library's store as the rendezvous: INA_AGGREGATOR, or
  // INA_CONTROLLER (admission), for the in-network path. Host only (INA_TRANSPORT=host, or
  // neither variable) is no use here: MPI's own MPI_Allreduce serves the host path.
  ina::Config cfg;
  ina::Result<ina::Config> env = ina::Config::from_env_with_store();
  if (env.ok()) {
    cfg = std::move(env.value());
    if (cfg.host_only) why = ina::host_only_reason(cfg);
  } else {
    why = env.status().message();
    config_error = true;
  }
  cfg.rank = rank;
  cfg.world_size = size;

  // The host mesh's store: rank 0 reserves a port and broadcasts "host:port" (empty: none).
  int hold_fd = -1;
  const bool own_store = cfg.store.empty();
  if (own_store) {
    char addr[256] = {0};
    if (rank == 0 && why.empty()) {
      if (cfg.mesh_address.empty()) cfg.mesh_address = "127.0.0.1";  // the store's host
      const uint16_t port = reserve_port(cfg.mesh_address, &hold_fd);
      if (port != 0) {
        std::snprintf(addr, sizeof(addr), "%s:%u", cfg.mesh_address.c_str(), port);
      } else {
        std::fprintf(stderr,
                     "ina-mpi: no TCP port for the host mesh's store on %s: INA runs without "
                     "host fallback\n",
                     cfg.mesh_address.c_str());
      }
    }
    PMPI_Bcast(addr, sizeof(addr), MPI_CHAR, 0, MPI_COMM_WORLD);
    cfg.store = addr;
  }

  std::unique_ptr<ina::Communicator> comm;
  if (all_ranks(why.empty())) {
    ina::Result<std::unique_ptr<ina::Communicator>> c = ina::Communicator::create(cfg);
    if (!c.ok()) {
      why = c.status().message();
    } else if (c.value()->on_host_path()) {
      why = cfg.controller_host.empty()
                ? "the aggregator " + cfg.aggregator_host + ":" +
                      std::to_string(cfg.aggregator_port) +
                      " did not answer (INA would only run on the host mesh)"
                : "the controller " + cfg.controller_host + ":" +
                      std::to_string(cfg.controller_port) +
                      " did not place the job on an aggregator that answers (INA would only run "
                      "on the host mesh; libina's line above says why)";
    } else {
      comm = std::move(c.value());
    }
  } else if (why.empty()) {
    why = "another rank cannot use INA";
  }
  if (hold_fd >= 0) close(hold_fd);
  const bool everyone = all_ranks(why.empty() && comm != nullptr);
  if (!everyone) {
    // Once per job: rank 0 says why; another rank only when its own configuration is at fault.
    if (rank == 0) {
      std::fprintf(stderr, "ina-mpi: INA is off, MPI_Allreduce passes through to MPI: %s\n",
                   why.empty() ? "another rank could not start INA" : why.c_str());
    } else if (config_error) {
      std::fprintf(stderr, "ina-mpi: rank %d cannot use INA: %s\n", rank, why.c_str());
    }
    return;  // comm (if any) is destroyed here on every rank that made one
  }
  auto* in = new Interposer();
  in->comm = std::move(comm);
  in->exact_only = env_flag("INA_MPI_EXACT");
  in->start_worker();
  g_ina = in;
}

void shutdown(int rank) {
  Interposer* in = g_ina;
  if (env_flag("INA_MPI_STATS")) {
    ina_mpi_stats_t s;
    ina_mpi_get_stats(&s);
    std::fprintf(stderr,
                 "ina-mpi: rank %d: INA %s; served %llu MPI_Allreduce + %llu MPI_Iallreduce, "
                 "passed through %llu, errors %llu\n",
                 rank, s.active ? "on" : "off", static_cast<unsigned long long>(s.served_blocking),
                 static_cast<unsigned long long>(s.served_nonblocking),
                 static_cast<unsigned long long>(s.passed_through),
                 static_cast<unsigned long long>(s.errors));
  }
  if (in == nullptr) return;
  in->stop();
  // Rank 0 serves the store: nobody may still be using it when it goes.
  PMPI_Barrier(MPI_COMM_WORLD);
  in->comm.reset();
}

int grequest_query(void* extra, MPI_Status* status) {
  auto* p = static_cast<Pending*>(extra);
  PMPI_Status_set_elements(status, MPI_BYTE, 0);
  PMPI_Status_set_cancelled(status, 0);
  status->MPI_SOURCE = MPI_UNDEFINED;
  status->MPI_TAG = MPI_UNDEFINED;
  status->MPI_ERROR = p->error;
  return p->error;
}

int grequest_free(void* extra) {
  delete static_cast<Pending*>(extra);
  return MPI_SUCCESS;
}

int grequest_cancel(void*, int) { return MPI_SUCCESS; }  // a reduction cannot be cancelled

bool intercepts(MPI_Comm comm, int count, MPI_Datatype datatype, MPI_Op op, ina::DType* dtype,
                ina::ReduceOp* rop) {
  Interposer* in = g_ina;
  return in != nullptr && comm == MPI_COMM_WORLD && count >= 0 &&
         map_call(datatype, op, in->exact_only, dtype, rop);
}

void count_passed() {
  if (g_ina != nullptr) {
    g_ina->passed.fetch_add(1, std::memory_order_relaxed);
  } else {
    g_passed_inactive.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void ina_mpi_get_stats(ina_mpi_stats_t* out) {
  if (out == nullptr) return;
  Interposer* in = g_ina;
  *out = ina_mpi_stats_t{};
  out->passed_through = g_passed_inactive.load(std::memory_order_relaxed);
  if (in == nullptr) return;
  out->active = 1;
  out->served_blocking = in->served_blocking.load(std::memory_order_relaxed);
  out->served_nonblocking = in->served_nonblocking.load(std::memory_order_relaxed);
  out->passed_through += in->passed.load(std::memory_order_relaxed);
  out->errors = in->errors.load(std::memory_order_relaxed);
}

__attribute__((visibility("default"))) int MPI_Init(int* argc, char*** argv) {
  const int rc = PMPI_Init(argc, argv);
  if (rc == MPI_SUCCESS) bootstrap();
  return rc;
}

__attribute__((visibility("default"))) int MPI_Init_thread(int* argc, char*** argv, int required,
                                                           int* provided) {
  const int rc = PMPI_Init_thread(argc, argv, required, provided);
  if (rc == MPI_SUCCESS) bootstrap();
  return rc;
}

__attribute__((visibility("default"))) int MPI_Finalize(void) {
  int rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  shutdown(rank);
  Interposer* in = g_ina;
  g_ina = nullptr;
  delete in;
  return PMPI_Finalize();
}

__attribute__((visibility("default"))) int MPI_Allreduce(const void* sendbuf, void* recvbuf,
                                                         int count, MPI_Datatype datatype,
                                                         MPI_Op op, MPI_Comm comm) {
  ina::DType dtype;
  ina::ReduceOp rop;
  if (!intercepts(comm, count, datatype, op, &dtype, &rop)) {
    count_passed();
    return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
  }
  Interposer* in = g_ina;
  const void* send = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
  ina::Status s = in->run_blocking(send, recvbuf, static_cast<size_t>(count), dtype, rop);
  if (!s.ok()) {
    in->errors.fetch_add(1, std::memory_order_relaxed);
    std::fprintf(stderr, "ina-mpi: rank %d: MPI_Allreduce through INA failed: %s\n",
                 in->comm->rank(), s.message().c_str());
    // The communicator's error handler decides (MPI_ERRORS_ARE_FATAL by default: the job ends
    // with the message above instead of computing on a wrong buffer).
    (void)PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
    return MPI_ERR_OTHER;
  }
  in->served_blocking.fetch_add(1, std::memory_order_relaxed);
  return MPI_SUCCESS;
}

__attribute__((visibility("default"))) int MPI_Iallreduce(const void* sendbuf, void* recvbuf,
                                                          int count, MPI_Datatype datatype,
                                                          MPI_Op op, MPI_Comm comm,
                                                          MPI_Request* request) {
  ina::DType dtype;
  ina::ReduceOp rop;
  if (!intercepts(comm, count, datatype, op, &dtype, &rop)) {
    count_passed();
    return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
  }
  Interposer* in = g_ina;
  auto* p = new Pending();
  p->send = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
  p->recv = recvbuf;
  p->count = static_cast<size_t>(count);
  p->dtype = dtype;
  p->op = rop;
  const int rc =
      PMPI_Grequest_start(grequest_query, grequest_free, grequest_cancel, p, &p->request);
  if (rc != MPI_SUCCESS) {  // passing through here would desynchronize the ranks' INA streams
    delete p;
    in->errors.fetch_add(1, std::memory_order_relaxed);
    (void)PMPI_Comm_call_errhandler(comm, rc);
    return rc;
  }
  *request = p->request;
  in->served_nonblocking.fetch_add(1, std::memory_order_relaxed);
  in->enqueue(p);
  return MPI_SUCCESS;
}

}  // extern "C"
