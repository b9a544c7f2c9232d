// AllToAll and AllToAllv: every rank sends a distinct block to every rank (MoE expert
// parallelism's dispatch and combine).
//
//   AlltoallOptions opts;                              // algorithm, node group size
//   opts.algorithm = *select_alltoall(model, block_bytes, world, group, "");  // or pick one
//   Status s = alltoall(ctx, send, recv, count, DType::kFloat32, opts);
//
// Algorithms (one file each, the block comment on top explains it):
//   pairwise      alltoall_pairwise.cc: P-1 exchanges, a byte-bounded window of them in flight
//                 (bandwidth-optimal: every byte crosses the network once)
//   bruck         alltoall_bruck.cc: ceil(log2 P) exchanges of about half the buffer each
//                 (latency-optimal for small blocks; moves each byte up to log2 P times)
//   hierarchical  alltoall_hierarchical.cc: node then global; (G-1) + (P/G-1) exchanges for
//                 nodes of G consecutive ranks (every byte crosses a node's links twice)
// AllToAllv always runs the pairwise schedule (sizes differ per peer; zero-size pairs send
// nothing), which keeps every link busy under skew (alltoall_pairwise.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "ina/base/status.h"
#include "ina/protocol/types.h"
#include "worker/host/context.h"
#include "worker/host/select.h"

namespace ina::host {

enum class AlltoallAlgorithm {
  kPairwise,      // alltoall_pairwise.cc
  kBruck,         // alltoall_bruck.cc
  kHierarchical,  // alltoall_hierarchical.cc
};

// Whether nodes of `group_size` consecutive ranks divide a world of `world` ranks into more than
// one node of more than one rank: the hierarchical exchange's condition (else it runs pairwise).
inline bool alltoall_groups(int world, int group_size) {
  return group_size > 1 && group_size < world && world % group_size == 0;
}

// Inline: the configuration's parser uses them without the algorithms (the config fuzz harness
// links config.cc alone).
inline std::string_view alltoall_algorithm_name(AlltoallAlgorithm a) {
  switch (a) {
    case AlltoallAlgorithm::kPairwise: return "pairwise";
    case AlltoallAlgorithm::kBruck: return "bruck";
    case AlltoallAlgorithm::kHierarchical: return "hier";
  }
  return "unknown";
}
inline std::optional<AlltoallAlgorithm> parse_alltoall_algorithm(std::string_view s) {
  if (s == "pairwise") return AlltoallAlgorithm::kPairwise;
  if (s == "bruck") return AlltoallAlgorithm::kBruck;
  if (s == "hier" || s == "hierarchical") return AlltoallAlgorithm::kHierarchical;
  return std::nullopt;
}

// Bytes the pairwise schedule keeps posted at once (sends plus receives, at least
// kAlltoallMinRounds rounds whatever their size): enough to keep a link busy while the next round
// is posted, little enough that the kernel's socket buffers, not the rank's memory, hold the data.
inline constexpr size_t kAlltoallWindowBytes = 8 << 20;
// Bruck is considered only while one step's message (floor(P/2) blocks) stays under this: beyond
// it the log2 P-fold bytes and the copies cost more than the latencies saved (measured on
// loopback with ina-a2a-algo-bench, calls interleaved: Bruck 1.3-1.5x faster than pairwise at
// 2-4 KiB steps; at 8 KiB steps (4 ranks) 1.5x slower in one run, 1.14x faster in another; at
// 16 KiB steps (8 ranks) even to 1.25x slower), and a latency measured under load (alpha
// inflated, beta not) would otherwise push the model towards it for large blocks, as AllReduce's
// recursive doubling is bounded by kRecursiveDoublingMaxBytes.
inline constexpr size_t kBruckMaxStepBytes = 4 << 10;
// The cost model considers the hierarchical exchange only for blocks up to this. Its formula is
// optimistic at middle sizes (each byte crosses links twice and is packed twice, costs that a
// loaded host's measured beta understates): with nodes of 4 at 8 ranks on loopback it won at
// 256 B - 4 KiB blocks (1.1-1.9x) and lost 1.8x at 16 KiB (ina-a2a-algo-bench --group 4), where
// its model chose it. inasim.py puts its gain at 1,024 ranks at 1.2x by 8 KiB blocks and none
// from 32 KiB, so the bound gives up little where the exchange is meant for.
inline constexpr size_t kHierarchicalMaxBlockBytes = 4 << 10;
inline constexpr int kAlltoallMinRounds = 4;
// AllToAll: a round that moves more than this (its send plus its receive) is posted only once
// every round before it has retired. Large blocks then move one round at a time: the receiver
// copies out of its socket bytes that the sender copied in shortly before, instead of megabytes
// queued behind other rounds, and a receiver's link carries fewer senders at once. Over loopback
// TCP both INA and Open MPI spend a call's CPU in those two copies per byte, about equally; on a
// 2-core VM, alternated with four rounds in flight, the ranks' CPU per call was 0.89-0.98x at
// 2-32 MiB per rank with 4 and 8 ranks, INA/MPI medians 0.68-0.96 at 8-32 MiB, rounds of 32 KiB
// or less unchanged; on 1 Gbit/s shaped links (8 ranks) 2 and 8 MiB per rank took 0.28x and
// 0.37x the time (testbed/results/alltoall-large-20261206/). Bounds of 16-128 KiB saved nothing
// more; small rounds stay together (posted one by one they would pay a latency each). AllToAllv
// has no bound by default: under Zipf(1.2) loads on the shaped links the bound took 1.3-1.9x the
// time (the hot expert reading one sender at a time, likely, where the window's rule feeds its
// link from several at once), while on loopback it changed AllToAllv's CPU per call 0.91-1.03x.
inline constexpr size_t kAlltoallSoloRoundBytes = 256 << 10;

struct AlltoallOptions {
  AlltoallAlgorithm algorithm = AlltoallAlgorithm::kPairwise;
  // Hierarchical: ranks per node, the node being consecutive ranks [n G, (n+1) G). It must divide
  // the world size; 0 or 1 (or the world size) leaves nothing to group: the flat pairwise runs.
  int group_size = 0;
  size_t window_bytes = kAlltoallWindowBytes;  // pairwise
  // Pairwise: rounds of more than this go alone; 0: kAlltoallSoloRoundBytes for AllToAll, no
  // bound for AllToAllv (under skew the window keeps the hot expert's link fed, see above).
  size_t solo_round_bytes = 0;
};

// send and recv hold size() blocks of `count` elements: block j of send goes to rank j, and
// block i of recv comes from rank i. send and recv must not overlap.
Status alltoall(Context& ctx, const void* send, void* recv, size_t count, DType t,
                const AlltoallOptions& opts = {});

// Per-peer counts and displacements, in elements: rank j gets send_counts[j] elements from
// send + send_displs[j]; rank i's contribution lands at recv + recv_displs[i] and must be
// recv_counts[i] elements (as rank i's send_counts[this rank]; a mismatch of two non-zero counts
// is an error naming rank i). Zero counts are allowed and send nothing at all, so both sides of a
// pair must agree that it is empty (as MPI_Alltoallv requires: a rank that sends to a peer
// expecting nothing leaves a stray message on the connection, which the pair's next message
// reports as a size mismatch). All four spans have size() entries.
Status alltoallv(Context& ctx, const void* send, std::span<const size_t> send_counts,
                 std::span<const size_t> send_displs, void* recv,
                 std::span<const size_t> recv_counts, std::span<const size_t> recv_displs, DType t,
                 const AlltoallOptions& opts = {});

// The algorithms themselves, in bytes (blocks of block_bytes; arguments checked by alltoall()).
Status alltoall_pairwise(Context& ctx, const uint8_t* send, uint8_t* recv, size_t block_bytes,
                         size_t window_bytes, size_t solo_round_bytes = kAlltoallSoloRoundBytes);
Status alltoall_bruck(Context& ctx, const uint8_t* send, uint8_t* recv, size_t block_bytes);
Status alltoall_hierarchical(Context& ctx, const uint8_t* send, uint8_t* recv, size_t block_bytes,
                             int group_size, size_t window_bytes,
                             size_t solo_round_bytes = kAlltoallSoloRoundBytes);
Status alltoallv_pairwise(Context& ctx, const uint8_t* send, std::span<const size_t> send_counts,
                          std::span<const size_t> send_displs, uint8_t* recv,
                          std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                          size_t elem_bytes, size_t window_bytes,
                          size_t solo_round_bytes = SIZE_MAX);

// The cost model of the AllToAll algorithms (select.h's alpha, beta and gamma; gamma stands for
// the time per byte of a memory copy, the same order as a reduction's), for blocks of `b` bytes
// over P ranks, W = the pairwise window in rounds, G the node size (M = P/G nodes):
//   pairwise      alpha R + (P-1-R) alpha + (P-1) b beta, R = ceil((P-1)/W) windows
//                 (a window of rounds shares one latency; each further message in it still
//                 costs a send and a receive system call and often a wake-up: about one
//                 measured alpha on loopback, kFurtherMessageAlpha in alltoall.cc)
//   bruck         ceil(log2 P) (alpha + floor(P/2) b (beta + 2 gamma)) + P b gamma
//                 (each step packs and unpacks about half the blocks; the rotations copy all);
//                 infinite when floor(P/2) b > kBruckMaxStepBytes
//   hierarchical  pairwise(G ranks, blocks of M b) + pairwise(M ranks, blocks of G b)
//                 + 2 P b gamma (packing before each level); infinite when
//                 b > kHierarchicalMaxBlockBytes
// Inapplicable algorithms cost infinity (hierarchical without a group that divides P).
double alltoall_cost(const CostModel& m, AlltoallAlgorithm a, size_t block_bytes, int world,
                     int group_size);

// The cheapest algorithm for blocks of `block_bytes`; `override_name` ("pairwise", "bruck",
// "hier"; empty: none) wins. An unknown override is a kInvalidArgument naming INA_A2A_ALGO; an
// override of "hier" with no usable group runs pairwise (alltoall() does the same).
Result<AlltoallAlgorithm> select_alltoall(const CostModel& m, size_t block_bytes, int world,
                                          int group_size, std::string_view override_name);

}  // namespace ina::host
