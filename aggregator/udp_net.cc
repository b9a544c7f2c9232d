// Kernel UDP sockets of the aggregator (see udp_net.h).
#include "aggregator/udp_net.h"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <netdb.h>
#include <unistd.h>

#include <bit>
#include <cerrno>

#ifndef SO_ATTACH_REUSEPORT_CBPF
#define SO_ATTACH_REUSEPORT_CBPF 51
#endif

namespace ina::agg::udp {
namespace {

constexpr int kSocketBufBytes = 8 << 20;  // SO_RCVBUF/SO_SNDBUF target

// Best effort: as root SO_*BUFFORCE passes net.core.[rw]mem_max; otherwise the kernel caps it.
void grow_socket_buffer(int fd, int force_opt, int opt) {
  const int want = kSocketBufBytes;
  if (setsockopt(fd, SOL_SOCKET, force_opt, &want, sizeof want) != 0) {
    (void)setsockopt(fd, SOL_SOCKET, opt, &want, sizeof want);
  }
}

}  // namespace

std::string format_addr(const sockaddr_in& sa) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(sa.sin_port));
}

Result<sockaddr_in> resolve_ipv4(const std::string& host, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  if (host.empty()) {
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    return sa;
  }
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) == 1) return sa;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return invalid_argument("bind host '" + host + "': " + gai_strerror(rc));
  }
  sa.sin_addr = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return sa;
}

Result<sockaddr_in> resolve_parent(const JobConfig& j) {
  const std::string& text = j.tree.parent;
  const std::string what = "udp: job " + std::to_string(j.job) + ": parent '" + text + "'";
  const size_t c = text.rfind(':');
  if (c == std::string::npos || c == 0 || c + 1 == text.size()) {
    return invalid_argument(what + " is not host:port");
  }
  const std::string port_text = text.substr(c + 1);
  if (port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos) {
    return invalid_argument(what + ": port must be a number in 1..65535");
  }
  const unsigned long port = std::stoul(port_text);
  if (port < 1 || port > 65535) return invalid_argument(what + ": port must be in 1..65535");
  Result<sockaddr_in> sa = resolve_ipv4(text.substr(0, c), static_cast<uint16_t>(port));
  if (!sa.ok()) return invalid_argument(what + ": " + sa.status().message());
  return sa;
}

// The program: socket index = lane_of_slot(slot), the slot read from the INA header (the program
// sees the UDP payload; loads are big-endian like the wire). A datagram too short for the load
// makes the program return 0: lane 0, whose Engine counts it.
Status attach_steering(int fd, unsigned lanes) {
  static_assert(std::has_single_bit(unsigned{wire::kSlotRun}), "a shift divides by the run");
  sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_H | BPF_ABS, static_cast<uint32_t>(wire::kOffSlot)),
      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, wire::kMaxSlot),
      BPF_STMT(BPF_ALU | BPF_RSH | BPF_K,
               static_cast<uint32_t>(std::countr_zero(unsigned{wire::kSlotRun}))),
      BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, lanes),
      BPF_STMT(BPF_RET | BPF_A, 0),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
  if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) != 0) {
    return errno_status("udp: SO_ATTACH_REUSEPORT_CBPF", errno);
  }
  return ok_status();
}

Result<int> bound_socket(const sockaddr_in& sa, bool reuseport) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno_status("udp: socket", errno);
  const int one = 1;
  if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
    const int err = errno;
    ::close(fd);
    return errno_status("udp: SO_REUSEPORT", err);
  }
  grow_socket_buffer(fd, SO_RCVBUFFORCE, SO_RCVBUF);
  grow_socket_buffer(fd, SO_SNDBUFFORCE, SO_SNDBUF);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EADDRINUSE) {
      return Status(StatusCode::kUnavailable,
                    "udp: bind " + format_addr(sa) + ": UDP port " +
                        std::to_string(ntohs(sa.sin_port)) +
                        " is already in use (another ina-aggregator?); stop it or choose another "
                        "--port");
    }
    return errno_status("udp: bind " + format_addr(sa), err);
  }
  return fd;
}

}  // namespace ina::agg::udp
