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
#include "ina/base/status.h"

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

// Whether an idle lane polls or sleeps (udp_lane.h): it polls for up to `spin_ns` after the last
// datagram or handoff, unless the traffic is dense: the last window of about `spin_ns` held a
// datagram every kDenseGapNs or more often. A stream's wake-ups each take a batch, so polling
// there buys nothing, and it costs: a lane that keeps yielding stays runnable, its virtual runtime
// grows, and it loses the preemption a sleeping lane gets when its next datagram arrives (on the
// 2-core VM, polling after dense traffic too took 8 workers at 500 Mbit/s from 289-308 ms per
// 16 MiB to 307-343). A small collective's few blocks, sparse, each pay a whole wake-up. Pure:
// the caller passes the time (monotonic ns).
class SpinGate {
 public:
  static constexpr uint64_t kDenseGapNs = 5000;

  explicit SpinGate(uint64_t spin_ns) : spin_ns_(spin_ns) {}
  // `items` datagrams or handoffs were taken at `now`.
  void on_traffic(uint64_t now, uint64_t items) {
    last_ = now;
    count_ += items;
    const uint64_t span = now - window_start_;
    if (span >= spin_ns_) {
      dense_ = count_ * kDenseGapNs > span;
      window_start_ = now;
      count_ = 0;
    }
  }
  // Nothing to do at `now`: true to poll again, false to sleep.
  bool poll(uint64_t now) const { return spin_ns_ != 0 && !dense_ && now - last_ < spin_ns_; }
  bool enabled() const { return spin_ns_ != 0; }
  bool dense() const { return dense_; }

 private:
  uint64_t spin_ns_;
  uint64_t last_ = 0;
  uint64_t window_start_ = 0;
  uint64_t count_ = 0;
  bool dense_ = false;
};

}  // namespace ina::agg::udp
