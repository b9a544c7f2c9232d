// The sharding rule of a job spread over K aggregators (pure logic, no I/O): which contiguous
// range of a collective's blocks goes to which aggregator. Every rank computes the same split.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ina::worker {

// Blocks [first, end) of a collective.
struct BlockRange {
  uint64_t first = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - first; }
  bool empty() const { return end == first; }
};

// Range k of a collective of n blocks over `shards` aggregators: blocks
// [floor(k n / K), floor((k + 1) n / K)). The ranges of k = 0 .. K-1 are contiguous, cover every
// block once, differ in size by at most one, and are empty for some k when n < K.
// Precondition: shards >= 1, k < shards.
inline BlockRange shard_range(uint64_t n, size_t k, size_t shards) {
  using U = unsigned __int128;  // k * n does not overflow for any n
  return BlockRange{static_cast<uint64_t>(U{k} * n / shards),
                    static_cast<uint64_t>(U{k + 1} * n / shards)};
}

}  // namespace ina::worker
