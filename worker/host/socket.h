// Small TCP helpers shared by the rendezvous store and the peer mesh: address parsing, listening,
// connecting with retry until a deadline, and whole-buffer I/O on non-blocking sockets bounded by
// a deadline. Every function returns a Status; none blocks past its deadline.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ina/base/status.h"

namespace ina::host {

using Clock = std::chrono::steady_clock;

// Milliseconds left until `deadline` (0 when past), clamped to an int for poll(2).
int ms_until(Clock::time_point deadline);

struct HostPort {
  std::string host;
  uint16_t port = 0;
};
// "host:port" or "[v6]:port". Names the input on error.
Result<HostPort> parse_host_port(std::string_view s);

// A non-blocking IPv4/IPv6 listening socket bound to host:port (port 0: ephemeral).
Result<int> listen_tcp(const std::string& host, uint16_t port, int backlog);
// The port a bound socket listens on.
Result<uint16_t> local_port(int fd);
// A TCP port on `host` that was free a moment ago (bound to port 0, read back, closed), for a
// tool or test that must name a port before its listener starts (a rendezvous store). Racy by
// nature: another process may take it in between.
Result<uint16_t> free_tcp_port(const std::string& host);
// Connects to host:port, retrying refused/unreachable attempts every few ms until `deadline`.
// Returns a non-blocking socket with TCP_NODELAY. A connection to itself (a TCP self-connect: no
// listener on a port of the ephemeral range, which the kernel picked as the source port too) is
// dropped and retried, never returned.
Result<int> connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline);
// Accepts one connection (non-blocking, TCP_NODELAY) or fails at `deadline`.
Result<int> accept_tcp(int listen_fd, Clock::time_point deadline);

// Two socket addresses with the same family, address and port.
bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b);
// A connected TCP socket whose local and peer addresses are the same: a self-connect.
bool is_self_connect(int fd);

Status set_nonblocking(int fd);
// Sends now whatever the kernel holds back of what was written (TCP_NODELAY set again: tcp(7)
// "forces an explicit flush of pending output"). Linux's autocorking keeps a write's last,
// partial segment while an earlier one of the socket still waits in a queue below TCP (a qdisc,
// the NIC's ring); when the link is the bottleneck that queue is long and the tail waits for it
// to drain. Best effort: a failure only leaves the tail to the kernel.
void flush_tcp(int fd);
// The message size from which a framed message (the mesh's, the NCCL plugin's net) is worth a
// flush_tcp once the kernel has it whole. The kernel cuts a write into buffers of up to about
// 64 KiB (less under pacing); a smaller message is one buffer, and for it the extra system call
// would weigh against its copy. 8 ranks on 1 Gbit/s links (tbf), AllToAll of 512 KiB per rank:
// 64 KiB + 8 bytes per pair, whose last 384 bytes waited 2-4 ms; 6.3-6.8 ms a call, 3.95-4.0 ms
// flushed (the busiest link's bound 3.84).
inline constexpr size_t kFlushFrom = 8 << 10;
// Writes/reads exactly n bytes on a non-blocking socket, polling until `deadline`. `what` names
// the peer in errors ("store server", "rank 3").
Status send_all(int fd, const void* buf, size_t n, Clock::time_point deadline,
                std::string_view what);
Status recv_all(int fd, void* buf, size_t n, Clock::time_point deadline, std::string_view what);

// Little-endian fixed-width coding for the store's and the mesh's framing.
inline void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}
inline uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

}  // namespace ina::host
