// Counts heap allocations made by threads that opted in, so tests can assert that the packet
// path never allocates. alloc_counter.cc replaces the global operator new/delete of the test
// binary it is linked into.
#pragma once

#include <atomic>
#include <cstddef>

namespace ina::agg::testing {

extern std::atomic<size_t> g_counted_allocs;
extern thread_local bool t_count_allocs;

// Counts this thread's allocations while alive.
class CountAllocs {
 public:
  CountAllocs() { t_count_allocs = true; }
  ~CountAllocs() { t_count_allocs = false; }
  CountAllocs(const CountAllocs&) = delete;
  CountAllocs& operator=(const CountAllocs&) = delete;
};

}  // namespace ina::agg::testing
