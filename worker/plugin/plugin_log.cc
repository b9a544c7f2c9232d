// ina::log for the plugins: level() and write() are libina's, reached through the PluginHost
// given at attach, so a plugin has no log level of its own (INA_LOG_LEVEL is read once, by
// libina, and log::set_level there applies to plugin messages). Linked into every plugin instead
// of protocol/log.cc. Before attach (never in libina's use) messages of level warn and above go
// to stderr as they are.
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>

#include "ina/base/log.h"
#include "worker/plugin/plugin_side.h"

namespace ina::worker::plugin {
namespace {
std::atomic<const PluginHost*> g_host{nullptr};
}  // namespace

void attach_host(const PluginHost* host) {
  if (host != nullptr && host->size >= sizeof(PluginHost))
    g_host.store(host, std::memory_order_release);
}

}  // namespace ina::worker::plugin

namespace ina::log {

using worker::plugin::g_host;

Level level() {
  const worker::plugin::PluginHost* h = g_host.load(std::memory_order_acquire);
  return h != nullptr ? h->log_level() : Level::kWarn;
}

// set_level and parse_level are left out on purpose: plugin code that called them would pull
// protocol/log.cc (a second level) into the plugin, and the link fails on level() and write()
// defined twice instead.

void write(Level l, const char* component, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  const worker::plugin::PluginHost* h = g_host.load(std::memory_order_acquire);
  if (h != nullptr) {
    h->log_write(l, component, "%s", buf);
  } else {
    std::fprintf(stderr, "[ina %s] %s\n", component, buf);
  }
}

}  // namespace ina::log
