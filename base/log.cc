#include "ina/base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace ina::log {
namespace {

constexpr int kUnset = -1;
std::atomic<int> g_level{kUnset};

const char* level_name(Level l) {
  switch (l) {
    case Level::kError: return "error";
    case Level::kWarn: return "warn";
    case Level::kInfo: return "info";
    case Level::kDebug: return "debug";
  }
  return "?";
}

}  // namespace

bool parse_level(const char* s, Level* out) {
  if (s == nullptr) return false;
  for (Level l : {Level::kError, Level::kWarn, Level::kInfo, Level::kDebug}) {
    if (std::strcmp(s, level_name(l)) == 0) {
      *out = l;
      return true;
    }
  }
  return false;
}

Level level() {
  int v = g_level.load(std::memory_order_relaxed);
  if (v == kUnset) {
    Level l = Level::kInfo;
    const char* env = std::getenv("INA_LOG_LEVEL");
    if (env != nullptr && !parse_level(env, &l)) {
      write(Level::kWarn, "log",
            "INA_LOG_LEVEL=%s is not one of error, warn, info, debug; using info", env);
    }
    v = static_cast<int>(l);
    g_level.store(v, std::memory_order_relaxed);
  }
  return static_cast<Level>(v);
}

size_t format_timestamp(long long unix_ms, char (&out)[kTimestampLen + 1]) {
  long long secs = unix_ms / 1000;
  long long ms = unix_ms % 1000;
  if (ms < 0) {
    ms += 1000;
    --secs;
  }
  const time_t t = static_cast<time_t>(secs);
  struct tm tm {};
  gmtime_r(&t, &tm);
  const int n = std::snprintf(out, sizeof out, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
                              tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                              tm.tm_sec, static_cast<int>(ms));
  return n < 0 ? 0 : static_cast<size_t>(n) < sizeof out ? static_cast<size_t>(n) : sizeof out - 1;
}

void set_level(Level l) { g_level.store(static_cast<int>(l), std::memory_order_relaxed); }

void write(Level l, const char* component, const char* fmt, ...) {
  char buf[1024];
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  char stamp[kTimestampLen + 1];
  format_timestamp(static_cast<long long>(now.tv_sec) * 1000 + now.tv_nsec / 1000000, stamp);
  int n = std::snprintf(buf, sizeof buf, "%s [ina %s %s] ", stamp, level_name(l), component);
  if (n < 0) return;
  va_list ap;
  va_start(ap, fmt);
  int m = std::vsnprintf(buf + n, sizeof buf - static_cast<size_t>(n), fmt, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m > 0 ? static_cast<size_t>(m) : 0);
  if (len > sizeof buf - 2) len = sizeof buf - 2;
  buf[len++] = '\n';
  ssize_t rc = ::write(STDERR_FILENO, buf, len);
  (void)rc;
}

}  // namespace ina::log
