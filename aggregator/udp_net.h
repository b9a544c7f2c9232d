// Kernel UDP sockets of the aggregator's UDP backend (pure setup, no packet loop): addresses, bound
// sockets with big buffers, the SO_REUSEPORT group's steering program, a rank's address and the
// cmsg buffer of UDP GRO/GSO.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "aggregator/engine.h"
#include "ina/protocol/status.h"

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace ina::agg::udp {

inline constexpr size_t kMaxUdpPayload = 65507;  // 65535 - IPv4 header - UDP header

// Control buffer big enough for one UDP_GRO (int) or UDP_SEGMENT (uint16) cmsg, aligned for it.
union CmsgBuf {
  char buf[CMSG_SPACE(sizeof(int))];
  cmsghdr align;
};

// Where a rank's valid packets come from (learned by the loop).
struct Peer {
  sockaddr_in addr{};
  bool known = false;
};

inline bool same_addr(const sockaddr_in& a, const sockaddr_in& b) {
  return a.sin_port == b.sin_port && a.sin_addr.s_addr == b.sin_addr.s_addr;
}
std::string format_addr(const sockaddr_in& sa);
// An IPv4 address or host name (empty: any) and a port.
Result<sockaddr_in> resolve_ipv4(const std::string& host, uint16_t port);
// A leaf job's parent: "host:port" (IPv4 address or host name, port 1..65535).
Result<sockaddr_in> resolve_parent(const JobConfig& j);
// A bound UDP socket with big buffers; `reuseport` joins the port's SO_REUSEPORT group. A busy
// port is kUnavailable, naming the port and --port.
Result<int> bound_socket(const sockaddr_in& sa, bool reuseport);

// The thread (of `lanes`) that owns a slot: runs of wire::kSlotRun consecutive slots in turn, so
// that a sender's GSO train, cut at run boundaries, is one thread's whole.
inline unsigned lane_of_slot(uint16_t slot, unsigned lanes) {
  return (slot / wire::kSlotRun) % lanes;
}
// Attaches to `fd`'s SO_REUSEPORT group the classic BPF program that steers each datagram to the
// socket of lane_of_slot(its header's slot).
Status attach_steering(int fd, unsigned lanes);

}  // namespace ina::agg::udp
