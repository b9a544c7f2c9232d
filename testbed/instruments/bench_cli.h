// The command-line options every nccl-tests style bench of the testbed shares (size sweep,
// iterations, datatype, op, check, CSV, per-size cap), for the C++ benches that use CLI11
// (ina-bench, ina-gloo-bench, ina-nccl-net-bench). `Options` needs the members named below;
// alltoall_sizes is their AllToAll size list.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <vector>

namespace ina::bench {

template <class Options>
void add_sweep_options(CLI::App& app, Options& o, const char* datatypes) {
  app.add_option("-b,--minbytes", o.minbytes, "smallest size (K/M/G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", o.maxbytes, "largest size (K/M/G suffixes)")
      ->capture_default_str();
  app.add_option("-f,--stepfactor", o.stepfactor, "size multiplier between rows")
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "untimed iterations per size")
      ->capture_default_str();
  app.add_option("-d,--datatype", o.datatype, datatypes)->capture_default_str();
  app.add_option("-o,--op", o.op, "sum|min|max")->capture_default_str();
  app.add_option("-c,--check", o.check, "1: verify every element of the last output")
      ->capture_default_str();
  app.add_option("--csv", o.csv, "append rows to this CSV file");
  app.add_option("--max-bytes-per-size", o.max_bytes_per_size,
                 "cap iterations so that iters x size <= this (K/M/G; 0: no cap)")
      ->capture_default_str();
}

// AllToAll's sizes: each rounded down to whole elements for every rank (a multiple of `unit`
// bytes: ranks x element size), the empty and the repeated ones dropped.
inline std::vector<size_t> alltoall_sizes(const std::vector<size_t>& sizes, size_t unit) {
  std::vector<size_t> kept;
  for (size_t b : sizes)
    if (b / unit * unit > 0 && (kept.empty() || kept.back() != b / unit * unit))
      kept.push_back(b / unit * unit);
  return kept;
}

}  // namespace ina::bench
