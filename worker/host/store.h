// Rendezvous key/value stores (Gloo's gloo/rendezvous/store.h, PyTorch's TCPStore).
//
// Ranks of a job meet through a Store: each publishes what the others need (its mesh address) with
// set() and waits for the others' keys with wait()/get(). Every wait has a timeout; one that
// expires is a kDeadlineExceeded naming the keys that never appeared, so a missing rank is named.
//
//   FileStore    a directory shared by the ranks (tests, one host, or a shared file system);
//                each key is a file written atomically (write to a temporary name, rename).
//   TcpStore     a server thread in one rank (rank 0) holds the map in memory; every rank,
//                the server's own included, is a client over TCP. Found from INA_STORE=host:port
//                or MASTER_ADDR/MASTER_PORT (PyTorch's names).
//   PrefixStore  namespaces another store ("job7/mesh/..."), so several meshes share one store.
//
// Values are byte strings. add() keeps a counter (decimal text, as PyTorch does) and returns the
// new value: it is atomic across ranks for every store.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ina/base/status.h"
#include "ina/ina.hpp"

namespace ina::host {

using Bytes = std::vector<uint8_t>;

inline Bytes to_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }
inline std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

class Store {
 public:
  virtual ~Store() = default;

  virtual Status set(const std::string& key, const Bytes& value) = 0;
  // Waits up to `timeout` for the key, then returns its value.
  virtual Result<Bytes> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Waits until every key exists; on timeout: kDeadlineExceeded "store: keys not set within
  // 5000 ms: mesh/addr/3, mesh/addr/4".
  virtual Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Adds `delta` to the counter at `key` (missing: 0) and returns the new value.
  virtual Result<int64_t> add(const std::string& key, int64_t delta) = 0;
};

// The message of a wait() that timed out.
std::string missing_keys_message(const std::vector<std::string>& missing,
                                 std::chrono::milliseconds timeout);

class FileStore final : public Store {
 public:
  // Creates `dir` (one level) when missing.
  static Result<std::unique_ptr<FileStore>> create(const std::string& dir);

  Status set(const std::string& key, const Bytes& value) override;
  Result<Bytes> get(const std::string& key, std::chrono::milliseconds timeout) override;
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;

 private:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  std::string path_of(const std::string& key) const;
  bool exists(const std::string& key) const;
  Result<Bytes> read(const std::string& key) const;

  std::string dir_;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // the server's address (clients connect here)
  uint16_t port = 29500;           // 0 with is_server: an ephemeral port (see TcpStore::port())
  bool is_server = false;          // run the server thread in this process
  std::chrono::milliseconds connect_timeout{30000};  // clients retry until then
};

class TcpStore final : public Store {
 public:
  static Result<std::unique_ptr<TcpStore>> create(const TcpStoreOptions& opts);
  // INA_STORE=host:port, else MASTER_ADDR and MASTER_PORT; the rank given serves when it is 0.
  static Result<std::unique_ptr<TcpStore>> from_env(int rank, std::chrono::milliseconds timeout);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  Status set(const std::string& key, const Bytes& value) override;
  Result<Bytes> get(const std::string& key, std::chrono::milliseconds timeout) override;
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;

  uint16_t port() const { return port_; }  // the server's port

 private:
  class Server;
  TcpStore() = default;
  // One request/reply round trip (serialized by mu_).
  Result<Bytes> call(const Bytes& request, std::chrono::milliseconds timeout);
  // Keys of `keys` that the server does not hold.
  Result<std::vector<std::string>> missing(const std::vector<std::string>& keys,
                                           std::chrono::milliseconds timeout);

  std::unique_ptr<Server> server_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::mutex mu_;  // one request in flight per client connection
};

// The application's store (Config::external_store, borrowed) as a rendezvous Store. wait() gets
// each key in turn within one deadline and names the keys still missing; add() is not offered
// (the mesh setup does not use it).
class ExternalStoreAdapter final : public Store {
 public:
  explicit ExternalStoreAdapter(ExternalStore& store) : store_(store) {}

  Status set(const std::string& key, const Bytes& value) override { return store_.set(key, value); }
  Result<Bytes> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return store_.get(key, timeout);
  }
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;

 private:
  ExternalStore& store_;
};

// Prepends "<prefix>/" to every key of a borrowed store (which must outlive it).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store& base) : prefix_(std::move(prefix) + "/"), base_(base) {}

  Status set(const std::string& key, const Bytes& value) override {
    return base_.set(prefix_ + key, value);
  }
  Result<Bytes> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return base_.get(prefix_ + key, timeout);
  }
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override {
    return base_.add(prefix_ + key, delta);
  }

 private:
  std::string prefix_;
  Store& base_;
};

}  // namespace ina::host
