#include "ina/protocol/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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
      std::fprintf(stderr, "[ina warn log] INA_LOG_LEVEL=%s is not one of error, warn, info, debug; using info\n", env);
    }
    v = static_cast<int>(l);
    g_level.store(v, std::memory_order_relaxed);
  }
  return static_cast<Level>(v);
}

void set_level(Level l) { g_level.store(static_cast<int>(l), std::memory_order_relaxed); }

void write(Level l, const char* component, const char* fmt, ...) {
  char buf[1024];
  int n = std::snprintf(buf, sizeof buf, "[ina %s %s] ", level_name(l), component);
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
