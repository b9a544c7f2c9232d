// ina-engine-bench: the aggregator Engine's per-core packet rate with and without the per-job tag
// check (SipHash-2-4, WIRE.md) and the straggler telemetry, in one run (configurations
// interleaved, median of the repetitions), so the overhead of each is measured under the same
// machine load; then the per-packet cost of SUM for each --dtype (the block codec).
//
//   ina-engine-bench [--world 8] [--elems 256] [--slots 64] [--rounds 4000] [--reps 5]
//
// Telemetry "on" includes what the UDP backend pays: one clock_gettime per receive batch
// (--batch datagrams).
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "aggregator/engine.h"
#include "ina/protocol/types.h"
#include "ina/protocol/wire.h"
#include "ina_config.h"
#include "testbed/instruments/engine_stream.h"

namespace {

uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

constexpr uint64_t kKey = 0x0123456789ABCDEFull;

// One timed run: a fresh engine serving job 1 (`world` ranks joined), fed `pkts`; seconds, or a
// negative value (reported on stderr) when not every one of the `rounds` rounds completed and
// was answered once. `batch` > 0: a clock read every `batch` packets, as the UDP backend's
// telemetry does per receive batch.
double timed_run(const ina::agg::EngineOptions& eo, uint32_t world, uint32_t slots, uint32_t elems,
                 const std::vector<std::vector<uint8_t>>& pkts, uint32_t rounds, uint32_t batch,
                 const char* what) {
  using namespace ina;
  agg::Engine e(eo);
  if (!e.add_job(bench::job_config(world, slots, elems, kKey)).ok()) return -1;
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
    if (batch > 0 && in_batch++ % batch == 0) now = mono_ns();
    replies += e.on_packet(p, now, &rank, &job).target != agg::Reply::Target::kNone;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (e.counters().completed != rounds || replies != rounds) {
    std::fprintf(stderr, "bench: %s: %llu completions and %llu replies, expected %u\n", what,
                 static_cast<unsigned long long>(e.counters().completed),
                 static_cast<unsigned long long>(replies), rounds);
    return -1;
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// SUM of each type through one engine (tag check and telemetry off), types interleaved, median
// of the repetitions: the cost of the block codec (float types) against int32's plain adds.
// `elems` elements per packet for 4-byte types; narrower types carry the same payload bytes.
int per_dtype(const std::vector<std::string>& names, uint32_t world, uint32_t slots, uint32_t elems,
              uint32_t rounds, uint32_t reps) {
  using namespace ina;
  struct Row {
    DType dtype;
    std::string name;
    uint32_t elems;
    std::vector<std::vector<uint8_t>> pkts;
    std::vector<double> ns;
  };
  std::vector<Row> rows;
  for (const std::string& n : names) {
    const std::optional<DType> t = parse_dtype(n);
    if (!t) {
      std::fprintf(stderr,
                   "bench: --dtype: unknown type '%s' (expected int32, float32, float16, "
                   "bfloat16, float8_e4m3 or float8_e5m2)\n",
                   n.c_str());
      return 2;
    }
    const auto e = static_cast<uint32_t>(elems * 4 / dtype_size(*t));
    rows.push_back({*t,
                    std::string(dtype_name(*t)),
                    e,
                    bench::data_stream(rounds, world, slots, e, *t,
                                       bench::incarnation_key_of(kKey, world, 77)),
                    {}});
  }
  agg::EngineOptions eo;
  eo.check_tag = false;  // the codec's cost alone (the tag's is printed above)
  eo.telemetry = false;
  for (uint32_t rep = 0; rep < reps; ++rep) {
    for (Row& row : rows) {
      const double s = timed_run(eo, world, slots, elems, row.pkts, rounds, 0, row.name.c_str());
      if (s < 0) return 1;
      row.ns.push_back(s * 1e9 / static_cast<double>(row.pkts.size()));
    }
  }
  std::printf("per type (SUM, tag check and telemetry off), %u payload bytes per packet:\n",
              elems * 4);
  const double base = median(rows.front().ns);
  for (const Row& row : rows) {
    const double med = median(row.ns);
    std::printf("  %-12s %5u elems  %7.1f ns/packet  %6.2f ns/element  (x%.2f vs %s)\n",
                row.name.c_str(), row.elems, med, med / row.elems, med / base,
                rows.front().name.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ina-engine-bench: Engine packets per second, tag check and telemetry on/off"};
  app.set_version_flag("--version", "ina-engine-bench " INA_VERSION);
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
  // The packet stream: rounds over the slot window, every rank's block, alternating copies.
  const std::vector<std::vector<uint8_t>> pkts =
      bench::data_stream(rounds, world, slots, elems, bench::incarnation_key_of(kKey, world, 77));
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
      const double s = timed_run(eo, world, slots, elems, pkts, rounds, v.tele ? batch : 0, v.name);
      if (s < 0) return 1;
      v.mpps.push_back(static_cast<double>(pkts.size()) / s / 1e6);
    }
  }
  std::printf("world %u, %u elements per packet, %u slots, %zu packets per run, median of %u\n",
              world, elems, slots, pkts.size(), reps);
  const double base = median(vs.front().mpps);
  for (const Variant& v : vs) {
    const double med = median(v.mpps);
    std::printf("  %s  %7.3f Mpps  %6.1f ns/packet  (%+5.1f%% vs tag off, telemetry off)\n", v.name,
                med, 1e3 / med, (med / base - 1) * 100);
  }
  const size_t dg = wire::kHeaderSize + 1024;  // a full 1 KiB block's DATA or RESULT
  const double tag_ns = bench::tag_ns_per_datagram(dg);
  std::printf(
      "  packet tag (POLYVAL by %s, then SipHash-2-4) of a %zu-byte datagram: %.1f ns "
      "(%.2f GB/s)\n",
      mac_path_name(best_mac_path()), dg, tag_ns, static_cast<double>(dg) / tag_ns);
  for (MacPath p : {MacPath::kClmul512, MacPath::kClmul, MacPath::kPortable}) {
    if (!mac_path_available(p) || p == best_mac_path()) continue;
    const double ns = bench::tag_ns_per_datagram(dg, &p, p == MacPath::kPortable ? 2000 : 200000);
    std::printf("    by %s instead: %.1f ns\n", mac_path_name(p), ns);
  }
  std::printf("    wire v3's tag (SipHash-2-4 over the datagram): %.1f ns\n",
              bench::siphash_ns_per_datagram(dg));
  // The receive pass (mac.h, packet_mac_copy): verify and keep the payload in one read, for a
  // 1 KiB block and an 8 KiB one (ina-bench's default).
  for (const size_t bytes : {dg, wire::kHeaderSize + 8192}) {
    for (const size_t span : {bytes - wire::kHeaderSize, size_t{16} << 20}) {
      const bench::ReceivePassNs r = bench::receive_pass_ns(bytes, span);
      std::printf(
          "  receive a %zu-byte datagram, destination %s:\n"
          "    verify + copy:        %6.1f ns apart, %6.1f ns in one pass (x%.2f)\n"
          "    verify + scan + copy: %6.1f ns apart, %6.1f ns in one pass (x%.2f)\n",
          bytes, span < (size_t{16} << 20) ? "one block" : "walking 16 MiB", r.separate_copy,
          r.fused_copy, r.fused_copy / r.separate_copy, r.separate_scan, r.fused_scan,
          r.fused_scan / r.separate_scan);
      if (span >= (size_t{16} << 20))
        std::printf("    verify + copy into a stream (prefetched): %6.1f ns (x%.2f)\n",
                    r.stream_copy, r.stream_copy / r.separate_copy);
    }
  }
  // The send side: a DATA packet's seal over the user's buffer, then the kernel's copy of it.
  for (const size_t payload : {size_t{1024}, size_t{8192}}) {
    const bench::SealWalkNs w = bench::seal_walk_ns(payload, size_t{16} << 20);
    std::printf(
        "  seal a %zu-byte payload in place, walking 16 MiB: %6.1f ns; a memcpy of it %6.1f ns; "
        "seal then memcpy %6.1f ns\n",
        payload, w.seal, w.copy, w.seal_then_copy);
  }
  return per_dtype(dtypes, world, slots, elems, rounds, reps);
}
