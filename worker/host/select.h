// Choosing the AllReduce algorithm with an alpha-beta(-gamma) cost model (Hockney's model, as in
// Thakur et al. 2005 and NCCL's tuning tables).
//
// For n bytes over P ranks, alpha the latency of one message, beta the transfer time per byte
// and gamma the reduction time per byte, with P2 the largest power of two <= P:
//   ring  2(P-1) alpha + 2 (P-1)/P n beta
//         (the pipelined ring hides its reductions behind the transfers)
//   hd    2 log2(P2) alpha + 2 (P2-1)/P2 n beta + (P2-1)/P2 n gamma
//         + [P != P2] (2 alpha + 2 n beta + n gamma)   (the pairwise fold and unfold);
//         up to kRecursiveDoublingMaxBytes it runs recursive doubling instead:
//         log2(P2) (alpha + n beta + n gamma) + the same fold term
//   tree  2 ceil(log2 P) alpha + 2 n beta + n gamma
//         (the double binary tree: log-depth latency for any P, each rank moves the buffer up
//         and down once and reduces two children's halves)
// Small buffers pick hd (recursive doubling, log2 P steps); large buffers pick ring.
// Ties go to ring, then hd. INA_ALGO=ring|hd|tree overrides the model.
//
// Where alpha, beta and gamma come from: the Communicator measures them when its mesh comes up
// (measure_cost_model: a short ring exchange of 8 B and 256 KiB, the slowest rank's figures
// agreed by every rank), unless INA_COST_MODEL gives them (parse_cost_model). Either way all
// ranks hold the same figures and so pick the same algorithm for the same size.
#pragma once

#include <cstddef>
#include <string_view>

#include "ina/base/status.h"
#include "worker/host/allreduce.h"
#include "worker/host/context.h"

namespace ina::host {

struct CostModel {
  double alpha_s = 20e-6;               // per message: loopback/TCP latency of a small message
  double beta_s_per_byte = 1.0 / 2e9;   // 2 GB/s per link
  double gamma_s_per_byte = 1.0 / 8e9;  // reduction throughput of one core

  // Predicted time of `a` for `bytes` over `world` ranks.
  double cost(AllreduceAlgorithm a, size_t bytes, int world) const;
};

// Parses "alpha_us,beta_ns_per_byte[,gamma_ns_per_byte]" (INA_COST_MODEL), e.g. "25,0.5" or
// "25,0.5,0.12": alpha in microseconds per message, beta and gamma in nanoseconds per byte; plain
// decimal numbers, alpha > 0, beta and gamma >= 0, nothing else in the text. gamma, when left
// out, is `defaults`' gamma. An error is a kInvalidArgument naming `name` and the expected form.
Result<CostModel> parse_cost_model(std::string_view text, std::string_view name = "INA_COST_MODEL",
                                   const CostModel& defaults = {});

// The cheapest algorithm under `model`; `override_name` ("ring", "hd", "tree"; empty: none) wins.
// An unknown override is a kInvalidArgument naming INA_ALGO.
Result<AllreduceAlgorithm> select_allreduce(const CostModel& model, size_t bytes, int world,
                                            std::string_view override_name);

// Measures the model on the job's own links (a collective: every rank calls it). alpha: the
// time of one ring step (send to r+1 while receiving from r-1) of 8 bytes; beta: the extra time
// per byte of a 256 KiB step; gamma: this rank's time to reduce 256 KiB of float32. Each is the
// median of a few repetitions, and then the maximum over ranks (an AllReduce MAX), so that every
// rank holds the same model and therefore selects the same algorithm, which the collectives
// require. A world of one returns `defaults`.
Result<CostModel> measure_cost_model(Context& ctx, const CostModel& defaults = {});

}  // namespace ina::host
