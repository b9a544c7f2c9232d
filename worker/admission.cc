// Admission client (see admission.h).
#include "worker/admission.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <thread>

#include "ina/base/log.h"
#include "worker/config_internal.h"
#include "worker/host/socket.h"

namespace ina::worker {
namespace {

bool parse_num(std::string_view v, uint64_t max, uint64_t* out) {
  uint64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || v.empty() || x > max) return false;
  *out = x;
  return true;
}

// URL query value: the job name is already restricted to [A-Za-z0-9._:-]; ':' is fine in a query.
// `connect_timeout` bounds the connection (connect_tcp retries a refused one until its deadline),
// `timeout` the whole exchange.
Result<std::string> http_get(const std::string& host, uint16_t port, const std::string& path,
                             std::chrono::milliseconds timeout,
                             std::chrono::milliseconds connect_timeout) {
  const auto deadline = host::Clock::now() + timeout;
  INA_ASSIGN_OR_RETURN(
      int fd,
      host::connect_tcp(host, port, std::min(deadline, host::Clock::now() + connect_timeout)));
  const std::string what = "controller " + host + ":" + std::to_string(port);
  const std::string req =
      "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
  Status st = host::send_all(fd, req.data(), req.size(), deadline, what);
  std::string resp;
  while (st.ok()) {
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, host::ms_until(deadline));
    if (rc == 0) {
      st = deadline_exceeded(what + ": no complete answer within " +
                             std::to_string(timeout.count()) + " ms");
      break;
    }
    if (rc < 0 && errno != EINTR) {
      st = unavailable(what + ": poll failed");
      break;
    }
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      st = unavailable(what + ": connection reset");
      break;
    }
    resp.append(buf, static_cast<size_t>(n));
    if (resp.size() > (1u << 20)) {
      st = unavailable(what + ": answer larger than 1 MiB");
      break;
    }
  }
  ::close(fd);
  INA_RETURN_IF_ERROR(st);
  // "HTTP/1.x 200 ..." then headers, a blank line, the body.
  const size_t sp = resp.find(' ');
  const size_t body_at = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/1.", 0) != 0 || sp == std::string::npos || body_at == std::string::npos) {
    return unavailable(what + ": not an HTTP answer");
  }
  const std::string code = resp.substr(sp + 1, 3);
  std::string body = resp.substr(body_at + 4);
  if (code != "200") {
    while (!body.empty() && body.back() == '\n') body.pop_back();
    return Status(code == "400" ? StatusCode::kInvalidArgument : StatusCode::kUnavailable,
                  what + ": HTTP " + code + ": " + body);
  }
  return body;
}

Result<std::string> http_get(const std::string& host, uint16_t port, const std::string& path,
                             std::chrono::milliseconds timeout) {
  return http_get(host, port, path, timeout, timeout);
}

// Controller replicas (Config::controllers): asked in turn, round after round, until one answers
// or `timeout` passes. Any replica forwards to the leader; one that is down, or answers 503 (no
// leader yet: an election is under way), hands the question to the next. A 400 (a bad request)
// is the answer: every replica would give it.
Result<std::string> ask_controllers(const Config& cfg, const std::string& path,
                                    std::chrono::milliseconds timeout) {
  if (cfg.controllers.size() <= 1) {
    return http_get(cfg.controller_host, cfg.controller_port, path, timeout);
  }
  using std::chrono::milliseconds;
  const auto deadline = host::Clock::now() + timeout;
  Status last = unavailable("no controller replica asked");
  for (;;) {
    for (const AggregatorAddress& c : cfg.controllers) {
      const milliseconds left =
          std::chrono::duration_cast<milliseconds>(deadline - host::Clock::now());
      if (left.count() <= 0) {
        return unavailable("no controller replica of " + std::to_string(cfg.controllers.size()) +
                           " answered within " + std::to_string(timeout.count()) +
                           " ms (last: " + last.message() + ")");
      }
      Result<std::string> r = http_get(c.host, c.port, path, std::min(left, milliseconds(5000)),
                                       std::min(left, milliseconds(250)));
      if (r.ok() || r.status().code() == StatusCode::kInvalidArgument) return r;
      last = r.status();
    }
    std::this_thread::sleep_for(
        std::min(milliseconds(100),
                 std::chrono::duration_cast<milliseconds>(deadline - host::Clock::now())));
  }
}

}  // namespace

Result<Admission> parse_admission(std::string_view body) {
  Admission a;
  bool first = true;
  bool have_job = false, have_key = false, have_slots = false, have_block = false;
  uint64_t shards = 0;  // 0: no "shards" line (one aggregator)
  while (!body.empty()) {
    const size_t nl = body.find('\n');
    std::string_view line = body.substr(0, nl);
    body = nl == std::string_view::npos ? std::string_view{} : body.substr(nl + 1);
    if (first) {
      if (line == "admitted") {
        a.admitted = true;
      } else if (line != "refused") {
        return unavailable("controller answer: first line '" + std::string(line) +
                           "' is neither 'admitted' nor 'refused'");
      }
      first = false;
      continue;
    }
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    const std::string_view k = line.substr(0, sp);
    const std::string_view v =
        sp == std::string_view::npos ? std::string_view{} : line.substr(sp + 1);
    uint64_t x = 0;
    auto bad = [&] {
      return unavailable("controller answer: bad '" + std::string(k) + "' value '" +
                         std::string(v) + "'");
    };
    if (k == "job") {
      if (!parse_num(v, UINT32_MAX, &x)) return bad();
      a.job = static_cast<JobId>(x);
      have_job = true;
    } else if (k == "key") {
      // 32 hex digits; not echoed in the error (it is the job's secret).
      if (!parse_key_hex(v, &a.key)) {
        return unavailable("controller answer: bad 'key' value (" + std::to_string(v.size()) +
                           " characters): expected 32 hexadecimal digits");
      }
      have_key = true;
    } else if (k == "shards") {
      if (shards != 0 || !a.aggregators.empty()) {
        return unavailable(
            "controller answer: 'shards' must come once, before the 'aggregator' "
            "lines");
      }
      if (!parse_num(v, kMaxShards, &x) || x == 0) {
        return unavailable("controller answer: bad 'shards' value '" + std::string(v) +
                           "': expected 1.." + std::to_string(kMaxShards));
      }
      shards = x;
    } else if (k == "aggregator") {
      AggregatorAddress addr;
      if (!parse_host_port(v, "controller answer 'aggregator'", &addr.host, &addr.port).ok()) {
        return bad();
      }
      const uint64_t expected = shards == 0 ? 1 : shards;
      if (a.aggregators.size() >= expected) {
        return unavailable("controller answer: more 'aggregator' lines than " +
                           (shards == 0 ? std::string("one (no 'shards' line)")
                                        : "'shards " + std::to_string(shards) + "'"));
      }
      for (const AggregatorAddress& o : a.aggregators) {
        if (o.host == addr.host && o.port == addr.port) {
          return unavailable("controller answer: aggregator '" + std::string(v) +
                             "' appears twice (each shard needs its own)");
        }
      }
      a.aggregators.push_back(std::move(addr));
    } else if (k == "slots") {
      if (!parse_num(v, 32768, &x) || x == 0) return bad();
      a.slots = static_cast<uint32_t>(x);
      have_slots = true;
    } else if (k == "block") {
      if (!parse_num(v, 16384, &x) || x == 0) return bad();
      a.block_elems = static_cast<uint32_t>(x);
      have_block = true;
    } else if (k == "reason") {
      a.reason = std::string(v);
    }  // unknown keys: a newer controller; ignored
  }
  if (first) return unavailable("controller answer is empty");
  if (a.admitted && !(have_job && have_key && !a.aggregators.empty() && have_slots && have_block)) {
    return unavailable(
        "controller answer: 'admitted' lacks one of job, key, aggregator, slots, block");
  }
  if (a.admitted && shards != 0 && a.aggregators.size() != shards) {
    return unavailable("controller answer: 'shards " + std::to_string(shards) + "' but " +
                       std::to_string(a.aggregators.size()) + " 'aggregator' lines");
  }
  if (!a.aggregators.empty()) {
    a.aggregator_host = a.aggregators[0].host;
    a.aggregator_port = a.aggregators[0].port;
  }
  if (!a.admitted && a.reason.empty()) a.reason = "no reason given";
  return a;
}

std::string admission_name(const Config& cfg) {
  if (!cfg.job_name.empty()) return cfg.job_name;
  if (!cfg.store.empty()) {
    std::string n = "store-";
    for (char c : cfg.store)
      n += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == ':' || c == '-') ? c
                                                                                             : '_';
    return n;
  }
  return {};
}

void apply_admission(const Admission& x, Config* cfg) {
  set_aggregators(cfg, x.aggregators);
  cfg->job = x.job;
  cfg->job_key = x.key;
  cfg->window = std::min(cfg->window, x.slots);
  cfg->block_elems = std::min(cfg->block_elems, x.block_elems);
  std::string where = x.aggregator_host + ":" + std::to_string(x.aggregator_port);
  if (x.aggregators.size() > 1) {
    where += " and " + std::to_string(x.aggregators.size() - 1) + " more aggregators (sharded)";
  }
  INA_INFO("worker", "rank %d: admitted as job %u on %s", cfg->rank, x.job, where.c_str());
}

Status admit(Config* cfg, std::chrono::milliseconds timeout, std::string* host_reason) {
  const std::string name = admission_name(*cfg);
  if (name.empty()) {
    return invalid_argument(
        "INA_CONTROLLER needs a job name shared by every rank: set INA_JOB_NAME, or INA_STORE / "
        "MASTER_ADDR and MASTER_PORT");
  }
  if (cfg->world_size < 1 || cfg->rank < 0) return cfg->validate();
  const std::string path = "/v1/admit?name=" + name + "&world=" + std::to_string(cfg->world_size) +
                           "&rank=" + std::to_string(cfg->rank) +
                           "&slots=" + std::to_string(cfg->window) +
                           "&block=" + std::to_string(cfg->block_elems);
  Result<std::string> body = ask_controllers(*cfg, path, timeout);
  Result<Admission> a =
      body.ok() ? parse_admission(body.value()) : Result<Admission>(body.status());
  if (a.ok() && a.value().admitted) {
    apply_admission(a.value(), cfg);
    return ok_status();
  }
  if (a.ok() || a.status().code() != StatusCode::kInvalidArgument) {
    const std::string why = a.ok() ? "refused: " + a.value().reason : a.status().message();
    if (!cfg->store.empty() || cfg->external_store != nullptr) {
      const std::string reason = "controller " + cfg->controller_host + ":" +
                                 std::to_string(cfg->controller_port) + ": " + why;
      if (host_reason != nullptr) {
        *host_reason = reason;
      } else {
        INA_DEBUG("worker", "rank %d: %s", cfg->rank, reason.c_str());
      }
      cfg->host_only = true;
      return ok_status();
    }
    return unavailable("admission " + why +
                       " (no host fallback: set INA_STORE or MASTER_ADDR "
                       "and MASTER_PORT)");
  }
  return a.status();
}

void release(const Config& cfg) {
  if (cfg.controller_host.empty()) return;
  const std::string name = admission_name(cfg);
  if (name.empty()) return;
  (void)ask_controllers(cfg, "/v1/release?name=" + name + "&rank=" + std::to_string(cfg.rank),
                        std::chrono::milliseconds(500));
}

}  // namespace ina::worker
