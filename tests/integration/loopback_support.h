// Shared by the loopback integration tests (multiprocess_test.cc, fallback_test.cc): a real
// `ina-aggregator` child process, deterministic per-rank inputs, and the protocol model that says
// bit for bit what an in-network AllReduce returns.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ina/protocol/types.h"

namespace ina::testing {

// The ina-aggregator named by INA_AGGREGATOR_BIN (set by meson test), on 127.0.0.1.
struct AggregatorProcess {
  struct Options {
    uint16_t port = 0;         // 0: an ephemeral port (read back through --port-file)
    double drop_percent = 0;   // the aggregator's test hooks
    double dup_percent = 0;
    std::vector<std::string> extra_args;  // appended to the command line (e.g. a tree leaf's)
    std::string stdout_path;              // "": inherit; else its stdout goes to this file
  };

  pid_t pid = -1;
  uint16_t port = 0;
  std::string port_file;

  AggregatorProcess() = default;
  AggregatorProcess(const AggregatorProcess&) = delete;
  AggregatorProcess& operator=(const AggregatorProcess&) = delete;
  ~AggregatorProcess() { stop(); }

  // Spawns it for a job of `world` ranks and waits (10 s) for its port. Returns "" on success,
  // else why not.
  std::string start(int world, const Options& opts);
  std::string start(int world) { return start(world, Options{}); }
  // SIGTERM, then a clean exit expected within 5 s (else SIGKILL). Returns the exit status, or -1
  // when it had to be killed or was not running.
  int stop();
};

struct Case {
  DType dtype;
  ReduceOp op;
  size_t count;
  bool nan = false;  // rank 2 puts a NaN at element count / 2
};

// Rank's input of case `case_index`: floats spanning several decades per block and both signs,
// int32 over the full range (SUM wraps).
void fill_input(std::vector<uint8_t>& buf, const Case& c, int rank, int case_index);

// What the in-network path returns for these inputs (one per rank), computed with the quantizer
// reference: per block of `block` elements the MAX of the ranks' exponents, encode, wrapping int32
// SUM (or MIN/MAX), decode; a block with a non-finite element on any rank is all NaN.
std::vector<uint8_t> model_result(const std::vector<std::vector<uint8_t>>& inputs, const Case& c,
                                  uint32_t block);

}  // namespace ina::testing
