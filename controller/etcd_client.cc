// See etcd_client.h.
#include "controller/etcd_client.h"

#include <httplib.h>

#include <charconv>
#include <nlohmann/json.hpp>

namespace ina::ctl {
namespace {

using json = nlohmann::json;

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// grpc-gateway writes int64 fields as decimal strings and leaves out fields that are zero.
int64_t i64_at(const json& o, const char* k) {
  auto it = o.find(k);
  if (it == o.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return 0;
  const std::string& s = it->get_ref<const std::string&>();
  int64_t x = 0;
  std::from_chars(s.data(), s.data() + s.size(), x);
  return x;
}

// An etcd error answer ({"error": ..., "code": N}) worth trying on another endpoint: gRPC
// UNAVAILABLE (14: no leader, member stopping) and DEADLINE_EXCEEDED (4).
bool retryable_error(const std::string& body) {
  const json e = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!e.is_object()) return true;
  const int64_t code = i64_at(e, "code");
  return code == 14 || code == 4;
}

std::string error_text(const std::string& body) {
  const json e = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (e.is_object()) {
    if (auto it = e.find("error"); it != e.end() && it->is_string()) return it->get<std::string>();
    if (auto it = e.find("message"); it != e.end() && it->is_string()) {
      return it->get<std::string>();
    }
  }
  return body.substr(0, 200);
}

}  // namespace

Result<std::vector<EtcdEndpoint>> parse_etcd_endpoints(const std::string& spec) {
  std::string s = spec;
  if (s.rfind("etcd://", 0) == 0) s = s.substr(7);
  std::vector<EtcdEndpoint> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    const std::string elem =
        s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    auto bad = [&](const std::string& why) {
      return invalid_argument("--store " + spec + ": element " + std::to_string(out.size() + 1) +
                              " '" + elem + "': " + why +
                              " (expected etcd://host:port[,host:port...], port 1..65535, "
                              "default 2379)");
    };
    if (elem.empty()) return bad("empty");
    EtcdEndpoint e;
    const size_t colon = elem.rfind(':');
    if (colon == std::string::npos) {
      e.host = elem;
    } else {
      e.host = elem.substr(0, colon);
      const std::string p = elem.substr(colon + 1);
      unsigned v = 0;
      auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
      if (ec != std::errc() || ptr != p.data() + p.size() || v < 1 || v > 65535) {
        return bad("bad port");
      }
      e.port = static_cast<uint16_t>(v);
    }
    if (e.host.empty()) return bad("no host");
    out.push_back(e);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

std::string base64_encode(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<unsigned char>(in[i])} << 16) |
                       (uint32_t{static_cast<unsigned char>(in[i + 1])} << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint32_t{static_cast<unsigned char>(in[i])} << 16;
    if (i + 1 < in.size()) v |= uint32_t{static_cast<unsigned char>(in[i + 1])} << 8;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < in.size() ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

bool base64_decode(const std::string& in, std::string* out) {
  out->clear();
  if (in.size() % 4 != 0) return false;
  uint32_t acc = 0;
  int bits = 0;
  size_t pad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    int v = -1;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    if (c >= '0' && c <= '9') v = c - '0' + 52;
    if (c == '+') v = 62;
    if (c == '/') v = 63;
    if (c == '=') {
      if (i + 2 < in.size()) return false;  // padding only in the last two places
      ++pad;
      continue;
    }
    if (v < 0 || pad != 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return true;
}

EtcdClient::EtcdClient(std::vector<EtcdEndpoint> endpoints, int64_t timeout_ms)
    : endpoints_(std::move(endpoints)), timeout_ms_(timeout_ms) {}

std::string EtcdClient::describe() const {
  std::string s = "etcd ";
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    if (i > 0) s += ',';
    s += endpoints_[i].host + ":" + std::to_string(endpoints_[i].port);
  }
  return s;
}

Result<std::string> EtcdClient::call(const std::string& path, const std::string& body) {
  size_t first = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    first = current_;
  }
  std::string last_error;
  // The whole call, every endpoint tried included, within twice the per-endpoint timeout: a
  // leader's lease renewal must not hang past its TTL on members that accept and never answer.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(2 * timeout_ms_);
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t at = (first + i) % endpoints_.size();
    const EtcdEndpoint& e = endpoints_[at];
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    httplib::Client cli(e.host, e.port);
    const auto t = std::min(std::chrono::milliseconds(timeout_ms_), left);
    cli.set_connection_timeout(std::min(t, std::chrono::milliseconds(500)));
    cli.set_read_timeout(t);
    cli.set_write_timeout(t);
    auto res = cli.Post(path, body, "application/json");
    const std::string where = e.host + ":" + std::to_string(e.port);
    if (!res) {
      last_error = where + ": " + httplib::to_string(res.error());
      continue;
    }
    if (res->status == 200) {
      std::lock_guard<std::mutex> g(mu_);
      current_ = at;
      return res->body;
    }
    last_error = where + ": HTTP " + std::to_string(res->status) + ": " + error_text(res->body);
    if (!retryable_error(res->body)) {
      return Status(StatusCode::kFailedPrecondition, "etcd " + path + " at " + last_error);
    }
  }
  return unavailable("etcd " + path + ": no endpoint answered (last: " + last_error + ")");
}

Result<EtcdKv> EtcdClient::get(const std::string& key) {
  INA_ASSIGN_OR_RETURN(std::string text,
                       call("/v3/kv/range", json{{"key", base64_encode(key)}}.dump()));
  const json r = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!r.is_object()) return unavailable("etcd range: answer is not JSON");
  EtcdKv kv;
  auto kvs = r.find("kvs");
  if (kvs == r.end() || !kvs->is_array() || kvs->empty()) return kv;
  const json& x = kvs->front();
  kv.found = true;
  if (auto v = x.find("value"); v != x.end() && v->is_string()) {
    if (!base64_decode(v->get<std::string>(), &kv.value)) {
      return unavailable("etcd range: value is not base64");
    }
  }
  kv.create_revision = i64_at(x, "create_revision");
  kv.mod_revision = i64_at(x, "mod_revision");
  kv.lease = i64_at(x, "lease");
  return kv;
}

Result<EtcdTxnResult> EtcdClient::put_if(const std::vector<EtcdCompare>& compares,
                                         const std::string& key, const std::string& value,
                                         int64_t lease) {
  json cmp = json::array();
  for (const EtcdCompare& c : compares) {
    const bool create = c.target == EtcdCompare::Target::kCreate;
    cmp.push_back({{"key", base64_encode(c.key)},
                   {"result", "EQUAL"},
                   {"target", create ? "CREATE" : "MOD"},
                   {create ? "create_revision" : "mod_revision", std::to_string(c.revision)}});
  }
  json put = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  const json body = {{"compare", cmp}, {"success", json::array({{{"request_put", put}}})}};
  INA_ASSIGN_OR_RETURN(std::string text, call("/v3/kv/txn", body.dump()));
  const json r = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!r.is_object()) return unavailable("etcd txn: answer is not JSON");
  EtcdTxnResult out;
  if (auto s = r.find("succeeded"); s != r.end() && s->is_boolean()) out.succeeded = s->get<bool>();
  if (auto h = r.find("header"); h != r.end() && h->is_object()) {
    out.revision = i64_at(*h, "revision");
  }
  return out;
}

Result<int64_t> EtcdClient::grant(int64_t ttl_s) {
  INA_ASSIGN_OR_RETURN(std::string text,
                       call("/v3/lease/grant", json{{"TTL", std::to_string(ttl_s)}}.dump()));
  const json r = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!r.is_object()) return unavailable("etcd lease grant: answer is not JSON");
  const int64_t id = i64_at(r, "ID");
  if (id == 0) return unavailable("etcd lease grant: no lease id in the answer");
  return id;
}

Result<int64_t> EtcdClient::keep_alive(int64_t lease_id) {
  INA_ASSIGN_OR_RETURN(std::string text,
                       call("/v3/lease/keepalive", json{{"ID", std::to_string(lease_id)}}.dump()));
  // The gateway streams one {"result": {...}} per request message: one here.
  const size_t nl = text.find('\n');
  const json r = json::parse(text.substr(0, nl), nullptr, /*allow_exceptions=*/false);
  if (!r.is_object()) return unavailable("etcd lease keepalive: answer is not JSON");
  if (auto e = r.find("error"); e != r.end()) {
    return unavailable("etcd lease keepalive: " + e->dump());
  }
  auto res = r.find("result");
  if (res == r.end() || !res->is_object()) return int64_t{0};
  return i64_at(*res, "TTL");
}

Status EtcdClient::revoke(int64_t lease_id) {
  return call("/v3/lease/revoke", json{{"ID", std::to_string(lease_id)}}.dump()).status();
}

}  // namespace ina::ctl
