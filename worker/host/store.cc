#include "worker/host/store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "worker/host/socket.h"

namespace ina::host {

std::string missing_keys_message(const std::vector<std::string>& missing,
                                 std::chrono::milliseconds timeout) {
  std::string m = "store: keys not set within " + std::to_string(timeout.count()) + " ms:";
  for (size_t i = 0; i < missing.size(); ++i) m += (i == 0 ? " " : ", ") + missing[i];
  return m;
}

namespace {

// Polls `check` (which returns the keys still missing) with a growing pause (1 ms .. 20 ms).
template <typename Check>
Status poll_keys(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                 Check check) {
  const auto deadline = Clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    Result<std::vector<std::string>> missing = check(keys);
    if (!missing.ok()) return missing.status();
    if (missing->empty()) return ok_status();
    if (Clock::now() >= deadline) return deadline_exceeded(missing_keys_message(*missing, timeout));
    std::this_thread::sleep_for(
        std::min(pause, std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - Clock::now() + std::chrono::milliseconds(1))));
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

Result<int64_t> parse_counter(const Bytes& b, const std::string& key) {
  const std::string s = to_string(b);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || errno != 0 || end != s.c_str() + s.size())
    return invalid_argument("store: key '" + key + "' does not hold a counter");
  return static_cast<int64_t>(v);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// FileStore

Result<std::unique_ptr<FileStore>> FileStore::create(const std::string& dir) {
  if (dir.empty()) return invalid_argument("FileStore: empty directory");
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return errno_status("mkdir " + dir, errno);
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return invalid_argument("FileStore: '" + dir + "' is not a directory");
  return std::unique_ptr<FileStore>(new FileStore(dir));
}

// Keys map to file names: [A-Za-z0-9_.-] kept, everything else (the '/' of prefixes) as %XX;
// a leading '.' is escaped too so that no key collides with the temporary files.
std::string FileStore::path_of(const std::string& key) const {
  static const char kHex[] = "0123456789ABCDEF";
  std::string name;
  for (size_t i = 0; i < key.size(); ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '_' || c == '-' || (c == '.' && i > 0);
    if (plain) {
      name += static_cast<char>(c);
    } else {
      name += '%';
      name += kHex[c >> 4];
      name += kHex[c & 15];
    }
  }
  return dir_ + "/" + name;
}

bool FileStore::exists(const std::string& key) const {
  return !key.empty() && access(path_of(key).c_str(), F_OK) == 0;
}

Result<Bytes> FileStore::read(const std::string& key) const {
  const std::string path = path_of(key);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status("FileStore: open " + path, errno);
  Bytes out;
  uint8_t buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return errno_status("FileStore: read " + path, err);
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  close(fd);
  return out;
}

Status FileStore::set(const std::string& key, const Bytes& value) {
  if (key.empty()) return invalid_argument("FileStore: empty key");
  // Readers see either no file or the whole value: write a temporary file, then rename it.
  static std::atomic<uint64_t> seq{0};
  const std::string tmp = dir_ + "/.tmp." + std::to_string(getpid()) + "." +
                          std::to_string(seq.fetch_add(1)) + "." +
                          std::to_string(std::random_device{}());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno_status("FileStore: create " + tmp, errno);
  size_t done = 0;
  while (done < value.size()) {
    const ssize_t n = ::write(fd, value.data() + done, value.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return errno_status("FileStore: write " + tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  if (rename(tmp.c_str(), path_of(key).c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return errno_status("FileStore: rename to " + path_of(key), err);
  }
  return ok_status();
}

Status FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  return poll_keys(keys, timeout,
                   [this](const std::vector<std::string>& ks) -> Result<std::vector<std::string>> {
                     std::vector<std::string> missing;
                     for (const auto& k : ks)
                       if (!exists(k)) missing.push_back(k);
                     return missing;
                   });
}

Result<Bytes> FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  INA_RETURN_IF_ERROR(wait({key}, timeout));
  return read(key);
}

Result<int64_t> FileStore::add(const std::string& key, int64_t delta) {
  // Read-modify-write under an exclusive flock on a per-key lock file.
  if (key.empty()) return invalid_argument("FileStore: empty key");
  // The lock file starts with '.', which no key's file name does (a leading '.' is escaped).
  const std::string file = path_of(key);
  const std::string lock_path = dir_ + "/.lock-" + file.substr(dir_.size() + 1);
  const int lfd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lfd < 0) return errno_status("FileStore: open " + lock_path, errno);
  while (flock(lfd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      const int err = errno;
      close(lfd);
      return errno_status("FileStore: flock " + lock_path, err);
    }
  }
  int64_t value = 0;
  Status s;
  if (exists(key)) {
    Result<Bytes> cur = read(key);
    if (!cur.ok()) {
      s = cur.status();
    } else {
      Result<int64_t> v = parse_counter(*cur, key);
      if (v.ok())
        value = *v;
      else
        s = v.status();
    }
  }
  if (s.ok()) {
    value += delta;
    s = set(key, to_bytes(std::to_string(value)));
  }
  flock(lfd, LOCK_UN);
  close(lfd);
  if (!s.ok()) return s;
  return value;
}

// ---------------------------------------------------------------------------------------------
// TcpStore wire format. Every message is framed as [u32 length][body]. Requests:
//   SET   [u8 1][u32 klen][key][value...]             reply [u8 0]
//   GET   [u8 2][u32 klen][key]                       reply [u8 found][value...]
//   ADD   [u8 3][u64 delta][u32 klen][key]            reply [u8 0|1][u64 new value] (1: not a
//   counter) CHECK [u8 4]([u32 klen][key])*                    reply [u8 0]([u32 index of a missing
//   key])*
// Integers are little-endian. A malformed request closes that client's connection.

namespace {
constexpr uint8_t kOpSet = 1, kOpGet = 2, kOpAdd = 3, kOpCheck = 4;
// How long the server retries a bind that finds its port taken (see Server::start).
constexpr std::chrono::milliseconds kBindRetry{2000};
constexpr uint32_t kMaxFrame = 64u << 20;

void append_u32(Bytes& b, uint32_t v) {
  uint8_t t[4];
  put_u32(t, v);
  b.insert(b.end(), t, t + 4);
}
void append_u64(Bytes& b, uint64_t v) {
  uint8_t t[8];
  put_u64(t, v);
  b.insert(b.end(), t, t + 8);
}
void append_str(Bytes& b, const std::string& s) {
  append_u32(b, static_cast<uint32_t>(s.size()));
  b.insert(b.end(), s.begin(), s.end());
}
// Reads [u32 len][bytes] at *pos; false when truncated.
bool take_str(const Bytes& b, size_t* pos, std::string* out) {
  if (*pos + 4 > b.size()) return false;
  const uint32_t n = get_u32(b.data() + *pos);
  if (*pos + 4 + n > b.size()) return false;
  out->assign(reinterpret_cast<const char*>(b.data()) + *pos + 4, n);
  *pos += 4 + n;
  return true;
}
}  // namespace

class TcpStore::Server {
 public:
  static Result<std::unique_ptr<Server>> start(const std::string& host, uint16_t port,
                                               std::chrono::milliseconds timeout) {
    // A client that retries its connect before this server listens may hold the port for an
    // instant: connected to itself (a TCP self-connect on a port of the ephemeral range), which
    // connect_tcp detects and resets at once. A bind that meets it is retried for a short while;
    // a port that another program holds stays an error.
    const auto bind_deadline = Clock::now() + std::min(timeout, kBindRetry);
    Result<int> bound = listen_tcp(host, port, 1024);
    while (!bound.ok() && bound.status().code() == StatusCode::kAlreadyExists && port != 0 &&
           Clock::now() < bind_deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      bound = listen_tcp(host, port, 1024);
    }
    INA_ASSIGN_OR_RETURN(int fd, bound);
    auto s = std::unique_ptr<Server>(new Server());
    s->listen_fd_ = fd;
    Result<uint16_t> p = local_port(fd);
    if (!p.ok()) return p.status();
    s->port_ = *p;
    if (pipe2(s->wake_, O_CLOEXEC | O_NONBLOCK) != 0) return errno_status("pipe2", errno);
    s->thread_ = std::thread([raw = s.get()] { raw->run(); });
    return s;
  }
  ~Server() {
    if (thread_.joinable()) {
      const char c = 0;
      (void)!::write(wake_[1], &c, 1);
      thread_.join();
    }
    for (auto& c : clients_) close(c.fd);
    if (listen_fd_ >= 0) close(listen_fd_);
    if (wake_[0] >= 0) close(wake_[0]);
    if (wake_[1] >= 0) close(wake_[1]);
  }
  uint16_t port() const { return port_; }

 private:
  struct Client {
    int fd = -1;
    Bytes in;
    Bytes out;
    size_t out_done = 0;
  };

  Server() = default;

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake_[0], POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      for (auto& c : clients_)
        fds.push_back(
            {c.fd, static_cast<short>(POLLIN | (c.out.size() > c.out_done ? POLLOUT : 0)), 0});
      if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
      if (fds[0].revents) return;  // stop
      if (fds[1].revents & POLLIN) {
        for (;;) {
          const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (fd < 0) break;
          clients_.push_back(Client{fd, {}, {}, 0});
        }
      }
      // clients_ may have grown: only the first (fds.size() - 2) were polled.
      std::vector<bool> dead(clients_.size(), false);
      for (size_t i = 2; i < fds.size(); ++i) {
        Client& c = clients_[i - 2];
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) dead[i - 2] = !read_client(c);
        if (!dead[i - 2] && c.out.size() > c.out_done) dead[i - 2] = !flush_client(c);
      }
      for (size_t i = clients_.size(); i-- > 0;) {
        if (dead[i]) {
          close(clients_[i].fd);
          clients_.erase(clients_.begin() + static_cast<ptrdiff_t>(i));
        }
      }
    }
  }

  // Reads what is there and serves every complete request; false: drop the client.
  bool read_client(Client& c) {
    uint8_t buf[65536];
    for (;;) {
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n > 0) {
        c.in.insert(c.in.end(), buf, buf + n);
        continue;
      }
      if (n == 0) return false;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    size_t pos = 0;
    while (c.in.size() - pos >= 4) {
      const uint32_t len = get_u32(c.in.data() + pos);
      if (len == 0 || len > kMaxFrame) return false;
      if (c.in.size() - pos - 4 < len) break;
      Bytes req(c.in.begin() + static_cast<ptrdiff_t>(pos + 4),
                c.in.begin() + static_cast<ptrdiff_t>(pos + 4 + len));
      pos += 4 + len;
      Bytes reply;
      if (!serve(req, &reply)) return false;
      append_u32(c.out, static_cast<uint32_t>(reply.size()));
      c.out.insert(c.out.end(), reply.begin(), reply.end());
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(pos));
    return true;
  }

  bool flush_client(Client& c) {
    while (c.out_done < c.out.size()) {
      const ssize_t n = send(c.fd, c.out.data() + c.out_done, c.out.size() - c.out_done,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out_done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      return false;
    }
    c.out.clear();
    c.out_done = 0;
    return true;
  }

  bool serve(const Bytes& req, Bytes* reply) {
    size_t pos = 1;
    std::string key;
    switch (req[0]) {
      case kOpSet:
        if (!take_str(req, &pos, &key)) return false;
        map_[key] = Bytes(req.begin() + static_cast<ptrdiff_t>(pos), req.end());
        reply->push_back(0);
        return true;
      case kOpGet: {
        if (!take_str(req, &pos, &key)) return false;
        auto it = map_.find(key);
        reply->push_back(it != map_.end() ? 1 : 0);
        if (it != map_.end()) reply->insert(reply->end(), it->second.begin(), it->second.end());
        return true;
      }
      case kOpAdd: {
        if (req.size() < 9) return false;
        const auto delta = static_cast<int64_t>(get_u64(req.data() + 1));
        pos = 9;
        if (!take_str(req, &pos, &key)) return false;
        int64_t value = 0;
        auto it = map_.find(key);
        if (it != map_.end()) {
          Result<int64_t> v = parse_counter(it->second, key);
          if (!v.ok()) {
            reply->push_back(1);
            append_u64(*reply, 0);
            return true;
          }
          value = *v;
        }
        value += delta;
        map_[key] = to_bytes(std::to_string(value));
        reply->push_back(0);
        append_u64(*reply, static_cast<uint64_t>(value));
        return true;
      }
      case kOpCheck: {
        reply->push_back(0);
        for (uint32_t index = 0; pos < req.size(); ++index) {
          if (!take_str(req, &pos, &key)) return false;
          if (map_.find(key) == map_.end()) append_u32(*reply, index);
        }
        return true;
      }
      default: return false;
    }
  }

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  uint16_t port_ = 0;
  std::thread thread_;
  std::vector<Client> clients_;
  std::map<std::string, Bytes> map_;
};

Result<std::unique_ptr<TcpStore>> TcpStore::create(const TcpStoreOptions& opts) {
  auto store = std::unique_ptr<TcpStore>(new TcpStore());
  store->port_ = opts.port;
  std::string connect_host = opts.host;
  if (opts.is_server) {
    INA_ASSIGN_OR_RETURN(store->server_, Server::start(opts.host, opts.port, opts.connect_timeout));
    store->port_ = store->server_->port();
    if (connect_host.empty() || connect_host == "0.0.0.0") connect_host = "127.0.0.1";
  }
  INA_ASSIGN_OR_RETURN(
      store->fd_, connect_tcp(connect_host, store->port_, Clock::now() + opts.connect_timeout));
  return store;
}

Result<std::unique_ptr<TcpStore>> TcpStore::from_env(int rank, std::chrono::milliseconds timeout) {
  TcpStoreOptions opts;
  opts.connect_timeout = timeout;
  opts.is_server = rank == 0;
  if (const char* s = std::getenv("INA_STORE"); s != nullptr && *s != '\0') {
    Result<HostPort> hp = parse_host_port(s);
    if (!hp.ok()) return invalid_argument("INA_STORE: " + hp.status().message());
    opts.host = hp->host;
    opts.port = hp->port;
  } else {
    const char* addr = std::getenv("MASTER_ADDR");
    const char* port = std::getenv("MASTER_PORT");
    if (addr == nullptr || port == nullptr)
      return invalid_argument(
          "no rendezvous store: set INA_STORE=host:port or MASTER_ADDR and MASTER_PORT");
    Result<HostPort> hp = parse_host_port(std::string(addr) + ":" + port);
    if (!hp.ok()) return invalid_argument("MASTER_ADDR/MASTER_PORT: " + hp.status().message());
    opts.host = hp->host;
    opts.port = hp->port;
  }
  return create(opts);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) close(fd_);
  server_.reset();
}

Result<Bytes> TcpStore::call(const Bytes& request, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto deadline = Clock::now() + timeout;
  uint8_t len[4];
  put_u32(len, static_cast<uint32_t>(request.size()));
  INA_RETURN_IF_ERROR(send_all(fd_, len, 4, deadline, "store server"));
  INA_RETURN_IF_ERROR(send_all(fd_, request.data(), request.size(), deadline, "store server"));
  INA_RETURN_IF_ERROR(recv_all(fd_, len, 4, deadline, "store server"));
  const uint32_t n = get_u32(len);
  if (n == 0 || n > kMaxFrame) return internal_error("store server: bad reply length");
  Bytes reply(n);
  INA_RETURN_IF_ERROR(recv_all(fd_, reply.data(), n, deadline, "store server"));
  return reply;
}

namespace {
constexpr std::chrono::milliseconds kCallTimeout{30000};
}

Status TcpStore::set(const std::string& key, const Bytes& value) {
  Bytes req{kOpSet};
  append_str(req, key);
  req.insert(req.end(), value.begin(), value.end());
  INA_ASSIGN_OR_RETURN(Bytes reply, call(req, kCallTimeout));
  (void)reply;
  return ok_status();
}

Result<std::vector<std::string>> TcpStore::missing(const std::vector<std::string>& keys,
                                                   std::chrono::milliseconds timeout) {
  Bytes req{kOpCheck};
  for (const auto& k : keys) append_str(req, k);
  INA_ASSIGN_OR_RETURN(Bytes reply, call(req, timeout));
  std::vector<std::string> out;
  for (size_t pos = 1; pos + 4 <= reply.size(); pos += 4) {
    const uint32_t i = get_u32(reply.data() + pos);
    if (i >= keys.size()) return internal_error("store server: bad key index");
    out.push_back(keys[i]);
  }
  return out;
}

Status TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  return poll_keys(keys, timeout, [this](const std::vector<std::string>& ks) {
    return missing(ks, kCallTimeout);
  });
}

Result<Bytes> TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  INA_RETURN_IF_ERROR(wait({key}, timeout));
  Bytes req{kOpGet};
  append_str(req, key);
  INA_ASSIGN_OR_RETURN(Bytes reply, call(req, kCallTimeout));
  if (reply[0] != 1) return internal_error("store: key '" + key + "' vanished");
  return Bytes(reply.begin() + 1, reply.end());
}

Result<int64_t> TcpStore::add(const std::string& key, int64_t delta) {
  Bytes req{kOpAdd};
  append_u64(req, static_cast<uint64_t>(delta));
  append_str(req, key);
  INA_ASSIGN_OR_RETURN(Bytes reply, call(req, kCallTimeout));
  if (reply.size() != 9) return internal_error("store server: bad ADD reply");
  if (reply[0] != 0) return invalid_argument("store: key '" + key + "' does not hold a counter");
  return static_cast<int64_t>(get_u64(reply.data() + 1));
}

// ---------------------------------------------------------------------------------------------
// PrefixStore

Status PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(prefix_ + k);
  return base_.wait(full, timeout);
}

Status ExternalStoreAdapter::wait(const std::vector<std::string>& keys,
                                  std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    const auto left =
        std::max(std::chrono::milliseconds(0),
                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    Result<Bytes> v = store_.get(k, left);
    if (v.ok()) continue;
    if (v.status().code() != StatusCode::kDeadlineExceeded) return v.status();
    missing.push_back(k);
  }
  if (!missing.empty()) return deadline_exceeded(missing_keys_message(missing, timeout));
  return ok_status();
}

Result<int64_t> ExternalStoreAdapter::add(const std::string& key, int64_t) {
  return unimplemented("external store: add('" + key +
                       "') is not offered by Config::external_store");
}

}  // namespace ina::host
