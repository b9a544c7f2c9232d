// bypass_endpoint_from_env and the options of INA_TRANSPORT=dpdk|xdp (bypass_endpoint.h): pure
// parsing, in libina itself, so a bad variable is named before any transport plugin is loaded.
#include "worker/transport/bypass_endpoint.h"

#include <charconv>
#include <cstdlib>
#include <string>

#include "worker/transport/dpdk_transport.h"
#include "worker/transport/xdp_transport.h"

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
    return invalid_argument("invalid INA_AGGREGATOR host \"" + cfg.aggregator_host +
                            "\": " + which + " needs an IPv4 address a.b.c.d (no names)");
  }
  o.aggregator_ip = aip.value();
  o.aggregator_port = cfg.aggregator_port;
  return o;
}

// ---- INA_TRANSPORT=dpdk ----

Result<DpdkTransportOptions> dpdk_options_from_env(const Config& cfg) {
  DpdkTransportOptions o;
  const char* args = nonempty_env("INA_DPDK_ARGS");
  if (args == nullptr) {
    return invalid_argument(
        "INA_TRANSPORT=dpdk needs INA_DPDK_ARGS: the EAL arguments, e.g. \"--no-huge -m 256 "
        "--no-shconf --no-pci -l 0 --file-prefix w0 "
        "--vdev=net_memif0,role=client,socket=/run/ina.sock\"");
  }
  std::string_view a(args);
  if (a.find_first_of("'\"\\") != std::string_view::npos) {
    return env_error("INA_DPDK_ARGS", a, "EAL arguments separated by blanks, without quoting");
  }
  size_t i = 0;
  while (i < a.size()) {
    while (i < a.size() && (a[i] == ' ' || a[i] == '\t' || a[i] == '\n')) ++i;
    size_t j = i;
    while (j < a.size() && a[j] != ' ' && a[j] != '\t' && a[j] != '\n') ++j;
    if (j > i) o.eal_args.emplace_back(a.substr(i, j - i));
    i = j;
  }
  if (o.eal_args.empty()) return env_error("INA_DPDK_ARGS", a, "EAL arguments");
  if (const char* v = nonempty_env("INA_DPDK_PORT")) o.port = v;

  INA_ASSIGN_OR_RETURN(BypassEndpoint e, bypass_endpoint_from_env(cfg, "dpdk", "on the port"));
  apply_endpoint(e, &o);
  return o;
}

// ---- INA_TRANSPORT=xdp ----

Result<XdpTransportOptions> xdp_options_from_env(const Config& cfg) {
  XdpTransportOptions o;
  const char* iface = nonempty_env("INA_XDP_IFACE");
  if (iface == nullptr) {
    return invalid_argument("INA_TRANSPORT=xdp needs INA_XDP_IFACE: the interface to bind");
  }
  o.iface = iface;
  if (const char* v = nonempty_env("INA_XDP_QUEUE")) {
    const std::string_view s(v);
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), o.queue);
    if (ec != std::errc() || ptr != s.data() + s.size()) {
      return env_error("INA_XDP_QUEUE", s, "a queue number (0, 1, ...)");
    }
  }
  if (const char* v = nonempty_env("INA_XDP_COPY")) {
    const std::string_view s(v);
    if (s != "0" && s != "1") return env_error("INA_XDP_COPY", s, "0 or 1");
    o.force_copy = s == "1";
  }
  INA_ASSIGN_OR_RETURN(BypassEndpoint e,
                       bypass_endpoint_from_env(cfg, "xdp",
                                                "(not configured on the kernel interface; the "
                                                "transport answers ARP for it)"));
  apply_endpoint(e, &o);
  return o;
}

}  // namespace ina::worker
