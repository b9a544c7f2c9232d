// Host AllReduce: the algorithms the worker falls back to when no aggregator serves the job.
//
//   AllreduceOptions opts;                       // algorithm, pipelining chunk
//   opts.algorithm = select_allreduce(...);      // or pick one (select.h)
//   Status s = allreduce(ctx, send, recv, count, DType::kFloat32, ReduceOp::kSum, opts);
//
// recv may equal send. Any count (0: nothing is sent). All dtypes and ops of protocol/types.h;
// see reduce.h for the arithmetic (16-bit floats are reduced in float32 and rounded per step).
// Every rank gets bitwise identical output. Errors come from the Context and name the peer.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "ina/base/status.h"
#include "ina/protocol/types.h"
#include "worker/host/context.h"

namespace ina::host {

enum class AllreduceAlgorithm {
  kRing,             // allreduce_ring.cc
  kHalvingDoubling,  // allreduce_halving_doubling.cc (Rabenseifner)
  kTree,             // allreduce_tree.cc (double binary tree)
};

std::string_view algorithm_name(AllreduceAlgorithm a);  // "ring", "hd", "tree"
std::optional<AllreduceAlgorithm> parse_algorithm(std::string_view s);

// Up to this many bytes allreduce_halving_doubling runs recursive doubling (log2 P latencies,
// the whole buffer per step) instead of halving-doubling (2 log2 P latencies).
inline constexpr size_t kRecursiveDoublingMaxBytes = 16 << 10;

struct AllreduceOptions {
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kRing;
  size_t chunk_bytes = 256 << 10;  // pipelining granularity of ring and tree
};

Status allreduce(Context& ctx, const void* send, void* recv, size_t count, DType t, ReduceOp op,
                 const AllreduceOptions& opts = {});

Status allreduce_ring(Context& ctx, const void* send, void* recv, size_t count, DType t,
                      ReduceOp op, size_t chunk_bytes);
Status allreduce_halving_doubling(Context& ctx, const void* send, void* recv, size_t count, DType t,
                                  ReduceOp op);
Status allreduce_tree(Context& ctx, const void* send, void* recv, size_t count, DType t,
                      ReduceOp op, size_t chunk_bytes);

}  // namespace ina::host
