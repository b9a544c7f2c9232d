#include "worker/host/mesh_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ina::host {
namespace {

std::string numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

}  // namespace

Result<std::string> source_address_towards(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port == 0 ? 1 : port);
  const int rc = getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    return unavailable("cannot resolve '" + host + "': " + gai_strerror(rc));
  Status last = unavailable("no address of '" + host + "'");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = errno_status("socket", errno);
      continue;
    }
    // connect() on a UDP socket sends nothing: it picks the route and the source address.
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      last = errno_status("no route to " + host, errno);
      close(fd);
      continue;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    const int g = getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
    const int err = errno;
    close(fd);
    if (g != 0) {
      last = errno_status("getsockname", err);
      continue;
    }
    freeaddrinfo(res);
    return numeric(reinterpret_cast<const sockaddr*>(&local));
  }
  freeaddrinfo(res);
  return last;
}

Result<std::string> interface_address(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return errno_status("getifaddrs", errno);
  bool found = false;
  std::string v4;
  std::string v6;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_name == nullptr || ifname != i->ifa_name) continue;
    found = true;
    if (i->ifa_addr == nullptr) continue;
    if (i->ifa_addr->sa_family == AF_INET && v4.empty()) {
      v4 = numeric(i->ifa_addr);
    } else if (i->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      const auto* a6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (!IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) v6 = numeric(i->ifa_addr);
    }
  }
  freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  if (!found) {
    return invalid_argument("INA_SOCKET_IFNAME=\"" + ifname +
                            "\": no such network interface on this host");
  }
  return invalid_argument("INA_SOCKET_IFNAME=\"" + ifname +
                          "\": the interface has no IPv4 or global IPv6 address");
}

Result<MeshAddress> find_mesh_address(const MeshAddressInputs& in) {
  if (!in.mesh_addr.empty()) return MeshAddress{in.mesh_addr, "INA_MESH_ADDR"};
  if (!in.ifname.empty()) {
    INA_ASSIGN_OR_RETURN(std::string a, interface_address(in.ifname));
    return MeshAddress{a, "INA_SOCKET_IFNAME=" + in.ifname};
  }
  if (!in.store_host.empty()) {
    Result<std::string> a = source_address_towards(in.store_host, in.store_port);
    if (a.ok()) return MeshAddress{*a, "the route to the store's host " + in.store_host};
    return MeshAddress{"127.0.0.1", "no route to the store's host " + in.store_host + " (" +
                                        a.status().message() + ")"};
  }
  return MeshAddress{"127.0.0.1", "no store host to route to"};
}

}  // namespace ina::host
