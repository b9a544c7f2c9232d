// A small etcd v3 client over etcd's JSON gateway (grpc-gateway: POST /v3/kv/range, /v3/kv/txn,
// /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke; keys and values base64, 64-bit numbers
// as decimal strings), spoken with cpp-httplib, which the controller already links.
//
// Why the gateway and not gRPC: the controller needs five unary calls, all of them in etcd 3.4's
// documented JSON API (Debian's etcd-server 3.4 serves it on the client port). libgrpc++ with
// etcd's .proto files would add protoc code generation, a large runtime and its own threads to
// the build of every controller, for calls that take one round trip on loopback either way.
// Watch is not used: followers poll the state key (a range per poll interval), which also keeps
// every call a short request/answer that fails over between endpoints cleanly.
//
// Endpoints fail over: a call goes to the endpoint that answered last; on a connection error, a
// timeout or an etcd "unavailable" answer (no raft leader, member stopping) it is tried on the
// next one, each endpoint once per call. A call that was sent and then lost may have been applied
// (a txn): callers make every write a compare-and-swap, so a repeated txn fails its compare
// instead of applying twice.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ina/base/status.h"

namespace ina::ctl {

struct EtcdEndpoint {
  std::string host;
  uint16_t port = 2379;
};

// "etcd://h1:p1,h2:p2" (or the list without the scheme); a missing port is 2379. Errors name the
// element and the expected form.
Result<std::vector<EtcdEndpoint>> parse_etcd_endpoints(const std::string& spec);

std::string base64_encode(const std::string& in);
// Standard alphabet with padding; false on any other character.
bool base64_decode(const std::string& in, std::string* out);

struct EtcdKv {
  bool found = false;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

// One compare of a txn: the key's create or mod revision equals `revision` (0: the key does not
// exist).
struct EtcdCompare {
  enum class Target { kCreate, kMod };
  std::string key;
  Target target = Target::kMod;
  int64_t revision = 0;
};

struct EtcdTxnResult {
  bool succeeded = false;
  int64_t revision = 0;  // the store's revision after the txn (the put's mod revision on success)
};

class EtcdClient {
 public:
  explicit EtcdClient(std::vector<EtcdEndpoint> endpoints, int64_t timeout_ms = 1500);
  Result<EtcdKv> get(const std::string& key);
  // Puts key = value (attached to `lease` unless 0) when every compare holds.
  Result<EtcdTxnResult> put_if(const std::vector<EtcdCompare>& compares, const std::string& key,
                               const std::string& value, int64_t lease);
  Result<int64_t> grant(int64_t ttl_s);          // the lease id
  Result<int64_t> keep_alive(int64_t lease_id);  // the TTL left (s); 0: the lease is gone
  Status revoke(int64_t lease_id);
  std::string describe() const;  // "etcd h1:p1,h2:p2"

 private:
  // POSTs `body` (JSON text) to `path` on the endpoints in turn; the answer's JSON text.
  Result<std::string> call(const std::string& path, const std::string& body);
  std::vector<EtcdEndpoint> endpoints_;
  int64_t timeout_ms_;
  std::mutex mu_;
  size_t current_ = 0;  // the endpoint that answered last
};

}  // namespace ina::ctl
