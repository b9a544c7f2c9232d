// ina-gloo-bench: Gloo's ring AllReduce over its TCP transport on 127.0.0.1, with the sweep,
// data, check and table of ina-bench. Forks --ranks processes (before any thread) which meet
// through a gloo::rendezvous::FileStore in a fresh temporary directory ($TMPDIR or /tmp), removed
// as soon as every rank is connected (and at the end, whatever happened).
//
//   build/testbed/ina-gloo-bench -b 8 -e 64M --ranks 4
//
// External ranks (one process per rank, e.g. one per network namespace): --rank R
// --world-size N --store-dir DIR --bind ADDR. DIR is a fresh directory every rank can reach
// (the file system is shared across network namespaces) and ADDR the rank's own address; the
// time (MAX) and #wrong (SUM) of each size are reduced over the ranks with Gloo itself, and rank
// 0 prints the table and writes the CSV.
//
//   ina-gloo-bench --rank 0 --world-size 2 --store-dir /run/x --bind 10.77.1.1 -e 16M   # and 1
//
// --coll alltoall times gloo::alltoall instead (each rank sends size/N bytes to each peer, sizes
// rounded down to whole elements per rank, busbw = algbw (N-1)/N, every element compared
// exactly), as ina-bench and ina-mpi-bench --coll alltoall do.
//
// time = max over ranks of the average time of one call; #wrong = sum over ranks (the inputs
// have few significant bits, so the float sum is exact in any order; one ulp is allowed anyway).
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_cli.h"
#include "bench_common.h"
#include "bench_ranks.h"
#include "ina_config.h"

namespace {

struct Options {
  std::string minbytes = "8";
  std::string maxbytes = "64M";
  double stepfactor = 2;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  std::string datatype = "float32";
  std::string op = "sum";
  int ranks = 4;
  uint32_t timeout_ms = 30000;
  std::string csv;
  std::string max_bytes_per_size = "0";
  int rank = -1;          // >= 0: external mode, this process is that rank
  std::string store_dir;  // external mode: the FileStore's directory
  std::string bind = "127.0.0.1";
  std::string coll = "allreduce";  // allreduce | alltoall
  bool alltoall = false;
  bool is_int = false;
  int opcode = 0;  // 0 sum, 1 min, 2 max
  size_t min_b = 0, max_b = 0, cap_b = 0;
};

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn reduce_fn(int opcode) {
  switch (opcode) {
    case 1: return static_cast<ReduceFn>(&gloo::min<T>);
    case 2: return static_cast<ReduceFn>(&gloo::max<T>);
    default: return static_cast<ReduceFn>(&gloo::sum<T>);
  }
}

// int32 SUM wraps (gloo::sum<int32_t> would overflow a signed int): add as uint32.
void sum_wrap_i32(void* c, const void* a, const void* b, size_t n) {
  auto* pc = static_cast<uint32_t*>(c);
  const auto* pa = static_cast<const uint32_t*>(a);
  const auto* pb = static_cast<const uint32_t*>(b);
  for (size_t i = 0; i < n; ++i) pc[i] = pa[i] + pb[i];
}

double ulp_f32(double a) {
  int e = -126;
  if (a > 0) {
    int e2 = 0;
    std::frexp(a, &e2);
    e = std::max(e2 - 1, -126);
  }
  return std::ldexp(1.0, e - 23);
}

// AllToAll: block j of `out` (per_peer elements) must be rank j's elements for `rank`.
int64_t check_alltoall(const Options& o, int rank, int ranks, const void* out, size_t per_peer,
                       double scale) {
  int64_t wrong = 0;
  for (int j = 0; j < ranks; ++j)
    for (size_t i = 0; i < per_peer; ++i) {
      const size_t at = static_cast<size_t>(j) * per_peer + i;
      const size_t src = static_cast<size_t>(rank) * per_peer + i;
      const bool bad = o.is_int ? static_cast<const int32_t*>(out)[at] != bench_int_value(src, j)
                                : static_cast<const float*>(out)[at] !=
                                      static_cast<float>(bench_float_value(src, j, 256, scale));
      if (bad && wrong++ < 5)
        std::fprintf(stderr, "# rank %d: element %zu (from rank %d) wrong\n", rank, at, j);
    }
  return wrong;
}

int64_t check_output(const Options& o, int rank, int ranks, const void* out, size_t count,
                     double scale) {
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    bool bad = false;
    if (o.is_int) {
      uint32_t sum = 0;
      int32_t mn = INT32_MAX;
      int32_t mx = INT32_MIN;
      for (int r = 0; r < ranks; ++r) {
        int32_t v = bench_int_value(i, r);
        sum += static_cast<uint32_t>(v);
        mn = std::min(mn, v);
        mx = std::max(mx, v);
      }
      int32_t got = static_cast<const int32_t*>(out)[i];
      bad = o.opcode == 0 ? static_cast<uint32_t>(got) != sum : got != (o.opcode == 1 ? mn : mx);
    } else {
      double sum = 0;
      double mn = 0;
      double mx = 0;
      for (int r = 0; r < ranks; ++r) {
        double v = static_cast<float>(bench_float_value(i, r, 256, scale));
        sum += v;
        if (r == 0 || v < mn) mn = v;
        if (r == 0 || v > mx) mx = v;
      }
      double got = static_cast<const float*>(out)[i];
      bad = o.opcode == 0 ? !(std::fabs(got - sum) <= ulp_f32(std::fabs(sum)))
                          : !(got == (o.opcode == 1 ? mn : mx));
    }
    if (bad) {
      if (wrong < 5) std::fprintf(stderr, "# rank %d: element %zu wrong\n", rank, i);
      wrong++;
    }
  }
  return wrong;
}

void fill(const Options& o, int rank, void* buf, size_t count, double scale) {
  if (o.is_int) {
    auto* p = static_cast<int32_t*>(buf);
    for (size_t i = 0; i < count; ++i) p[i] = bench_int_value(i, rank);
  } else {
    auto* p = static_cast<float*>(buf);
    for (size_t i = 0; i < count; ++i)
      p[i] = static_cast<float>(bench_float_value(i, rank, 256, scale));
  }
}

// What a rank does with its result of one size: fork mode sends it to the parent through the
// pipe; external mode reduces it over the ranks (MAX time, SUM wrong) and rank 0 prints it.
struct Sink {
  std::function<void()> ready;
  std::function<void(int k, double time_us, int64_t wrong)> size;
};

// Reduces one double over the ranks with Gloo (the external mode's table).
double reduce_one(const std::shared_ptr<gloo::Context>& ctx, double v, bool max) {
  gloo::AllreduceOptions opts(ctx);
  opts.setInput(&v, 1);
  opts.setOutput(&v, 1);
  opts.setReduceFunction(max ? static_cast<ReduceFn>(&gloo::max<double>)
                             : static_cast<ReduceFn>(&gloo::sum<double>));
  opts.setTag(0x7fff0000u);
  gloo::allreduce(opts);
  return v;
}

int child_main(const Options& o, const std::vector<size_t>& sizes, const std::string& dir, int rank,
               const std::function<Sink(std::shared_ptr<gloo::Context>)>& make_sink,
               const std::function<void(const std::string&)>& fail) {
  try {
    gloo::transport::tcp::attr attr(o.bind.c_str());
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(dir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, o.ranks);
    ctx->setTimeout(std::chrono::milliseconds(o.timeout_ms));
    ctx->connectFullMesh(store, dev);
    Sink sink = make_sink(ctx);
    sink.ready();  // fork mode: the parent removes the store once every rank is here

    const size_t esize = 4;
    std::vector<uint64_t> send_store(sizes.back() / 8 + 8);
    std::vector<uint64_t> recv_store(sizes.back() / 8 + 8);
    double scale = bench_float_scale(o.ranks, 3.0e38);
    bool all_ok = true;
    for (size_t k = 0; k < sizes.size(); ++k) {
      size_t bytes = sizes[k];
      size_t count = bytes / esize;
      int iters = 0;
      int warmup = 0;
      bench_iters_for(bytes, o.iters, o.warmup, o.cap_b, &iters, &warmup);
      fill(o, rank, send_store.data(), count, scale);
      std::memset(recv_store.data(), 0xff, bytes);
      gloo::AllreduceOptions opts(ctx);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setTimeout(std::chrono::milliseconds(o.timeout_ms));
      if (o.is_int) {
        opts.setInput(reinterpret_cast<int32_t*>(send_store.data()), count);
        opts.setOutput(reinterpret_cast<int32_t*>(recv_store.data()), count);
        opts.setReduceFunction(o.opcode == 0 ? &sum_wrap_i32 : reduce_fn<int32_t>(o.opcode));
      } else {
        opts.setInput(reinterpret_cast<float*>(send_store.data()), count);
        opts.setOutput(reinterpret_cast<float*>(recv_store.data()), count);
        opts.setReduceFunction(reduce_fn<float>(o.opcode));
      }
      opts.setTag(static_cast<uint32_t>(k));
      gloo::AlltoallOptions a2a(ctx);
      a2a.setTimeout(std::chrono::milliseconds(o.timeout_ms));
      a2a.setTag(static_cast<uint32_t>(k));
      if (o.is_int) {
        a2a.setInput(reinterpret_cast<int32_t*>(send_store.data()), count);
        a2a.setOutput(reinterpret_cast<int32_t*>(recv_store.data()), count);
      } else {
        a2a.setInput(reinterpret_cast<float*>(send_store.data()), count);
        a2a.setOutput(reinterpret_cast<float*>(recv_store.data()), count);
      }
      auto run_once = [&] { o.alltoall ? gloo::alltoall(a2a) : gloo::allreduce(opts); };
      for (int i = 0; i < warmup; ++i) run_once();
      double t0 = bench_now_us();
      for (int i = 0; i < iters; ++i) run_once();
      double t = (bench_now_us() - t0) / iters;
      const size_t per_peer = count / static_cast<size_t>(o.ranks);
      int64_t wrong = !o.check ? -1
                      : o.alltoall
                          ? check_alltoall(o, rank, o.ranks, recv_store.data(), per_peer, scale)
                          : check_output(o, rank, o.ranks, recv_store.data(), count, scale);
      if (wrong > 0) all_ok = false;
      sink.size(static_cast<int>(k), t, wrong);
    }
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::string msg = std::string("gloo: ") + e.what();
    std::fprintf(stderr, "# rank %d: %s\n", rank, msg.c_str());
    fail(msg);
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "ina-gloo-bench: Gloo ring AllReduce over TCP on 127.0.0.1 (nccl-tests style table)"};
  app.set_version_flag("--version", "ina-gloo-bench " INA_VERSION);
  ina::bench::add_sweep_options(app, o, "float32|int32 (or float|int)");
  app.add_option("--ranks,--workers,--world-size", o.ranks,
                 "ranks (forked; with --rank: the job's world size)")
      ->capture_default_str();
  app.add_option("--timeout-ms", o.timeout_ms, "Gloo's timeout")->capture_default_str();
  app.add_option("--coll", o.coll, "allreduce, or alltoall (size/N bytes to each peer)")
      ->check(CLI::IsMember({"allreduce", "alltoall"}))
      ->capture_default_str();
  app.add_option("--rank", o.rank,
                 "external mode: this process is that rank of --world-size (one process per "
                 "rank; needs --store-dir)");
  app.add_option("--store-dir", o.store_dir,
                 "external mode: the FileStore directory every rank reaches (fresh per job)");
  app.add_option("--bind", o.bind, "the TCP transport's address (external mode: this rank's)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  o.alltoall = o.coll == "alltoall";
  if (o.rank >= 0 && (o.rank >= o.ranks || o.store_dir.empty())) {
    std::fprintf(stderr,
                 "ina-gloo-bench: --rank %d: needs 0 <= rank < --world-size (%d) and "
                 "--store-dir DIR (a fresh directory every rank reaches)\n",
                 o.rank, o.ranks);
    return 1;
  }

  if (bench_parse_size(o.minbytes.c_str(), &o.min_b) != 0 ||
      bench_parse_size(o.maxbytes.c_str(), &o.max_b) != 0 ||
      bench_parse_size(o.max_bytes_per_size.c_str(), &o.cap_b) != 0) {
    std::fprintf(stderr, "ina-gloo-bench: bad size in -b/-e/--max-bytes-per-size\n");
    return 1;
  }
  if (o.datatype == "float32" || o.datatype == "float")
    o.is_int = false;
  else if (o.datatype == "int32" || o.datatype == "int")
    o.is_int = true;
  else {
    std::fprintf(stderr, "ina-gloo-bench: datatype must be float32 or int32\n");
    return 1;
  }
  if (o.op == "sum")
    o.opcode = 0;
  else if (o.op == "min")
    o.opcode = 1;
  else if (o.op == "max")
    o.opcode = 2;
  else {
    std::fprintf(stderr, "ina-gloo-bench: op must be sum, min or max\n");
    return 1;
  }
  if (o.iters < 1 || o.warmup < 0 || o.ranks < 1 || o.stepfactor <= 1.0) {
    std::fprintf(stderr,
                 "ina-gloo-bench: need iters >= 1, warmup >= 0, ranks >= 1, "
                 "stepfactor > 1\n");
    return 1;
  }
  std::vector<size_t> sizes(BENCH_MAX_SIZES);
  int n = bench_sizes(o.min_b, o.max_b, o.stepfactor, 4, sizes.data());
  if (n <= 0) {
    std::fprintf(stderr, "ina-gloo-bench: no sizes in the range\n");
    return 1;
  }
  sizes.resize(static_cast<size_t>(n));
  if (o.alltoall) {  // whole elements per rank; drop empty and repeated sizes
    const size_t unit = static_cast<size_t>(o.ranks) * 4;
    sizes = ina::bench::alltoall_sizes(sizes, unit);
    if (sizes.empty()) {
      std::fprintf(stderr, "ina-gloo-bench: alltoall needs at least %zu B\n", unit);
      return 1;
    }
  }
  const char* type_name = o.is_int ? "int32" : "float32";

  auto print_header = [&](const char* where) {
    std::string title = std::string(o.alltoall ? "ina-gloo-bench: Gloo AllToAll"
                                               : "ina-gloo-bench: Gloo AllReduce (ring)") +
                        ", TCP transport on " + where;
    bench_print_preamble(stdout, title.c_str());
    std::printf("# ranks %d, dtype %s, op %s, iters %d, warmup %d, check %d", o.ranks, type_name,
                o.op.c_str(), o.iters, o.warmup, o.check);
    if (o.cap_b > 0) {
      char cap[64];
      bench_format_size(o.cap_b, cap, sizeof cap);
      std::printf(", iterations capped at %s per size", cap);
    }
    std::printf("\n");
    bench_print_table_header(stdout);
  };
  double busbw_sum = 0;
  int rows = 0;
  long long wrong_total = 0;
  bool all_ok = true;
  // One row of the table (and the CSV), from the time (MAX) and #wrong (SUM) over the ranks.
  auto emit = [&](size_t bytes, double time_us, long long wrong, bool counted) {
    size_t count = bytes / 4;
    double algbw = 0;
    double busbw = 0;
    bench_bandwidth(bytes, time_us, o.ranks, &algbw, &busbw);
    if (o.alltoall) busbw = algbw * bench_alltoall_busbw_factor(o.ranks);
    const char* op_name = o.alltoall ? "none" : o.op.c_str();
    bench_print_row(stdout, bytes, count, type_name, op_name, time_us, algbw, busbw, wrong);
    if (counted) {
      busbw_sum += busbw;
      rows++;
    }
    if (wrong > 0) {
      wrong_total += wrong;
      all_ok = false;
    }
    if (!o.csv.empty() &&
        bench_csv_append(o.csv.c_str(), o.alltoall ? "gloo-alltoall" : "gloo", o.ranks, bytes,
                         count, type_name, op_name, time_us, algbw, busbw, wrong) != 0)
      std::fprintf(stderr, "ina-gloo-bench: cannot append to %s: %s\n", o.csv.c_str(),
                   std::strerror(errno));
  };

  if (o.rank >= 0) {  // external mode: this process is one rank
    if (o.rank == 0) print_header(o.bind.c_str());
    int rc = child_main(
        o, sizes, o.store_dir, o.rank,
        [&](std::shared_ptr<gloo::Context> ctx) {
          Sink sink;
          sink.ready = [] {};
          sink.size = [&, ctx](int k, double t, int64_t wrong) {
            double tmax = reduce_one(ctx, t, true);
            double wsum = reduce_one(ctx, wrong < 0 ? 0.0 : static_cast<double>(wrong), false);
            if (o.rank != 0) return;
            emit(sizes[static_cast<size_t>(k)], tmax, o.check ? static_cast<long long>(wsum) : -1,
                 true);
            std::fflush(stdout);
          };
          return sink;
        },
        [](const std::string&) {});
    if (o.rank == 0) bench_print_footer(stdout, busbw_sum, rows, wrong_total, o.check);
    return rc == 0 && all_ok ? 0 : 1;
  }

  const std::string dir = bench::make_temp_dir("ina-gloo-bench");
  if (dir.empty()) {
    std::perror("mkdtemp");
    return 1;
  }

  print_header(o.bind.c_str());

  std::vector<pid_t> pids;
  int read_fd = -1;
  if (!bench::spawn_ranks(
          o.ranks,
          [&](int rank, int fd) {
            return child_main(
                o, sizes, dir, rank,
                [rank, fd](std::shared_ptr<gloo::Context>) {
                  Sink sink;
                  sink.ready = [rank, fd] { bench::report_ready(fd, rank); };
                  sink.size = [rank, fd](int k, double t, int64_t wrong) {
                    bench::report_size(fd, rank, k, t, wrong, true, "");
                  };
                  return sink;
                },
                [rank, fd](const std::string& msg) { bench::report_failure(fd, rank, msg); });
          },
          &pids, &read_fd)) {
    bench::remove_dir(dir);
    return 1;
  }
  bench::Collected col;
  bench::collect(
      read_fd, o.ranks, n,
      [&](int k, const bench::SizeRow& row) {
        size_t bytes = sizes[static_cast<size_t>(k)];
        if (!row.ok) {
          std::printf("%12zu  FAILED (see below)\n", bytes);
          all_ok = false;
          return;
        }
        bool complete = row.reports == o.ranks && row.ok;
        emit(bytes, row.time_us, static_cast<long long>(row.wrong), complete);
        if (!complete) {
          std::printf("# (size %zu: not every rank completed it)\n", bytes);
          all_ok = false;
        }
      },
      &col, [&] { bench::remove_dir(dir); });
  std::vector<std::string> failures = col.failures;
  if (!bench::wait_ranks(pids, &failures)) all_ok = false;
  for (size_t k = 0; k < sizes.size(); ++k)
    if (!col.rows[k].printed) all_ok = false;
  bench::remove_dir(dir);
  bench_print_footer(stdout, busbw_sum, rows, wrong_total, o.check);
  for (const auto& f : failures) std::printf("# FAILED %s\n", f.c_str());
  std::fflush(stdout);
  return all_ok ? 0 : 1;
}
