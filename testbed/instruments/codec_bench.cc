// ina-codec-bench: throughput of the block codec (protocol/codec.h), the payload loops the
// aggregators and the exact host fallback run, per dtype, one thread. The buffer is cut into the
// blocks of one wire packet (--payload bytes of the user's type, 1024 by default) and each step
// runs over every block, as the slot table does for one rank's packets:
//   scan        block exponent and non-finite mark (every float SUM block, once per rank)
//   quant_add   acc += rint(x * 2^(B-E)) (float SUM, once per rank) / acc += x (int32 SUM)
//   dequant     the fixed-point sum of --world ranks' words back to the user's type (float SUM,
//               once per block)
//   minmax      acc = max(acc, key(x)) (MIN/MAX, once per rank)
//   memcpy      the same buffer copied, the yardstick of the machine's memory path
// GB/s is 1e9 bytes of the user's buffer per second (the median of --reps timed passes).
//
// A second table gives the aggregator's float SUM path in ns per element, stage by stage: what
// it does per rank's packet (the tag checked over header and payload, scan, quantize+add) and
// per block once (dequantize, the result's tag), and the whole path per element per rank:
// tag + scan + fused + tag / world, beside memcpy per element and the ratio. The completion of a
// round (every rank's words quantized, added and converted) is timed twice over the slot table's
// layout: the per-rank loops through a tile and the fused loop (codec::quantize_sum), beside a
// memcpy of the same ranks' words.
// --impl runs one kernel implementation (ina/kernels/codec.h: avx512, avx2, neon, portable), so two
// can be compared in the same run, alternated.
//
//   ina-codec-bench [--dtype float32,bfloat16,...] [--elems N] [--world N] [--payload B]
//                   [--impl avx2,avx512] [--rounds R]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "ina/base/half.h"
#include "ina/kernels/codec.h"
#include "ina/protocol/codec.h"
#include "ina/protocol/fp8.h"
#include "ina/protocol/mac.h"
#include "ina/protocol/types.h"
#include "ina/protocol/wire.h"
#include "ina_config.h"
#include "testbed/instruments/dtype_list.h"

namespace {

using ina::DType;
using ina::ReduceOp;
namespace codec = ina::codec;

// Gaussian gradients (sigma 1e-2) in type t, as raw little-endian bytes.
std::vector<uint8_t> make_input(DType t, size_t n) {
  std::mt19937_64 rng(42);
  std::normal_distribution<float> g(0.0f, 1e-2f);
  const size_t w = ina::dtype_size(t);
  std::vector<uint8_t> buf(n * w);
  for (size_t i = 0; i < n; ++i) {
    const float x = g(rng);
    uint32_t bits = 0;
    switch (t) {
      case DType::kFloat32: std::memcpy(&bits, &x, 4); break;
      case DType::kFloat16: bits = ina::float_to_half(x); break;
      case DType::kBFloat16: bits = ina::float_to_bf16(x); break;
      case DType::kFloat8E4M3: bits = ina::float_to_e4m3(x * 100); break;
      case DType::kFloat8E5M2: bits = ina::float_to_e5m2(x * 100); break;
      case DType::kInt32: bits = static_cast<uint32_t>(static_cast<int32_t>(x * 1e6f)); break;
    }
    std::memcpy(buf.data() + i * w, &bits, w);
  }
  return buf;
}

// --cpu-clock: the thread's CPU clock instead of the wall clock (a machine shared with other
// work: time spent preempted is not counted).
bool g_cpu_clock = false;

double now_s() {
  if (g_cpu_clock) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds of `reps` calls of f (one warm-up call first).
template <class F>
double median_seconds(int reps, F&& f) {
  f();
  std::vector<double> s;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    f();
    s.push_back(now_s() - t0);
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ina-codec-bench: the block codec's loops (protocol/codec.h) per dtype, GB/s"};
  app.set_version_flag("--version", std::string("ina-codec-bench ") + INA_VERSION);
  std::string dtypes = "int32,float32,float16,bfloat16,float8_e4m3,float8_e5m2";
  size_t elems = size_t{1} << 20;
  uint32_t world = 8;
  uint32_t payload = 1024;
  int reps = 7;
  app.add_option("--dtype", dtypes, "comma-separated dtypes")->capture_default_str();
  app.add_option("--elems", elems, "elements per buffer")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 28));
  app.add_option("--world", world, "world size (sets the fixed-point scale B)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 65535u));
  app.add_option("--payload", payload, "bytes of user data per block (one packet)")
      ->capture_default_str()
      ->check(CLI::Range(4u, 65536u));
  app.add_option("--reps", reps, "timed passes per figure (the median is printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  std::string impls;
  int rounds = 1;
  app.add_option("--impl", impls,
                 "comma-separated kernel implementations, each run in turn (default: the best)");
  app.add_option("--rounds", rounds, "passes over the --impl list (alternated)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_flag("--cpu-clock", g_cpu_clock,
               "time by the thread's CPU clock (preemption not counted), not the wall clock");
  CLI11_PARSE(app, argc, argv);

  std::vector<DType> types;
  if (!ina::bench::parse_dtype_list(dtypes, false, &types)) return 2;
  std::vector<std::string> impl_list;
  for (size_t pos = 0; pos <= impls.size();) {
    const size_t comma = std::min(impls.find(',', pos), impls.size());
    if (comma > pos) impl_list.push_back(impls.substr(pos, comma - pos));
    pos = comma + 1;
  }
  if (impl_list.empty()) impl_list.push_back("");
  for (const auto& name : impl_list) {
    if (!ina::kernels::set_codec_kernels_for_testing(name)) {
      std::fprintf(stderr, "ina-codec-bench: this CPU does not run kernels '%s'\n", name.c_str());
      return 2;
    }
  }
  const ina::MacKey mac_key = ina::expand_mac_key(ina::Key128{0x0123456789abcdefULL, 42});
  std::vector<std::string> path_rows;
  for (int round = 0; round < rounds; ++round) {
    for (const auto& impl_name : impl_list) {
      ina::kernels::set_codec_kernels_for_testing(impl_name);
      const char* impl = ina::kernels::codec_kernels().name;

      std::printf("# ina-codec-bench: %zu elements, world %u, %u-byte blocks, median of %d (%s)\n",
                  elems, world, payload, reps, g_cpu_clock ? "thread CPU clock" : "wall clock");
      std::printf("# GB/s of the user's buffer; '-' where the step does not apply\n");
      std::printf("# kernels: %s\n", impl);
      std::printf("%-12s %6s %9s %9s %9s %9s %9s\n", "dtype", "block", "scan", "quant_add",
                  "dequant", "minmax", "memcpy");
      for (const DType t : types) {
        const size_t w = ina::dtype_size(t);
        const size_t block = std::max<size_t>(1, payload / w);
        const std::vector<uint8_t> in = make_input(t, elems);
        std::vector<uint8_t> out(in.size());
        std::vector<int64_t> acc(elems, 0);
        std::vector<int32_t> acc32(elems, 0);
        const double bytes = static_cast<double>(in.size());
        auto per_block = [&](auto&& step) {
          return median_seconds(reps, [&] {
            for (size_t off = 0; off < elems; off += block) step(off, std::min(block, elems - off));
          });
        };
        const bool is_float = t != DType::kInt32;
        std::vector<int16_t> exps((elems + block - 1) / block, 0);
        double scan_s = 0, quant_s = 0, deq_s = 0;
        if (is_float) {
          scan_s = per_block([&](size_t off, size_t n) {
            exps[off / block] = codec::scan(in.data() + off * w, n, t, ReduceOp::kSum).exp;
          });
          quant_s = per_block([&](size_t off, size_t n) {
            codec::quantize_add(in.data() + off * w, n, t, exps[off / block], world,
                                acc.data() + off);
          });
          // The sums dequantize sees: `world` ranks' words (the timed passes above added 1 + reps
          // copies, which past 2^30 no honest sum reaches).
          std::fill(acc.begin(), acc.end(), int64_t{0});
          for (uint32_t r = 0; r < world; ++r) {
            for (size_t off = 0; off < elems; off += block) {
              codec::quantize_add(in.data() + off * w, std::min(block, elems - off), t,
                                  exps[off / block], world, acc.data() + off);
            }
          }
          deq_s = per_block([&](size_t off, size_t n) {
            codec::dequantize(acc.data() + off, n, t,
                              codec::scale_exponent(t, exps[off / block], world),
                              out.data() + off * w);
          });
        } else {
          // int32 SUM as the slot table runs it: in int32 words (fold_int32).
          quant_s = per_block([&](size_t off, size_t n) {
            codec::fold_int32(in.data() + off * w, n, ReduceOp::kSum, acc32.data() + off);
          });
        }
        std::fill(acc.begin(), acc.end(), int64_t{INT64_MIN});
        std::fill(acc32.begin(), acc32.end(), INT32_MIN);
        const double mm_s = per_block([&](size_t off, size_t n) {
          if (is_float) {  // the slot table's int32 keys
            codec::keys_minmax32(in.data() + off * w, n, t, ReduceOp::kMax, acc32.data() + off);
          } else {
            codec::fold_int32(in.data() + off * w, n, ReduceOp::kMax, acc32.data() + off);
          }
        });
        const double cp_s =
            median_seconds(reps, [&] { std::memcpy(out.data(), in.data(), in.size()); });
        auto gbs = [&](double s) {
          char b[16];
          if (s <= 0) return std::string("-");
          std::snprintf(b, sizeof b, "%.2f", bytes / s / 1e9);
          return std::string(b);
        };
        std::printf("%-12s %6zu %9s %9s %9s %9s %9s\n", std::string(ina::dtype_name(t)).c_str(),
                    block, gbs(scan_s).c_str(), gbs(quant_s).c_str(), gbs(deq_s).c_str(),
                    gbs(mm_s).c_str(), gbs(cp_s).c_str());
        // The tag over each packet (header + block), as the aggregator checks a rank's DATA and
        // seals a result.
        const size_t pkt_bytes = ina::wire::kHeaderSize + block * w;
        const size_t packets = (elems + block - 1) / block;
        std::vector<uint8_t> pkts(packets * pkt_bytes, 0x33);
        for (size_t k = 0; k < packets; ++k) {
          const size_t n = std::min(block, elems - k * block);
          std::memcpy(pkts.data() + k * pkt_bytes + ina::wire::kHeaderSize,
                      in.data() + k * block * w, n * w);
        }
        uint64_t tag_sink = 0;
        const double tag_s = median_seconds(reps, [&] {
          for (size_t k = 0; k < packets; ++k) {
            tag_sink += ina::packet_mac(mac_key, {pkts.data() + k * pkt_bytes, pkt_bytes},
                                        ina::wire::kOffTag / 8);
          }
        });
        if (is_float) {
          // The completion as the slot table runs it: every rank's words of a block side by side
          // (rank r's at r * payload bytes), the blocks one after another; `tiles` is the loop
          // the fused kernel replaced (quantize, quantize_add per rank, dequantize, through a
          // 512-element tile), `fused` is codec::quantize_sum (the kernels' one-pass loop where
          // the table has one, the same tile loop where not); `copy` is memcpy of the same
          // ranks' words. All in ns per element per rank.
          const size_t blocks = packets;
          const size_t stride = payload;
          std::vector<uint8_t> raw(blocks * world * stride);
          for (size_t b = 0; b < blocks; ++b) {
            const size_t n = std::min(block, elems - b * block);
            for (uint32_t r = 0; r < world; ++r) {
              std::memcpy(raw.data() + (b * world + r) * stride, in.data() + b * block * w, n * w);
            }
          }
          std::vector<uint8_t> raw_out(raw.size());
          auto per_round = [&](auto&& step) {
            return median_seconds(reps, [&] {
              for (size_t b = 0; b < blocks; ++b) {
                step(raw.data() + b * world * stride, std::min(block, elems - b * block), exps[b],
                     out.data() + b * block * w);
              }
            });
          };
          alignas(64) static int64_t tile[512];
          const double tiles_s =
              per_round([&](const uint8_t* src, size_t n, int16_t e, uint8_t* d) {
                for (size_t at = 0; at < n; at += 512) {
                  const size_t m = std::min<size_t>(512, n - at);
                  codec::quantize(src + at * w, m, t, e, world, tile);
                  for (uint32_t r = 1; r < world; ++r) {
                    codec::quantize_add(src + r * stride + at * w, m, t, e, world, tile);
                  }
                  codec::dequantize(tile, m, t, codec::scale_exponent(t, e, world), d + at * w);
                }
              });
          std::vector<const uint8_t*> ranks(world);
          const double fused_s =
              per_round([&](const uint8_t* src, size_t n, int16_t e, uint8_t* d) {
                for (uint32_t r = 0; r < world; ++r) ranks[r] = src + r * stride;
                codec::quantize_sum(ranks.data(), world, n, t, e, world, d, /*bounded=*/true);
              });
          const double rawcp_s =
              median_seconds(reps, [&] { std::memcpy(raw_out.data(), raw.data(), raw.size()); });
          const double e = static_cast<double>(elems);
          const double er = e * world;
          const double ns_scan = scan_s / e * 1e9, ns_q = quant_s / e * 1e9, ns_d = deq_s / e * 1e9;
          const double ns_tag = tag_s / e * 1e9, ns_cp = cp_s / e * 1e9;
          const double ns_tiles = tiles_s / er * 1e9, ns_fused = fused_s / er * 1e9;
          const double ns_rawcp = rawcp_s / er * 1e9;
          const double path = ns_tag + ns_scan + ns_fused + ns_tag / world;
          char line[320];
          std::snprintf(line, sizeof line,
                        "%-8s %-12s %8.3f %9.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %7.2f %8.3f "
                        "%7.2f",
                        impl, std::string(ina::dtype_name(t)).c_str(), ns_scan, ns_q, ns_d,
                        ns_tiles, ns_fused, ns_tag, path, ns_cp, path / ns_cp, ns_rawcp,
                        ns_fused / ns_rawcp);
          path_rows.push_back(line);
        }
        // Keep the results alive (and the compiler honest).
        volatile uint8_t sink = out[elems * w / 2];
        volatile uint64_t sink2 = tag_sink;
        (void)sink;
        (void)sink2;
      }
    }
  }
  if (!path_rows.empty()) {
    std::printf(
        "#\n# float SUM at the aggregator, ns per element (per rank): scan, quant_add, dequant: "
        "the stages alone (dequant per block, not per rank); tiles: the completion as the "
        "per-rank loops through a tile (quantize + quantize_add x %u + dequantize), fused: "
        "codec::quantize_sum, both over the ranks' words side by side; path = tag + scan + "
        "fused + tag / %u; memcpy = the user's buffer copied, x = path / memcpy; copy = the "
        "ranks' words copied, c = fused / copy\n",
        world - 1, world);
    std::printf("%-8s %-12s %8s %9s %8s %8s %8s %8s %8s %8s %7s %8s %7s\n", "kernels", "dtype",
                "scan", "quant_add", "dequant", "tiles", "fused", "tag", "path", "memcpy", "x",
                "copy", "c");
    for (const auto& l : path_rows) std::printf("%s\n", l.c_str());
  }
  return 0;
}
