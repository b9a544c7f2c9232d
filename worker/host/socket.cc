#include "worker/host/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <thread>

namespace ina::host {

int ms_until(Clock::time_point deadline) {
  // Rounded up: a wait never ends before its deadline.
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>((left.count() + 999) / 1000, INT_MAX));
}

Result<HostPort> parse_host_port(std::string_view s) {
  HostPort hp;
  std::string_view port_str;
  if (!s.empty() && s.front() == '[') {
    const size_t close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return invalid_argument("'" + std::string(s) + "': expected [v6addr]:port");
    hp.host = std::string(s.substr(1, close - 1));
    port_str = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == std::string_view::npos || colon == 0)
      return invalid_argument("'" + std::string(s) + "': expected host:port");
    hp.host = std::string(s.substr(0, colon));
    port_str = s.substr(colon + 1);
  }
  uint32_t port = 0;
  if (port_str.empty() || port_str.size() > 5) {
    return invalid_argument("'" + std::string(s) + "': bad port");
  }
  for (char c : port_str) {
    if (c < '0' || c > '9') return invalid_argument("'" + std::string(s) + "': bad port");
    port = port * 10 + static_cast<uint32_t>(c - '0');
  }
  if (port > 65535) return invalid_argument("'" + std::string(s) + "': port out of range");
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

namespace {

Status set_nodelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
    return errno_status("setsockopt(TCP_NODELAY)", errno);
  return ok_status();
}

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};

Result<std::unique_ptr<addrinfo, AddrInfoDeleter>> resolve(const std::string& host, uint16_t port,
                                                           bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    return invalid_argument("cannot resolve '" + host + "': " + gai_strerror(rc));
  return std::unique_ptr<addrinfo, AddrInfoDeleter>(res);
}

}  // namespace

void flush_tcp(int fd) { (void)set_nodelay(fd); }

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0;
  }
  return false;
}

bool is_self_connect(int fd) {
  sockaddr_storage local{};
  sockaddr_storage peer{};
  socklen_t llen = sizeof(local);
  socklen_t plen = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) return false;
  return same_endpoint(local, peer);
}

Status set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return errno_status("fcntl(O_NONBLOCK)", errno);
  return ok_status();
}

Result<int> listen_tcp(const std::string& host, uint16_t port, int backlog) {
  INA_ASSIGN_OR_RETURN(auto ai, resolve(host, port, true));
  const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno_status("socket", errno);
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    const int err = errno;
    close(fd);
    return errno_status("bind " + host + ":" + std::to_string(port), err);
  }
  if (listen(fd, backlog) != 0) {
    const int err = errno;
    close(fd);
    return errno_status("listen", err);
  }
  return fd;
}

Result<uint16_t> local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return errno_status("getsockname", errno);
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

Result<uint16_t> free_tcp_port(const std::string& host) {
  INA_ASSIGN_OR_RETURN(int fd, listen_tcp(host, 0, 1));
  Result<uint16_t> port = local_port(fd);
  close(fd);
  return port;
}

Result<int> connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline) {
  INA_ASSIGN_OR_RETURN(auto ai, resolve(host, port, false));
  const std::string name = host + ":" + std::to_string(port);
  Status last;
  bool refused = false;  // `last` holds an attempt's error
  int self_connects = 0;
  for (;;) {
    const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return errno_status("socket", errno);
    int err = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const int n = poll(&p, 1, std::max(ms_until(deadline), 1));
        if (n == 1) {
          socklen_t len = sizeof(err);
          if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        } else {
          err = ETIMEDOUT;
        }
      }
    }
    const bool self = err == 0 && is_self_connect(fd);
    if (self) {
      // Reset, not closed: a close would leave the port in TIME_WAIT, held from the server.
      linger abort{1, 0};
      (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort, sizeof(abort));
    }
    if (err == 0 && !self) {
      Status s = set_nodelay(fd);
      if (!s.ok()) {
        close(fd);
        return s;
      }
      return fd;
    }
    close(fd);
    if (err == 0) {
      // No listener yet, and the kernel picked the destination port as the source port: TCP's
      // simultaneous open connected the socket to itself (ZOOKEEPER-2101, KAFKA-1836). It would
      // hold the port the server is about to bind: dropped, and retried as a refusal is.
      ++self_connects;
    } else {
      last = errno_status("connect " + name, err);
      refused = true;
      // EADDRNOTAVAIL: no ephemeral port free for this destination now (TIME_WAIT), transient.
      if (err != ECONNREFUSED && err != ETIMEDOUT && err != EHOSTUNREACH && err != ENETUNREACH &&
          err != ECONNRESET && err != EAGAIN && err != EADDRNOTAVAIL)
        return last;
    }
    if (Clock::now() >= deadline) {
      std::string why = refused ? last.message() : "";
      if (self_connects > 0) {
        why += (why.empty() ? "" : "; ") + std::to_string(self_connects) + " TCP self-connect" +
               (self_connects > 1 ? "s" : "") + " dropped";
      }
      return deadline_exceeded("connect " + name + ": no listener before the deadline (" + why +
                               ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Result<int> accept_tcp(int listen_fd, Clock::time_point deadline) {
  for (;;) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      Status s = set_nodelay(fd);
      if (!s.ok()) {
        close(fd);
        return s;
      }
      return fd;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      return errno_status("accept", errno);
    const int wait_ms = ms_until(deadline);
    if (wait_ms == 0) return deadline_exceeded("accept: no connection before the deadline");
    pollfd p{listen_fd, POLLIN, 0};
    (void)poll(&p, 1, wait_ms);
  }
}

Status send_all(int fd, const void* buf, size_t n, Clock::time_point deadline,
                std::string_view what) {
  const auto* p = static_cast<const uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::send(fd, p + done, n - done, MSG_NOSIGNAL);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return errno_status(std::string(what), errno);
    const int wait_ms = ms_until(deadline);
    if (wait_ms == 0) return deadline_exceeded(std::string(what) + ": send timed out");
    pollfd pf{fd, POLLOUT, 0};
    (void)poll(&pf, 1, wait_ms);
  }
  return ok_status();
}

Status recv_all(int fd, void* buf, size_t n, Clock::time_point deadline, std::string_view what) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::recv(fd, p + done, n - done, 0);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return unavailable(std::string(what) + ": connection closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_status(std::string(what), errno);
    const int wait_ms = ms_until(deadline);
    if (wait_ms == 0) return deadline_exceeded(std::string(what) + ": receive timed out");
    pollfd pf{fd, POLLIN, 0};
    (void)poll(&pf, 1, wait_ms);
  }
  return ok_status();
}

}  // namespace ina::host
