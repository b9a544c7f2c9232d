#include "worker/host/allreduce.h"

#include "worker/host/common.h"

namespace ina::host {

std::string_view algorithm_name(AllreduceAlgorithm a) {
  switch (a) {
    case AllreduceAlgorithm::kRing: return "ring";
    case AllreduceAlgorithm::kHalvingDoubling: return "hd";
    case AllreduceAlgorithm::kTree: return "tree";
  }
  return "unknown";
}

std::optional<AllreduceAlgorithm> parse_algorithm(std::string_view s) {
  if (s == "ring") return AllreduceAlgorithm::kRing;
  if (s == "hd" || s == "halving-doubling" || s == "rabenseifner")
    return AllreduceAlgorithm::kHalvingDoubling;
  if (s == "tree" || s == "dbtree") return AllreduceAlgorithm::kTree;
  return std::nullopt;
}

Status allreduce(Context& ctx, const void* send, void* recv, size_t count, DType t, ReduceOp op,
                 const AllreduceOptions& opts) {
  switch (opts.algorithm) {
    case AllreduceAlgorithm::kRing:
      return allreduce_ring(ctx, send, recv, count, t, op, opts.chunk_bytes);
    case AllreduceAlgorithm::kHalvingDoubling:
      return allreduce_halving_doubling(ctx, send, recv, count, t, op);
    case AllreduceAlgorithm::kTree:
      return allreduce_tree(ctx, send, recv, count, t, op, opts.chunk_bytes);
  }
  return invalid_argument("allreduce: bad algorithm");
}

}  // namespace ina::host
