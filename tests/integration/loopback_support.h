// Shared by the loopback integration tests (multiprocess, fallback, sharding, tree, ...): a real
// `ina-aggregator` child process, deterministic per-rank inputs, the protocol model that says bit
// for bit what an in-network AllReduce returns, forked ranks, and an aggregator killed mid-stream.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "ina/protocol/types.h"

namespace ina::testing {

// The ina-aggregator named by INA_AGGREGATOR_BIN (set by meson test), on 127.0.0.1.
struct AggregatorProcess {
  struct Options {
    uint16_t port = 0;        // 0: an ephemeral port (read back through --port-file)
    double drop_percent = 0;  // the aggregator's test hooks
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

// The whole file at `path` (a child's log), empty when it cannot be read.
inline std::string slurp(const std::string& path) {
  std::string s;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    std::fclose(f);
  }
  return s;
}

// Forks `world` children running body(rank) (its return value is the exit code) and waits up to
// `limit` for all of them; returns each one's exit code (128 + the signal when one killed it, -1
// when it did not finish in time: then it is killed).
template <typename Body>
std::vector<int> fork_ranks(int world, Body body, std::chrono::seconds limit) {
  using Clock = std::chrono::steady_clock;
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) _exit(body(r));
    pids.push_back(pid);
  }
  std::vector<int> codes(static_cast<size_t>(world), -1);
  const auto deadline = Clock::now() + limit;
  size_t left = pids.size();
  while (left > 0 && Clock::now() < deadline) {
    for (size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] <= 0) continue;
      int status;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pids[r] = -1;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (pid_t p : pids) {
    if (p > 0) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  }
  return codes;
}

// Forks `world` children running body(rank) (its return value is the exit code) and waits up to
// `limit` for all of them; returns "" or what went wrong. `while_running` runs in the parent and
// returns "" or an error. Children that outlive `limit` are killed.
template <typename Body, typename Parent>
std::string run_forked(int world, Body body, Parent while_running, std::chrono::seconds limit) {
  using Clock = std::chrono::steady_clock;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid < 0) return "fork failed";
    if (pid == 0) {
      int rc = 1;
      try {
        rc = body(r);
      } catch (...) {
        rc = 9;
      }
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  std::string err = while_running();
  const auto deadline = Clock::now() + limit;
  size_t left = pids.size();
  std::vector<bool> done(pids.size(), false);
  while (left > 0 && Clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        done[i] = true;
        --left;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          err +=
              "rank " + std::to_string(i) + " exited with status " + std::to_string(status) + "; ";
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (done[i]) continue;
    kill(pids[i], SIGKILL);
    waitpid(pids[i], nullptr, 0);
    err += "rank " + std::to_string(i) + " did not finish in time; ";
  }
  return err;
}

// An aggregator stopped while collective `at` is in flight, between a parent and the ranks it
// forked (run_forked): the flags must live in memory the children share (a MAP_SHARED struct).
struct KillDuringCollective {
  std::atomic<int> ready{0};   // ranks waiting before collective `at`
  std::atomic<int> go{0};      // the parent lets them run it
  std::atomic<int> killed{0};  // the aggregator is gone (reaped)

  // In a rank, before its collective `ci`: at `at`, waits until the parent lets the ranks go; at
  // `at` + 1, until the aggregator is gone.
  void before(size_t ci, size_t at) {
    using namespace std::chrono_literals;
    if (ci == at) {
      ready.fetch_add(1);
      while (go.load() == 0) std::this_thread::sleep_for(100us);
    }
    if (ci == at + 1) {
      while (killed.load() == 0) std::this_thread::sleep_for(100us);
    }
  }

  // In the parent: waits up to 60 s for `world` ranks to reach collective `at`, lets them run it,
  // 3 ms later stops the aggregator (`stop()` returns its exit status), marks it gone. Returns ""
  // or what went wrong, naming the aggregator as `who`.
  template <typename Stop>
  std::string kill(int world, size_t at, Stop stop, const std::string& who) {
    using namespace std::chrono_literals;
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (ready.load() < world && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    if (ready.load() < world) {
      return "the ranks never reached collective " + std::to_string(at) + "; ";
    }
    go.store(1);
    std::this_thread::sleep_for(3ms);  // collective `at` is in flight
    const int rc = stop();
    killed.store(1);
    return rc == 0 ? "" : who + " exit status " + std::to_string(rc) + "; ";
  }
};

}  // namespace ina::testing
