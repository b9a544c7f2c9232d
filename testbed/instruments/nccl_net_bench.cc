// ina-nccl-net-bench: AllToAll over libnccl-net-ina.so's point-to-point net (ncclNetPlugin_v8,
// integrations/nccl/ina_net.cc), the net that carries NCCL's own traffic (rings, trees, p2p)
// wherever the INA plugin is loaded. Each rank drives the plugin as NCCL's proxy does: it
// dlopens it, listens, connects to every peer and accepts every peer's connection, then per call
// posts a receive from and a send to every peer and calls test() on every request until all are
// done, yielding the CPU when nothing moved. An nccl-tests style table (alltoall_perf: size is
// one rank's buffer, size/N bytes to each peer; time the slowest rank's mean call); every byte
// checked; exit status 1 on a wrong byte or a failed call.
//
//   ina-nccl-net-bench --plugin build/integrations/nccl/libnccl-net-ina.so --workers 4 -b 1K -e 16M
//       forks 4 ranks on 127.0.0.1
//   ina-nccl-net-bench --plugin P --rank R --world-size N --store-dir DIR --bind ADDR ...
//       one process per rank (rank R of N; every rank reaches DIR, where the listen handles meet)
//
// The net offers its device only when INA is configured (INA_AGGREGATOR), so the bench sets that
// variable where it is unset: it measures the net alone, and no aggregator is involved.
#include <dlfcn.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_cli.h"
#include "bench_common.h"
#include "bench_ranks.h"
#include "ina_config.h"
#include "integrations/nccl/collnet_v8.h"

namespace {

struct Options {
  std::string minbytes = "1K";
  std::string maxbytes = "16M";
  double stepfactor = 2;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  std::string datatype = "float32";  // a label: the net moves bytes
  std::string op = "none";
  std::string csv;
  std::string max_bytes_per_size = "0";
  int ranks = 4;
  int rank = -1;  // >= 0: one process per rank (needs --store-dir)
  std::string store_dir;
  std::string bind = "127.0.0.1";
  std::string plugin = "libnccl-net-ina.so";
  std::string coll = "alltoall";
  uint32_t timeout_ms = 60000;
  size_t min_b = 0, max_b = 0, cap_b = 0;
};

void logger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  if (level != NCCL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "# plugin: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
}

// One rank's job. Returns 0 when every call succeeded and every byte was right.
class Rank {
 public:
  Rank(const Options& o, int rank) : o_(o), rank_(rank), n_(o.ranks) {}

  int run(const std::vector<size_t>& sizes) {
    if (!connect_all()) return 1;
    const auto title = "ina-nccl-net-bench: AllToAll over libnccl-net-ina.so's net (" + o_.plugin +
                       "), " + std::to_string(n_) + " ranks";
    if (rank_ == 0) {
      bench_print_preamble(stdout, title.c_str());
      std::printf("# iters %d, warmup %d, check %d, this rank on %s\n", o_.iters, o_.warmup,
                  o_.check, o_.bind.c_str());
      bench_print_table_header(stdout);
    }
    bool ok = true;
    for (size_t bytes : sizes) ok &= one_size(bytes);
    for (void* c : send_) net_->closeSend(c);
    for (void* c : recv_) net_->closeRecv(c);
    net_->closeListen(listen_);
    return ok ? 0 : 1;
  }

 private:
  bool fail(const std::string& what) {
    std::fprintf(stderr, "# rank %d: %s\n", rank_, what.c_str());
    return false;
  }

  bool connect_all() {
    if (std::getenv("INA_AGGREGATOR") == nullptr) setenv("INA_AGGREGATOR", "unused:0", 1);
    setenv("INA_MESH_ADDR", o_.bind.c_str(), 1);
    void* lib = dlopen(o_.plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return fail(std::string("cannot load the plugin: ") + dlerror());
    net_ = static_cast<const ncclNet_v8_t*>(dlsym(lib, "ncclNetPlugin_v8"));
    if (net_ == nullptr) return fail(o_.plugin + " has no ncclNetPlugin_v8");
    int ndev = 0;
    if (net_->init(logger) != ncclSuccess || net_->devices(&ndev) != ncclSuccess || ndev < 1)
      return fail("the net offers no device");
    char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    if (net_->listen(0, handle, &listen_) != ncclSuccess) return fail("listen failed");
    const std::string mine = o_.store_dir + "/handle." + std::to_string(rank_);
    FILE* f = std::fopen((mine + ".tmp").c_str(), "wb");
    if (f == nullptr || std::fwrite(handle, sizeof handle, 1, f) != 1 || std::fclose(f) != 0 ||
        std::rename((mine + ".tmp").c_str(), mine.c_str()) != 0)
      return fail("cannot write " + mine + ": " + std::strerror(errno));
    const double deadline = bench_now_us() + o_.timeout_ms * 1e3;
    send_.assign(static_cast<size_t>(n_), nullptr);
    recv_.assign(static_cast<size_t>(n_), nullptr);
    for (int p = 0; p < n_; ++p) {
      if (p == rank_) continue;
      char h[NCCL_NET_HANDLE_MAXSIZE];
      const std::string path = o_.store_dir + "/handle." + std::to_string(p);
      for (;;) {
        FILE* g = std::fopen(path.c_str(), "rb");
        const bool got = g != nullptr && std::fread(h, sizeof h, 1, g) == 1;
        if (g != nullptr) std::fclose(g);
        if (got) break;
        if (bench_now_us() > deadline) return fail("rank " + std::to_string(p) + " never listened");
        usleep(2000);
      }
      if (net_->connect(0, h, &send_[static_cast<size_t>(p)], nullptr) != ncclSuccess)
        return fail("connect to rank " + std::to_string(p) + " failed");
    }
    // Accepted connections arrive in any order: each peer's first message names it.
    std::vector<void*> accepted;
    while (static_cast<int>(accepted.size()) < n_ - 1) {
      void* c = nullptr;
      if (net_->accept(listen_, &c, nullptr) != ncclSuccess) return fail("accept failed");
      if (c != nullptr) {
        accepted.push_back(c);
      } else {
        if (bench_now_us() > deadline) return fail("not every peer connected");
        usleep(1000);
      }
    }
    std::vector<int> me(static_cast<size_t>(n_), rank_), who(accepted.size(), -1);
    std::vector<void*> reqs;
    for (int p = 0; p < n_; ++p)
      if (p != rank_) reqs.push_back(isend(p, &me[static_cast<size_t>(p)], 4));
    for (size_t i = 0; i < accepted.size(); ++i) reqs.push_back(irecv(accepted[i], &who[i], 4));
    if (!wait_all(reqs)) return false;
    for (size_t i = 0; i < accepted.size(); ++i) {
      if (who[i] < 0 || who[i] >= n_ || who[i] == rank_ || recv_[static_cast<size_t>(who[i])])
        return fail("a peer named itself rank " + std::to_string(who[i]));
      recv_[static_cast<size_t>(who[i])] = accepted[i];
    }
    return true;
  }

  void* isend(int peer, const void* data, size_t bytes) {
    void* r = nullptr;
    if (net_->isend(send_[static_cast<size_t>(peer)], const_cast<void*>(data),
                    static_cast<int>(bytes), 0, nullptr, &r) != ncclSuccess)
      return nullptr;
    return r;
  }
  void* irecv(void* comm, void* data, size_t bytes) {
    void* r = nullptr;
    int size = static_cast<int>(bytes), tag = 0;
    void* mh = nullptr;
    if (net_->irecv(comm, 1, &data, &size, &tag, &mh, &r) != ncclSuccess) return nullptr;
    return r;
  }

  // test() on every request until all are done (NCCL's proxy loop).
  bool wait_all(std::vector<void*>& reqs) {
    for (void* r : reqs)
      if (r == nullptr) return fail("a request could not be posted");
    const double deadline = bench_now_us() + o_.timeout_ms * 1e3;
    size_t left = reqs.size();
    while (left > 0) {
      bool moved = false;
      for (void*& r : reqs) {
        if (r == nullptr) continue;
        int done = 0, size = 0;
        if (net_->test(r, &done, &size) != ncclSuccess) return fail("a request failed");
        if (done) {
          r = nullptr;
          --left;
          moved = true;
        }
      }
      if (!moved) {
        if (bench_now_us() > deadline) return fail("a call did not finish in time");
        sched_yield();
      }
    }
    return true;
  }

  bool exchange(const std::vector<uint8_t>& send, std::vector<uint8_t>& recv, size_t pp) {
    std::vector<void*> reqs;
    for (int k = 1; k < n_; ++k) {
      const int p = (rank_ + n_ - k) % n_;
      reqs.push_back(irecv(recv_[static_cast<size_t>(p)], recv.data() + p * pp, pp));
    }
    for (int k = 1; k < n_; ++k) {
      const int p = (rank_ + k) % n_;
      reqs.push_back(isend(p, send.data() + p * pp, pp));
    }
    std::memcpy(recv.data() + rank_ * pp, send.data() + rank_ * pp, pp);
    return wait_all(reqs);
  }

  bool one_size(size_t bytes) {
    const size_t pp = bytes / static_cast<size_t>(n_);
    std::vector<uint8_t> send(bytes), recv(bytes, 0xff);
    for (size_t i = 0; i < bytes / 4; ++i) {
      const int32_t v = bench_int_value(i, rank_);
      std::memcpy(send.data() + 4 * i, &v, 4);
    }
    int iters = 0, warmup = 0;
    bench_iters_for(bytes, o_.iters, o_.warmup, o_.cap_b, &iters, &warmup);
    bool ok = true;
    for (int i = 0; i < warmup && ok; ++i) ok = exchange(send, recv, pp);
    const double t0 = bench_now_us();
    for (int i = 0; i < iters && ok; ++i) ok = exchange(send, recv, pp);
    double rec[2] = {ok ? (bench_now_us() - t0) / iters : -1, 0};
    if (ok && o_.check) {  // block j is rank j's elements for this rank
      for (int j = 0; j < n_; ++j)
        for (size_t i = 0; i < pp / 4; ++i) {
          const int32_t want = bench_int_value(rank_ * pp / 4 + i, j);
          rec[1] += std::memcmp(recv.data() + j * pp + 4 * i, &want, 4) != 0;
        }
    }
    // The row: the slowest rank's time and every rank's wrong bytes, gathered at rank 0.
    std::vector<double> all(2 * static_cast<size_t>(n_), 0);
    std::vector<void*> reqs;
    if (rank_ != 0) {
      reqs.push_back(isend(0, rec, sizeof rec));
    } else {
      for (int p = 1; p < n_; ++p)
        reqs.push_back(irecv(recv_[static_cast<size_t>(p)], &all[2 * p], sizeof rec));
      all[0] = rec[0];
      all[1] = rec[1];
    }
    if (!wait_all(reqs)) return false;
    if (rank_ != 0) return ok && rec[1] == 0;
    double t = 0, wrong = 0;
    bool all_ok = true;
    for (int p = 0; p < n_; ++p) {
      all_ok &= all[2 * p] >= 0;
      t = std::max(t, all[2 * p]);
      wrong += all[2 * p + 1];
    }
    double algbw = 0, busbw = 0;
    bench_bandwidth(bytes, t, n_, &algbw, &busbw);
    busbw = algbw * bench_alltoall_busbw_factor(n_);
    const long long w = o_.check ? static_cast<long long>(wrong) : -1;
    bench_print_row(stdout, bytes, bytes / 4, o_.datatype.c_str(), "none", t, algbw, busbw, w);
    if (!o_.csv.empty() &&
        bench_csv_append(o_.csv.c_str(), "nccl-net-alltoall", n_, bytes, bytes / 4,
                         o_.datatype.c_str(), "none", t, algbw, busbw, w) != 0)
      std::fprintf(stderr, "ina-nccl-net-bench: cannot append to %s: %s\n", o_.csv.c_str(),
                   std::strerror(errno));
    return all_ok && wrong == 0;
  }

  const Options& o_;
  const int rank_;
  const int n_;
  const ncclNet_v8_t* net_ = nullptr;
  void* listen_ = nullptr;
  std::vector<void*> send_, recv_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ina-nccl-net-bench: AllToAll over the INA NCCL plugin's net (nccl-tests style)"};
  app.set_version_flag("--version", "ina-nccl-net-bench " INA_VERSION);
  ina::bench::add_sweep_options(app, o, "a label for the table (the net moves bytes)");
  app.add_option("--ranks,--workers,--world-size", o.ranks,
                 "ranks (forked; with --rank: the job's world size)")
      ->capture_default_str();
  app.add_option("--plugin", o.plugin, "the plugin to load (a path, or a name the loader finds)")
      ->capture_default_str();
  app.add_option("--coll", o.coll, "alltoall (the only one)")
      ->check(CLI::IsMember({"alltoall"}))
      ->capture_default_str();
  app.add_option("--rank", o.rank, "one process per rank: this one (needs --store-dir)");
  app.add_option("--store-dir", o.store_dir,
                 "one process per rank: a fresh directory every rank reaches");
  app.add_option("--bind", o.bind, "this rank's address (INA_MESH_ADDR)")->capture_default_str();
  app.add_option("--timeout-ms", o.timeout_ms, "a call's deadline")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.ranks < 2 || o.iters < 1 || o.warmup < 0 || o.stepfactor <= 1.0 ||
      (o.rank >= 0 && (o.rank >= o.ranks || o.store_dir.empty()))) {
    std::fprintf(stderr,
                 "ina-nccl-net-bench: need ranks >= 2, iters >= 1, warmup >= 0, stepfactor > 1, "
                 "and with --rank: 0 <= rank < ranks and --store-dir\n");
    return 1;
  }
  if (bench_parse_size(o.minbytes.c_str(), &o.min_b) != 0 ||
      bench_parse_size(o.maxbytes.c_str(), &o.max_b) != 0 ||
      bench_parse_size(o.max_bytes_per_size.c_str(), &o.cap_b) != 0) {
    std::fprintf(stderr, "ina-nccl-net-bench: bad size in -b/-e/--max-bytes-per-size\n");
    return 1;
  }
  std::vector<size_t> sizes(BENCH_MAX_SIZES);
  sizes.resize(static_cast<size_t>(
      std::max(0, bench_sizes(o.min_b, o.max_b, o.stepfactor, 4, sizes.data()))));
  // Whole int32 elements to every peer; a rank's buffer at most 2 GiB (the net's sizes are ints).
  const size_t unit = static_cast<size_t>(o.ranks) * 4;
  std::vector<size_t> kept = ina::bench::alltoall_sizes(sizes, unit);
  std::erase_if(kept, [&](size_t b) {
    return b > (size_t{1} << 31) / static_cast<size_t>(o.ranks) * static_cast<size_t>(o.ranks);
  });
  if (kept.empty()) {
    std::fprintf(stderr, "ina-nccl-net-bench: no size in the range holds %zu B\n", unit);
    return 1;
  }
  if (o.rank >= 0) return Rank(o, o.rank).run(kept);

  // Forked ranks on 127.0.0.1, their handles in a fresh directory.
  const std::string dir = bench::make_temp_dir("ina-nccl-net");
  if (dir.empty()) {
    std::perror("ina-nccl-net-bench: mkdtemp");
    return 1;
  }
  o.store_dir = dir;
  std::vector<pid_t> pids;
  int report_fd = -1;  // unused: rank 0 gathers the rows over the net itself
  if (!bench::spawn_ranks(
          o.ranks, [&](int r, int) { return Rank(o, r).run(kept); }, &pids, &report_fd)) {
    bench::remove_dir(dir);
    return 1;
  }
  close(report_fd);
  // Reaped as they end: the first rank that fails ends the others, which would wait for it.
  int rc = 0;
  for (size_t left = pids.size(); left > 0; --left) {
    int st = 0;
    if (waitpid(-1, &st, 0) < 0) break;
    if ((!WIFEXITED(st) || WEXITSTATUS(st) != 0) && rc == 0) {
      rc = 1;
      for (pid_t q : pids) kill(q, SIGKILL);
    }
  }
  bench::remove_dir(dir);
  return rc;
}
