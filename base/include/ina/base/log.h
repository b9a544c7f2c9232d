// Leveled logging to stderr, gated before any formatting (NCCL's debug.h habit).
// The level comes from INA_LOG_LEVEL (error, warn, info, debug; default info), read once.
// Never call these in a per-packet loop.
#pragma once

#include <cstdarg>
#include <cstddef>

namespace ina::log {

enum class Level : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

Level level();            // current level
void set_level(Level l);  // overrides the environment (tools' --verbose)
bool parse_level(const char* s, Level* out);

// printf-style; prefixes "<UTC time> [ina <level> <component>] ", the time as ISO 8601 with
// milliseconds ("2026-12-01T20:01:02.345Z "). Thread-safe (one write(2) per line).
void write(Level l, const char* component, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

// The log lines' time stamp of `unix_ms` (milliseconds since 1970-01-01 UTC), e.g.
// "2026-12-01T20:01:02.345Z": 24 characters and a NUL in `out`. Returns the length (24).
constexpr size_t kTimestampLen = 24;
size_t format_timestamp(long long unix_ms, char (&out)[kTimestampLen + 1]);

}  // namespace ina::log

#define INA_LOG(lvl, component, ...)                                                       \
  do {                                                                                     \
    if (static_cast<int>(::ina::log::Level::lvl) <= static_cast<int>(::ina::log::level())) \
      ::ina::log::write(::ina::log::Level::lvl, component, __VA_ARGS__);                   \
  } while (0)
#define INA_ERROR(component, ...) INA_LOG(kError, component, __VA_ARGS__)
#define INA_WARN(component, ...) INA_LOG(kWarn, component, __VA_ARGS__)
#define INA_INFO(component, ...) INA_LOG(kInfo, component, __VA_ARGS__)
#define INA_DEBUG(component, ...) INA_LOG(kDebug, component, __VA_ARGS__)
