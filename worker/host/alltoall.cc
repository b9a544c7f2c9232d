// AllToAll(v): argument checks, the algorithm dispatch and the algorithms' cost model
// (alltoall.h). The algorithms live one per file: alltoall_pairwise.cc, alltoall_bruck.cc,
// alltoall_hierarchical.cc.
#include "worker/host/alltoall.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "worker/host/common.h"

namespace ina::host {

namespace {

// What each further message of a pairwise window costs, in latencies: a send and a receive
// system call (strace: exactly one sendmsg and one recvmsg per message), and a wake-up whenever
// the receive finds nothing yet (the messages of a window arrive spread out). On loopback alpha
// (measure_cost_model's ring step) is itself a send, a receive and a wake-up, so a further
// message costs about one alpha: with 0.6 the model kept pairwise for 1 KiB blocks at 4 and 8
// ranks, where Bruck measured 1.3-1.5x faster (ina-a2a-algo-bench, calls interleaved, 2-core
// VM). On a real network alpha also holds the wire's latency, which a window shares, so this
// overstates pairwise's cost there a little: Bruck remains bounded by kBruckMaxStepBytes.
constexpr double kFurtherMessageAlpha = 1.0;

double pairwise_cost(const CostModel& m, size_t b, int p, size_t window_bytes) {
  if (p <= 1) return 0;
  const double peers = p - 1;
  const double per_round = 2.0 * static_cast<double>(b);
  const double w =
      std::clamp(per_round > 0 ? std::floor(static_cast<double>(window_bytes) / per_round) : peers,
                 static_cast<double>(kAlltoallMinRounds), peers);
  const double windows = std::ceil(peers / w);
  return m.alpha_s * windows + (peers - windows) * m.alpha_s * kFurtherMessageAlpha +
         peers * static_cast<double>(b) * m.beta_s_per_byte;
}

}  // namespace

double alltoall_cost(const CostModel& m, AlltoallAlgorithm a, size_t block_bytes, int world,
                     int group_size) {
  if (world <= 1) return 0;
  const double b = static_cast<double>(block_bytes);
  const double p = world;
  switch (a) {
    case AlltoallAlgorithm::kPairwise:
      return pairwise_cost(m, block_bytes, world, kAlltoallWindowBytes);
    case AlltoallAlgorithm::kBruck:
      if (static_cast<size_t>(world / 2) * block_bytes > kBruckMaxStepBytes)
        return std::numeric_limits<double>::infinity();
      return std::ceil(std::log2(p)) *
                 (m.alpha_s +
                  std::floor(p / 2) * b * (m.beta_s_per_byte + 2 * m.gamma_s_per_byte)) +
             p * b * m.gamma_s_per_byte;
    case AlltoallAlgorithm::kHierarchical: {
      if (!alltoall_groups(world, group_size) || block_bytes > kHierarchicalMaxBlockBytes)
        return std::numeric_limits<double>::infinity();
      const int nodes = world / group_size;
      return pairwise_cost(m, block_bytes * static_cast<size_t>(nodes), group_size,
                           kAlltoallWindowBytes) +
             pairwise_cost(m, block_bytes * static_cast<size_t>(group_size), nodes,
                           kAlltoallWindowBytes) +
             2 * p * b * m.gamma_s_per_byte;
    }
  }
  return std::numeric_limits<double>::infinity();
}

Result<AlltoallAlgorithm> select_alltoall(const CostModel& m, size_t block_bytes, int world,
                                          int group_size, std::string_view override_name) {
  if (!override_name.empty()) {
    auto a = parse_alltoall_algorithm(override_name);
    if (!a)
      return invalid_argument("INA_A2A_ALGO: '" + std::string(override_name) +
                              "' is not one of pairwise, bruck, hier");
    return *a;
  }
  AlltoallAlgorithm best = AlltoallAlgorithm::kPairwise;
  double best_cost = alltoall_cost(m, best, block_bytes, world, group_size);
  for (AlltoallAlgorithm a : {AlltoallAlgorithm::kBruck, AlltoallAlgorithm::kHierarchical}) {
    const double c = alltoall_cost(m, a, block_bytes, world, group_size);
    if (c < best_cost) {
      best = a;
      best_cost = c;
    }
  }
  return best;
}

Status alltoall(Context& ctx, const void* send, void* recv, size_t count, DType t,
                const AlltoallOptions& opts) {
  if (!is_valid_dtype(static_cast<uint8_t>(t))) return invalid_argument("alltoall: bad dtype");
  INA_RETURN_IF_ERROR(check_buffers("alltoall", send, recv, count));
  if (count == 0) return ok_status();
  const auto* s = static_cast<const uint8_t*>(send);
  auto* r = static_cast<uint8_t*>(recv);
  const size_t b = count * dtype_size(t);
  const size_t solo = opts.solo_round_bytes > 0 ? opts.solo_round_bytes : kAlltoallSoloRoundBytes;
  switch (opts.algorithm) {
    case AlltoallAlgorithm::kPairwise:
      return alltoall_pairwise(ctx, s, r, b, opts.window_bytes, solo);
    case AlltoallAlgorithm::kBruck: return alltoall_bruck(ctx, s, r, b);
    case AlltoallAlgorithm::kHierarchical:
      return alltoall_hierarchical(ctx, s, r, b, opts.group_size, opts.window_bytes, solo);
  }
  return invalid_argument("alltoall: bad algorithm");
}

Status alltoallv(Context& ctx, const void* send, std::span<const size_t> send_counts,
                 std::span<const size_t> send_displs, void* recv,
                 std::span<const size_t> recv_counts, std::span<const size_t> recv_displs, DType t,
                 const AlltoallOptions& opts) {
  if (!is_valid_dtype(static_cast<uint8_t>(t))) return invalid_argument("alltoallv: bad dtype");
  const size_t p = static_cast<size_t>(ctx.size());
  if (send_counts.size() != p || send_displs.size() != p || recv_counts.size() != p ||
      recv_displs.size() != p)
    return invalid_argument("alltoallv: counts and displacements need world size entries");
  size_t sent = 0, received = 0;
  for (size_t i = 0; i < p; ++i) {
    sent += send_counts[i];
    received += recv_counts[i];
  }
  if ((sent > 0 && send == nullptr) || (received > 0 && recv == nullptr))
    return invalid_argument("alltoallv: null buffer");
  return alltoallv_pairwise(ctx, static_cast<const uint8_t*>(send), send_counts, send_displs,
                            static_cast<uint8_t*>(recv), recv_counts, recv_displs, dtype_size(t),
                            opts.window_bytes,
                            opts.solo_round_bytes > 0 ? opts.solo_round_bytes : SIZE_MAX);
}

}  // namespace ina::host
