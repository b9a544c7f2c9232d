// Config::from_env: strict parsing of the INA_* environment (Config::validate, which checks the
// result, is config_validate.cc's).
//
// Every variable is parsed as a whole (std::from_chars must consume it all) and range checked, so
// "INA_RANK=1x" or "INA_WINDOW=0" is an error that names the variable, the value and the expected
// form instead of a silently wrong job. An unset or empty variable keeps the default.
#include <charconv>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>

#include "ina/ina.hpp"
#include "ina/protocol/frame.h"
#include "ina/protocol/wire.h"
#include "worker/config_internal.h"
#include "worker/host/allreduce.h"
#include "worker/host/alltoall.h"
#include "worker/host/select.h"
#include "worker/rdma/verbs_proto.h"

namespace ina {
namespace {

using worker::kMaxBlockElems;
using worker::kMaxRetransmitUs;
using worker::kMaxTimeoutMs;
using worker::kMaxWindow;
using worker::kMaxWorldSize;
using worker::range_error;

std::string quoted(std::string_view v) {
  std::string s = "\"";
  s += v;
  s += '"';
  return s;
}

Status bad_value(std::string_view name, std::string_view value, std::string_view form) {
  std::string m(name);
  m += '=';
  m += quoted(value);
  m += " is not valid: expected ";
  m += form;
  return invalid_argument(std::move(m));
}

// An unsigned integer in [lo, hi], decimal, or hexadecimal with a 0x prefix when `allow_hex`.
Status parse_unsigned(std::string_view name, std::string_view value, uint64_t lo, uint64_t hi,
                      bool allow_hex, uint64_t* out) {
  auto form = [&] {
    std::string f = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (allow_hex) f += " (decimal or 0x hexadecimal)";
    return f;
  };
  std::string_view digits = value;
  int base = 10;
  if (allow_hex && digits.size() > 2 && digits[0] == '0' &&
      (digits[1] == 'x' || digits[1] == 'X')) {
    digits.remove_prefix(2);
    base = 16;
  }
  uint64_t v = 0;
  const char* first = digits.data();
  const char* last = digits.data() + digits.size();
  auto [ptr, ec] = std::from_chars(first, last, v, base);
  if (ec != std::errc() || ptr != last || digits.empty()) return bad_value(name, value, form());
  if (v < lo || v > hi) return bad_value(name, value, form());
  *out = v;
  return ok_status();
}

Status parse_percent(std::string_view name, std::string_view value, double* out) {
  double v = 0;
  const char* last = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), last, v);
  // from_chars accepts "inf" and "nan": the range check below rejects both.
  if (ec != std::errc() || ptr != last || !(v >= 0.0 && v <= 100.0)) {
    return bad_value(name, value, "a percentage in [0, 100]");
  }
  *out = v;
  return ok_status();
}

// INA_TEST_STRAGGLE: "prob_percent:delay_us", e.g. "10:5000" (one collective in ten is delayed
// by 5 ms more).
Status parse_straggle(std::string_view value, double* percent, uint32_t* delay_us) {
  constexpr std::string_view kName = "INA_TEST_STRAGGLE";
  constexpr const char* kForm =
      "prob_percent:delay_us, a percentage in [0, 100] and microseconds "
      "in [0, 4294967295], e.g. 10:5000";
  const size_t colon = value.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == value.size()) {
    return bad_value(kName, value, kForm);
  }
  double p = 0;
  uint64_t d = 0;
  if (!parse_percent(kName, value.substr(0, colon), &p).ok() ||
      !parse_unsigned(kName, value.substr(colon + 1), 0, std::numeric_limits<uint32_t>::max(),
                      false, &d)
           .ok()) {
    return bad_value(kName, value, kForm);
  }
  *percent = p;
  *delay_us = static_cast<uint32_t>(d);
  return ok_status();
}

// Stores the variable's value in *out; false when it is unset or empty (the default stays).
bool get_env(const char* name, std::string_view* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  *out = v;
  return true;
}

// INA_JOB_KEY: the job's 128-bit key as 32 hex digits. A wrong form is refused without echoing
// the value (it is meant to be a secret).
Status parse_job_key(std::string_view name, std::string_view value, Key128* out) {
  if (parse_key_hex(value, out)) return ok_status();
  return invalid_argument(std::string(name) + " is not valid (" + std::to_string(value.size()) +
                          " characters): expected 32 hexadecimal digits, the job's 128-bit key");
}

Status env_job_key(Key128* out) {
  std::string_view v;
  if (!get_env("INA_JOB_KEY", &v)) return ok_status();
  return parse_job_key("INA_JOB_KEY", v, out);
}

template <typename T>
Status env_unsigned(const char* name, uint64_t lo, uint64_t hi, bool allow_hex, T* field) {
  std::string_view v;
  if (!get_env(name, &v)) return ok_status();
  uint64_t x = 0;
  INA_RETURN_IF_ERROR(parse_unsigned(name, v, lo, hi, allow_hex, &x));
  *field = static_cast<T>(x);
  return ok_status();
}

Status env_percent(const char* name, double* field) {
  std::string_view v;
  if (!get_env(name, &v)) return ok_status();
  return parse_percent(name, v, field);
}

// The kernel-bypass transports' variables (INA_TRANSPORT=dpdk|xdp; Config::local_ip ...). Every
// one set is parsed, whatever INA_TRANSPORT says; the ones a transport requires are checked by
// validate (worker::validate_bypass).
Status bypass_from_env(Config* c) {
  constexpr const char* kMacForm = "a MAC address aa:bb:cc:dd:ee:ff";
  std::string_view v;
  if (get_env("INA_LOCAL_IP", &v)) {
    Result<uint32_t> ip = frame::parse_ipv4(v);
    if (!ip.ok()) return bad_value("INA_LOCAL_IP", v, "an IPv4 address a.b.c.d");
    if (ip.value() == 0)
      return bad_value("INA_LOCAL_IP", v, "an IPv4 address a.b.c.d, not 0.0.0.0");
    c->local_ip = ip.value();
  }
  if (get_env("INA_LOCAL_MAC", &v)) {
    Result<frame::Mac> m = frame::parse_mac(v);
    if (!m.ok()) return bad_value("INA_LOCAL_MAC", v, kMacForm);
    c->local_mac = m.value();
  }
  if (get_env("INA_AGGREGATOR_MAC", &v)) {
    Result<frame::Mac> m = frame::parse_mac(v);
    if (!m.ok()) return bad_value("INA_AGGREGATOR_MAC", v, kMacForm);
    c->aggregator_mac = m.value();
  }
  if (get_env("INA_LOCAL_PORT", &v)) {
    uint64_t port = 0;
    if (!parse_unsigned("INA_LOCAL_PORT", v, 1, 65535, false, &port).ok()) {
      return bad_value("INA_LOCAL_PORT", v, "a UDP port in [1, 65535] (rank r uses it + r)");
    }
    c->local_port = static_cast<uint16_t>(port);
  }
  if (get_env("INA_DPDK_ARGS", &v)) {
    if (v.find_first_of("'\"\\") != std::string_view::npos) {
      return bad_value("INA_DPDK_ARGS", v, "EAL arguments separated by blanks, without quoting");
    }
    std::vector<std::string> args;
    size_t i = 0;
    while (i < v.size()) {
      while (i < v.size() && (v[i] == ' ' || v[i] == '\t' || v[i] == '\n')) ++i;
      size_t j = i;
      while (j < v.size() && v[j] != ' ' && v[j] != '\t' && v[j] != '\n') ++j;
      if (j > i) args.emplace_back(v.substr(i, j - i));
      i = j;
    }
    if (args.empty()) return bad_value("INA_DPDK_ARGS", v, "EAL arguments");
    c->dpdk_args = std::move(args);
  }
  if (get_env("INA_DPDK_PORT", &v)) c->dpdk_port = std::string(v);
  if (get_env("INA_XDP_IFACE", &v)) c->xdp_iface = std::string(v);
  if (get_env("INA_XDP_QUEUE", &v)) {
    uint64_t q = 0;
    if (!parse_unsigned("INA_XDP_QUEUE", v, 0, std::numeric_limits<uint32_t>::max(), false, &q)
             .ok()) {
      return bad_value("INA_XDP_QUEUE", v, "a queue number (0, 1, ...)");
    }
    c->xdp_queue = static_cast<uint32_t>(q);
  }
  if (get_env("INA_XDP_COPY", &v)) {
    if (v != "0" && v != "1") return bad_value("INA_XDP_COPY", v, "0 or 1");
    c->xdp_copy = v == "1";
  }
  return ok_status();
}

// Rank and world size from the launcher for what INA_RANK/INA_WORLD_SIZE do not give. Sources in
// order: INA_*, torchrun (RANK, WORLD_SIZE), Open MPI (OMPI_COMM_WORLD_RANK/SIZE), Slurm
// (SLURM_PROCID, SLURM_NTASKS); the first launcher with any of its pair set is used. A launcher's
// pair must be complete (a half-set pair is an error naming both variables): mixing torchrun's
// RANK with Slurm's task count, under an srun that runs torchrun, would give a wrong but
// plausible world. Every value is parsed strictly, like the INA_* variables.
struct LauncherVars {
  const char* rank;
  const char* size;
};
constexpr LauncherVars kLaunchers[] = {
    {"RANK", "WORLD_SIZE"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"SLURM_PROCID", "SLURM_NTASKS"},
};

Status rank_from_env(int* rank, int* world) {
  std::string_view v;
  const bool have_rank = get_env("INA_RANK", &v);
  INA_RETURN_IF_ERROR(env_unsigned("INA_RANK", 0, kMaxWorldSize - 1, false, rank));
  const bool have_world = get_env("INA_WORLD_SIZE", &v);
  INA_RETURN_IF_ERROR(env_unsigned("INA_WORLD_SIZE", 1, kMaxWorldSize, false, world));
  if (have_rank && have_world) return ok_status();
  for (const LauncherVars& l : kLaunchers) {
    std::string_view r;
    std::string_view w;
    const bool hr = get_env(l.rank, &r);
    const bool hw = get_env(l.size, &w);
    if (!hr && !hw) continue;
    if (hr != hw) {
      return invalid_argument(std::string(hr ? l.rank : l.size) + " is set but " +
                              (hr ? l.size : l.rank) +
                              " is not: expected both of the launcher's pair, or INA_RANK and "
                              "INA_WORLD_SIZE");
    }
    uint64_t x = 0;
    INA_RETURN_IF_ERROR(parse_unsigned(l.rank, r, 0, kMaxWorldSize - 1, false, &x));
    if (!have_rank) *rank = static_cast<int>(x);
    INA_RETURN_IF_ERROR(parse_unsigned(l.size, w, 1, kMaxWorldSize, false, &x));
    if (!have_world) *world = static_cast<int>(x);
    return ok_status();
  }
  return ok_status();
}

}  // namespace

namespace worker {

std::string range_error(std::string_view field, std::string_view env, const std::string& value,
                        const std::string& range) {
  std::string m = "invalid ";
  m += field;
  m += ' ';
  m += value;
  m += ": must be in ";
  m += range;
  if (!env.empty()) {
    m += " (";
    m += env;
    m += ')';
  }
  return m;
}

Status parse_host_port(std::string_view s, std::string_view what, std::string* host,
                       uint16_t* port) {
  return parse_host_port(s, what, wire::kDefaultPort, host, port);
}

Status parse_host_port(std::string_view s, std::string_view what, uint16_t default_port,
                       std::string* host, uint16_t* port) {
  auto bad = [&] {
    return bad_value(what, s,
                     "host, host:port, [ipv6] or [ipv6]:port (port 1..65535, default " +
                         std::to_string(default_port) + ")");
  };
  std::string_view h;
  std::string_view p;
  if (!s.empty() && s.front() == '[') {
    const size_t close = s.find(']');
    if (close == std::string_view::npos) return bad();
    h = s.substr(1, close - 1);
    std::string_view rest = s.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return bad();
      p = rest.substr(1);
      if (p.empty()) return bad();
    }
  } else {
    const size_t first = s.find(':');
    if (first != std::string_view::npos && s.find(':', first + 1) != std::string_view::npos) {
      h = s;  // more than one colon and no brackets: a bare IPv6 literal, no port
    } else if (first != std::string_view::npos) {
      h = s.substr(0, first);
      p = s.substr(first + 1);
      if (p.empty()) return bad();
    } else {
      h = s;
    }
  }
  if (h.empty()) return bad();
  uint16_t port_value = default_port;
  if (!p.empty()) {
    uint64_t v = 0;
    auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
    if (ec != std::errc() || ptr != p.data() + p.size() || v < 1 || v > 65535) return bad();
    port_value = static_cast<uint16_t>(v);
  }
  *host = std::string(h);
  *port = port_value;
  return ok_status();
}

Status parse_aggregator_list(std::string_view s, std::string_view what,
                             std::vector<AggregatorAddress>* out) {
  std::vector<AggregatorAddress> list;
  size_t count = 1;
  for (char c : s) count += c == ',' ? 1 : 0;
  if (count > kMaxShards) {
    return bad_value(what, s,
                     "at most " + std::to_string(kMaxShards) +
                         " comma-separated aggregators (host:port,host:port,...); got " +
                         std::to_string(count));
  }
  size_t start = 0;
  for (size_t i = 0; i < count; ++i) {
    size_t end = s.find(',', start);
    if (end == std::string_view::npos) end = s.size();
    const std::string_view elem = s.substr(start, end - start);
    start = end + 1;
    const std::string name =
        std::string(what) + " element " + std::to_string(i + 1) + " of " + std::to_string(count);
    if (elem.empty()) {
      return bad_value(name, elem,
                       "host, host:port, [ipv6] or [ipv6]:port between the commas of " +
                           std::string(what) + "=" + quoted(s));
    }
    if (elem.find_first_of(" \t\r\n") != std::string_view::npos) {
      return bad_value(name, elem,
                       "host, host:port, [ipv6] or [ipv6]:port without spaces (the list "
                       "is comma-separated, no blanks around the commas)");
    }
    AggregatorAddress a;
    INA_RETURN_IF_ERROR(parse_host_port(elem, name, &a.host, &a.port));
    for (size_t j = 0; j < list.size(); ++j) {
      if (list[j].host == a.host && list[j].port == a.port) {
        return bad_value(name, elem,
                         "distinct aggregators: it repeats element " + std::to_string(j + 1) +
                             " (" + a.host + ":" + std::to_string(a.port) + ")");
      }
    }
    list.push_back(std::move(a));
  }
  *out = std::move(list);
  return ok_status();
}

void set_aggregators(Config* cfg, std::vector<AggregatorAddress> list) {
  if (list.empty()) return;
  cfg->aggregator_host = list[0].host;
  cfg->aggregator_port = list[0].port;
  if (list.size() == 1) {
    cfg->aggregators.clear();
  } else {
    cfg->aggregators = std::move(list);
  }
}

std::vector<AggregatorAddress> aggregator_list(const Config& cfg) {
  if (!cfg.aggregators.empty()) return cfg.aggregators;
  return {AggregatorAddress{cfg.aggregator_host, cfg.aggregator_port}};
}

}  // namespace worker

namespace {

// from_env; `own_store`: the caller brings the rendezvous (Config::external_store, or a store
// address it sets itself), which counts as a store for the host-only rule.
Result<Config> config_from_env(bool own_store) {
  Config c;
  INA_RETURN_IF_ERROR(rank_from_env(&c.rank, &c.world_size));
  std::string_view agg;
  const bool have_aggregator = get_env("INA_AGGREGATOR", &agg);
  if (have_aggregator) {
    // One address, or a comma-separated list: the job sharded over those aggregators.
    std::vector<AggregatorAddress> list;
    INA_RETURN_IF_ERROR(worker::parse_aggregator_list(agg, "INA_AGGREGATOR", &list));
    worker::set_aggregators(&c, std::move(list));
  }
  std::string_view controller;
  if (get_env("INA_CONTROLLER", &controller)) {
    // One replica or a comma-separated list of them.
    c.controllers.clear();
    const bool list = controller.find(',') != std::string_view::npos;
    for (std::string_view rest = controller;;) {
      const size_t comma = rest.find(',');
      AggregatorAddress a;
      const Status st = worker::parse_host_port(rest.substr(0, comma), "INA_CONTROLLER",
                                                worker::kDefaultControllerPort, &a.host, &a.port);
      if (!st.ok() && !list) return st;
      if (!st.ok()) {
        return bad_value("INA_CONTROLLER", controller,
                         "comma-separated replicas, each host, host:port, [ipv6] or [ipv6]:port "
                         "(port 1..65535, default " +
                             std::to_string(worker::kDefaultControllerPort) + "): element " +
                             std::to_string(c.controllers.size() + 1) + " is not");
      }
      c.controllers.push_back(std::move(a));
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
    c.controller_host = c.controllers[0].host;
    c.controller_port = c.controllers[0].port;
    if (c.controllers.size() == 1) c.controllers.clear();
  }
  std::string_view job_name;
  if (get_env("INA_JOB_NAME", &job_name)) {
    const bool ok =
        job_name.size() <= 128 && job_name.find_first_not_of(
                                      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                      "0123456789._:-") == std::string_view::npos;
    if (!ok) return bad_value("INA_JOB_NAME", job_name, "1..128 of [A-Za-z0-9._:-]");
    c.job_name = std::string(job_name);
  }
  // The host mesh's rendezvous: INA_STORE, else PyTorch's MASTER_ADDR and MASTER_PORT.
  std::string_view store;
  std::string_view master_addr;
  std::string_view master_port;
  if (get_env("INA_STORE", &store)) {
    c.store = std::string(store);
  } else if (get_env("MASTER_ADDR", &master_addr) && get_env("MASTER_PORT", &master_port)) {
    c.store = std::string(master_addr) + ":" + std::string(master_port);
  }
  if (!c.store.empty()) {
    // The port is required: rank 0 serves the store on it (no default would be right).
    const char* name = store.empty() ? "MASTER_ADDR:MASTER_PORT" : "INA_STORE";
    std::string h;
    uint16_t p = 0;
    const Status s = worker::parse_host_port(c.store, name, 0, &h, &p);
    if (!s.ok() || p == 0) {
      return bad_value(name, c.store,
                       "host:port or [ipv6]:port, the rendezvous store's TCP port in 1..65535 "
                       "(e.g. 10.0.0.1:29500)");
    }
  }
  // The mesh address: INA_MESH_ADDR as given, else found when the mesh forms
  // (host/mesh_address.h: INA_SOCKET_IFNAME's address, else the route to the store's host).
  std::string_view mesh_addr;
  if (get_env("INA_MESH_ADDR", &mesh_addr)) c.mesh_address = std::string(mesh_addr);
  std::string_view ifname;
  if (get_env("INA_SOCKET_IFNAME", &ifname)) {
    if (ifname.size() >= 16 || ifname.find_first_of("/ \t") != std::string_view::npos) {
      return bad_value("INA_SOCKET_IFNAME", ifname, "a network interface name (e.g. eth0)");
    }
    c.mesh_interface = std::string(ifname);
  }
  std::string_view require;
  if (get_env("INA_REQUIRE_INC", &require)) {
    if (require != "0" && require != "1") return bad_value("INA_REQUIRE_INC", require, "0 or 1");
    c.require_inc = require == "1";
  }
  std::string_view fallback;
  if (get_env("INA_FALLBACK", &fallback)) {
    if (fallback == "exact") {
      c.fallback = FallbackMode::kExact;
    } else if (fallback == "float") {
      c.fallback = FallbackMode::kFloat;
    } else {
      return bad_value("INA_FALLBACK", fallback, "exact or float");
    }
  }
  std::string_view transport;
  if (get_env("INA_TRANSPORT", &transport)) {
    // dpdk, xdp: the kernel-bypass transports, configured by their own variables
    // (bypass_from_env), whatever the transport: a malformed one is an error here.
    if (transport == "auto") {
      c.transport = AggregatorTransport::kAuto;
    } else if (transport == "udp") {
      c.transport = AggregatorTransport::kUdp;
    } else if (transport == "dpdk") {
      c.transport = AggregatorTransport::kDpdk;
    } else if (transport == "xdp") {
      c.transport = AggregatorTransport::kXdp;
    } else if (transport == "host") {
      c.transport = AggregatorTransport::kHost;
      c.host_only = true;
    } else {
      return bad_value("INA_TRANSPORT", transport, "auto, udp, dpdk, xdp or host");
    }
  }
  INA_RETURN_IF_ERROR(bypass_from_env(&c));
  std::string_view algo;
  if (get_env("INA_ALGO", &algo)) {
    if (!host::parse_algorithm(algo)) return bad_value("INA_ALGO", algo, "ring, hd or tree");
    c.host_algorithm = std::string(algo);
  }
  std::string_view a2a;
  if (get_env("INA_A2A_ALGO", &a2a)) {
    if (!host::parse_alltoall_algorithm(a2a))
      return bad_value("INA_A2A_ALGO", a2a, "pairwise, bruck or hier");
    c.alltoall_algorithm = std::string(a2a);
  }
  INA_RETURN_IF_ERROR(env_unsigned("INA_A2A_GROUP", 0, 1 << 20, false, &c.alltoall_group));
  std::string_view local_world;  // the launcher's (torchrun): used when it is a plain number
  if (c.alltoall_group == 0 && get_env("LOCAL_WORLD_SIZE", &local_world)) {
    int g = 0;
    auto [end, ec] =
        std::from_chars(local_world.data(), local_world.data() + local_world.size(), g);
    if (ec == std::errc() && end == local_world.data() + local_world.size() && g > 0)
      c.alltoall_group = g;
  }
  std::string_view verbs_device;
  if (get_env("INA_VERBS_DEVICE", &verbs_device)) {
    const std::string d(verbs_device);
    INA_RETURN_IF_ERROR(rdma::parse_verbs_selection(d.c_str(), nullptr).status());
    c.verbs_device = d;
  }
  INA_RETURN_IF_ERROR(env_unsigned("INA_VERBS_GID_INDEX", 0, 255, false, &c.verbs_gid_index));
  std::string_view host_transport;
  if (get_env("INA_HOST_TRANSPORT", &host_transport)) {
    if (host_transport == "auto") {
      c.host_transport = HostTransport::kAuto;
    } else if (host_transport == "tcp") {
      c.host_transport = HostTransport::kTcp;
    } else if (host_transport == "verbs") {
      c.host_transport = HostTransport::kVerbs;
    } else {
      return bad_value("INA_HOST_TRANSPORT", host_transport, "auto, tcp or verbs");
    }
  }
  // A store and nobody to place the job in-network: every collective on the host mesh.
  if (!have_aggregator && c.controller_host.empty() && (own_store || !c.store.empty())) {
    c.host_only = true;
  }
  // Every collective on the host mesh, for good: nothing to be bitwise equal to, so the host
  // AllReduce reduces floats as Gloo does (one host AllReduce; exact mode's quantized words
  // need a second one for the block exponents, twice the latency of a small collective), unless
  // INA_FALLBACK asks for exact.
  if (c.host_only && fallback.empty()) c.fallback = FallbackMode::kFloat;
  std::string_view cost_model;
  if (get_env("INA_COST_MODEL", &cost_model)) {
    INA_RETURN_IF_ERROR(host::parse_cost_model(cost_model).status());
    c.cost_model = std::string(cost_model);
  }
  INA_RETURN_IF_ERROR(
      env_unsigned("INA_JOB", 0, std::numeric_limits<uint32_t>::max(), false, &c.job));
  INA_RETURN_IF_ERROR(env_job_key(&c.job_key));
  INA_RETURN_IF_ERROR(env_unsigned("INA_BLOCK_ELEMS", 1, kMaxBlockElems, false, &c.block_elems));
  INA_RETURN_IF_ERROR(env_unsigned("INA_WINDOW", 1, kMaxWindow, false, &c.window));
  uint64_t timeout_ms = 0;
  std::string_view v;
  if (get_env("INA_TIMEOUT_MS", &v)) {
    INA_RETURN_IF_ERROR(parse_unsigned("INA_TIMEOUT_MS", v, 1, kMaxTimeoutMs, false, &timeout_ms));
    c.timeout = std::chrono::milliseconds(timeout_ms);
  }
  if (get_env("INA_RETRANSMIT_US", &v)) {
    uint64_t us = 0;
    INA_RETURN_IF_ERROR(parse_unsigned("INA_RETRANSMIT_US", v, 1, kMaxRetransmitUs, false, &us));
    c.retransmit = std::chrono::microseconds(us);
  }
  INA_RETURN_IF_ERROR(
      env_unsigned("INA_DEVICE_CHUNK_ELEMS", 1, uint64_t{1} << 32, false, &c.device_chunk_elems));
  INA_RETURN_IF_ERROR(env_unsigned("INA_DEVICE_BUFFERS", 1, 16, false, &c.device_buffers));
  INA_RETURN_IF_ERROR(env_percent("INA_TEST_DROP_PERCENT", &c.fault.drop_send_percent));
  // One knob for both directions: a lossy link loses requests and replies alike.
  c.fault.drop_recv_percent = c.fault.drop_send_percent;
  INA_RETURN_IF_ERROR(env_percent("INA_TEST_DUP_PERCENT", &c.fault.dup_send_percent));
  INA_RETURN_IF_ERROR(env_unsigned("INA_TEST_DELAY_US", 0, std::numeric_limits<uint32_t>::max(),
                                   false, &c.fault.delay_us));
  if (get_env("INA_TEST_STRAGGLE", &v)) {
    INA_RETURN_IF_ERROR(parse_straggle(v, &c.fault.straggle_percent, &c.fault.straggle_delay_us));
  }
  INA_RETURN_IF_ERROR(
      env_unsigned("INA_TEST_SEED", 0, std::numeric_limits<uint64_t>::max(), true, &c.fault.seed));
  return c;
}

}  // namespace

Result<Config> Config::from_env() { return config_from_env(false); }

Result<Config> Config::from_env_with_store() { return config_from_env(true); }

std::string host_only_reason(const Config& cfg) {
  if (!cfg.host_only) return {};
  std::string_view v;
  if (cfg.transport == AggregatorTransport::kHost) return "INA_TRANSPORT=host";
  if (!get_env("INA_AGGREGATOR", &v) && !get_env("INA_CONTROLLER", &v)) {
    return "neither INA_AGGREGATOR nor INA_CONTROLLER is set (nothing places the job "
           "in-network)";
  }
  return "Config::host_only is set by the application";
}

}  // namespace ina
