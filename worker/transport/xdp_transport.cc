// XdpTransport: AF_XDP socket setup (UMEM, zero-copy then copy mode, native then generic XDP),
// receive with ARP/ICMP answered from protocol/frame.h, burst transmit from a recycled frame pool.
#include "worker/transport/xdp_transport.h"

#include <linux/if_link.h>
#include <linux/if_xdp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xdp/libxdp.h>
#include <xdp/xsk.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "ina/base/log.h"

namespace ina::worker {

namespace {

constexpr uint32_t kFrames = 4096;
constexpr uint32_t kFrameSize = XSK_UMEM__DEFAULT_FRAME_SIZE;  // 4096
constexpr uint32_t kRxFrames = kFrames / 2;
constexpr uint32_t kRingSize = XSK_RING_CONS__DEFAULT_NUM_DESCS;  // 2048

}  // namespace

struct XdpTransport::State {
  void* area = nullptr;
  size_t area_size = 0;
  xsk_umem* umem = nullptr;
  xsk_socket* xsk = nullptr;
  xsk_ring_prod fill{};
  xsk_ring_cons comp{};
  xsk_ring_cons rx{};
  xsk_ring_prod tx{};
  int fd = -1;
  uint32_t tx_outstanding = 0;
};

XdpTransport::XdpTransport() : s_(std::make_unique<State>()) {}

Result<std::unique_ptr<XdpTransport>> XdpTransport::create(const XdpTransportOptions& opts) {
  std::unique_ptr<XdpTransport> t(new XdpTransport());
  INA_RETURN_IF_ERROR(t->init(opts));
  return t;
}

XdpTransport::~XdpTransport() {
  if (s_->xsk != nullptr) xsk_socket__delete(s_->xsk);  // detaches libxdp's program when last
  if (s_->umem != nullptr) (void)xsk_umem__delete(s_->umem);
  if (s_->area != nullptr) munmap(s_->area, s_->area_size);
}

Status XdpTransport::init(const XdpTransportOptions& o) {
  if (o.local_ip == 0 || o.aggregator_ip == 0 || o.local_port == 0) {
    return invalid_argument("xdp: local_ip, aggregator_ip and local_port are required");
  }
  if (o.batch == 0 || o.batch > 256) return invalid_argument("xdp: batch must be in [1, 256]");
  batch_ = o.batch;
  const unsigned ifindex = if_nametoindex(o.iface.c_str());
  if (ifindex == 0) {
    return invalid_argument("invalid INA_XDP_IFACE=\"" + o.iface + "\": no such interface");
  }
  local_.ip = o.local_ip;
  local_.udp_port = o.local_port;
  if (o.local_mac_set) {
    local_.mac = o.local_mac;
  } else {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, o.iface.c_str(), IFNAMSIZ - 1);
    if (fd < 0 || ioctl(fd, SIOCGIFHWADDR, &ifr) != 0) {
      const int err = errno;
      if (fd >= 0) ::close(fd);
      return errno_status("xdp: MAC address of " + o.iface + " (set INA_LOCAL_MAC)", err);
    }
    std::memcpy(local_.mac.data(), ifr.ifr_hwaddr.sa_data, 6);
    ifr = ifreq{};
    std::strncpy(ifr.ifr_name, o.iface.c_str(), IFNAMSIZ - 1);
    int mtu = 1500;
    if (ioctl(fd, SIOCGIFMTU, &ifr) == 0) mtu = ifr.ifr_mtu;
    ::close(fd);
    max_datagram_ = static_cast<size_t>(
        std::clamp(mtu, 576,
                   static_cast<int>(kFrameSize - XDP_PACKET_HEADROOM - frame::kEthHeader)) -
        static_cast<int>(frame::kIpv4MinHeader + frame::kUdpHeader));
  }
  if (max_datagram_ == 0) max_datagram_ = 1500 - frame::kIpv4MinHeader - frame::kUdpHeader;

  s_->area_size = size_t{kFrames} * kFrameSize;
  void* area =
      mmap(nullptr, s_->area_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (area == MAP_FAILED) return errno_status("xdp: UMEM mmap", errno);
  s_->area = area;
  xsk_umem_config ucfg{};
  ucfg.fill_size = kRingSize;
  ucfg.comp_size = kRingSize;
  ucfg.frame_size = kFrameSize;
  ucfg.frame_headroom = 0;
  int rc = xsk_umem__create(&s_->umem, s_->area, s_->area_size, &s_->fill, &s_->comp, &ucfg);
  if (rc != 0) {
    s_->umem = nullptr;
    return Status(StatusCode::kUnavailable,
                  std::string("xdp: UMEM registration failed: ") + std::strerror(-rc));
  }
  // Zero-copy with native XDP, then copy mode, then generic (SKB) XDP in copy mode.
  struct Attempt {
    uint16_t bind;
    uint32_t xdp;
    const char* what;
  };
  const Attempt attempts[] = {
      {XDP_ZEROCOPY, XDP_FLAGS_DRV_MODE, "zero-copy, native XDP"},
      {XDP_COPY, XDP_FLAGS_DRV_MODE, "copy mode, native XDP"},
      {XDP_COPY, XDP_FLAGS_SKB_MODE, "copy mode, generic XDP"},
  };
  std::string tried;
  for (const Attempt& a : attempts) {
    if (o.force_copy && a.bind == XDP_ZEROCOPY) continue;
    xsk_socket_config scfg{};
    scfg.rx_size = kRingSize;
    scfg.tx_size = kRingSize;
    scfg.libxdp_flags = 0;  // load libxdp's default program (redirect by queue)
    scfg.xdp_flags = a.xdp;
    scfg.bind_flags = a.bind;
    rc = xsk_socket__create(&s_->xsk, o.iface.c_str(), o.queue, s_->umem, &s_->rx, &s_->tx, &scfg);
    if (rc == 0) {
      zero_copy_ = a.bind == XDP_ZEROCOPY;
      tried += std::string(tried.empty() ? "" : "; ") + a.what + ": ok";
      break;
    }
    s_->xsk = nullptr;
    tried += std::string(tried.empty() ? "" : "; ") + a.what + ": " + std::strerror(-rc);
  }
  if (s_->xsk == nullptr) {
    return Status(StatusCode::kUnavailable, "xdp: cannot bind an AF_XDP socket to " + o.iface +
                                                " queue " + std::to_string(o.queue) + " (" + tried +
                                                ")");
  }
  s_->fd = xsk_socket__fd(s_->xsk);

  // Receive frames into the fill ring; the rest is the transmit pool.
  uint32_t idx = 0;
  if (xsk_ring_prod__reserve(&s_->fill, kRxFrames, &idx) != kRxFrames) {
    return internal_error("xdp: cannot fill the fill ring");
  }
  for (uint32_t i = 0; i < kRxFrames; ++i) {
    *xsk_ring_prod__fill_addr(&s_->fill, idx + i) = uint64_t{i} * kFrameSize;
  }
  xsk_ring_prod__submit(&s_->fill, kRxFrames);
  tx_free_.reserve(kFrames - kRxFrames);
  for (uint32_t i = kRxFrames; i < kFrames; ++i) tx_free_.push_back(uint64_t{i} * kFrameSize);
  held_.reserve(batch_);

  src_ = frame::Endpoint{local_.mac, local_.ip, local_.udp_port};
  dst_.ip = o.aggregator_ip;
  dst_.port = o.aggregator_port;
  peer_name_ = frame::format_ipv4(o.aggregator_ip) + ":" + std::to_string(o.aggregator_port) +
               " (xdp " + o.iface + "/" + std::to_string(o.queue) + ")";
  if (o.aggregator_mac_set) {
    dst_.mac = o.aggregator_mac;
    have_mac_ = true;
  } else {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + o.arp_timeout;
    auto next = Clock::now();
    Datagram scratch[1];
    while (!have_mac_) {
      const auto now = Clock::now();
      if (now >= deadline) {
        return Status(StatusCode::kUnavailable,
                      "xdp: no ARP reply from the aggregator " + frame::format_ipv4(dst_.ip) +
                          " on " + o.iface + " within " + std::to_string(o.arp_timeout.count()) +
                          " ms; is it running? INA_AGGREGATOR_MAC=aa:bb:cc:dd:ee:ff skips ARP");
      }
      if (now >= next) {
        reclaim_tx();
        if (!tx_free_.empty()) {
          const uint64_t addr = tx_free_.back();
          auto* f = static_cast<uint8_t*>(xsk_umem__get_data(s_->area, addr));
          const size_t len = frame::arp_request(f, local_, dst_.ip);
          uint32_t ti = 0;
          if (xsk_ring_prod__reserve(&s_->tx, 1, &ti) == 1) {
            tx_free_.pop_back();
            xdp_desc* d = xsk_ring_prod__tx_desc(&s_->tx, ti);
            d->addr = addr;
            d->len = static_cast<uint32_t>(len);
            xsk_ring_prod__submit(&s_->tx, 1);
            ++s_->tx_outstanding;
            kick_tx();
          }
        }
        next = now + std::chrono::milliseconds(100);
      }
      // Datagrams before the MAC is known cannot be ours (nothing was sent): drop them.
      (void)recv_batch(scratch, std::chrono::microseconds(10000));
      recycle_held();
    }
  }
  INA_DEBUG("worker",
            "transport xdp: %s queue %u (%s), %s:%u (mac %s) -> aggregator %s (mac %s%s), max "
            "datagram %zu",
            o.iface.c_str(), o.queue, tried.c_str(), frame::format_ipv4(local_.ip).c_str(),
            local_.udp_port, frame::format_mac(local_.mac).c_str(), peer_name_.c_str(),
            frame::format_mac(dst_.mac).c_str(), o.aggregator_mac_set ? ", static" : ", arp",
            max_datagram_);
  return ok_status();
}

void XdpTransport::kick_tx() {
  // Copy mode needs a syscall to transmit; zero-copy only when the kernel asks for a wakeup.
  if (!zero_copy_ || xsk_ring_prod__needs_wakeup(&s_->tx)) {
    (void)::sendto(s_->fd, nullptr, 0, MSG_DONTWAIT, nullptr, 0);
  }
}

void XdpTransport::reclaim_tx() {
  uint32_t idx = 0;
  const uint32_t n = xsk_ring_cons__peek(&s_->comp, kRingSize, &idx);
  for (uint32_t i = 0; i < n; ++i)
    tx_free_.push_back(*xsk_ring_cons__comp_addr(&s_->comp, idx + i));
  if (n > 0) xsk_ring_cons__release(&s_->comp, n);
  s_->tx_outstanding -= std::min(s_->tx_outstanding, n);
}

void XdpTransport::recycle_held() {
  if (held_.empty()) return;
  uint32_t idx = 0;
  const auto n = static_cast<uint32_t>(held_.size());
  // The fill ring has room for every rx frame, so the reservation cannot fail.
  if (xsk_ring_prod__reserve(&s_->fill, n, &idx) == n) {
    for (uint32_t i = 0; i < n; ++i) *xsk_ring_prod__fill_addr(&s_->fill, idx + i) = held_[i];
    xsk_ring_prod__submit(&s_->fill, n);
  }
  held_.clear();
}

size_t XdpTransport::drain(std::span<Datagram> out) {
  uint32_t idx = 0;
  const auto want = static_cast<uint32_t>(std::min<size_t>(out.size(), batch_));
  const uint32_t n = xsk_ring_cons__peek(&s_->rx, want, &idx);
  if (n == 0) return 0;
  size_t produced = 0;
  // Frames not handed out go back to the fill ring at once; answers are copied to tx frames.
  uint64_t back[256];
  uint32_t nback = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const xdp_desc* d = xsk_ring_cons__rx_desc(&s_->rx, idx + i);
    auto* f = static_cast<uint8_t*>(xsk_umem__get_data(s_->area, d->addr));
    const std::span<const uint8_t> fr(f, d->len);
    frame::Parsed p;
    const frame::Verdict v = frame::classify(fr, local_, frame::RxOffload{}, &p);
    frames_.add(v);
    if (v == frame::Verdict::kIna) {
      out[produced++] = p.ina;
      held_.push_back(d->addr);
      continue;
    }
    if (v == frame::Verdict::kArpRequest || v == frame::Verdict::kIcmpEcho) {
      reclaim_tx();
      uint32_t ti = 0;
      if (!tx_free_.empty() && xsk_ring_prod__reserve(&s_->tx, 1, &ti) == 1) {
        const uint64_t addr = tx_free_.back();
        tx_free_.pop_back();
        auto* t = static_cast<uint8_t*>(xsk_umem__get_data(s_->area, addr));
        std::memcpy(t, f, d->len);
        const size_t len = v == frame::Verdict::kArpRequest ? frame::arp_reply(t, p, local_)
                                                            : frame::icmp_echo_reply(t, p, local_);
        xdp_desc* td = xsk_ring_prod__tx_desc(&s_->tx, ti);
        td->addr = addr;
        td->len = static_cast<uint32_t>(len);
        xsk_ring_prod__submit(&s_->tx, 1);
        ++s_->tx_outstanding;
        kick_tx();
        ++(v == frame::Verdict::kArpRequest ? counters_.arp_answered : counters_.icmp_answered);
      }
    } else if (v == frame::Verdict::kArpNotRequest && !have_mac_) {
      uint32_t ip = 0;
      frame::Mac mac{};
      if (frame::arp_reply_sender(fr, local_, &ip, &mac) && ip == dst_.ip) {
        dst_.mac = mac;
        have_mac_ = true;
      }
    }
    back[nback++] = d->addr;
  }
  xsk_ring_cons__release(&s_->rx, n);
  if (nback > 0) {
    uint32_t fi = 0;
    if (xsk_ring_prod__reserve(&s_->fill, nback, &fi) == nback) {
      for (uint32_t i = 0; i < nback; ++i) *xsk_ring_prod__fill_addr(&s_->fill, fi + i) = back[i];
      xsk_ring_prod__submit(&s_->fill, nback);
    }
  }
  counters_.received += produced;
  return produced;
}

Result<size_t> XdpTransport::recv_batch(std::span<Datagram> out,
                                        std::chrono::microseconds timeout) {
  recycle_held();
  if (out.empty()) return size_t{0};
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  const auto spin_until = start + std::min(spin_, timeout);  // udp_transport.cc: why poll
  for (;;) {
    const size_t n = drain(out);
    if (n > 0) return n;
    const auto now = Clock::now();
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
    if (left.count() <= 0) return size_t{0};
    const bool kick = xsk_ring_prod__needs_wakeup(&s_->fill) || !zero_copy_;
    if (now < spin_until) {
      if (kick) {
        pollfd pfd{s_->fd, POLLIN, 0};
        (void)::poll(&pfd, 1, 0);  // lets the kernel fill the ring without blocking
      }
      sched_yield();
      continue;
    }
    if (kick) {
      pollfd pfd{s_->fd, POLLIN, 0};
      const timespec ts{static_cast<time_t>(left.count() / 1000000),
                        static_cast<long>((left.count() % 1000000) * 1000)};
      const int pr = ::ppoll(&pfd, 1, &ts, nullptr);
      if (pr < 0 && errno != EINTR) return errno_status("xdp: poll", errno);
    }
  }
}

Status XdpTransport::send_batch(std::span<const std::span<const uint8_t>> pkts) {
  for (const auto& p : pkts) {
    if (p.size() > max_datagram_) {
      return invalid_argument("datagram of " + std::to_string(p.size()) +
                              " bytes exceeds the xdp interface's limit of " +
                              std::to_string(max_datagram_));
    }
  }
  size_t i = 0;
  while (i < pkts.size()) {
    reclaim_tx();
    const auto want =
        static_cast<uint32_t>(std::min<size_t>({pkts.size() - i, tx_free_.size(), size_t{batch_}}));
    uint32_t ti = 0;
    const uint32_t n = want == 0 ? 0 : xsk_ring_prod__reserve(&s_->tx, want, &ti);
    if (n == 0) {
      counters_.no_tx_frame += pkts.size() - i;  // loss: the engine retransmits
      kick_tx();
      return ok_status();
    }
    for (uint32_t k = 0; k < n; ++k) {
      const std::span<const uint8_t> d = pkts[i + k];
      const uint64_t addr = tx_free_.back();
      tx_free_.pop_back();
      auto* f = static_cast<uint8_t*>(xsk_umem__get_data(s_->area, addr));
      // Copied and summed for the UDP checksum in one vectorized pass (sum16 is the bytewise
      // loop for headers: several times slower over a payload).
      const uint32_t sum =
          d.empty() ? 0 : frame::copy_sum16(f + frame::kUdpHeadroom, d.data(), d.size());
      xdp_desc* td = xsk_ring_prod__tx_desc(&s_->tx, ti + k);
      td->addr = addr;
      td->len =
          static_cast<uint32_t>(frame::write_udp_headers(f, src_, dst_, d.size(), sum, ip_id_++));
    }
    xsk_ring_prod__submit(&s_->tx, n);
    s_->tx_outstanding += n;
    counters_.sent += n;
    i += n;
    kick_tx();
  }
  return ok_status();
}

}  // namespace ina::worker
