// The straggler ranking of one job as text for `ina-ctl job ID`: from the controller's
// /v1/jobs/ID answer (each aggregator's telemetry: "stragglers" by lost time with their causes),
// per aggregator the ranks by lost time, and for a tree the path from the root's worst leaf to
// that leaf's worst rank. Pure: JSON in, text out.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace ina::ctl {

// "" when the answer holds no telemetry. `top`: ranks listed per aggregator (named ones always).
std::string straggler_report(const nlohmann::json& job, size_t top = 4);

}  // namespace ina::ctl
