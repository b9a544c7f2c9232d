// Ranks as threads of one process, for the tests whose ranks share one DPDK port (a memif server
// port serves one peer process): the communicators created together, and one AllReduce case run
// on all of them at once, with the protocol model's result to compare with (loopback_support.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "ina/ina.hpp"
#include "tests/integration/loopback_support.h"

namespace ina::testing {

// One Communicator per rank from config(rank), all created at once (the join barrier waits for
// every rank). comms[r] is null when rank r could not join; created[r] says why.
struct ThreadRanks {
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<Status> created;
};

inline ThreadRanks create_thread_ranks(int world, const std::function<Config(int)>& config) {
  ThreadRanks t;
  t.comms.resize(static_cast<size_t>(world));
  t.created.resize(static_cast<size_t>(world));
  std::vector<std::thread> th;
  for (int r = 0; r < world; ++r) {
    th.emplace_back([&, r] {
      const auto i = static_cast<size_t>(r);
      auto res = Communicator::create(config(r));
      if (res.ok()) {
        t.comms[i] = std::move(res.value());
      } else {
        t.created[i] = res.status();
      }
    });
  }
  for (auto& x : th) x.join();
  return t;
}

// One AllReduce of case `c` (inputs: fill_input with `case_index`) on every communicator at
// once, a thread per rank; `want` is model_result with blocks of `block` elements.
struct ThreadCase {
  std::vector<Status> status;
  std::vector<std::vector<uint8_t>> out;
  std::vector<uint8_t> want;
  double ms = 0;  // wall time of the collective over all ranks
};

inline ThreadCase run_thread_case(const std::vector<std::unique_ptr<Communicator>>& comms,
                                  const Case& c, int case_index, uint32_t block) {
  const size_t world = comms.size();
  std::vector<std::vector<uint8_t>> in(world);
  for (size_t r = 0; r < world; ++r) fill_input(in[r], c, static_cast<int>(r), case_index);
  ThreadCase tc;
  tc.want = model_result(in, c, block);
  tc.out.resize(world);
  tc.status.resize(world);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> th;
  for (size_t r = 0; r < world; ++r) {
    th.emplace_back([&, r] {
      tc.out[r].resize(in[r].size());
      tc.status[r] = comms[r]->allreduce(in[r].data(), tc.out[r].data(), c.count, c.dtype, c.op);
    });
  }
  for (auto& x : th) x.join();
  tc.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return tc;
}

}  // namespace ina::testing
