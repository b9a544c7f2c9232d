#include "tests/integration/loopback_support.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "ina/base/half.h"
#include "ina/protocol/codec.h"
#include "ina/protocol/fp8.h"
#include "ina/protocol/quantize.h"

extern char** environ;

namespace ina::testing {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string AggregatorProcess::start(int world, const Options& opts) {
  const char* bin = std::getenv("INA_AGGREGATOR_BIN");
  if (bin == nullptr) return "INA_AGGREGATOR_BIN is not set (run through meson test)";
  char tmpl[] = "/tmp/ina-agg-port-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return "mkstemp failed";
  close(fd);
  unlink(tmpl);
  port_file = tmpl;
  std::vector<std::string> args = {bin,
                                   "--world-size",
                                   std::to_string(world),
                                   "--bind",
                                   "127.0.0.1",
                                   "--port",
                                   std::to_string(opts.port),
                                   "--port-file",
                                   port_file,
                                   "--stats-interval-ms",
                                   "0",
                                   "--seed",
                                   "7",
                                   "--drop-percent",
                                   std::to_string(opts.drop_percent),
                                   "--dup-percent",
                                   std::to_string(opts.dup_percent)};
  args.insert(args.end(), opts.extra_args.begin(), opts.extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (!opts.stdout_path.empty()) {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, opts.stdout_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  const int spawned = posix_spawn(&pid, bin, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (spawned != 0) {
    pid = -1;
    return std::string("cannot spawn ") + bin;
  }
  const auto deadline = Clock::now() + 10s;
  while (Clock::now() < deadline) {
    std::ifstream in(port_file);
    unsigned p = 0;
    if (in >> p && p > 0 && p < 65536) {
      port = static_cast<uint16_t>(p);
      return "";
    }
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      return "ina-aggregator exited during start-up";
    }
    std::this_thread::sleep_for(10ms);
  }
  return "ina-aggregator did not write its port within 10 s";
}

int AggregatorProcess::stop() {
  if (pid <= 0) return -1;
  kill(pid, SIGTERM);
  int status = 0;
  const auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      unlink(port_file.c_str());
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(5ms);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  pid = -1;
  unlink(port_file.c_str());
  return -1;
}

void fill_input(std::vector<uint8_t>& buf, const Case& c, int rank, int case_index) {
  buf.resize(c.count * dtype_size(c.dtype));
  std::mt19937_64 rng(0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(rank + 1) +
                      1000003ULL * static_cast<uint64_t>(case_index));
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> decade(-4, 4);
  for (size_t i = 0; i < c.count; ++i) {
    double v = unit(rng) * std::pow(10.0, decade(rng));
    if (c.nan && rank == 2 && i == c.count / 2) v = std::numeric_limits<double>::quiet_NaN();
    switch (c.dtype) {
      case DType::kInt32: {
        const auto x = static_cast<int32_t>(rng());
        std::memcpy(&buf[i * 4], &x, 4);
        break;
      }
      case DType::kFloat32: {
        const auto x = static_cast<float>(v);
        std::memcpy(&buf[i * 4], &x, 4);
        break;
      }
      case DType::kFloat16: {
        const uint16_t x = float_to_half(static_cast<float>(v / 100.0));
        std::memcpy(&buf[i * 2], &x, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t x = float_to_bf16(static_cast<float>(v));
        std::memcpy(&buf[i * 2], &x, 2);
        break;
      }
      case DType::kFloat8E4M3: buf[i] = double_to_e4m3(v); break;
      case DType::kFloat8E5M2: buf[i] = double_to_e5m2(v); break;
    }
  }
}

std::vector<uint8_t> model_result(const std::vector<std::vector<uint8_t>>& inputs, const Case& c,
                                  uint32_t block) {
  // What the aggregator computes per block (wire v2, protocol/codec.h): `block` counts 4-byte
  // elements, the block is 4 * block bytes.
  const auto world = static_cast<uint32_t>(inputs.size());
  const size_t es = dtype_size(c.dtype);
  const size_t k = size_t{block} * 4 / es;
  std::vector<uint8_t> out(c.count * es);
  std::vector<int64_t> acc(k);
  for (size_t base = 0; base < c.count; base += k) {
    const size_t n = std::min<size_t>(k, c.count - base);
    int16_t exp = kNoExponent;
    bool nonfinite = false;
    for (const auto& in : inputs) {
      const codec::Scan s = codec::scan(in.data() + base * es, n, c.dtype, c.op);
      exp = codec::max_exponent(exp, s.exp);
      nonfinite = nonfinite || (c.dtype != DType::kInt32 && s.nonfinite);
    }
    uint8_t* o = out.data() + base * es;
    if (c.op == ReduceOp::kSum && c.dtype == DType::kInt32) {
      // The sum modulo 2^32 (two's complement).
      for (size_t i = 0; i < n; ++i) {
        uint32_t sum = 0;
        for (const auto& in : inputs) {
          uint32_t x;
          std::memcpy(&x, in.data() + (base + i) * 4, 4);
          sum += x;
        }
        std::memcpy(o + i * 4, &sum, 4);
      }
    } else if (c.op != ReduceOp::kSum) {
      // The element of least (MIN) or greatest (MAX) value, -0 below +0, as it arrived (a NaN
      // anywhere makes the block NONFINITE below).
      for (size_t i = 0; i < n; ++i) {
        const uint8_t* best = inputs[0].data() + (base + i) * es;
        for (const auto& in : inputs) {
          const uint8_t* x = in.data() + (base + i) * es;
          const double a = codec::widen(x, 0, c.dtype), b = codec::widen(best, 0, c.dtype);
          const bool below = a < b || (a == b && std::signbit(a) && !std::signbit(b));
          const bool above = a > b || (a == b && !std::signbit(a) && std::signbit(b));
          if (c.op == ReduceOp::kMin ? below : above) best = x;
        }
        std::memcpy(o + i * es, best, es);
      }
    } else {
      std::fill_n(acc.begin(), n, int64_t{0});
      for (const auto& in : inputs) {
        codec::quantize_add(in.data() + base * es, n, c.dtype, exp, world, acc.data());
      }
      codec::dequantize(acc.data(), n, c.dtype, codec::scale_exponent(c.dtype, exp, world), o);
    }
    if (nonfinite) codec::fill_nan(o, n, c.dtype);
  }
  return out;
}

}  // namespace ina::testing
