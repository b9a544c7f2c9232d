// Counts heap allocations made by threads that opted in, so tests can assert that the packet
// path never allocates. alloc_counter.cc replaces the global operator new/delete of the test
// binary it is linked into.
#pragma once

#include <atomic>
#include <cstddef>

namespace ina::agg::testing {

extern std::atomic<size_t> g_counted_allocs;
// Whether this thread's allocations count. A function, not an extern thread_local: gcc 12's
// UBSan reported the store through the latter's TLS wrapper as a store to null.
void count_allocs(bool on);

// Counts this thread's allocations while alive.
class CountAllocs {
 public:
  CountAllocs() { count_allocs(true); }
  ~CountAllocs() { count_allocs(false); }
  CountAllocs(const CountAllocs&) = delete;
  CountAllocs& operator=(const CountAllocs&) = delete;
};

}  // namespace ina::agg::testing
