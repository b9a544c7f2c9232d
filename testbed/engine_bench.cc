// ina-engine-bench: the aggregator Engine's per-core packet rate with and without the per-job tag
// check (SipHash-2-4, WIRE.md) and the straggler telemetry, in one run (configurations interleaved, median of the
// repetitions), so the overhead of each is measured under the same machine load.
//
//   ina-engine-bench [--world 8] [--elems 256] [--slots 64] [--rounds 4000] [--reps 5]
//
// Telemetry "on" includes what the UDP backend pays: one clock_gettime per receive batch
// (--batch datagrams).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "aggregator/engine.h"
#include "ina/protocol/types.h"
#include "ina/protocol/wire.h"
#include "testbed/engine_stream.h"

namespace {

uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

// SUM of each type through one engine (tag check and telemetry off), types interleaved, median
// of the repetitions: the cost of the block codec (float types) against int32's plain adds.
// `elems` elements per packet for 4-byte types; narrower types carry the same payload bytes.
int per_dtype(const std::vector<std::string>& names, uint32_t world, uint32_t slots,
              uint32_t elems, uint32_t rounds, uint32_t reps) {
  using namespace ina;
  constexpr uint64_t kKey = 0x0123456789ABCDEFull;
  struct Row {
    DType dtype;
    uint32_t elems;
    std::vector<std::vector<uint8_t>> pkts;
    std::vector<double> ns;
  };
  std::vector<Row> rows;
  for (const std::string& n : names) {
    const std::optional<DType> t = parse_dtype(n);
    if (!t) {
      std::fprintf(stderr, "bench: --dtype: unknown type '%s' (expected int32, float32, float16, "
                   "bfloat16, float8_e4m3 or float8_e5m2)\n", n.c_str());
      return 2;
    }
    const auto e = static_cast<uint32_t>(elems * 4 / dtype_size(*t));
    rows.push_back({*t, e, bench::data_stream(rounds, world, slots, e, *t, kKey), {}});
  }
  for (uint32_t rep = 0; rep < reps; ++rep) {
    for (Row& row : rows) {
      agg::EngineOptions eo;
      eo.check_tag = false;  // the codec's cost alone (the tag's is the line above)
      eo.telemetry = false;
      agg::Engine e(eo);
      if (!e.add_job(bench::job_config(world, slots, elems, kKey)).ok()) return 1;
      int32_t rank;
      JobId job;
      for (uint32_t r = 0; r < world; ++r) {
        e.on_packet(bench::hello_packet(static_cast<uint16_t>(r), world, kKey, 77), &rank, &job);
      }
      const auto t0 = std::chrono::steady_clock::now();
      for (const auto& p : row.pkts) e.on_packet(p, 0, &rank, &job);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (e.counters().completed != rounds) {
        std::fprintf(stderr, "bench: %s: %llu completions, expected %u\n",
                     std::string(dtype_name(row.dtype)).c_str(),
                     static_cast<unsigned long long>(e.counters().completed), rounds);
        return 1;
      }
      row.ns.push_back(s * 1e9 / static_cast<double>(row.pkts.size()));
    }
  }
  std::printf("per type (SUM, tag check and telemetry off), %u payload bytes per packet:\n",
              elems * 4);
  const double base = [&] {
    std::vector<double> v = rows.front().ns;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }();
  for (Row& row : rows) {
    std::sort(row.ns.begin(), row.ns.end());
    const double med = row.ns[row.ns.size() / 2];
    std::printf("  %-12s %5u elems  %7.1f ns/packet  %6.2f ns/element  (x%.2f vs %s)\n",
                std::string(dtype_name(row.dtype)).c_str(), row.elems, med, med / row.elems,
                med / base, std::string(dtype_name(rows.front().dtype)).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ina-engine-bench: Engine packets per second, tag check and telemetry on/off"};
  uint32_t world = 8, elems = 256, slots = 64, rounds = 4000, reps = 5, batch = 32;
  app.add_option("--world", world)->check(CLI::Range(2, 1024))->capture_default_str();
  app.add_option("--elems", elems)->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--slots", slots)->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--rounds", rounds, "block rounds per measurement")->capture_default_str();
  app.add_option("--reps", reps)->check(CLI::Range(1, 100))->capture_default_str();
  app.add_option("--batch", batch, "datagrams per clock read (the backend's recvmmsg batch)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  std::vector<std::string> dtypes = {"int32", "float32", "bfloat16"};
  app.add_option("--dtype", dtypes,
                 "element types of the per-type table (SUM; float types: the block codec)")
      ->delimiter(',')
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  using namespace ina;
  constexpr uint64_t kKey = 0x0123456789ABCDEFull;
  // The packet stream: rounds over the slot window, every rank's block, alternating copies.
  const std::vector<std::vector<uint8_t>> pkts =
      bench::data_stream(rounds, world, slots, elems, kKey);
  struct Variant {
    const char* name;
    bool key;
    bool tele;
    std::vector<double> mpps;
  };
  std::vector<Variant> vs = {{"tag off, telemetry off", false, false, {}},
                             {"tag on,  telemetry off", true, false, {}},
                             {"tag off, telemetry on ", false, true, {}},
                             {"tag on,  telemetry on ", true, true, {}}};
  for (uint32_t rep = 0; rep < reps; ++rep) {
    for (Variant& v : vs) {
      agg::EngineOptions eo;
      eo.check_tag = v.key;
      eo.telemetry = v.tele;
      agg::Engine e(eo);
      if (!e.add_job(bench::job_config(world, slots, elems, kKey)).ok()) return 1;
      int32_t rank;
      JobId job;
      for (uint32_t r = 0; r < world; ++r) {  // join
        e.on_packet(bench::hello_packet(static_cast<uint16_t>(r), world, kKey, 77), &rank, &job);
      }
      const auto t0 = std::chrono::steady_clock::now();
      uint64_t replies = 0;
      uint64_t now = 0;
      uint32_t in_batch = 0;
      for (const auto& p : pkts) {
        if (v.tele && in_batch++ % batch == 0) now = mono_ns();
        replies += e.on_packet(p, now, &rank, &job).target != agg::Reply::Target::kNone;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (e.counters().completed != rounds || replies != rounds) {
        std::fprintf(stderr, "bench: %s: %llu completions, expected %u\n", v.name,
                     static_cast<unsigned long long>(e.counters().completed), rounds);
        return 1;
      }
      v.mpps.push_back(static_cast<double>(pkts.size()) / s / 1e6);
    }
  }
  std::printf("world %u, %u elements per packet, %u slots, %zu packets per run, median of %u\n",
              world, elems, slots, pkts.size(), reps);
  double base = 0;
  for (Variant& v : vs) {
    std::sort(v.mpps.begin(), v.mpps.end());
    const double med = v.mpps[v.mpps.size() / 2];
    if (base == 0) base = med;
    std::printf("  %s  %7.3f Mpps  %6.1f ns/packet  (%+5.1f%% vs tag off, telemetry off)\n",
                v.name, med, 1e3 / med, (med / base - 1) * 100);
  }
  const size_t dg = wire::kHeaderSize + 1024;  // a full 1 KiB block's DATA or RESULT
  const double tag_ns = bench::siphash_ns_per_datagram(dg);
  std::printf("  siphash-2-4 tag of a %zu-byte datagram: %.1f ns (%.2f GB/s)\n", dg, tag_ns,
              static_cast<double>(dg) / tag_ns);
  return per_dtype(dtypes, world, slots, elems, rounds, reps);
}
