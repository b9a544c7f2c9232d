// ina-a2a-algo-bench: the host AllToAll algorithms against each other, interleaved call by call
// in one job, so that load from elsewhere on the machine falls on every algorithm alike (separate
// runs on a shared 2-core VM differ by up to 4x; calls interleaved in one job do not). The cost
// model's choice is printed beside the measured best, which is how its constants are checked.
//
//   build/testbed/ina-a2a-algo-bench --ranks 8 -b 8 -e 1M -f 4 -n 30 [--group 2]
//
// Forks --ranks processes that meet through a FileStore in a fresh temporary directory and build
// the TCP mesh (as libina does); each measures the cost model on the mesh (measure_cost_model),
// then for every block size runs -n rounds, each round every algorithm once in a rotated order,
// a barrier before each call. Rank 0 prints, per block size, the median time of each algorithm
// (its own time from the barrier to the call's end: no rank finishes before the data it needs
// arrived), the cost model's choice and the measured best. Every output is checked exactly.
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_ranks.h"
#include "worker/host/alltoall.h"
#include "worker/host/barrier.h"
#include "worker/host/select.h"
#include "worker/host/store.h"
#include "worker/host/tcp_mesh.h"

namespace {

using ina::host::AlltoallAlgorithm;

struct Options {
  int ranks = 4;
  std::string minbytes = "8", maxbytes = "1M";
  double factor = 4;
  int iters = 20;
  int group = 0;
  size_t min_b = 0, max_b = 0;
};

uint8_t byte_of(int from, int to, size_t k) {
  return static_cast<uint8_t>((from * 131 + to * 31 + k * 7) ^ (k >> 8));
}

int rank_main(const Options& o, const std::string& dir, int rank) {
  auto store = ina::host::FileStore::create(dir);
  if (!store.ok()) return 2;
  ina::host::TcpMeshOptions mo;
  auto mesh = ina::host::TcpMesh::connect(**store, rank, o.ranks, mo);
  if (!mesh.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, mesh.status().to_string().c_str());
    return 2;
  }
  ina::host::Context& ctx = **mesh;
  auto model = ina::host::measure_cost_model(ctx);
  if (!model.ok()) return 2;
  // pairwise4: the pairwise schedule with kAlltoallMinRounds rounds in flight whatever their
  // size (a 1-byte window), as before the byte window; pairwiseall: every round in flight at once
  // (no window, Gloo's schedule).
  struct Variant {
    const char* name;
    AlltoallAlgorithm algorithm;
    size_t window;
  };
  std::vector<Variant> algos = {
      {"pairwise", AlltoallAlgorithm::kPairwise, ina::host::kAlltoallWindowBytes},
      {"pairwise4", AlltoallAlgorithm::kPairwise, 1},
      {"pairwiseall", AlltoallAlgorithm::kPairwise, SIZE_MAX},
      {"bruck", AlltoallAlgorithm::kBruck, ina::host::kAlltoallWindowBytes}};
  const int g = o.group;
  if (g > 1 && g < o.ranks && o.ranks % g == 0)
    algos.push_back({"hier", AlltoallAlgorithm::kHierarchical, ina::host::kAlltoallWindowBytes});
  if (rank == 0) {
    std::printf("# ina-a2a-algo-bench: %d ranks, group %d, %d interleaved rounds per size\n",
                o.ranks, g, o.iters);
    std::printf("# cost model (measured): alpha %.1f us, beta %.3f ns/B, gamma %.3f ns/B\n",
                model->alpha_s * 1e6, model->beta_s_per_byte * 1e9, model->gamma_s_per_byte * 1e9);
    std::printf("# %10s %12s", "block(B)", "total(B)");
    for (const Variant& a : algos) std::printf(" %12s", a.name);
    std::printf(" %10s %10s\n", "model", "measured");
  }
  const auto p = static_cast<size_t>(o.ranks);
  int wrong = 0;
  for (size_t b = o.min_b; b <= o.max_b;
       b = static_cast<size_t>(static_cast<double>(b) * o.factor)) {
    std::vector<uint8_t> in(p * b), out(p * b);
    for (size_t j = 0; j < p; ++j)
      for (size_t k = 0; k < b; ++k) in[j * b + k] = byte_of(rank, static_cast<int>(j), k);
    std::vector<std::vector<double>> t(algos.size());
    for (int it = -1; it < o.iters; ++it) {  // round -1: warm-up (pages, scratch)
      for (size_t x = 0; x < algos.size(); ++x) {
        const size_t ai = (x + static_cast<size_t>(it + 1)) % algos.size();
        ina::host::AlltoallOptions ao;
        ao.algorithm = algos[ai].algorithm;
        ao.window_bytes = algos[ai].window;
        ao.group_size = g;
        if (!ina::host::barrier(ctx).ok()) return 2;
        const double t0 = bench_now_us();
        ina::Status s =
            ina::host::alltoall(ctx, in.data(), out.data(), b, ina::DType::kFloat8E4M3, ao);
        const double t1 = bench_now_us();
        if (!s.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", rank, s.to_string().c_str());
          return 2;
        }
        if (it >= 0) t[ai].push_back(t1 - t0);
        for (size_t i = 0; i < p; ++i)
          for (size_t k = 0; k < b; ++k)
            wrong += out[i * b + k] != byte_of(static_cast<int>(i), rank, k);
      }
    }
    if (rank == 0) {
      std::printf("  %10zu %12zu", b, b * p);
      size_t best = 0;
      std::vector<double> med(algos.size());
      for (size_t i = 0; i < algos.size(); ++i) {
        std::sort(t[i].begin(), t[i].end());
        med[i] = t[i][t[i].size() / 2];
        if (med[i] < med[best]) best = i;
        std::printf(" %12.1f", med[i]);
      }
      auto pick = ina::host::select_alltoall(*model, b, o.ranks, g, "");
      std::printf(" %10s %10s\n",
                  pick.ok() ? ina::host::alltoall_algorithm_name(*pick).data() : "?",
                  algos[best].name);
      std::fflush(stdout);
    }
  }
  if (wrong > 0) std::fprintf(stderr, "rank %d: %d wrong bytes\n", rank, wrong);
  return wrong > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"host AllToAll algorithms, interleaved call by call in one job"};
  app.add_option("--ranks", o.ranks, "ranks (forked processes)")->check(CLI::Range(2, 64));
  app.add_option("-b,--minbytes", o.minbytes, "smallest block per pair");
  app.add_option("-e,--maxbytes", o.maxbytes, "largest block per pair");
  app.add_option("-f,--stepfactor", o.factor, "block size factor")->check(CLI::Range(1.01, 1e6));
  app.add_option("-n,--iters", o.iters, "interleaved rounds per size")
      ->check(CLI::Range(1, 100000));
  app.add_option("--group", o.group, "ranks per node for the hierarchical algorithm (0: none)");
  CLI11_PARSE(app, argc, argv);
  if (bench_parse_size(o.minbytes.c_str(), &o.min_b) != 0 ||
      bench_parse_size(o.maxbytes.c_str(), &o.max_b) != 0 || o.min_b == 0 || o.min_b > o.max_b) {
    std::fprintf(stderr, "ina-a2a-algo-bench: bad -b/-e\n");
    return 1;
  }
  const std::string tmpl = bench::make_temp_dir("ina-a2a");
  if (tmpl.empty()) return 1;
  std::vector<pid_t> kids;
  for (int r = 0; r < o.ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) _exit(rank_main(o, tmpl, r));
    if (pid > 0) kids.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : kids) {
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  bench::remove_dir(tmpl);
  return rc;
}
