// The time now as the log lines' stamp ("2026-12-01T20:01:02.345Z"), for the lines
// ina-aggregator prints on stdout (its start lines), so that every line it writes has one.
#pragma once

#include <ctime>

#include "ina/base/log.h"

namespace ina::agg {

inline void format_now(char (&out)[log::kTimestampLen + 1]) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  log::format_timestamp(static_cast<long long>(now.tv_sec) * 1000 + now.tv_nsec / 1000000, out);
}

}  // namespace ina::agg
