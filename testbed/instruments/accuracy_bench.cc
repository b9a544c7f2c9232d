// ina-accuracy-bench: the worst error of a float SUM against the exact sum, in units of the
// output's ulp at the exact sum, for the in-network result and for the host ring in float, on the
// same inputs (the accuracy table of the docs).
//
//   in-network  what every aggregator path computes (flat, tree, shards, and the exact host
//               fallback, bitwise alike: paths_agree and QUANTIZATION.md): per block of one
//               packet, E = the MAX over ranks of the block exponent (codec::scan), every rank's
//               block quantized and added in integers (codec::quantize_add), the sum rounded once
//               to the user's type (codec::dequantize). The same calls the slot table makes.
//   host ring   libina's float-mode ring (INA_FALLBACK=float): each element reduced along one
//               chain of ranks in float32 (host::reduce_into, IEEE float adds; the 16- and 8-bit
//               types widened to float32 first, exactly), rounded once to the user's type at the
//               end. The chain of chunk c starts at rank (c + 1) mod N, as the ring's
//               reduce-scatter does.
// Exact sums are formed in long double (64-bit mantissa) from the exactly widened inputs: exact
// here, since every input is a float32 value and each distribution's exponents span well under
// 64 - log2(N) bits.
//
//   ina-accuracy-bench [--world 8] [--elems 65536] [--dist gauss,wide,cancel] [--dtype ...]
//
// Distributions: gauss (N(0, 1e-2) per rank), wide (sign random, magnitude log-uniform over 2^-20
// .. 2^4: small elements beside large ones in a block), cancel (ranks 0..N-2 gauss, rank N-1 the
// negated sum of the others rounded to the type plus gauss * 2^-10: sums near zero).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ina/base/half.h"
#include "ina/protocol/codec.h"
#include "ina/protocol/fp8.h"
#include "ina/protocol/quantize.h"
#include "ina/protocol/types.h"
#include "ina_config.h"
#include "testbed/instruments/dtype_list.h"
#include "worker/host/reduce.h"

namespace {

using ina::DType;
using ina::ReduceOp;
namespace codec = ina::codec;

// float -> the user's type (round to nearest even), as raw bits in the low bytes.
uint32_t to_type(DType t, float x) {
  switch (t) {
    case DType::kFloat32: return std::bit_cast<uint32_t>(x);
    case DType::kFloat16: return ina::float_to_half(x);
    case DType::kBFloat16: return ina::float_to_bf16(x);
    case DType::kFloat8E4M3: return ina::float_to_e4m3(x);
    case DType::kFloat8E5M2: return ina::float_to_e5m2(x);
    case DType::kInt32: break;
  }
  return 0;
}

struct Stats {
  double worst = 0;  // ulps
  double sum = 0;
  size_t over_half = 0;  // elements more than 0.5 ulp off (not the correctly rounded sum)
  size_t n = 0;
  void add(double ulps) {
    worst = std::max(worst, ulps);
    sum += ulps;
    over_half += ulps > 0.5 + 1e-12;
    ++n;
  }
};

double ulps_off(DType t, const uint8_t* out, size_t i, long double exact) {
  const double v = codec::widen(out, i, t);
  const double ulp = ina::quant::output_ulp(t, std::fabs(static_cast<double>(exact)));
  return static_cast<double>(std::fabs(static_cast<long double>(v) - exact)) / ulp;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ina-accuracy-bench: float SUM error in output ulps, in-network vs host ring"};
  app.set_version_flag("--version", std::string("ina-accuracy-bench ") + INA_VERSION);
  uint32_t world = 8;
  size_t elems = 65536;
  uint32_t payload = 1024;
  std::string dists = "gauss,wide,cancel";
  std::string dtypes = "float32,float16,bfloat16,float8_e4m3,float8_e5m2";
  uint64_t seed = 1;
  app.add_option("--world", world, "ranks")->capture_default_str()->check(CLI::Range(2u, 1024u));
  app.add_option("--elems", elems, "elements per rank")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 24));
  app.add_option("--payload", payload, "bytes of user data per block (one packet)")
      ->capture_default_str()
      ->check(CLI::Range(4u, 65536u));
  app.add_option("--dist", dists, "gauss, wide, cancel (comma-separated)")->capture_default_str();
  app.add_option("--dtype", dtypes, "float types (comma-separated)")->capture_default_str();
  app.add_option("--seed", seed, "input seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto split = [](const std::string& s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ',');) v.push_back(x);
    return v;
  };
  std::vector<DType> types;
  if (!ina::bench::parse_dtype_list(dtypes, true, &types)) return 2;
  for (const std::string& d : split(dists)) {
    if (d != "gauss" && d != "wide" && d != "cancel") {
      std::fprintf(stderr, "--dist: unknown '%s' (expected gauss, wide or cancel)\n", d.c_str());
      return 2;
    }
  }

  std::printf("# ina-accuracy-bench: world %u, %zu elements per rank, %u-byte blocks, seed %llu\n",
              world, elems, payload, static_cast<unsigned long long>(seed));
  std::printf(
      "# error |out - exact| in ulps of the output type at |exact|; >0.5: elements not "
      "the correctly rounded sum\n");
  std::printf("%-12s %-7s %12s %12s %9s %12s %12s %9s\n", "dtype", "dist", "inc_worst", "inc_mean",
              "inc_>0.5", "ring_worst", "ring_mean", "ring_>0.5");
  for (const DType t : types) {
    const size_t w = ina::dtype_size(t);
    const size_t block = std::max<size_t>(1, payload / w);
    for (const std::string& dist : split(dists)) {
      std::mt19937_64 rng(seed);
      std::normal_distribution<float> g(0.0f, 1e-2f);
      std::uniform_real_distribution<float> u(-20.0f, 4.0f);
      // float8: gauss and cancel scaled to sigma 1 (e4m3's normal range is 2^-6 .. 448).
      const bool fp8 = t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2;
      const float scale = fp8 && dist != "wide" ? 100.0f : 1.0f;
      // Inputs in the user's type, rank-major.
      std::vector<std::vector<uint8_t>> in(world, std::vector<uint8_t>(elems * w));
      for (uint32_t r = 0; r < world; ++r) {
        for (size_t i = 0; i < elems; ++i) {
          float x = g(rng) * scale;
          if (dist == "wide") x = (rng() & 1 ? -1.0f : 1.0f) * std::exp2(u(rng));
          if (dist == "cancel" && r == world - 1) {
            float s = 0;
            for (uint32_t q = 0; q + 1 < world; ++q)
              s += static_cast<float>(codec::widen(in[q].data(), i, t));
            x = -s + g(rng) * scale * 0x1p-10f;
          }
          const uint32_t bits = to_type(t, x);
          std::memcpy(in[r].data() + i * w, &bits, w);
        }
      }
      std::vector<long double> exact(elems, 0.0L);
      for (uint32_t r = 0; r < world; ++r) {
        for (size_t i = 0; i < elems; ++i) exact[i] += codec::widen(in[r].data(), i, t);
      }
      // In-network: the aggregator's late quantization, block by block.
      std::vector<uint8_t> inc(elems * w);
      std::vector<int64_t> acc(block);
      for (size_t off = 0; off < elems; off += block) {
        const size_t n = std::min(block, elems - off);
        int16_t e = ina::kNoExponent;
        for (uint32_t r = 0; r < world; ++r) {
          e = codec::max_exponent(e, codec::scan(in[r].data() + off * w, n, t, ReduceOp::kSum).exp);
        }
        std::fill(acc.begin(), acc.end(), 0);
        for (uint32_t r = 0; r < world; ++r) {
          codec::quantize_add(in[r].data() + off * w, n, t, e, world, acc.data());
        }
        codec::dequantize(acc.data(), n, t, codec::scale_exponent(t, e, world),
                          inc.data() + off * w);
      }
      // Host ring, float mode: one chain per chunk in float32, rounded once.
      std::vector<uint8_t> ring(elems * w);
      const size_t chunk = (elems + world - 1) / world;
      std::vector<float> part(chunk), wide(chunk);
      for (uint32_t c = 0; c < world; ++c) {
        const size_t lo = std::min(elems, c * chunk), hi = std::min(elems, lo + chunk);
        for (uint32_t k = 0; k < world; ++k) {
          const uint32_t r = (c + 1 + k) % world;
          float* dst = k == 0 ? part.data() : wide.data();
          for (size_t i = lo; i < hi; ++i)
            dst[i - lo] = static_cast<float>(codec::widen(in[r].data(), i, t));
          if (k > 0)
            ina::host::reduce_into(part.data(), wide.data(), hi - lo, DType::kFloat32,
                                   ReduceOp::kSum);
        }
        for (size_t i = lo; i < hi; ++i) {
          const uint32_t bits = to_type(t, part[i - lo]);
          std::memcpy(ring.data() + i * w, &bits, w);
        }
      }
      Stats si, sr;
      for (size_t i = 0; i < elems; ++i) {
        if (!std::isfinite(static_cast<double>(exact[i]))) continue;
        si.add(ulps_off(t, inc.data(), i, exact[i]));
        sr.add(ulps_off(t, ring.data(), i, exact[i]));
      }
      std::printf("%-12s %-7s %12.3f %12.4f %9zu %12.3f %12.4f %9zu\n",
                  std::string(ina::dtype_name(t)).c_str(), dist.c_str(), si.worst,
                  si.sum / static_cast<double>(si.n), si.over_half, sr.worst,
                  sr.sum / static_cast<double>(sr.n), sr.over_half);
    }
  }
  return 0;
}
