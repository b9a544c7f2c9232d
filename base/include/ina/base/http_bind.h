// Binding a cpp-httplib server the way ina's listeners must: exclusively. httplib's default
// socket options set SO_REUSEPORT on Linux, so a second ina-controller (or aggregator HTTP
// endpoint) on a busy port started silently and the kernel shared the incoming connections
// between the two processes. Here the listening socket gets SO_REUSEADDR only (a restart binds
// at once past the old connections' TIME_WAIT; a second listener still gets EADDRINUSE), and a
// failed bind is an error naming the address, the port and the reason. The backlog is raised to
// SOMAXCONN: httplib listens with 5, so the 6th of a job's ranks asking the controller at once had
// its SYN dropped and waited for the 1 s SYN retransmission (TcpExtListenOverflows).
// Header only (it needs cpp-httplib, which base does not link): the controller and the
// aggregator's control agent both include it.
#pragma once

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "ina/base/status.h"

namespace ina::http {

inline void exclusive_socket_options(socket_t sock) {
  const int yes = 1;
  (void)setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
}

// Binds `server` to host:port (port 0: any free port) and returns the bound port. `what` names
// the listener and its flag in the error, e.g. "--http-port".
inline Result<int> bind_exclusive(httplib::Server& server, const std::string& host, int port,
                                  const std::string& what) {
  // The listening socket, seen as httplib creates it (the callback runs inside bind_to_*).
  auto fd = std::make_shared<socket_t>(INVALID_SOCKET);
  server.set_socket_options([fd](socket_t sock) {
    exclusive_socket_options(sock);
    *fd = sock;
  });
  errno = 0;
  int bound = -1;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (server.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound > 0) {
    // listen() again on a listening socket sets its backlog (Linux, POSIX).
    if (*fd != INVALID_SOCKET) (void)::listen(*fd, SOMAXCONN);
    return bound;
  }
  const int err = errno;
  std::string msg = what + ": cannot listen on TCP " + host + ":" + std::to_string(port);
  if (err == EADDRINUSE) {
    msg += ": TCP port " + std::to_string(port) +
           " is already in use (another instance running?); stop it or choose another port";
  } else if (err != 0) {
    msg += std::string(": ") + std::strerror(err);
  }
  return Status(StatusCode::kUnavailable, msg);
}

}  // namespace ina::http
