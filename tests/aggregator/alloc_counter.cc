// Global operator new/delete that count allocations of opted-in threads (see alloc_counter.h).
// In its own translation unit so that the compiler never sees malloc/free paired with new/delete.
#include "alloc_counter.h"

#include <cstdlib>
#include <new>

namespace ina::agg::testing {

std::atomic<size_t> g_counted_allocs{0};
namespace {
thread_local bool t_count_allocs = false;
}  // namespace
void count_allocs(bool on) { t_count_allocs = on; }

}  // namespace ina::agg::testing

void* operator new(std::size_t n) {
  if (ina::agg::testing::t_count_allocs) ++ina::agg::testing::g_counted_allocs;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
// The nothrow forms too (std::stable_sort's temporary buffer uses them): left to the runtime they
// would allocate with its operator new and be freed by the free() above, a mismatch ASan reports,
// and they would not be counted.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (ina::agg::testing::t_count_allocs) ++ina::agg::testing::g_counted_allocs;
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
