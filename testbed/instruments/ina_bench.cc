// Longer than 700 lines: one tool whose three modes (local, local host, external ranks) share
// the options, the element check and the CPU report; splitting it would scatter one CLI.
// ina-bench: AllReduce through an INA aggregator, in the style of nccl-tests' all_reduce_perf;
// also the host algorithms (--transport host: ring, tree, halving-doubling over the TCP mesh, no
// aggregator) and AllToAll (--coll alltoall, nccl-tests' alltoall_perf: each rank sends size/N
// bytes to each peer; busbw = algbw (N-1)/N).
//
// Local mode (default): the process binds an embedded aggregator (kernel UDP backend) on
// 127.0.0.1, forks --workers ranks, serves them from a thread until they finish, and prints one
// row per size (time = max over ranks, #wrong = sum over ranks) and the aggregator's counters.
// External mode (--aggregator host:port, or INA_AGGREGATOR with INA_RANK / INA_WORLD_SIZE): this
// process is one rank of a job served by a running ina-aggregator; rank 0 prints the table (time
// and #wrong are reduced over the ranks through the aggregator itself, outside the timed loop).
// --local-ranks N runs ranks --rank .. --rank+N-1 as threads of the one process, each with its own
// communicator: ranks that must share one DPDK port (INA_TRANSPORT=dpdk over net_memif, whose
// server serves one peer process) run this way.
// Through a controller (INA_CONTROLLER): every rank asks the controller once, as libina does, and
// the header names the aggregator(s) and the job the controller admitted it to (or the host path
// when it refused); no embedded aggregator is started. With INA_RANK / --rank this process is one
// rank; without, its --workers ranks run as threads (job name INA_JOB_NAME, else
// ina-bench-<pid>; a store on a free 127.0.0.1 port for the host fallback unless INA_STORE).
//
// --transport host (or INA_TRANSPORT=host) needs no aggregator: local mode forks the ranks with a
// rendezvous store on a free 127.0.0.1 port (INA_STORE if set) and the host path reduces in float
// (INA_FALLBACK=float unless set). --algo ring|tree|hd sets INA_ALGO for the ranks; auto leaves
// the choice to the cost model. AllToAll always runs on the host mesh (no aggregator does it), so
// --coll alltoall gives local mode a store with either transport. --coll alltoallv --zipf S
// times AllToAllv with expert loads: each rank sends size bytes in all, rank j receiving the share
// 1/(j+1)^S of every rank's (bench_common.h's bench_a2av_count; S = 0: uniform), as
// ina-mpi-bench --coll alltoallv --zipf S does. INA_A2A_ALGO and INA_A2A_GROUP reach the ranks.
//
// Every size: fill the send buffer (rank r, element i: bench_float_value / bench_int_value),
// run the warmup and the timed iterations out of place, then check every element of the last
// output against the exact reduction of all ranks' inputs, computed in double (int32: wrapping):
//   float SUM: |out - s| <= quant::sum_error_bound(dtype, M, N, s) (quantize.h), M the block's
//              largest |x| over ranks (blocks of --block-elems elements);
//   float8 SUM (either path; the host path's is the looser): |out - s| <= e + ulp8(|s| + e),
//              e = max(qb, (N - 1) * 2^-24 * N * M): the larger of the exact mode's quantization
//              bound qb = N * M * 2^-B and the float mode's float32 chain (N - 1 additions, each
//              rounding a partial sum of at most N * M by at most half its float32 ulp), plus
//              one rounding to float8 (ulp8: its spacing, quantize.h's output_ulp);
//   MIN, MAX and int32: exact.
// AllToAll: rank r's block from rank j must equal, exactly, rank j's input for r.
//
// Length: a command-line program whose local, external and host modes share the table, the
// element check and the summary; the shared pieces for other benches are in bench_common.h.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/udp_backend.h"
#include "bench_cli.h"
#include "bench_common.h"
#include "bench_ranks.h"
#include "ina/base/half.h"
#include "ina/base/log.h"
#include "ina/base/status.h"
#include "ina/ina.hpp"
#include "ina/protocol/fp8.h"
#include "ina/protocol/quantize.h"
#include "ina/protocol/types.h"
#include "ina/protocol/wire.h"
#include "ina_config.h"
#include "udp_floor.h"
#include "worker/admission.h"
#include "worker/config_internal.h"
#include "worker/host/socket.h"

namespace {

using ina::DType;
using ina::ReduceOp;

constexpr ina::JobId kJob = 1;
constexpr ina::Key128 kJobKey{0x696e612d62656e63ULL, 0x686d61726b000000ULL};  // "ina-benchmark"

struct Options {
  std::string minbytes = "8";
  std::string maxbytes = "64M";
  double stepfactor = 2;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  std::string datatype = "float32";
  std::string op = "sum";
  int workers = 4;
  uint32_t block_elems = 2048;
  uint32_t window = 128;
  uint32_t timeout_ms = 30000;
  std::string csv;
  double drop_percent = 0;
  double agg_drop_percent = 0;
  unsigned agg_threads = 1;
  std::string max_bytes_per_size = "0";
  std::string transport = "inc";   // inc | host
  std::string algo;                // auto | ring | tree | hd (empty: INA_ALGO as set)
  std::string coll = "allreduce";  // allreduce | alltoall | alltoallv
  double zipf = 0;                 // alltoallv: the expert popularity exponent
  std::string aggregator;          // external mode
  int aggregators = 1;             // local mode: embedded aggregators the job is sharded over
  int rank = -1;                   // external mode (default INA_RANK)
  int local_ranks = 1;             // external mode: ranks rank .. rank + local_ranks - 1 as threads
  bool workers_given = false;
  ina::Config env;  // the environment (INA_*) overlaid with the flags given
  bool verbose = false;
  bool cpu = true;       // local mode: CPU per GB reduced after the table
  bool floor = true;     // ... beside the kernel's floor for the same datagrams
  bool vs_ring = false;  // local in-network AllReduce: then the host ring's sweep beside it

  // Derived.
  bool host = false;       // --transport host
  bool alltoall = false;   // --coll alltoall or alltoallv
  bool alltoallv = false;  // --coll alltoallv
  size_t min_b = 0, max_b = 0, cap_b = 0;
  DType dtype = DType::kFloat32;
  ReduceOp rop = ReduceOp::kSum;
};

// ---- data ----

struct DataSpec {
  DType dtype;
  ReduceOp op;
  int ranks;
  size_t block;
  double scale;
};

DataSpec make_spec(const Options& o, int ranks, size_t block) {
  double limit = o.dtype == DType::kFloat16      ? 65504.0
                 : o.dtype == DType::kFloat8E4M3 ? 448.0
                 : o.dtype == DType::kFloat8E5M2 ? 57344.0
                                                 : 3.0e38;
  return DataSpec{o.dtype, o.rop, ranks, block, bench_float_scale(ranks, limit)};
}

// Rank r's input element i, as stored in the buffer (float types: the value after rounding to
// the type, which is exact for these values).
double input_value(const DataSpec& d, size_t i, int r) {
  double v = bench_float_value(i, r, d.block, d.scale);
  switch (d.dtype) {
    case DType::kFloat32: return static_cast<float>(v);
    case DType::kFloat16: return ina::half_to_float(ina::float_to_half(static_cast<float>(v)));
    case DType::kBFloat16: return ina::bf16_to_float(ina::float_to_bf16(static_cast<float>(v)));
    case DType::kFloat8E4M3: return ina::e4m3_to_float(ina::double_to_e4m3(v));
    case DType::kFloat8E5M2: return ina::e5m2_to_float(ina::double_to_e5m2(v));
    case DType::kInt32: break;
  }
  return 0;
}

void fill_input(const DataSpec& d, int rank, void* buf, size_t count) {
  switch (d.dtype) {
    case DType::kFloat32: {
      auto* p = static_cast<float*>(buf);
      for (size_t i = 0; i < count; ++i)
        p[i] = static_cast<float>(bench_float_value(i, rank, d.block, d.scale));
      break;
    }
    case DType::kFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i)
        p[i] = ina::float_to_half(static_cast<float>(bench_float_value(i, rank, d.block, d.scale)));
      break;
    }
    case DType::kBFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i)
        p[i] = ina::float_to_bf16(static_cast<float>(bench_float_value(i, rank, d.block, d.scale)));
      break;
    }
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: {
      // Rounded to the type (bench_float_value's 6 bits are more than float8's 4 or 3): the
      // checks below use the rounded inputs (input_value).
      const bool e4m3 = d.dtype == DType::kFloat8E4M3;
      auto* p = static_cast<uint8_t*>(buf);
      for (size_t i = 0; i < count; ++i) {
        const double v = bench_float_value(i, rank, d.block, d.scale);
        p[i] = e4m3 ? ina::double_to_e4m3(v) : ina::double_to_e5m2(v);
      }
      break;
    }
    case DType::kInt32: {
      auto* p = static_cast<int32_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = bench_int_value(i, rank);
      break;
    }
  }
}

double output_value(DType t, const void* buf, size_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(buf)[i];
    case DType::kFloat16: return ina::half_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DType::kBFloat16: return ina::bf16_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DType::kFloat8E4M3: return ina::e4m3_to_float(static_cast<const uint8_t*>(buf)[i]);
    case DType::kFloat8E5M2: return ina::e5m2_to_float(static_cast<const uint8_t*>(buf)[i]);
    case DType::kInt32: return static_cast<const int32_t*>(buf)[i];
  }
  return 0;
}

// The float8 SUM bound (the header's): the host path's reduction error e, the larger of exact
// mode's quantization and float mode's float32 chain, plus one rounding to float8.
double float8_sum_bound(DType t, double block_max_abs, int ranks, double exact) {
  const auto n = static_cast<uint32_t>(ranks);
  const double qb = ina::quant::sum_quantization_bound(block_max_abs, n);
  const double chain = (ranks - 1) * std::ldexp(1.0, -24) * ranks * block_max_abs;
  const double e = std::max(qb, chain);
  return e + ina::quant::output_ulp(t, std::fabs(exact) + e);
}

// Counts the elements of `out` outside the documented bound; describes the first few on stderr.
int64_t check_output(const DataSpec& d, int rank, const void* out, size_t count, size_t bytes) {
  int64_t wrong = 0;
  constexpr int kShow = 5;
  auto show = [&](size_t i, double got, double ref, double tol) {
    if (wrong <= kShow)
      std::fprintf(stderr,
                   "# rank %d, %zu B: element %zu: got %.9g, expected %.9g (tolerance %.3g)\n",
                   rank, bytes, i, got, ref, tol);
  };
  if (d.dtype == DType::kInt32) {
    const auto* p = static_cast<const int32_t*>(out);
    for (size_t i = 0; i < count; ++i) {
      uint32_t sum = 0;
      int32_t mn = INT32_MAX;
      int32_t mx = INT32_MIN;
      for (int r = 0; r < d.ranks; ++r) {
        int32_t v = bench_int_value(i, r);
        sum += static_cast<uint32_t>(v);
        mn = std::min(mn, v);
        mx = std::max(mx, v);
      }
      int32_t ref = d.op == ReduceOp::kSum   ? static_cast<int32_t>(sum)
                    : d.op == ReduceOp::kMin ? mn
                                             : mx;
      if (p[i] != ref) {
        wrong++;
        show(i, p[i], ref, 0);
      }
    }
    return wrong;
  }
  if (d.op != ReduceOp::kSum) {
    for (size_t i = 0; i < count; ++i) {
      double ref = input_value(d, i, 0);
      for (int r = 1; r < d.ranks; ++r) {
        double v = input_value(d, i, r);
        ref = d.op == ReduceOp::kMin ? std::min(ref, v) : std::max(ref, v);
      }
      double got = output_value(d.dtype, out, i);
      if (!(got == ref)) {
        wrong++;
        show(i, got, ref, 0);
      }
    }
    return wrong;
  }
  // Float SUM: per block, the exact sums and the largest |x| over ranks, then the bound.
  size_t block = std::max<size_t>(d.block, 1);
  std::vector<double> sums(block);
  for (size_t b0 = 0; b0 < count; b0 += block) {
    size_t n = std::min(block, count - b0);
    double m = 0;
    for (size_t j = 0; j < n; ++j) {
      double s = 0;
      for (int r = 0; r < d.ranks; ++r) {
        double v = input_value(d, b0 + j, r);
        s += v;  // exact: few significant bits
        m = std::max(m, std::fabs(v));
      }
      sums[j] = s;
    }
    for (size_t j = 0; j < n; ++j) {
      double ref = sums[j];
      double tol = ina::is_float8(d.dtype) ? float8_sum_bound(d.dtype, m, d.ranks, ref)
                                           : ina::quant::sum_error_bound(
                                                 d.dtype, m, static_cast<uint32_t>(d.ranks), ref);
      double got = output_value(d.dtype, out, b0 + j);
      if (!(std::fabs(got - ref) <= tol)) {
        wrong++;
        show(b0 + j, got, ref, tol);
      }
    }
  }
  return wrong;
}

// AllToAll: `out` holds, per source rank j, the `per_peer` elements j sent to `rank`: j's input
// elements [rank * per_peer, (rank + 1) * per_peer). Exact comparison (nothing is reduced).
int64_t check_alltoall(const DataSpec& d, int rank, const void* out, size_t per_peer,
                       size_t bytes) {
  int64_t wrong = 0;
  for (int j = 0; j < d.ranks; ++j)
    for (size_t i = 0; i < per_peer; ++i) {
      const size_t at = static_cast<size_t>(j) * per_peer + i;
      const size_t src = static_cast<size_t>(rank) * per_peer + i;
      const double ref =
          d.dtype == DType::kInt32 ? bench_int_value(src, j) : input_value(d, src, j);
      const double got = output_value(d.dtype, out, at);
      if (!(got == ref)) {
        if (++wrong <= 5)
          std::fprintf(stderr,
                       "# rank %d, %zu B: element %zu (from rank %d): got %.9g, expected %.9g\n",
                       rank, bytes, at, j, got, ref);
      }
    }
  return wrong;
}

// AllToAllv (bench_a2av_count): rank `rank` receives c elements from every rank j, at j * c; they
// are j's input elements [off, off + c), off = what j sends to the ranks before `rank`.
int64_t check_alltoallv(const DataSpec& d, double zipf, int rank, const void* out, size_t elems,
                        size_t bytes) {
  int64_t wrong = 0;
  const size_t c = bench_a2av_count(elems, d.ranks, rank, zipf);
  size_t off = 0;
  for (int j = 0; j < rank; ++j) off += bench_a2av_count(elems, d.ranks, j, zipf);
  for (int j = 0; j < d.ranks; ++j)
    for (size_t i = 0; i < c; ++i) {
      const size_t at = static_cast<size_t>(j) * c + i;
      const double ref =
          d.dtype == DType::kInt32 ? bench_int_value(off + i, j) : input_value(d, off + i, j);
      const double got = output_value(d.dtype, out, at);
      if (!(got == ref) && ++wrong <= 5)
        std::fprintf(stderr,
                     "# rank %d, %zu B: element %zu (from rank %d): got %.9g, expected %.9g\n",
                     rank, bytes, at, j, got, ref);
    }
  return wrong;
}

// ---- the sweep (one rank) ----

struct SizeOutcome {
  double time_us = 0;
  double cpu_s = 0;  // this process's CPU seconds (user + system) over the timed iterations
  int64_t wrong = 0;
  bool ok = true;
  std::string msg;
};

// User + system CPU seconds of this process, every thread, so far.
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

using Reporter = std::function<bool(int k, const SizeOutcome&)>;  // false: stop

// Runs the sweep on one rank; returns true when every collective succeeded and nothing was wrong.
// Failures are printed to stderr when `print_failures` (otherwise the reporter passes them on).
bool run_sweep(ina::Communicator& comm, const Options& o, const std::vector<size_t>& sizes,
               bool print_failures, const Reporter& report, uint64_t* elements = nullptr) {
  const size_t esize = ina::dtype_size(o.dtype);
  const size_t max_bytes = sizes.empty() ? 0 : sizes.back();
  // Cache-line aligned buffers, as a framework's tensors would be.
  struct alignas(64) Line {
    unsigned char b[64];
  };
  std::vector<Line> send_store(max_bytes / sizeof(Line) + 1);
  // AllToAllv: the hot rank receives N times its share, more than it sends.
  const size_t recv_bytes =
      o.alltoallv
          ? std::max(max_bytes, static_cast<size_t>(comm.size()) * esize *
                                    bench_a2av_count(max_bytes / esize, comm.size(), 0, o.zipf))
          : max_bytes;
  std::vector<Line> recv_store(recv_bytes / sizeof(Line) + 1);
  const auto world = static_cast<size_t>(comm.size());
  std::vector<size_t> sc(world), sd(world), rc(world), rd(world);
  void* send = send_store.data();
  void* recv = recv_store.data();
  // Blocks as the job cuts them (the WELCOME's, in this dtype's elements): the float SUM check
  // bounds each element by its block's largest |x|.
  const size_t job_block =
      comm.block_elems() != 0 ? size_t{comm.block_elems()} * 4 / esize : size_t{o.block_elems};
  DataSpec spec = make_spec(o, comm.size(), job_block);
  bool all_ok = true;
  for (size_t k = 0; k < sizes.size(); ++k) {
    size_t bytes = sizes[k];
    size_t count = bytes / esize;
    int iters = 0;
    int warmup = 0;
    bench_iters_for(bytes, o.iters, o.warmup, o.cap_b, &iters, &warmup);
    fill_input(spec, comm.rank(), send, count);
    // NaN / -1: a block never written shows up as wrong
    std::memset(recv, 0xff,
                o.alltoallv
                    ? world * esize * bench_a2av_count(count, comm.size(), comm.rank(), o.zipf)
                    : bytes);
    // AllToAll: count / N elements to each peer (the sizes are multiples of N elements).
    const size_t per_peer = count / static_cast<size_t>(comm.size());
    if (o.alltoallv) {
      size_t off = 0;
      for (size_t j = 0; j < world; ++j) {
        sc[j] = bench_a2av_count(count, comm.size(), static_cast<int>(j), o.zipf);
        sd[j] = off;
        off += sc[j];
        rc[j] = bench_a2av_count(count, comm.size(), comm.rank(), o.zipf);
        rd[j] = j * rc[j];
      }
    }
    auto run_once = [&]() {
      if (o.alltoallv)
        return comm.alltoallv(send, sc.data(), sd.data(), recv, rc.data(), rd.data(), o.dtype);
      return o.alltoall ? comm.alltoall(send, recv, per_peer, o.dtype)
                        : comm.allreduce(send, recv, count, o.dtype, o.rop);
    };
    SizeOutcome res;
    for (int i = 0; i < warmup && res.ok; ++i) {
      ina::Status st = run_once();
      if (!st.ok()) {
        res.ok = false;
        res.msg = "warmup " + o.coll + " of " + std::to_string(bytes) + " B: " + st.to_string();
      } else if (elements != nullptr) {
        *elements += count;
      }
    }
    const double c0 = process_cpu_s();
    double t0 = bench_now_us();
    int done = 0;
    for (int i = 0; i < iters && res.ok; ++i) {
      ina::Status st = run_once();
      if (!st.ok()) {
        res.ok = false;
        res.msg = o.coll + " of " + std::to_string(bytes) + " B (iteration " + std::to_string(i) +
                  "): " + st.to_string();
      } else {
        done++;
        if (elements != nullptr) *elements += count;
      }
    }
    double t1 = bench_now_us();
    res.cpu_s = process_cpu_s() - c0;
    res.time_us = done > 0 ? (t1 - t0) / done : 0;
    if (!res.ok) {
      res.wrong = 0;
    } else if (o.check) {
      res.wrong = o.alltoallv  ? check_alltoallv(spec, o.zipf, comm.rank(), recv, count, bytes)
                  : o.alltoall ? check_alltoall(spec, comm.rank(), recv, per_peer, bytes)
                               : check_output(spec, comm.rank(), recv, count, bytes);
    } else {
      res.wrong = -1;
    }
    if (!res.ok && print_failures)
      std::fprintf(stderr, "# rank %d: %s\n", comm.rank(), res.msg.c_str());
    if (!res.ok || res.wrong > 0) all_ok = false;
    if (!report(static_cast<int>(k), res) || !res.ok) break;
  }
  return all_ok;
}

// A rank's counters as reported to the parent (BENCH_REC_STATS), in this order.
enum StatSlot : size_t {
  kCollectives,
  kSent,
  kReceived,
  kRetransmits,
  kDupResults,
  kMalformed,
  kNonfinite,
  kErrorReports,
  kFallbacks,
  kHostCollectives,
  kElements,
  kSpurious,
  kFast,
};
static_assert(kFast + 1 == BENCH_STATS, "one slot per counter");

std::array<uint64_t, BENCH_STATS> stats_array(const ina::CommStats& s, uint64_t elements) {
  return {s.collectives,       s.packets_sent,     s.packets_received, s.retransmits,
          s.duplicate_results, s.malformed,        s.nonfinite_blocks, s.error_reports,
          s.fallbacks,         s.host_collectives, elements,           s.spurious_retransmits,
          s.fast_retransmits};
}

// Which path the collectives took, from the ranks' counters (w: summed, or one rank's): the
// header's transport says what was asked, this what ran. `why`: the reason for a host path that
// was not asked for (empty: see the ranks' warnings).
void print_path(const Options& o, const std::array<uint64_t, BENCH_STATS>& w,
                const std::string& why = {}) {
  const unsigned long long all = w[kCollectives];
  const unsigned long long host = w[kHostCollectives];
  const unsigned long long fallbacks = w[kFallbacks];
  if (o.host || o.alltoall) {
    std::printf("# path: host mesh (%s)\n", o.alltoall ? "AllToAll" : "--transport host");
  } else if (host == 0) {
    std::printf("# path: in-network (%llu collectives, no fallback)\n", all);
  } else if (host >= all && why.rfind("host only: ", 0) == 0) {
    std::printf("# path: host mesh for every collective (%s)\n", why.c_str() + 11);
  } else if (host >= all) {
    std::printf(
        "# path: host fallback for every collective: %s\n",
        why.empty() ? "INA was configured but not used (see the ranks' warnings)" : why.c_str());
  } else {
    std::printf(
        "# path: in-network, then host fallback: %llu of %llu collectives on the host path, %llu "
        "fallbacks (see the ranks' warnings)\n",
        host, all, fallbacks);
  }
}

// The summary a user reads after a local in-network run (w: the ranks' counters summed;
// bytes_in: what the aggregators received): bytes on the wire per element, the share of packets
// resent, the fallbacks. The protocol's own counters follow only with -v, explained.
void print_summary(const Options& o, const std::array<uint64_t, BENCH_STATS>& w, int ranks,
                   uint64_t bytes_in) {
  const std::string type(ina::dtype_name(o.dtype));
  const double elements = static_cast<double>(w[kElements]);
  const double sent = static_cast<double>(w[kSent]);
  std::printf(
      "# summary: %d ranks, %.4g %s elements reduced per rank; on the wire to the "
      "aggregator %.2f B per element (the data: %zu B; the wire's words are the data's width, "
      "plus headers), %.2f%% of packets resent, %llu fallbacks to the host path\n",
      ranks, elements / std::max(ranks, 1), type.c_str(),
      elements > 0 ? static_cast<double>(bytes_in) / elements : 0.0, ina::dtype_size(o.dtype),
      sent > 0 ? 100.0 * static_cast<double>(w[kRetransmits]) / sent : 0.0,
      static_cast<unsigned long long>(w[kFallbacks]));
  if (!o.verbose) return;
  std::printf(
      "# workers: collectives %llu, packets sent %llu, received %llu, retransmits %llu "
      "(presumed lost %llu, spurious %llu), duplicate results %llu, error reports %llu, "
      "malformed %llu, nonfinite blocks %llu, on the host path %llu\n",
      static_cast<unsigned long long>(w[kCollectives]), static_cast<unsigned long long>(w[kSent]),
      static_cast<unsigned long long>(w[kReceived]),
      static_cast<unsigned long long>(w[kRetransmits]), static_cast<unsigned long long>(w[kFast]),
      static_cast<unsigned long long>(w[kSpurious]),
      static_cast<unsigned long long>(w[kDupResults]),
      static_cast<unsigned long long>(w[kErrorReports]),
      static_cast<unsigned long long>(w[kMalformed]),
      static_cast<unsigned long long>(w[kNonfinite]),
      static_cast<unsigned long long>(w[kHostCollectives]));
  std::printf(
      "#   retransmits: packets sent again when their result was late (the adaptive timeout, "
      "from INA_RETRANSMIT_US), or presumed lost when a packet sent after them got its result "
      "first; spurious ones had their result arrive after all. Normal when ranks share CPUs: a "
      "slow rank keeps the others' slots waiting.\n"
      "#   duplicate results: results for blocks already done (the answers to those resends).\n"
      "#   error reports: the aggregator's answer to a resend whose slot still misses ranks (it "
      "names them, for the deadline message), or to data before every rank joined: flow "
      "control, not failures.\n"
      "#   malformed, nonfinite blocks: datagrams that failed validation (expected 0); blocks "
      "with a NaN or Inf input (their result is NaN).\n");
}

// The CSV's tool column: ina (in-network), ina-host (host algorithms, the cost model's choice),
// ina-host-ring / -tree / -hd (forced), and "-alltoall" appended for AllToAll.
std::string tool_name(const Options& o) {
  std::string t = o.host ? "ina-host" : "ina";
  if (o.host && !o.alltoall && !o.algo.empty() && o.algo != "auto") t += "-" + o.algo;
  if (o.alltoall) t += o.alltoallv ? "-alltoallv" : "-alltoall";
  return t;
}

void print_row(const Options& o, int ranks, size_t bytes, double time_us, int64_t wrong,
               bool complete, double* busbw_sum, int* rows) {
  size_t count = bytes / ina::dtype_size(o.dtype);
  double algbw = 0;
  double busbw = 0;
  bench_bandwidth(bytes, time_us, ranks, &algbw, &busbw);
  if (o.alltoall) busbw = algbw * bench_alltoall_busbw_factor(ranks);
  const char* type = ina::dtype_name(o.dtype).data();
  const char* redop = o.alltoall ? "none" : ina::op_name(o.rop).data();
  bench_print_row(stdout, bytes, count, type, redop, time_us, algbw, busbw,
                  static_cast<long long>(wrong));
  if (!complete) {
    std::printf("# (size %zu: not every rank completed it)\n", bytes);
  } else {
    *busbw_sum += busbw;
    (*rows)++;
  }
  if (!o.csv.empty() &&
      bench_csv_append(o.csv.c_str(), tool_name(o).c_str(), ranks, bytes, count, type, redop,
                       time_us, algbw, busbw, static_cast<long long>(wrong)) != 0) {
    std::fprintf(stderr, "ina-bench: cannot append to %s: %s\n", o.csv.c_str(),
                 std::strerror(errno));
  }
}

std::string cap_text(size_t cap) {
  if (cap == 0) return "";
  char buf[64];
  bench_format_size(cap, buf, sizeof buf);
  return std::string(", iterations capped at ") + buf + " per size";
}

const char* tool_line(const Options& o) {
  if (o.alltoallv) return "ina-bench: AllToAllv (expert loads) on the host TCP mesh";
  if (o.alltoall) return "ina-bench: AllToAll on the host TCP mesh";
  return o.host ? "ina-bench: host AllReduce over the TCP mesh (no aggregator)"
                : "ina-bench: in-network AllReduce through a software aggregator";
}

// `block`: the job's block in 4-byte elements (the communicator's, once joined; 0: --block-elems).
void print_config_line(const Options& o, int ranks, const std::string& where, uint32_t block = 0) {
  std::printf(
      "# ranks %d, dtype %s, op %s, block %u elems, window %u slots, iters %d, warmup %d, "
      "check %d%s\n# %s: %s\n",
      ranks, ina::dtype_name(o.dtype).data(), o.alltoall ? "none" : ina::op_name(o.rop).data(),
      block != 0 ? block : o.block_elems, o.window, o.iters, o.warmup, o.check,
      cap_text(o.cap_b).c_str(), o.host ? "transport" : "aggregator", where.c_str());
  const char* algo = std::getenv("INA_ALGO");
  if (o.alltoall) {
    const char* a2a = std::getenv("INA_A2A_ALGO");
    std::printf("# collective: %s, algorithm %s", o.coll.c_str(),
                o.alltoallv                      ? "pairwise (windowed)"
                : a2a != nullptr && *a2a != '\0' ? a2a
                                                 : "auto (cost model)");
    if (o.alltoallv) std::printf(", expert loads Zipf(%g)", o.zipf);
    std::printf("\n");
  }
  if (!o.alltoall)
    std::printf("# collective: allreduce, transport %s, host algorithm %s\n", o.transport.c_str(),
                algo != nullptr && *algo != '\0' ? algo : "auto (cost model)");
  if (o.drop_percent > 0 || o.agg_drop_percent > 0)
    std::printf(
        "# fault injection: workers drop %.3g%% of sent and received datagrams, "
        "aggregator drops %.3g%% of received datagrams\n",
        o.drop_percent, o.agg_drop_percent);
}

// The host transport for the ranks: the host path only, reducing in float unless INA_FALLBACK
// asks for the quantized words.
void use_host_transport(Options* o) {
  o->host = true;
  o->transport = "host";
  o->env.host_only = true;
  if (std::getenv("INA_FALLBACK") == nullptr) o->env.fallback = ina::FallbackMode::kFloat;
}

// The host AllReduce algorithm the ranks use: auto (the cost model), ring, tree or hd; empty
// leaves INA_ALGO as set. The ranks read INA_ALGO when their communicator starts (forked children
// inherit it).
void use_host_algo(Options* o, const std::string& algo) {
  o->algo = algo;
  if (algo == "auto") {
    unsetenv("INA_ALGO");
    o->env.host_algorithm.clear();
  } else if (!algo.empty()) {
    setenv("INA_ALGO", algo.c_str(), 1);  // print_config_line shows it
    o->env.host_algorithm = algo;
  }
}

// A rendezvous store on a free 127.0.0.1 port where `cfg` names none (the host mesh's).
ina::Status ensure_local_store(ina::Config* cfg) {
  if (!cfg->store.empty()) return ina::ok_status();
  ina::Result<uint16_t> p = ina::host::free_tcp_port("127.0.0.1");
  if (!p.ok()) return p.status();
  cfg->store = "127.0.0.1:" + std::to_string(*p);
  return ina::ok_status();
}

// ---- local mode ----

int child_main(const Options& o, const ina::Config& env_cfg, const std::vector<size_t>& sizes,
               const std::vector<uint16_t>& ports, int rank, int fd) {
  ina::Config cfg = env_cfg;
  cfg.rank = rank;
  cfg.world_size = o.workers;
  if (!o.host) {
    // One embedded aggregator, or several: the job sharded over them (--aggregators).
    std::vector<ina::AggregatorAddress> list;
    for (uint16_t p : ports) list.push_back({"127.0.0.1", p});
    ina::worker::set_aggregators(&cfg, std::move(list));
  }
  cfg.job = kJob;
  cfg.job_key = kJobKey;
  auto comm = ina::Communicator::create(cfg);
  if (!comm.ok()) {
    std::string msg = "joining the job: " + comm.status().to_string();
    bench::report_failure(fd, rank, msg);
    return 1;
  }
  std::unique_ptr<ina::Communicator> c = std::move(comm).value();
  uint64_t elements = 0;
  bool ok = run_sweep(
      *c, o, sizes, false,
      [&](int k, const SizeOutcome& r) {
        bench::report_size(fd, rank, k, r.time_us, r.wrong, r.ok, r.msg, r.cpu_s);
        return true;
      },
      &elements);
  bench::report_stats(fd, rank, stats_array(c->stats(), elements));
  c.reset();
  return ok ? 0 : 1;
}

// CPU seconds per GB reduced, every row, printed after the table as nccl-tests prints busbw:
// the ranks (the sum over the rank processes of their CPU, every thread, over the timed
// iterations), the embedded aggregator (its process's CPU between two rows, divided by the
// bytes reduced in them, warmup included; the aggregator does nothing else), and the kernel's
// floor for the same datagrams (udp_floor.h: N x the send and receive cost of D bytes on each
// side), measured once after the sweep for the job's datagram size.
class CpuReport {
 public:
  CpuReport(const Options& o, bool aggregator) : o_(o), aggregator_(aggregator) {}
  // Before the ranks start their sweep.
  void start() { last_ = process_cpu_s(); }
  // Row k is complete: the ranks' CPU sum for it.
  void row(size_t bytes, double ranks_cpu_s) {
    int iters = 0;
    int warmup = 0;
    bench_iters_for(bytes, o_.iters, o_.warmup, o_.cap_b, &iters, &warmup);
    Row r;
    r.bytes = bytes;
    r.timed_gb = static_cast<double>(bytes) * iters / 1e9;
    r.ranks_s = ranks_cpu_s;
    const double now = process_cpu_s();
    r.agg_s = now - last_;
    r.all_gb = static_cast<double>(bytes) * (iters + warmup) / 1e9;
    last_ = now;
    rows_.push_back(r);
  }
  // The CPU per GB reduced over every row (the figures print() ends with).
  struct Totals {
    double ranks = 0;
    double agg = 0;
    bool valid = false;
  };
  Totals totals() const {
    double ranks_sum = 0, timed_sum = 0, agg_sum = 0, all_sum = 0;
    for (const Row& r : rows_) {
      ranks_sum += r.ranks_s;
      timed_sum += r.timed_gb;
      agg_sum += r.agg_s;
      all_sum += r.all_gb;
    }
    Totals t;
    t.valid = timed_sum > 0;
    t.ranks = timed_sum > 0 ? ranks_sum / timed_sum : 0;
    t.agg = aggregator_ && all_sum > 0 ? agg_sum / all_sum : 0;
    return t;
  }
  void print(bool floor) const {
    if (rows_.empty()) return;
    bench::UdpFloor f;
    const size_t payload = size_t{o_.block_elems} * 4;
    if (floor && aggregator_) {
      // About 32768 datagrams (0.27 GB at 2048 words): the cost per datagram, scaled per row.
      f = bench::measure_udp_floor(ina::wire::kHeaderSize + payload, 32768);
      if (!f.error.empty()) std::printf("# floor not measured: %s\n", f.error.c_str());
    }
    const bool have_floor = floor && aggregator_ && f.error.empty() && f.received > 0;
    std::printf(
        "#\n# CPU seconds (user + system) per GB reduced: ranks = the %d rank processes over the "
        "timed iterations%s\n",
        o_.workers,
        aggregator_ ? "; aggregator = the embedded aggregator's process (warmup included)" : "");
    if (have_floor) {
      std::printf(
          "# floor = the kernel's cost for the same datagrams on each side (UDP_SEGMENT + "
          "UDP_GRO on loopback, %zu B each: %.2f us per datagram sent and received, %.3f s per "
          "GB moved; ina-floor-bench)\n",
          f.datagram, f.per_datagram_s() * 1e6, f.per_gb_s());
      std::printf("# %10s %9s %10s %9s %9s %9s %9s %9s\n", "size", "ranks", "aggregator", "total",
                  "floor", "ranks/fl", "agg/fl", "total/fl");
    } else {
      std::printf("# %10s %9s %10s %9s\n", "size", "ranks", "aggregator", "total");
    }
    double timed_sum = 0, floor_sum = 0;
    for (const Row& r : rows_) {
      const double ranks = r.timed_gb > 0 ? r.ranks_s / r.timed_gb : 0;
      const double agg = aggregator_ && r.all_gb > 0 ? r.agg_s / r.all_gb : 0;
      const double side = have_floor ? side_floor(f, r.bytes, payload) : 0;
      timed_sum += r.timed_gb;
      floor_sum += side * r.timed_gb;
      print_line(r.bytes, ranks, agg, side);
    }
    const Totals t = totals();
    const double ranks = t.ranks;
    const double agg = t.agg;
    char a[32] = "-";
    if (aggregator_) std::snprintf(a, sizeof a, "%.3f s", agg);
    std::printf("# CPU per GB reduced (all rows): ranks %.3f s, aggregator %s, total %.3f s", ranks,
                a, ranks + agg);
    if (have_floor && timed_sum > 0) {
      const double side = floor_sum / timed_sum;
      std::printf("; floor %.3f s per side: ranks %.2fx, aggregator %.2fx, total %.2fx", side,
                  ranks / side, agg / side, (ranks + agg) / (2 * side));
    }
    std::printf("\n#\n");
    std::fflush(stdout);
  }

 private:
  struct Row {
    size_t bytes = 0;
    double timed_gb = 0;  // GB reduced in the timed iterations
    double ranks_s = 0;
    double agg_s = 0;
    double all_gb = 0;  // GB reduced, warmup included
  };
  // The kernel's CPU per GB reduced for one side (the ranks, or the aggregator).
  double side_floor(const bench::UdpFloor& f, size_t bytes, size_t payload) const {
    return f.per_datagram_s() * static_cast<double>(bench::datagrams_per_rank(bytes, payload)) *
           o_.workers / (static_cast<double>(bytes) / 1e9);
  }
  void print_line(size_t bytes, double ranks, double agg, double side) const {
    char a[16] = "-";
    if (aggregator_) std::snprintf(a, sizeof a, "%.3f", agg);
    if (side > 0) {
      std::printf("# %10zu %9.3f %10s %9.3f %9.3f %9.2f %9.2f %9.2f\n", bytes, ranks, a,
                  ranks + agg, side, ranks / side, agg / side, (ranks + agg) / (2 * side));
    } else {
      std::printf("# %10zu %9.3f %10s %9.3f\n", bytes, ranks, a, ranks + agg);
    }
  }
  const Options& o_;
  bool aggregator_;
  double last_ = 0;
  std::vector<Row> rows_;
};

// One local sweep as the forked ranks report it: a table row per size (and its CPU row), then
// the ranks reaped; all_ok is false for a failed, incomplete, wrong or unreached size, a rank that
// did not exit cleanly, or a truncated report.
struct Sweep {
  std::vector<double> time_us;  // per size: the slowest rank's average call (0: no figure)
  double busbw_sum = 0;
  int rows = 0;
  int64_t wrong_total = 0;
  bool all_ok = true;
  bench::Collected col;
  std::vector<std::string> failures;

  // The ranks' counters (BENCH_REC_STATS), summed over the ranks that sent theirs.
  std::array<uint64_t, BENCH_STATS> stats() const {
    std::array<uint64_t, BENCH_STATS> w{};
    for (size_t r = 0; r < col.stats.size(); ++r)
      if (col.have_stats[r])
        for (size_t j = 0; j < w.size(); ++j) w[j] += col.stats[r][j];
    return w;
  }
};

Sweep collect_sweep(const Options& o, const std::vector<size_t>& sizes, int read_fd,
                    const std::vector<pid_t>& pids, CpuReport* cpu) {
  Sweep sw;
  sw.time_us.assign(sizes.size(), 0.0);
  cpu->start();
  bench::collect(
      read_fd, o.workers, static_cast<int>(sizes.size()),
      [&](int k, const bench::SizeRow& row) {
        if (!row.ok) {  // a rank's collective failed: no numbers for this size
          std::printf("%12zu  FAILED (see below)\n", sizes[static_cast<size_t>(k)]);
          sw.all_ok = false;
          return;
        }
        const bool complete = row.reports == o.workers;
        if (complete) sw.time_us[static_cast<size_t>(k)] = row.time_us;
        print_row(o, o.workers, sizes[static_cast<size_t>(k)], row.time_us, row.wrong, complete,
                  &sw.busbw_sum, &sw.rows);
        if (complete) cpu->row(sizes[static_cast<size_t>(k)], row.cpu_s);
        if (row.wrong > 0) sw.wrong_total += row.wrong;
        if (!complete || row.wrong > 0) sw.all_ok = false;
      },
      &sw.col);
  sw.failures = sw.col.failures;
  if (!bench::wait_ranks(pids, &sw.failures)) sw.all_ok = false;
  for (size_t k = 0; k < sizes.size(); ++k)
    if (!sw.col.rows[k].printed) sw.all_ok = false;  // a size no rank reached
  if (sw.col.protocol_error) {
    sw.failures.push_back("a rank sent a truncated report");
    sw.all_ok = false;
  }
  return sw;
}

// The sweep on the host transport: the ranks and their TCP mesh, no aggregator; the table, its
// footer and the CPU report (o.cpu). Returns false when no rank could be started.
bool host_sweep(const Options& o, const ina::Config& env_cfg, const std::vector<size_t>& sizes,
                Sweep* sw, CpuReport* cpu) {
  bench_print_table_header(stdout);
  std::vector<pid_t> pids;
  int read_fd = -1;
  if (!bench::spawn_ranks(
          o.workers, [&](int rank, int fd) { return child_main(o, env_cfg, sizes, {}, rank, fd); },
          &pids, &read_fd))
    return false;
  *sw = collect_sweep(o, sizes, read_fd, pids, cpu);
  bench_print_footer(stdout, sw->busbw_sum, sw->rows, static_cast<long long>(sw->wrong_total),
                     o.check);
  if (o.cpu) cpu->print(false);
  return true;
}

// Local mode on the host transport.
int run_local_host(const Options& o, const ina::Config& env_cfg, const std::vector<size_t>& sizes) {
  bench_print_preamble(stdout, tool_line(o));
  print_config_line(o, o.workers, "host TCP mesh on 127.0.0.1, store " + env_cfg.store);
  Sweep sw;
  CpuReport cpu(o, false);
  if (!host_sweep(o, env_cfg, sizes, &sw, &cpu)) return 1;
  const std::array<uint64_t, BENCH_STATS> w = sw.stats();
  std::printf("# workers: collectives %llu\n", static_cast<unsigned long long>(w[0]));
  print_path(o, w);
  for (const auto& f : sw.failures) std::printf("# FAILED %s\n", f.c_str());
  std::fflush(stdout);
  return sw.all_ok ? 0 : 1;
}

// --vs-ring: the in-network sweep just run, then the same sizes on libina's host ring (the same
// ranks as processes, its TCP mesh on loopback, reducing in float as the host path does), and the
// two side by side: the time per call at each size, and (o.cpu) the CPU per GB reduced of all of
// INA (ranks and aggregator) and of its ranks alone against the ring's. Returns false when the
// ring's sweep failed.
bool ring_beside(const Options& o, const std::vector<size_t>& sizes, const Sweep& ina_sweep,
                 const CpuReport& ina_cpu) {
  Options ro = o;
  use_host_transport(&ro);
  use_host_algo(&ro, "ring");
  if (ina::Status st = ensure_local_store(&ro.env); !st.ok()) {
    std::printf("# FAILED the host ring beside it: %s\n", st.to_string().c_str());
    return false;
  }
  std::printf(
      "#\n# The same sweep on libina's host ring (the same %d ranks, TCP mesh on loopback, "
      "store %s):\n",
      o.workers, ro.env.store.c_str());
  // Each rank's note that it runs on the host mesh says what this section's header says.
  const ina::log::Level level = ina::log::level();
  if (std::getenv("INA_LOG_LEVEL") == nullptr && level == ina::log::Level::kInfo)
    ina::log::set_level(ina::log::Level::kWarn);
  Sweep sw;
  CpuReport cpu(ro, false);
  const bool started = host_sweep(ro, ro.env, sizes, &sw, &cpu);
  ina::log::set_level(level);
  if (!started) return false;
  for (const auto& f : sw.failures) std::printf("# FAILED (ring) %s\n", f.c_str());
  std::printf(
      "# INA against the host ring, per size: time per call (us) and the ring's time over "
      "INA's\n# %10s %10s %10s %9s\n",
      "size", "ina", "ring", "ring/ina");
  for (size_t k = 0; k < sizes.size(); ++k) {
    const double a = ina_sweep.time_us[k];
    const double b = sw.time_us[k];
    if (a <= 0 || b <= 0) continue;
    std::printf("# %10zu %10.1f %10.1f %9.2f\n", sizes[k], a, b, b / a);
  }
  const CpuReport::Totals ti = ina_cpu.totals();
  const CpuReport::Totals tr = cpu.totals();
  if (o.cpu && ti.valid && tr.valid && tr.ranks > 0) {
    std::printf(
        "# CPU per GB reduced: INA %.3f s (ranks %.3f, aggregator %.3f), ring %.3f s: INA / ring "
        "%.2fx, INA's ranks / ring %.2fx\n",
        ti.ranks + ti.agg, ti.ranks, ti.agg, tr.ranks, (ti.ranks + ti.agg) / tr.ranks,
        ti.ranks / tr.ranks);
  }
  std::printf("#\n");
  std::fflush(stdout);
  return sw.all_ok;
}

int run_local(const Options& o, const std::vector<size_t>& sizes) {
  // Flags and the environment were merged into o.env by main().
  ina::Config env_cfg = o.env;
  // A rendezvous store for the host mesh (the host transport, AllToAll).
  if (o.host || o.alltoall) {
    if (ina::Status st = ensure_local_store(&env_cfg); !st.ok()) {
      std::fprintf(stderr, "ina-bench: %s\n", st.to_string().c_str());
      return 1;
    }
  }
  if (o.host) return run_local_host(o, env_cfg, sizes);
  // The embedded aggregators are the job's: INA_STORE set without INA_AGGREGATOR made the
  // environment's configuration host only (and float), which this run is not.
  if (env_cfg.host_only) {
    env_cfg.host_only = false;
    if (std::getenv("INA_FALLBACK") == nullptr) env_cfg.fallback = ina::FallbackMode::kExact;
  }

  ina::agg::UdpOptions uo;
  uo.bind_host = "127.0.0.1";
  uo.port = 0;
  uo.drop_percent = o.agg_drop_percent;
  uo.threads = o.agg_threads;
  ina::agg::JobConfig job;
  job.job = kJob;
  job.key = kJobKey;  // the workers' (child_main): every packet sealed and verified
  job.slots.world_size = static_cast<uint32_t>(o.workers);
  job.slots.num_slots = std::max<uint32_t>(o.window, 1);
  job.slots.max_payload_bytes = static_cast<uint32_t>(static_cast<uint16_t>(o.block_elems)) * 4;
  // --aggregators N: N embedded aggregators serving the same job (id, key), one thread each; the
  // ranks shard every AllReduce over them.
  std::vector<std::unique_ptr<ina::agg::UdpAggregator>> aggregators;
  std::vector<uint16_t> ports;
  for (int i = 0; i < o.aggregators; ++i) {
    uo.seed = static_cast<uint64_t>(i) + 1;
    auto agg = ina::agg::UdpAggregator::create(uo, {job});
    if (!agg.ok()) {
      std::fprintf(stderr, "ina-bench: starting embedded aggregator %d: %s\n", i,
                   agg.status().to_string().c_str());
      return 1;
    }
    aggregators.push_back(std::move(agg).value());
    ports.push_back(aggregators.back()->port());
  }

  bench_print_preamble(stdout, tool_line(o));
  std::string where;
  for (size_t i = 0; i < aggregators.size(); ++i) {
    if (i > 0) where += ", ";
    where += "127.0.0.1:" + std::to_string(ports[i]);
  }
  where += std::string(" (embedded, kernel UDP, GRO ") +
           (aggregators[0]->gro_enabled() ? "on" : "off") + ", GSO " +
           (aggregators[0]->gso_enabled() ? "on" : "off") + ")";
  if (aggregators.size() > 1) where += ", job sharded over " + std::to_string(aggregators.size());
  print_config_line(o, o.workers, where);
  bench_print_table_header(stdout);

  // Fork every rank before the aggregator threads exist. Children never touch `aggregators`
  // and leave through _exit, so their destructors run only here.
  std::vector<pid_t> pids;
  int read_fd = -1;
  bool spawned = bench::spawn_ranks(
      o.workers, [&](int rank, int fd) { return child_main(o, env_cfg, sizes, ports, rank, fd); },
      &pids, &read_fd);
  if (!spawned) return 1;

  std::atomic<bool> stop{false};
  std::vector<ina::Status> agg_status(aggregators.size());
  std::vector<std::thread> servers;
  for (size_t i = 0; i < aggregators.size(); ++i) {
    servers.emplace_back([&, i] { agg_status[i] = aggregators[i]->run(stop); });
  }

  CpuReport cpu(o, true);
  const Sweep sw = collect_sweep(o, sizes, read_fd, pids, &cpu);
  stop.store(true);
  for (std::thread& t : servers) t.join();
  bool all_ok = sw.all_ok;
  std::vector<std::string> failures = sw.failures;
  bench_print_footer(stdout, sw.busbw_sum, sw.rows, static_cast<long long>(sw.wrong_total),
                     o.check);
  if (o.cpu) cpu.print(o.floor && !o.alltoall);  // AllToAll moves its bytes on the host mesh

  uint64_t bytes_in = 0;
  for (const auto& a : aggregators) bytes_in += a->engine_totals().bytes_in;
  const std::array<uint64_t, BENCH_STATS> w = sw.stats();
  print_summary(o, w, o.workers, bytes_in);
  print_path(o, w);
  for (size_t i = 0; o.verbose && i < aggregators.size(); ++i) {
    const auto c = aggregators[i]->engine_totals();
    uint64_t agg_retx = 0;
    uint64_t agg_dups = 0;
    for (unsigned t = 0; t < aggregators[i]->threads(); ++t) {
      for (const auto& rc : aggregators[i]->engine(t).rank_counters(kJob)) {
        agg_retx += rc.retransmits;
        agg_dups += rc.duplicates;
      }
    }
    std::printf(
        "# aggregator%s: packets in %llu (%.1f MB), replies out %llu, completed slots %llu, "
        "retransmits %llu, duplicates %llu (resent results %llu), stale %llu, "
        "not ready %llu, malformed %llu, mismatched %llu, dropped by hook %llu\n",
        aggregators.size() > 1 ? (" " + std::to_string(i)).c_str() : "",
        static_cast<unsigned long long>(c.packets_in), static_cast<double>(c.bytes_in) / 1e6,
        static_cast<unsigned long long>(c.replies_out),
        static_cast<unsigned long long>(c.completed), static_cast<unsigned long long>(agg_retx),
        static_cast<unsigned long long>(std::max(c.duplicates, agg_dups)),
        static_cast<unsigned long long>(c.resent_results), static_cast<unsigned long long>(c.stale),
        static_cast<unsigned long long>(c.not_ready), static_cast<unsigned long long>(c.malformed),
        static_cast<unsigned long long>(c.mismatched),
        static_cast<unsigned long long>(aggregators[i]->dropped_by_hook()));
  }
  for (size_t i = 0; o.verbose && i < aggregators.size(); ++i) {
    std::string text = aggregators[i]->format_counters();
    size_t pos = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      std::printf("# %s\n", text.substr(pos, nl - pos).c_str());
      pos = nl + 1;
    }
  }
  for (size_t i = 0; i < aggregators.size(); ++i) {
    if (agg_status[i].ok()) continue;
    std::printf("# aggregator %zu stopped with %s\n", i, agg_status[i].to_string().c_str());
    all_ok = false;
  }
  for (const auto& f : failures) std::printf("# FAILED %s\n", f.c_str());
  if (o.vs_ring && !o.alltoall && !ring_beside(o, sizes, sw, cpu)) all_ok = false;
  std::fflush(stdout);
  return all_ok ? 0 : 1;
}

// ---- external mode ----

// One rank of a job served by a running aggregator (or of a host-transport job): joins with
// `cfg` and runs the sweep; rank 0 prints the table.
int run_external_rank(const Options& o, const ina::Config& cfg, const std::vector<size_t>& sizes);

int run_external(const Options& o, const std::vector<size_t>& sizes) {
  ina::Config cfg = o.env;
  if (!o.aggregator.empty()) {
    // The library's parser, so --aggregator reads exactly like INA_AGGREGATOR (a list shards
    // the job over those aggregators).
    std::vector<ina::AggregatorAddress> list;
    ina::Status st = ina::worker::parse_aggregator_list(o.aggregator, "--aggregator", &list);
    if (!st.ok()) {
      std::fprintf(stderr, "ina-bench: %s\n", st.message().c_str());
      return 1;
    }
    ina::worker::set_aggregators(&cfg, std::move(list));
  }
  if (o.rank >= 0) cfg.rank = o.rank;
  if (o.workers_given) cfg.world_size = o.workers;
  if (cfg.rank < 0 || cfg.world_size <= 0 || cfg.rank >= cfg.world_size) {
    std::fprintf(stderr,
                 "ina-bench: external mode needs a rank and a world size (INA_RANK and "
                 "INA_WORLD_SIZE, or --rank and --workers); got rank %d, world %d\n",
                 cfg.rank, cfg.world_size);
    return 1;
  }
  if (o.local_ranks < 1 || cfg.rank + o.local_ranks > cfg.world_size) {
    std::fprintf(stderr,
                 "ina-bench: --local-ranks %d from rank %d goes past the world size %d (need "
                 "1 <= local-ranks <= world - rank)\n",
                 o.local_ranks, cfg.rank, cfg.world_size);
    return 1;
  }
  if (o.local_ranks == 1) return run_external_rank(o, cfg, sizes);
  // Ranks as threads of this process, each with its own communicator (libina keeps no global
  // state but the one DPDK port a process may have, which its ranks share).
  std::vector<int> rc(static_cast<size_t>(o.local_ranks), 1);
  std::vector<std::thread> threads;
  for (int k = 0; k < o.local_ranks; ++k) {
    threads.emplace_back([&, k] {
      ina::Config c = cfg;
      c.rank = cfg.rank + k;
      rc[static_cast<size_t>(k)] = run_external_rank(o, c, sizes);
    });
  }
  for (auto& t : threads) t.join();
  return *std::max_element(rc.begin(), rc.end());
}

// Through a controller: asks it once for this rank (worker::admit, as Communicator::create would)
// so the header can name what it admitted; `cfg` then holds the admitted aggregator(s), job and
// key (or host_only on a refusal) and no controller, so the communicator does not ask again (a
// second request from a rank is a new run to the controller). `*where` is the header's text.
ina::Status admit_through_controller(ina::Config* cfg, std::string* where) {
  const std::string controller = cfg->controller_host + ":" + std::to_string(cfg->controller_port);
  const std::string name = ina::worker::admission_name(*cfg);
  INA_RETURN_IF_ERROR(ina::worker::admit(
      cfg, std::min<std::chrono::milliseconds>(cfg->timeout, std::chrono::seconds(10))));
  if (cfg->host_only) {
    *where = "host TCP mesh, store " + cfg->store + " (the controller at " + controller +
             " refused job '" + name + "' or could not be reached: see the log above)";
  } else {
    *where = cfg->aggregator_host + ":" + std::to_string(cfg->aggregator_port);
    const size_t shards = ina::worker::aggregator_list(*cfg).size();
    if (shards > 1) *where += " and " + std::to_string(shards - 1) + " more (sharded)";
    *where += " (admitted by the controller at " + controller + " as '" + name + "')";
  }
  cfg->controller_host.clear();
  cfg->controller_port = 0;
  return ina::ok_status();
}

int run_external_rank(const Options& o, const ina::Config& given,
                      const std::vector<size_t>& sizes) {
  ina::Config cfg = given;
  std::string admitted;  // through a controller: the header's aggregator text
  if (!cfg.controller_host.empty() && !cfg.host_only) {
    const ina::Status st = admit_through_controller(&cfg, &admitted);
    if (!st.ok()) {
      std::fprintf(stderr, "ina-bench: rank %d: admission: %s\n", cfg.rank, st.to_string().c_str());
      return 1;
    }
  }
  // The controller learns that this rank is done when the communicator is gone (libina's own
  // release needs the controller in its config, which the admitted one no longer has).
  struct Release {
    const ina::Config* cfg;
    ~Release() {
      if (cfg != nullptr) ina::worker::release(*cfg);
    }
  } release{given.controller_host.empty() || given.host_only ? nullptr : &given};
  auto comm = ina::Communicator::create(cfg);
  if (!comm.ok()) {
    std::fprintf(stderr, "ina-bench: rank %d: joining the job: %s\n", cfg.rank,
                 comm.status().to_string().c_str());
    return 1;
  }
  std::unique_ptr<ina::Communicator> c = std::move(comm).value();
  const int rank = c->rank();
  const int ranks = c->size();
  if (rank == 0) {
    bench_print_preamble(stdout, tool_line(o));
    print_config_line(
        o, ranks,
        (o.host || cfg.host_only ? "host TCP mesh, store " + cfg.store
         : !admitted.empty()
             ? admitted
             : cfg.aggregator_host + ":" + std::to_string(cfg.aggregator_port) + " (external)") +
            (cfg.host_only && !o.host ? std::string{} : ", job " + std::to_string(cfg.job)),
        c->block_elems());
    if (o.host || o.alltoall) {
      std::printf("# path: host mesh (%s)\n", o.alltoall ? "AllToAll" : "--transport host");
    } else if (cfg.host_only) {
      std::printf("# path: host mesh: %s\n", ina::host_only_reason(cfg).c_str());
    } else if (c->on_host_path()) {
      std::printf(
          "# path: host fallback from the start: the aggregator could not serve the job "
          "(see the ranks' warnings)\n");
    } else {
      std::printf("# path: in-network from the start\n");
    }
    bench_print_table_header(stdout);
  }
  double busbw_sum = 0;
  int rows = 0;
  int64_t wrong_total = 0;
  bool all_ok = true;
  bool ok = run_sweep(*c, o, sizes, true, [&](int k, const SizeOutcome& r) {
    if (!r.ok) {
      all_ok = false;
      if (rank == 0) std::printf("# FAILED rank 0: %s\n", r.msg.c_str());
      return false;
    }
    // Max time and total #wrong over the ranks, through the aggregator (MAX of floats and
    // SUM of int32 are exact).
    float t = static_cast<float>(r.time_us);
    int32_t w = static_cast<int32_t>(std::min<int64_t>(r.wrong, INT32_MAX / ranks));
    ina::Status st = c->allreduce(&t, &t, 1, DType::kFloat32, ReduceOp::kMax);
    if (st.ok()) st = c->allreduce(&w, &w, 1, DType::kInt32, ReduceOp::kSum);
    if (!st.ok()) {
      std::fprintf(stderr, "# rank %d: reducing the results: %s\n", rank, st.to_string().c_str());
      all_ok = false;
      return false;
    }
    if (w != 0) all_ok = false;
    if (rank == 0) {
      print_row(o, ranks, sizes[static_cast<size_t>(k)], t, w, true, &busbw_sum, &rows);
      if (w > 0) wrong_total += w;
    }
    return true;
  });
  if (rank == 0) {
    bench_print_footer(stdout, busbw_sum, rows, static_cast<long long>(wrong_total), o.check);
    auto s = stats_array(c->stats(), 0);
    std::printf(
        "# rank 0: collectives %llu, packets sent %llu, received %llu, retransmits %llu, "
        "duplicate results %llu\n",
        static_cast<unsigned long long>(s[0]), static_cast<unsigned long long>(s[1]),
        static_cast<unsigned long long>(s[2]), static_cast<unsigned long long>(s[3]),
        static_cast<unsigned long long>(s[4]));
    print_path(o, s, cfg.host_only ? "host only: " + ina::host_only_reason(cfg) : std::string());
    std::fflush(stdout);
  }
  c.reset();
  return ok && all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ina-bench: AllReduce through an INA aggregator (nccl-tests style table)"};
  app.set_version_flag("--version", "ina-bench " INA_VERSION);
  ina::bench::add_sweep_options(app, o,
                                "float32|float16|bfloat16|int32|float8_e4m3|float8_e5m2 (or "
                                "float|half|int|e4m3|e5m2)");
  auto* workers_opt = app.add_option("--workers", o.workers, "ranks (local mode: forked processes)")
                          ->capture_default_str();
  auto* block_opt = app.add_option("--block-elems", o.block_elems, "elements per packet (1..16384)")
                        ->capture_default_str();
  auto* window_opt = app.add_option("--window", o.window, "slots in flight")->capture_default_str();
  auto* timeout_opt = app.add_option("--timeout-ms", o.timeout_ms, "deadline of one collective")
                          ->capture_default_str();
  auto* drop_opt =
      app.add_option("--drop-percent", o.drop_percent,
                     "workers drop this percent of sent and of received datagrams (fault hook)")
          ->capture_default_str();
  app.add_option("--agg-drop-percent", o.agg_drop_percent,
                 "local mode: the aggregator drops this percent of received datagrams")
      ->capture_default_str();
  app.add_option("--agg-threads", o.agg_threads,
                 "local mode: serving threads of each embedded aggregator (0: one per CPU)")
      ->check(CLI::Range(0u, ina::agg::kMaxUdpThreads))
      ->capture_default_str();
  app.add_option("--aggregator", o.aggregator,
                 "external mode: host:port of a running ina-aggregator, or a comma-separated "
                 "list (the job sharded over them; or INA_AGGREGATOR)");
  auto* aggregators_opt =
      app.add_option("--aggregators", o.aggregators,
                     "local mode: embedded aggregators the job is sharded over (1..8)")
          ->check(CLI::Range(1, 8))
          ->capture_default_str();
  app.add_option("--rank", o.rank, "external mode: this rank (default INA_RANK)");
  app.add_option("--local-ranks", o.local_ranks,
                 "external mode: run ranks --rank .. --rank+N-1 as threads of this process "
                 "(ranks that share one DPDK port: INA_TRANSPORT=dpdk over net_memif)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--transport", o.transport,
                 "inc: through the aggregator; host: the host algorithms over the TCP mesh")
      ->check(CLI::IsMember({"inc", "host"}))
      ->capture_default_str();
  app.add_option("--algo", o.algo, "host AllReduce algorithm: auto (cost model), ring, tree, hd")
      ->check(CLI::IsMember({"auto", "ring", "tree", "hd"}));
  app.add_option("--coll", o.coll,
                 "allreduce, alltoall (size/N bytes to each peer), or alltoallv (size bytes in "
                 "all, split by --zipf)")
      ->check(CLI::IsMember({"allreduce", "alltoall", "alltoallv"}))
      ->capture_default_str();
  app.add_option(
         "--zipf", o.zipf,
         "alltoallv: rank j receives the share 1/(j+1)^S of every rank's bytes (0: uniform)")
      ->check(CLI::Range(0.0, 10.0))
      ->capture_default_str();
  app.add_flag("-v,--verbose", o.verbose,
               "print the protocol counters (explained) and the aggregator's full counter table");
  app.add_flag("--cpu,!--no-cpu", o.cpu,
               "local mode: print the CPU seconds per GB reduced of the ranks and the aggregator")
      ->capture_default_str();
  app.add_flag("--floor,!--no-floor", o.floor,
               "local mode: measure the kernel's floor for the same datagrams and print the ratio")
      ->capture_default_str();
  app.add_flag("--vs-ring", o.vs_ring,
               "local mode, in-network AllReduce: then run the same sweep on libina's host ring "
               "and print the two side by side (time per call; CPU per GB with --cpu)");
  CLI11_PARSE(app, argc, argv);
  o.workers_given = workers_opt->count() > 0;
  const bool aggregators_given = aggregators_opt->count() > 0;

  // Defaults < environment (INA_BLOCK_ELEMS, INA_WINDOW, INA_TIMEOUT_MS, INA_RETRANSMIT_US,
  // INA_TEST_*) < flags.
  auto env = ina::Config::from_env();
  if (!env.ok()) {
    std::fprintf(stderr, "ina-bench: %s\n", env.status().to_string().c_str());
    return 1;
  }
  o.env = env.value();
  const char* env_transport = std::getenv("INA_TRANSPORT");
  o.host = o.transport == "host" ||
           (env_transport != nullptr && std::string_view(env_transport) == "host");
  if (o.host) use_host_transport(&o);
  o.alltoall = o.coll == "alltoall" || o.coll == "alltoallv";
  o.alltoallv = o.coll == "alltoallv";
  use_host_algo(&o, o.algo);
  if (block_opt->count() > 0)
    o.env.block_elems = o.block_elems;
  else
    o.block_elems = o.env.block_elems;
  if (window_opt->count() > 0)
    o.env.window = o.window;
  else
    o.window = o.env.window;
  if (timeout_opt->count() > 0)
    o.env.timeout = std::chrono::milliseconds(o.timeout_ms);
  else
    o.timeout_ms = static_cast<uint32_t>(o.env.timeout.count());
  if (drop_opt->count() > 0) {
    o.env.fault.drop_send_percent = o.drop_percent;
    o.env.fault.drop_recv_percent = o.drop_percent;
  } else {
    o.drop_percent = o.env.fault.drop_send_percent;
  }

  if (bench_parse_size(o.minbytes.c_str(), &o.min_b) != 0 ||
      bench_parse_size(o.maxbytes.c_str(), &o.max_b) != 0 ||
      bench_parse_size(o.max_bytes_per_size.c_str(), &o.cap_b) != 0) {
    std::fprintf(stderr, "ina-bench: bad size in -b/-e/--max-bytes-per-size\n");
    return 1;
  }
  auto dt = ina::parse_dtype(o.datatype);
  auto op = ina::parse_op(o.op);
  if (!dt || !op) {
    std::fprintf(stderr, "ina-bench: unknown %s '%s'\n", !dt ? "datatype" : "op",
                 !dt ? o.datatype.c_str() : o.op.c_str());
    return 1;
  }
  o.dtype = *dt;
  o.rop = *op;
  if (o.iters < 1 || o.warmup < 0 || o.workers < 1 || o.block_elems < 1 || o.block_elems > 16384 ||
      o.window < 1 || o.stepfactor <= 1.0 || o.drop_percent < 0 || o.drop_percent >= 100 ||
      o.agg_drop_percent < 0 || o.agg_drop_percent >= 100) {
    std::fprintf(stderr,
                 "ina-bench: need iters >= 1, warmup >= 0, workers >= 1, 1 <= block-elems <= "
                 "16384, window >= 1, stepfactor > 1, drop percents in [0, 100)\n");
    return 1;
  }
  // External mode: this process is one rank of a job (an aggregator given, or host transport
  // with a rank given); local mode forks --workers ranks.
  const char* env_agg = std::getenv("INA_AGGREGATOR");
  const char* env_rank = std::getenv("INA_RANK");
  // A rank of a host-only job (a store, no aggregator: Config::from_env's host_only) runs as one
  // too: local mode would start embedded aggregators for it.
  const bool rank_given = o.rank >= 0 || (env_rank != nullptr && *env_rank != '\0');
  // Through a controller: its ranks are admitted there, never served by an embedded aggregator.
  const bool via_controller = !o.env.controller_host.empty() && !o.host;
  const bool external = !o.aggregator.empty() || (env_agg != nullptr && *env_agg != '\0') ||
                        ((o.host || o.env.host_only) && rank_given) || via_controller;
  if (external && o.env.host_only && !o.host) o.transport = "host (store only, no aggregator)";
  if (aggregators_given && (external || o.host)) {
    std::fprintf(stderr,
                 "ina-bench: --aggregators is for local mode through embedded aggregators "
                 "(external mode: --aggregator h1:p1,h2:p2)\n");
    return 1;
  }
  if (o.vs_ring && (external || o.host || o.alltoall)) {
    std::fprintf(stderr,
                 "ina-bench: --vs-ring compares a local in-network AllReduce with the host ring "
                 "(not with --transport host, --coll alltoall(v) or external mode)\n");
    return 1;
  }
  if (via_controller && !rank_given && o.aggregator.empty()) {
    // Local mode through the controller: --workers ranks as threads of this process.
    if (o.local_ranks != 1) {
      std::fprintf(stderr, "ina-bench: --local-ranks needs --rank (or INA_RANK)\n");
      return 1;
    }
    o.env.rank = 0;
    o.env.world_size = o.workers;
    o.workers_given = true;
    o.local_ranks = o.workers;
    if (o.env.job_name.empty() && o.env.store.empty()) {
      o.env.job_name = "ina-bench-" + std::to_string(::getpid());
    }
    // The host fallback when the controller refuses.
    if (ina::Status st = ensure_local_store(&o.env); !st.ok()) {
      std::fprintf(stderr, "ina-bench: %s\n", st.to_string().c_str());
      return 1;
    }
  }
  std::vector<size_t> sizes(BENCH_MAX_SIZES);
  int n = bench_sizes(o.min_b, o.max_b, o.stepfactor, ina::dtype_size(o.dtype), sizes.data());
  if (n <= 0) {
    std::fprintf(stderr, "ina-bench: no sizes between -b %s and -e %s\n", o.minbytes.c_str(),
                 o.maxbytes.c_str());
    return 1;
  }
  sizes.resize(static_cast<size_t>(n));
  if (o.alltoall) {
    // Whole elements to each of the N ranks: round every size down to a multiple of N elements.
    const size_t ranks =
        static_cast<size_t>(external && !o.workers_given ? o.env.world_size : o.workers);
    const size_t unit = ranks * ina::dtype_size(o.dtype);
    sizes = ina::bench::alltoall_sizes(sizes, unit);
    if (sizes.empty()) {
      std::fprintf(stderr, "ina-bench: alltoall needs at least %zu B (one element per rank)\n",
                   unit);
      return 1;
    }
  }

  return external ? run_external(o, sizes) : run_local(o, sizes);
}
