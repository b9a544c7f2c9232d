// bypass_endpoint_from_env: the environment of the kernel-bypass transports (bypass_endpoint.h).
#include "worker/bypass_endpoint.h"

#include <charconv>
#include <cstdlib>
#include <string>

namespace ina::worker {

Status env_error(const char* name, std::string_view value, std::string_view form) {
  return invalid_argument("invalid " + std::string(name) + "=\"" + std::string(value) +
                          "\": expected " + std::string(form));
}

const char* nonempty_env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

Result<BypassEndpoint> bypass_endpoint_from_env(const Config& cfg, std::string_view transport,
                                                std::string_view local_ip_hint) {
  const std::string which = "INA_TRANSPORT=" + std::string(transport);
  BypassEndpoint o;
  const char* ip = nonempty_env("INA_LOCAL_IP");
  if (ip == nullptr) {
    return invalid_argument(which + " needs INA_LOCAL_IP: this worker's IPv4 address a.b.c.d " +
                            std::string(local_ip_hint));
  }
  Result<uint32_t> lip = frame::parse_ipv4(ip);
  if (!lip.ok()) return env_error("INA_LOCAL_IP", ip, "an IPv4 address a.b.c.d");
  o.local_ip = lip.value();
  if (const char* v = nonempty_env("INA_LOCAL_MAC")) {
    Result<frame::Mac> m = frame::parse_mac(v);
    if (!m.ok()) return env_error("INA_LOCAL_MAC", v, "a MAC address aa:bb:cc:dd:ee:ff");
    o.local_mac = m.value();
    o.local_mac_set = true;
  }
  if (const char* v = nonempty_env("INA_AGGREGATOR_MAC")) {
    Result<frame::Mac> m = frame::parse_mac(v);
    if (!m.ok()) return env_error("INA_AGGREGATOR_MAC", v, "a MAC address aa:bb:cc:dd:ee:ff");
    o.aggregator_mac = m.value();
    o.aggregator_mac_set = true;
  }
  unsigned base = 47500;
  if (const char* v = nonempty_env("INA_LOCAL_PORT")) {
    const std::string_view s(v);
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), base);
    if (ec != std::errc() || ptr != s.data() + s.size() || base < 1 || base > 65535) {
      return env_error("INA_LOCAL_PORT", s, "a UDP port in [1, 65535] (rank r uses it + r)");
    }
  }
  if (base + static_cast<unsigned>(cfg.rank) > 65535) {
    return invalid_argument("INA_LOCAL_PORT=" + std::to_string(base) + " + rank " +
                            std::to_string(cfg.rank) + " exceeds 65535");
  }
  o.local_port = static_cast<uint16_t>(base + static_cast<unsigned>(cfg.rank));
  Result<uint32_t> aip = frame::parse_ipv4(cfg.aggregator_host);
  if (!aip.ok()) {
    return invalid_argument("invalid INA_AGGREGATOR host \"" + cfg.aggregator_host + "\": " +
                            which + " needs an IPv4 address a.b.c.d (no names)");
  }
  o.aggregator_ip = aip.value();
  o.aggregator_port = cfg.aggregator_port;
  return o;
}

}  // namespace ina::worker
