#include "worker/transport/udp_transport.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "ina/base/log.h"
#include "ina/protocol/wire.h"

namespace ina::worker {
namespace {

// The kernel's UDP_MAX_SEGMENTS was 64 until 6.x raised it; 64 is safe everywhere.
constexpr size_t kMaxGsoSegments = 64;
// Consecutive attempts on a full socket buffer before the rest of a batch counts as lost.
constexpr int kMaxBlockedAttempts = 3;
constexpr int kBlockedPollMs = 10;

void set_buffer(int fd, int force_opt, int opt, int bytes) {
  // SO_*BUFFORCE ignores the rmem_max/wmem_max ceiling but needs CAP_NET_ADMIN; without it the
  // plain option is clamped by the kernel. Both are best effort: a small buffer costs
  // retransmissions, not correctness.
  if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof bytes) == 0) return;
  (void)setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof bytes);
}

std::string numeric_name(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) !=
      0) {
    return "?";
  }
  std::string s;
  if (sa->sa_family == AF_INET6) {
    s = "[";
    s += host;
    s += "]";
  } else {
    s = host;
  }
  s += ':';
  s += serv;
  return s;
}

}  // namespace

Result<std::unique_ptr<UdpTransport>> UdpTransport::create(const UdpTransportOptions& opts) {
  std::unique_ptr<UdpTransport> t(new UdpTransport());
  INA_RETURN_IF_ERROR(t->init(opts));
  return t;
}

UdpTransport::~UdpTransport() {
  if (fd_ >= 0) ::close(fd_);
}

Status UdpTransport::init(const UdpTransportOptions& opts) {
  if (opts.batch == 0) return invalid_argument("UdpTransportOptions.batch must be >= 1");
  batch_ = opts.batch;

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_protocol = IPPROTO_UDP;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(opts.port);
  const int gai = getaddrinfo(opts.host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) {
    std::string m = "cannot resolve aggregator host \"" + opts.host + "\" (INA_AGGREGATOR): ";
    m += gai == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(gai);
    // A name that does not exist is a configuration error; a resolver that is down is not.
    if (gai == EAI_AGAIN || gai == EAI_FAIL || gai == EAI_SYSTEM) return unavailable(std::move(m));
    return invalid_argument(std::move(m));
  }
  Status last = unavailable("aggregator host \"" + opts.host + "\" has no usable address");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last =
          errno_status("socket for aggregator " + numeric_name(ai->ai_addr, ai->ai_addrlen), errno);
      continue;
    }
    // Connecting a UDP socket sends nothing; it fixes the peer (so send needs no address and
    // ICMP errors are reported to us) and filters datagrams from anyone else.
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      last =
          errno_status("connect to aggregator " + numeric_name(ai->ai_addr, ai->ai_addrlen), errno);
      ::close(fd);
      continue;
    }
    fd_ = fd;
    peer_name_ = numeric_name(ai->ai_addr, ai->ai_addrlen);
    break;
  }
  freeaddrinfo(res);
  if (fd_ < 0) return last;
  if (peer_name_.rfind(opts.host, 0) != 0 && opts.host.find(':') == std::string::npos) {
    peer_name_ = opts.host + " (" + peer_name_ + ")";
  }

  sockaddr_storage local{};
  socklen_t local_len = sizeof local;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &local_len) == 0) {
    if (local.ss_family == AF_INET) {
      local_port_ = ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
    } else if (local.ss_family == AF_INET6) {
      local_port_ = ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
    }
  }

  // The largest datagram that crosses the path to the aggregator in one piece: the route's MTU
  // (IP_MTU, IPV6_MTU on the connected socket) less the IP and UDP headers. Blocks are sized to
  // it (IncEngine::join): a fragmented datagram costs the kernel more per byte and loses all of
  // itself with any one fragment, and UDP GSO refuses segments beyond it.
  int mtu = 0;
  socklen_t mtu_len = sizeof mtu;
  if (local.ss_family == AF_INET && getsockopt(fd_, IPPROTO_IP, IP_MTU, &mtu, &mtu_len) == 0 &&
      mtu > 28) {
    max_datagram_ = std::min<size_t>(kMaxUdpPayload, static_cast<size_t>(mtu) - 28);
  } else if (local.ss_family == AF_INET6 &&
             getsockopt(fd_, IPPROTO_IPV6, IPV6_MTU, &mtu, &mtu_len) == 0 && mtu > 48) {
    max_datagram_ = std::min<size_t>(kMaxUdpPayload, static_cast<size_t>(mtu) - 48);
  }

  set_buffer(fd_, SO_SNDBUFFORCE, SO_SNDBUF, opts.socket_buffer_bytes);
  set_buffer(fd_, SO_RCVBUFFORCE, SO_RCVBUF, opts.socket_buffer_bytes);

  const int one = 1;
  if (opts.gro && setsockopt(fd_, SOL_UDP, UDP_GRO, &one, sizeof one) == 0) gro_on_ = true;
  if (opts.gso) {
    // Probe: kernels without UDP GSO answer ENOPROTOOPT. The size itself goes per message.
    int gso_size = 0;
    socklen_t len = sizeof gso_size;
    gso_on_ = getsockopt(fd_, SOL_UDP, UDP_SEGMENT, &gso_size, &len) == 0;
  }

  // Receive buffers: untouched memory until the kernel writes into it (new[] without
  // value-initialization), so a communicator that never sees large bursts costs no RSS.
  rx_storage_.reset(new uint8_t[size_t{batch_} * kRxBufferSize]);
  rx_ctrl_words_ = (CMSG_SPACE(sizeof(int)) + sizeof(uint64_t) - 1) / sizeof(uint64_t);
  rx_ctrl_.assign(size_t{batch_} * rx_ctrl_words_, 0);
  rx_msgs_.assign(batch_, mmsghdr{});
  rx_iov_.assign(batch_, iovec{});
  for (size_t i = 0; i < batch_; ++i) {
    rx_iov_[i].iov_base = rx_storage_.get() + i * kRxBufferSize;
    rx_iov_[i].iov_len = kRxBufferSize;
    msghdr& h = rx_msgs_[i].msg_hdr;
    h.msg_iov = &rx_iov_[i];
    h.msg_iovlen = 1;
  }

  const size_t tx_ctrl_words =
      (CMSG_SPACE(sizeof(uint16_t)) + sizeof(uint64_t) - 1) / sizeof(uint64_t);
  tx_msgs_.assign(batch_, mmsghdr{});
  tx_iov_.assign(size_t{batch_} * kMaxGsoSegments * 2, iovec{});
  tx_ctrl_.assign(size_t{batch_} * tx_ctrl_words, 0);
  tx_pkts_per_msg_.assign(batch_, 0);

  INA_DEBUG("worker", "udp transport to %s: local port %u, gro %s, gso %s", peer_name_.c_str(),
            local_port_, gro_on_ ? "on" : "off", gso_on_ ? "on" : "off");
  return ok_status();
}

namespace {

// A datagram's header (what wire::slot_run_of reads) and its iovecs, for either kind of datagram.
std::span<const uint8_t> head_of(std::span<const uint8_t> p) { return p; }
std::span<const uint8_t> head_of(const GatherDatagram& g) { return g.head; }
size_t put_iov(std::span<const uint8_t> p, iovec* iov) {
  iov->iov_base = const_cast<uint8_t*>(p.data());
  iov->iov_len = p.size();
  return 1;
}
size_t put_iov(const GatherDatagram& g, iovec* iov) {
  size_t n = put_iov(g.head, iov);
  if (!g.body.empty()) n += put_iov(g.body, iov + n);
  return n;
}

}  // namespace

template <class P>
long UdpTransport::send_some(std::span<const P> pkts, size_t from) {
  const size_t tx_ctrl_words = tx_ctrl_.size() / batch_;
  size_t m = 0;
  size_t iov_used = 0;
  size_t i = from;
  while (m < batch_ && i < pkts.size()) {
    const size_t sz = pkts[i].size();
    size_t run = 1;
    if (gso_on_ && sz > 0) {
      // All segments but the last must be exactly gso_size; we only group equal sizes, and at
      // most 64 KiB of payload in all (the super-datagram is one UDP datagram until segmented).
      // A train also stays within one run of wire::kSlotRun slots: a multi-threaded aggregator's
      // kernel places a train by its first datagram, and each of its threads owns whole runs.
      const size_t max_run = std::min(kMaxGsoSegments, kMaxUdpPayload / sz);
      const uint16_t slot_run = wire::slot_run_of(head_of(pkts[i]));
      while (i + run < pkts.size() && run < max_run && pkts[i + run].size() == sz &&
             wire::slot_run_of(head_of(pkts[i + run])) == slot_run) {
        ++run;
      }
    }
    msghdr& h = tx_msgs_[m].msg_hdr;
    h = msghdr{};
    size_t iovs = 0;
    for (size_t k = 0; k < run; ++k) iovs += put_iov(pkts[i + k], &tx_iov_[iov_used + iovs]);
    h.msg_iov = &tx_iov_[iov_used];
    h.msg_iovlen = iovs;
    if (run > 1) {
      h.msg_control = &tx_ctrl_[m * tx_ctrl_words];
      h.msg_controllen = CMSG_SPACE(sizeof(uint16_t));
      cmsghdr* c = CMSG_FIRSTHDR(&h);
      c->cmsg_level = SOL_UDP;
      c->cmsg_type = UDP_SEGMENT;
      c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      const uint16_t gso_size = static_cast<uint16_t>(sz);
      std::memcpy(CMSG_DATA(c), &gso_size, sizeof gso_size);
    }
    tx_pkts_per_msg_[m] = static_cast<uint32_t>(run);
    iov_used += iovs;
    i += run;
    ++m;
  }
  const int r = ::sendmmsg(fd_, tx_msgs_.data(), static_cast<unsigned>(m), MSG_DONTWAIT);
  if (r < 0) return -1;
  long datagrams = 0;
  for (int k = 0; k < r; ++k) {
    datagrams += tx_pkts_per_msg_[k];
    if (tx_pkts_per_msg_[k] > 1) ++counters_.gso_sends;
  }
  return datagrams;
}

void UdpTransport::probe() {
  // The connected socket's error (ECONNREFUSED) comes back on a later send or receive.
  if (::send(fd_, nullptr, 0, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno == ECONNREFUSED) {
    ++counters_.refusals;
  }
}

Status UdpTransport::send_batch(std::span<const std::span<const uint8_t>> pkts) {
  return send_all(pkts);
}

Status UdpTransport::send_gather(std::span<const GatherDatagram> pkts) { return send_all(pkts); }

template <class P>
Status UdpTransport::send_all(std::span<const P> pkts) {
  for (const auto& p : pkts) {
    if (p.size() > kMaxUdpPayload) {
      return invalid_argument("datagram of " + std::to_string(p.size()) +
                              " bytes exceeds the UDP limit of " + std::to_string(kMaxUdpPayload));
    }
  }
  size_t i = 0;
  int blocked = 0;
  // Each refusal consumes one pending ICMP error, and each error stems from a datagram we sent,
  // so the loop ends; the bound only guards against a kernel that behaves otherwise.
  size_t budget = 2 * pkts.size() + 16;
  while (i < pkts.size()) {
    if (budget-- == 0) break;
    const long r = send_some(pkts, i);
    if (r > 0) {
      i += static_cast<size_t>(r);
      counters_.datagrams_sent += static_cast<uint64_t>(r);
      blocked = 0;
      continue;
    }
    const int err = r == 0 ? EAGAIN : errno;
    switch (err) {
      case EINTR: continue;
      case ECONNREFUSED:
        // The aggregator's port answered ICMP port unreachable for an earlier datagram. The
        // error is consumed now and this datagram was not sent: retry it.
        ++counters_.refusals;
        continue;
      case EHOSTUNREACH:
      case ENETUNREACH: continue;  // an earlier datagram's ICMP error: loss, retry this one
      case EPERM:
        // A firewall in this host's output path (nftables/iptables drop) refused the call's
        // first entry (one datagram, or a GSO super-datagram, which netfilter sees whole): it
        // is lost like any other; skip it and send the rest.
        counters_.filtered += tx_pkts_per_msg_[0];
        i += tx_pkts_per_msg_[0];
        continue;
      case EAGAIN:
      case ENOBUFS: {
        if (++blocked > kMaxBlockedAttempts) break;
        pollfd pfd{fd_, POLLOUT, 0};
        (void)::poll(&pfd, 1, kBlockedPollMs);
        continue;
      }
      case EIO:
      case EINVAL:
      case EOPNOTSUPP:
        if (gso_on_ && tx_pkts_per_msg_[0] > 1) {
          // The path cannot segment (no checksum offload, or gso_size beyond the MTU): send
          // plain datagrams from now on.
          gso_on_ = false;
          INA_DEBUG("worker", "udp to %s: UDP_SEGMENT refused (%s); sending without GSO",
                    peer_name_.c_str(), std::strerror(err));
          continue;
        }
        return errno_status("sendmmsg to aggregator " + peer_name_, err);
      default: return errno_status("sendmmsg to aggregator " + peer_name_, err);
    }
    break;  // the socket buffer stays full: the rest counts as lost
  }
  counters_.send_dropped += pkts.size() - i;
  return ok_status();
}

size_t UdpTransport::drain(std::span<Datagram> out) {
  size_t produced = 0;
  while (produced < out.size() && rx_next_msg_ < rx_received_) {
    const mmsghdr& mh = rx_msgs_[rx_next_msg_];
    const size_t len = mh.msg_len;
    if ((mh.msg_hdr.msg_flags & MSG_TRUNC) != 0) {
      ++counters_.truncated;
      ++rx_next_msg_;
      rx_next_off_ = 0;
      continue;
    }
    size_t seg = len;
    if (gro_on_) {
      msghdr* h = const_cast<msghdr*>(&mh.msg_hdr);
      for (cmsghdr* c = CMSG_FIRSTHDR(h); c != nullptr; c = CMSG_NXTHDR(h, c)) {
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
          int gso_size = 0;
          std::memcpy(&gso_size, CMSG_DATA(c), sizeof gso_size);
          if (gso_size > 0) seg = static_cast<size_t>(gso_size);
        }
      }
    }
    const uint8_t* base = rx_storage_.get() + rx_next_msg_ * kRxBufferSize;
    if (len == 0) {
      out[produced++] = Datagram(base, size_t{0});
      ++counters_.datagrams_received;
      ++rx_next_msg_;
      continue;
    }
    if (rx_next_off_ == 0 && seg < len) ++counters_.gro_receives;
    while (rx_next_off_ < len && produced < out.size()) {
      const size_t n = std::min(seg, len - rx_next_off_);
      out[produced++] = Datagram(base + rx_next_off_, n);
      rx_next_off_ += n;
      ++counters_.datagrams_received;
    }
    if (rx_next_off_ >= len) {
      ++rx_next_msg_;
      rx_next_off_ = 0;
    }
  }
  return produced;
}

int UdpTransport::read_now() {
  for (size_t i = 0; i < batch_; ++i) {
    msghdr& h = rx_msgs_[i].msg_hdr;
    h.msg_control = &rx_ctrl_[i * rx_ctrl_words_];
    h.msg_controllen = rx_ctrl_words_ * sizeof(uint64_t);
    h.msg_flags = 0;
    rx_msgs_[i].msg_len = 0;
  }
  const int got = ::recvmmsg(fd_, rx_msgs_.data(), batch_, MSG_DONTWAIT, nullptr);
  if (got >= 0) return got;
  switch (errno) {
    case EAGAIN:
    case EINTR:
    case EHOSTUNREACH:
    case ENETUNREACH: return 0;
    case ECONNREFUSED: ++counters_.refusals; return 0;
    default: return -errno;
  }
}

Result<size_t> UdpTransport::recv_batch(std::span<Datagram> out,
                                        std::chrono::microseconds timeout) {
  if (out.empty()) return size_t{0};
  // Hand out what the last recvmmsg brought before reading more: the views point into the same
  // buffers, which must not be overwritten while the caller may still hold them.
  if (rx_next_msg_ < rx_received_) {
    const size_t n = drain(out);
    if (n > 0) return n;
  }
  // Latency: a blocking wait costs a wake-up (a context switch: 10-15 us on the 2-core VM, more
  // when its cores are shared) after the datagram arrived. So read first without waiting (in a
  // stream the results are usually there already: no ppoll at all), then poll for up to the
  // engine's spin budget before blocking, as the progress engines of MPI and NCCL do. Between
  // polls the rank yields the CPU (Open MPI's yield_when_idle): with more processes than cores,
  // a busy spin would hold the core that the aggregator or another rank needs to produce the
  // very datagram awaited (on the 2-core VM a 50 us busy spin made an 8 B AllReduce at 4 ranks
  // 2.7x slower), while sched_yield() gives it up and returns at once when nothing else runs.
  //
  // A read that found fewer messages than a batch left the socket empty: when the caller would
  // block anyway (no polling budget), the wait comes first, not a read that most likely finds
  // nothing (in a stream that cost one recvmmsg per wake-up; ppoll returns at once where a
  // datagram came meanwhile).
  //
  // What the waiting costs in a stream (the 2-core VM, 4 ranks, 16 MiB float32, loopback, the
  // embedded aggregator): a system call 0.07-0.16 us; a wake-up across cores about 2.5 us more
  // CPU per side than a hand-over on one core. Each rank sleeps about 1.6 times per aggregator
  // flush (the flush's 10-20 GSO trains land one after the other and the first wakes the rank,
  // which then outruns the rest), 35-46k sleeps and 100-140k system calls per GB reduced for the
  // 4 ranks: about a tenth of their CPU per GB at most (the scheduler's functions are 4% of the
  // benchmark's samples in `perf record -a`). Yielding once before the sleep, so that the rest of
  // the burst lands first, cut those sleeps by 75-97%, but CPU per GB moved 0.98x (median of 40
  // alternated pairs, load 8-17) and busbw 0.88x in the same pairs; and a rank whose cores are
  // shared with the trainer's compute threads would give them its core at every wait. So the rank
  // sleeps.
  const auto us = std::max<int64_t>(0, timeout.count());
  const bool wait_first = rx_drained_ && spin_us_ == 0 && us > 0;
  int got = wait_first ? 0 : read_now();
  if (got == 0) {
    const auto spin = std::min<int64_t>(us, spin_us_);
    if (spin > 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin);
      while (got == 0 && std::chrono::steady_clock::now() < until) {
        sched_yield();
        got = read_now();
      }
      if (got > 0) ++counters_.spin_receives;
    }
    if (got == 0 && us > spin) {
      ++counters_.blocking_waits;
      pollfd pfd{fd_, POLLIN, 0};
      const int64_t left = us - spin;
      timespec ts{static_cast<time_t>(left / 1000000), static_cast<long>((left % 1000000) * 1000)};
      const int pr = ::ppoll(&pfd, 1, &ts, nullptr);
      if (pr < 0) {
        if (errno == EINTR) return size_t{0};
        return errno_status("poll on the socket to aggregator " + peer_name_, errno);
      }
      if (pr == 0) return size_t{0};
      got = read_now();
    }
  }
  if (got < 0) return errno_status("recvmmsg from aggregator " + peer_name_, -got);
  rx_drained_ = static_cast<size_t>(got) < batch_;
  if (got == 0) return size_t{0};
  rx_received_ = static_cast<size_t>(got);
  rx_next_msg_ = 0;
  rx_next_off_ = 0;
  return drain(out);
}

}  // namespace ina::worker
