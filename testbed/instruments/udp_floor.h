// The kernel's floor for INA's bytes: what a UDP_SEGMENT sender and a UDP_GRO receiver on
// loopback spend (CPU seconds, user + system) to move datagrams of one size. ina-floor-bench
// prints it alone; ina-bench measures it for its own datagram size and prints every row's CPU
// per GB reduced beside it.
//
// One thread does both ends in turns, so the figure has no wake-up or scheduling cost in it (the
// floor, not a design): it sends a burst of super-datagrams (sendmmsg, UDP_SEGMENT at the
// datagram size, up to 64 KiB each) that fits the receive buffer, then receives the burst
// (recvmmsg, UDP_GRO: one super-datagram per call entry), and reads its own CPU clock around
// each phase. On loopback the kernel delivers the packet to the receiving socket inside the
// sender's system call, so the send phase carries the delivery too, as it does for INA's ranks
// and aggregator. The bytes come from and go to buffers as large as a collective's (a sliding
// window over `span` bytes), so the copies touch memory as INA's do, not one hot cache line.
//
// Per GB reduced: an AllReduce of D bytes over N ranks through one aggregator moves N * D bytes
// up (each rank sends D, the aggregator receives N D) and N * D down (the aggregator sends N D,
// each rank receives D), in datagrams of the job's payload plus the 40-byte header. So the
// ranks' floor and the aggregator's floor are each N * (send + receive cost of D bytes).
#pragma once

#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace bench {

struct UdpFloor {
  size_t datagram = 0;    // bytes of UDP payload per datagram
  uint64_t sent = 0;      // datagrams sent
  uint64_t received = 0;  // datagrams received (sent - received: dropped)
  double send_cpu_s = 0;  // the send phases (delivery on loopback included)
  double recv_cpu_s = 0;  // the receive phases
  bool gso = false;       // UDP_SEGMENT took
  bool gro = false;       // UDP_GRO took
  std::string error;      // empty on success
  // CPU seconds per datagram moved (sent and received once).
  double per_datagram_s() const {
    return received == 0 ? 0 : (send_cpu_s + recv_cpu_s) / static_cast<double>(received);
  }
  // CPU seconds per GB of datagram bytes moved.
  double per_gb_s() const {
    return received == 0 ? 0 : per_datagram_s() * 1e9 / static_cast<double>(datagram);
  }
};

inline double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Moves `count` datagrams of `datagram` bytes (1..65507) from a sender to a receiver socket on
// 127.0.0.1, `span` bytes of buffer on each side.
inline UdpFloor measure_udp_floor(size_t datagram, uint64_t count, size_t span = 16u << 20) {
  UdpFloor f;
  f.datagram = datagram;
  if (datagram < 1 || datagram > 65507) {
    f.error = "datagram size must be 1..65507 bytes";
    return f;
  }
  const int rx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const int tx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  auto fail = [&](const char* what) {
    f.error = std::string(what) + ": " + std::strerror(errno);
    if (rx >= 0) close(rx);
    if (tx >= 0) close(tx);
    return f;
  };
  if (rx < 0 || tx < 0) return fail("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof a;
  if (bind(rx, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return fail("bind");
  if (getsockname(rx, reinterpret_cast<sockaddr*>(&a), &alen) != 0) return fail("getsockname");
  if (connect(tx, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return fail("connect");
  int want = 8 << 20;
  if (setsockopt(rx, SOL_SOCKET, SO_RCVBUFFORCE, &want, sizeof want) != 0)
    setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &want, sizeof want);
  if (setsockopt(tx, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof want) != 0)
    setsockopt(tx, SOL_SOCKET, SO_SNDBUF, &want, sizeof want);
  int rcvbuf = 0;
  socklen_t ilen = sizeof rcvbuf;
  getsockopt(rx, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &ilen);
  const int one = 1;
  f.gro = setsockopt(rx, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
  // Segments per super-datagram: at most 64 and 64 KiB of UDP payload.
  const size_t segs = datagram * 2 <= 65507 ? std::min<size_t>(64, 65507 / datagram) : 1;
  if (segs > 1) {
    const int g = static_cast<int>(datagram);
    f.gso = setsockopt(tx, SOL_UDP, UDP_SEGMENT, &g, sizeof g) == 0;
  }
  const size_t per_msg = f.gso ? segs : 1;
  const size_t msg_bytes = per_msg * datagram;
  // A burst fills at most half the receive buffer (an skb's truesize exceeds its bytes).
  const size_t burst =
      std::clamp<size_t>(static_cast<size_t>(rcvbuf) / 2 / (msg_bytes + 1024), 1, 64);
  span = std::max(span, burst * msg_bytes * 2);
  std::vector<uint8_t> src(span, 0x5A);
  std::vector<uint8_t> dst(span + 65536);
  std::vector<mmsghdr> smsg(burst), rmsg(burst);
  std::vector<iovec> siov(burst), riov(burst);
  struct Cmsg {
    alignas(cmsghdr) char b[CMSG_SPACE(sizeof(int))];
  };
  std::vector<Cmsg> rcm(burst);
  size_t soff = 0;
  size_t roff = 0;
  uint64_t left = count;
  while (left > 0) {
    // Send phase.
    size_t nmsg = 0;
    uint64_t in_burst = 0;
    for (; nmsg < burst && in_burst < left; ++nmsg) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(per_msg, left - in_burst));
      if (soff + k * datagram > span) soff = 0;
      siov[nmsg] = {src.data() + soff, k * datagram};
      smsg[nmsg] = {};
      smsg[nmsg].msg_hdr.msg_iov = &siov[nmsg];
      smsg[nmsg].msg_hdr.msg_iovlen = 1;
      soff += k * datagram;
      in_burst += k;
    }
    double t0 = thread_cpu_s();
    size_t done = 0;
    while (done < nmsg) {
      const int r = sendmmsg(tx, smsg.data() + done, static_cast<unsigned>(nmsg - done), 0);
      if (r < 0) {
        if (errno == EINTR) continue;
        return fail("sendmmsg");
      }
      done += static_cast<size_t>(r);
    }
    double t1 = thread_cpu_s();
    f.send_cpu_s += t1 - t0;
    f.sent += in_burst;
    left -= in_burst;
    // Receive phase: until the socket is empty.
    for (;;) {
      for (size_t i = 0; i < burst; ++i) {
        if (roff + 65536 > span) roff = 0;
        riov[i] = {dst.data() + roff, 65536};
        rmsg[i] = {};
        rmsg[i].msg_hdr.msg_iov = &riov[i];
        rmsg[i].msg_hdr.msg_iovlen = 1;
        rmsg[i].msg_hdr.msg_control = rcm[i].b;
        rmsg[i].msg_hdr.msg_controllen = sizeof rcm[i].b;
        roff += msg_bytes;
      }
      const int r = recvmmsg(rx, rmsg.data(), static_cast<unsigned>(burst), MSG_DONTWAIT, nullptr);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return fail("recvmmsg");
      }
      for (int i = 0; i < r; ++i) {
        const size_t len = rmsg[static_cast<size_t>(i)].msg_len;
        size_t seg = len;
        msghdr& h = rmsg[static_cast<size_t>(i)].msg_hdr;
        for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
          if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
            int g = 0;
            std::memcpy(&g, CMSG_DATA(c), sizeof g);
            if (g > 0) seg = static_cast<size_t>(g);
          }
        }
        f.received += seg == 0 ? 0 : (len + seg - 1) / seg;
      }
    }
    f.recv_cpu_s += thread_cpu_s() - t1;
  }
  // Stragglers the kernel had not queued yet (none expected on loopback): up to 100 ms.
  for (int tries = 0; f.received < f.sent && tries < 100; ++tries) {
    pollfd p{rx, POLLIN, 0};
    if (poll(&p, 1, 1) <= 0) continue;
    const double t = thread_cpu_s();
    char b[65536];
    int g = 0;
    char cm[CMSG_SPACE(sizeof(int))];
    iovec v{b, sizeof b};
    msghdr h{};
    h.msg_iov = &v;
    h.msg_iovlen = 1;
    h.msg_control = cm;
    h.msg_controllen = sizeof cm;
    const ssize_t len = recvmsg(rx, &h, MSG_DONTWAIT);
    if (len > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c))
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) std::memcpy(&g, CMSG_DATA(c), 4);
      const size_t seg = g > 0 ? static_cast<size_t>(g) : static_cast<size_t>(len);
      f.received += (static_cast<size_t>(len) + seg - 1) / seg;
    }
    f.recv_cpu_s += thread_cpu_s() - t;
  }
  close(rx);
  close(tx);
  return f;
}

// Datagrams one rank sends (and receives) for an AllReduce of `bytes` in blocks of
// `payload` bytes.
inline uint64_t datagrams_per_rank(size_t bytes, size_t payload) {
  return payload == 0 ? 0 : (bytes + payload - 1) / payload;
}

}  // namespace bench
