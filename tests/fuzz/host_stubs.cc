// The config harness links the worker's parsers (config.cc, host/select.cc, host/allreduce.cc)
// without the host collectives those files also drive; the parsers never call them. These stand
// in for the collectives so the harness links, and abort if that ever changes.
#include <cstdlib>

#include "worker/host/allreduce.h"
#include "worker/host/reduce.h"

namespace ina::host {

void reduce_into(void*, const void*, size_t, DType, ReduceOp) { std::abort(); }
Status allreduce_ring(Context&, const void*, void*, size_t, DType, ReduceOp, size_t) {
  std::abort();
}
Status allreduce_halving_doubling(Context&, const void*, void*, size_t, DType, ReduceOp) {
  std::abort();
}
Status allreduce_tree(Context&, const void*, void*, size_t, DType, ReduceOp, size_t) {
  std::abort();
}

}  // namespace ina::host
