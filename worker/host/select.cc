#include "worker/host/select.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "worker/host/common.h"
#include "worker/host/reduce.h"

namespace ina::host {

double CostModel::cost(AllreduceAlgorithm a, size_t bytes, int world) const {
  if (world <= 1) return 0;
  const double n = static_cast<double>(bytes);
  const double p = world;
  int log2_p2 = 0;
  while ((2 << log2_p2) <= world) ++log2_p2;
  const double p2 = std::ldexp(1.0, log2_p2);
  const double ceil_log2_p = std::ceil(std::log2(p));
  switch (a) {
    case AllreduceAlgorithm::kRing:
      return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * n * beta_s_per_byte;
    case AllreduceAlgorithm::kHalvingDoubling: {
      double c = bytes <= kRecursiveDoublingMaxBytes
                     ? log2_p2 * (alpha_s + n * beta_s_per_byte + n * gamma_s_per_byte)
                     : 2 * log2_p2 * alpha_s + 2 * (p2 - 1) / p2 * n * beta_s_per_byte +
                           (p2 - 1) / p2 * n * gamma_s_per_byte;
      if (p2 != p) c += 2 * alpha_s + 2 * n * beta_s_per_byte + n * gamma_s_per_byte;
      return c;
    }
    case AllreduceAlgorithm::kTree:
      return 2 * ceil_log2_p * alpha_s + 2 * n * beta_s_per_byte + n * gamma_s_per_byte;
  }
  return 0;
}

Result<CostModel> parse_cost_model(std::string_view text, std::string_view name,
                                   const CostModel& defaults) {
  auto bad = [&] {
    return invalid_argument(
        std::string(name) + "=\"" + std::string(text) +
        "\" is not valid: expected alpha_us,beta_ns_per_byte[,gamma_ns_per_byte]"
        " (decimal numbers, alpha > 0, beta and gamma >= 0; e.g. 25,0.5)");
  };
  double v[3] = {0, 0, defaults.gamma_s_per_byte * 1e9};
  int n = 0;
  size_t pos = 0;
  for (;;) {
    if (n == 3) return bad();
    const size_t comma = text.find(',', pos);
    const std::string_view field =
        text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    if (field.empty()) return bad();
    auto [ptr, ec] =
        std::from_chars(field.data(), field.data() + field.size(), v[n], std::chars_format::fixed);
    if (ec != std::errc() || ptr != field.data() + field.size() || !std::isfinite(v[n]) || v[n] < 0)
      return bad();
    ++n;
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  if (n < 2 || v[0] <= 0) return bad();
  CostModel m;
  m.alpha_s = v[0] * 1e-6;
  m.beta_s_per_byte = v[1] * 1e-9;
  m.gamma_s_per_byte = v[2] * 1e-9;
  return m;
}

Result<AllreduceAlgorithm> select_allreduce(const CostModel& model, size_t bytes, int world,
                                            std::string_view override_name) {
  if (!override_name.empty()) {
    auto a = parse_algorithm(override_name);
    if (!a)
      return invalid_argument("INA_ALGO: '" + std::string(override_name) +
                              "' is not one of ring, hd, tree");
    return *a;
  }
  AllreduceAlgorithm best = AllreduceAlgorithm::kRing;
  double best_cost = model.cost(best, bytes, world);
  for (AllreduceAlgorithm a : {AllreduceAlgorithm::kHalvingDoubling, AllreduceAlgorithm::kTree}) {
    const double c = model.cost(a, bytes, world);
    if (c < best_cost) {
      best = a;
      best_cost = c;
    }
  }
  return best;
}

namespace {

using SteadyClock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of one ring step of `bytes` (send right, receive left).
Result<double> time_ring_step(Context& ctx, size_t bytes, int reps) {
  std::vector<uint8_t> out(bytes + 1, 1), in(bytes + 1);
  const int right = mod(ctx.rank() + 1, ctx.size());
  const int left = mod(ctx.rank() - 1, ctx.size());
  std::vector<double> t;
  INA_RETURN_IF_ERROR(ctx.sendrecv(right, out.data(), bytes, left, in.data(), bytes));  // warm-up
  for (int i = 0; i < reps; ++i) {
    const auto start = SteadyClock::now();
    INA_RETURN_IF_ERROR(ctx.sendrecv(right, out.data(), bytes, left, in.data(), bytes));
    t.push_back(std::chrono::duration<double>(SteadyClock::now() - start).count());
  }
  return median(std::move(t));
}

}  // namespace

Result<CostModel> measure_cost_model(Context& ctx, const CostModel& defaults) {
  if (ctx.size() == 1) return defaults;
  constexpr size_t kBig = 256 << 10;
  INA_ASSIGN_OR_RETURN(double small, time_ring_step(ctx, 8, 21));
  INA_ASSIGN_OR_RETURN(double big, time_ring_step(ctx, kBig, 5));
  std::vector<float> acc(kBig / 4, 1.0f), in(kBig / 4, 2.0f);
  std::vector<double> g;
  for (int i = 0; i < 5; ++i) {
    const auto start = SteadyClock::now();
    reduce_into(acc.data(), in.data(), acc.size(), DType::kFloat32, ReduceOp::kSum);
    g.push_back(std::chrono::duration<double>(SteadyClock::now() - start).count());
  }
  // Agree on the slowest rank's figures (float MAX is exact, so every rank gets the same bits).
  float v[3] = {static_cast<float>(small), static_cast<float>(std::max(big - small, 1e-9) / kBig),
                static_cast<float>(std::max(median(std::move(g)), 1e-9) / kBig)};
  INA_RETURN_IF_ERROR(allreduce_ring(ctx, v, v, 3, DType::kFloat32, ReduceOp::kMax, 1 << 16));
  CostModel m;
  m.alpha_s = v[0];
  m.beta_s_per_byte = v[1];
  m.gamma_s_per_byte = v[2];
  return m;
}

}  // namespace ina::host
