// The kernel UDP transport on loopback against a plain socket standing in for the aggregator:
// datagram boundaries survive GSO on send and GRO on receive, refusals are counted, and a bad
// host is named.
#include "worker/transport/udp_transport.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ina/protocol/wire.h"

namespace ina::worker {
namespace {

// A UDP socket bound to 127.0.0.1 on an ephemeral port.
class PeerSocket {
 public:
  PeerSocket() {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    const int big = 4 << 20;
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  }
  ~PeerSocket() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }
  uint16_t port() const { return port_; }

  // Receives one datagram (waits up to 2 s); empty on timeout.
  std::vector<uint8_t> recv_one() {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 2000) <= 0) return {};
    std::vector<uint8_t> buf(70000);
    const ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
    buf.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return buf;
  }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

std::unique_ptr<UdpTransport> connect_to(uint16_t port, bool gso = true, bool gro = true) {
  UdpTransportOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.gso = gso;
  o.gro = gro;
  auto t = UdpTransport::create(o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

// Where the peer sends to reach the transport: its socket on loopback.
sockaddr_in address_of(const UdpTransport& t) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(t.local_port());
  return a;
}

std::vector<uint8_t> pattern(size_t index, size_t size) {
  std::vector<uint8_t> p(size);
  for (size_t i = 0; i < size; ++i) p[i] = static_cast<uint8_t>(index * 31 + i);
  return p;
}

void check_send_keeps_boundaries(bool gso) {
  PeerSocket peer;
  auto t = connect_to(peer.port(), gso);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->peer_name(), "127.0.0.1:" + std::to_string(peer.port()));
  // Runs of equal sizes (GSO candidates) broken by odd sizes, more than one sendmmsg batch.
  std::vector<size_t> sizes;
  for (int i = 0; i < 150; ++i) sizes.push_back(1056);
  sizes.push_back(100);
  for (int i = 0; i < 70; ++i) sizes.push_back(64);
  sizes.push_back(1056);
  std::vector<std::vector<uint8_t>> pkts;
  std::vector<std::span<const uint8_t>> spans;
  for (size_t i = 0; i < sizes.size(); ++i) {
    pkts.push_back(pattern(i, sizes[i]));
    // One slot for all (as an INA header would have it): trains end at a run of slots.
    if (sizes[i] >= wire::kHeaderSize) wire::put_u16(pkts.back().data() + wire::kOffSlot, 0);
  }
  for (const auto& p : pkts) spans.emplace_back(p);
  ASSERT_TRUE(t->send_batch(spans).ok());
  for (size_t i = 0; i < pkts.size(); ++i) {
    const std::vector<uint8_t> got = peer.recv_one();
    ASSERT_EQ(got, pkts[i]) << "datagram " << i;
  }
  EXPECT_EQ(t->counters().datagrams_sent, pkts.size());
  EXPECT_EQ(t->counters().send_dropped, 0u);
  if (gso && t->gso_enabled()) {
    EXPECT_GT(t->counters().gso_sends, 0u);
  } else {
    EXPECT_EQ(t->counters().gso_sends, 0u);
  }
}

TEST(UdpTransportTest, SendKeepsDatagramBoundariesWithGso) { check_send_keeps_boundaries(true); }
TEST(UdpTransportTest, SendKeepsDatagramBoundariesWithoutGso) {
  check_send_keeps_boundaries(false);
}

// Datagrams in two parts (an INA header, the payload elsewhere: the engine's DATA packets) arrive
// as the two joined, with and without GSO, mixed with whole datagrams (headers only: an abort's
// body lies in its head), over more than one sendmmsg batch.
void check_gather_joins_the_parts(bool gso) {
  PeerSocket peer;
  auto t = connect_to(peer.port(), gso);
  ASSERT_NE(t, nullptr);
  std::vector<std::vector<uint8_t>> heads, bodies, want;
  for (size_t i = 0; i < 160; ++i) {
    std::vector<uint8_t> h = pattern(i, wire::kHeaderSize);
    wire::put_u16(h.data() + wire::kOffSlot, static_cast<uint16_t>(i % 8));
    const size_t body = i == 70 ? 0 : i == 71 ? 13 : 1024;
    heads.push_back(h);
    bodies.push_back(pattern(1000 + i, body));
    want.push_back(h);
    want.back().insert(want.back().end(), bodies.back().begin(), bodies.back().end());
  }
  std::vector<GatherDatagram> g;
  for (size_t i = 0; i < heads.size(); ++i) g.push_back(GatherDatagram{heads[i], bodies[i]});
  ASSERT_TRUE(t->send_gather(g).ok());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(peer.recv_one(), want[i]) << "datagram " << i;
  EXPECT_EQ(t->counters().datagrams_sent, want.size());
  if (gso && t->gso_enabled()) {
    EXPECT_GT(t->counters().gso_sends, 0u);
  }
}

TEST(UdpTransportTest, GatherJoinsThePartsWithGso) { check_gather_joins_the_parts(true); }
TEST(UdpTransportTest, GatherJoinsThePartsWithoutGso) { check_gather_joins_the_parts(false); }

// INA datagrams of consecutive slots 8..55: GSO trains end where a run of wire::kSlotRun slots
// ends (a multi-threaded aggregator steers a train by its first slot), so 8..15, 16..31, 32..47
// and 48..55 leave as four trains.
TEST(UdpTransportTest, GsoTrainsStayWithinARunOfSlots) {
  PeerSocket peer;
  auto t = connect_to(peer.port());
  ASSERT_NE(t, nullptr);
  if (!t->gso_enabled()) GTEST_SKIP() << "the kernel has no UDP_SEGMENT";
  std::vector<std::vector<uint8_t>> pkts;
  std::vector<std::span<const uint8_t>> spans;
  for (uint16_t slot = 8; slot < 56; ++slot) {
    std::vector<uint8_t> p = pattern(slot, 1064);
    wire::put_u16(p.data() + wire::kOffSlot, slot);
    pkts.push_back(p);
  }
  for (const auto& p : pkts) spans.emplace_back(p);
  ASSERT_TRUE(t->send_batch(spans).ok());
  for (size_t i = 0; i < pkts.size(); ++i) ASSERT_EQ(peer.recv_one(), pkts[i]) << "datagram " << i;
  static_assert(wire::kSlotRun == 16, "the expected trains below assume runs of 16 slots");
  EXPECT_EQ(t->counters().gso_sends, 4u);
}

// The peer sends one UDP_SEGMENT super-datagram; the transport (UDP_GRO on) receives it as one
// buffer and must hand out the segments one by one, also across calls with a small `out`.
TEST(UdpTransportTest, ReceiveSplitsCoalescedDatagrams) {
  PeerSocket peer;
  auto t = connect_to(peer.port());
  ASSERT_NE(t, nullptr);
  sockaddr_in dst = address_of(*t);

  constexpr size_t kSeg = 500, kSegs = 10, kLast = 123;
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < kSegs; ++i) {
    const auto p = pattern(i, i + 1 == kSegs ? kLast : kSeg);
    buf.insert(buf.end(), p.begin(), p.end());
  }
  iovec iov{buf.data(), buf.size()};
  msghdr h{};
  h.msg_name = &dst;
  h.msg_namelen = sizeof dst;
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(uint16_t))] = {};
  h.msg_control = ctrl;
  h.msg_controllen = sizeof ctrl;
  cmsghdr* c = CMSG_FIRSTHDR(&h);
  c->cmsg_level = SOL_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  const uint16_t seg = kSeg;
  std::memcpy(CMSG_DATA(c), &seg, sizeof seg);
  if (::sendmsg(peer.fd(), &h, 0) < 0) GTEST_SKIP() << "no UDP GSO here: " << std::strerror(errno);

  std::vector<Datagram> out(3);
  size_t got = 0;
  for (int attempt = 0; attempt < 20 && got < kSegs; ++attempt) {
    auto n = t->recv_batch(out, std::chrono::milliseconds(200));
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    ASSERT_LE(*n, out.size());
    for (size_t i = 0; i < *n; ++i, ++got) {
      const auto want = pattern(got, got + 1 == kSegs ? kLast : kSeg);
      ASSERT_EQ(std::vector<uint8_t>(out[i].begin(), out[i].end()), want) << "segment " << got;
    }
  }
  EXPECT_EQ(got, kSegs);
  EXPECT_EQ(t->counters().datagrams_received, kSegs);
  if (t->gro_enabled()) {
    EXPECT_EQ(t->counters().gro_receives, 1u);
  }
  auto none = t->recv_batch(out, std::chrono::milliseconds(0));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0u);
}

// With a spin budget the transport polls instead of blocking: a datagram sent while it polls is
// received without a blocking wait. Without one it blocks at once.
TEST(UdpTransportTest, SpinReceivesWithoutBlocking) {
  PeerSocket peer;
  auto t = connect_to(peer.port());
  ASSERT_NE(t, nullptr);
  sockaddr_in dst = address_of(*t);
  const auto payload = pattern(7, 64);
  auto send_later = [&] {
    return std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ASSERT_EQ(::sendto(peer.fd(), payload.data(), payload.size(), 0,
                         reinterpret_cast<const sockaddr*>(&dst), sizeof dst),
                static_cast<ssize_t>(payload.size()));
    });
  };
  std::vector<Datagram> out(4);

  t->set_spin(std::chrono::seconds(5));  // longer than the sender's delay, bounded by the timeout
  std::thread sender = send_later();
  auto n = t->recv_batch(out, std::chrono::seconds(10));
  sender.join();
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  ASSERT_EQ(*n, 1u);
  EXPECT_EQ(std::vector<uint8_t>(out[0].begin(), out[0].end()), payload);
  EXPECT_EQ(t->counters().spin_receives, 1u);
  EXPECT_EQ(t->counters().blocking_waits, 0u);

  t->set_spin(std::chrono::microseconds(0));
  sender = send_later();
  n = t->recv_batch(out, std::chrono::seconds(10));
  sender.join();
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  ASSERT_EQ(*n, 1u);
  EXPECT_EQ(t->counters().spin_receives, 1u);
  EXPECT_EQ(t->counters().blocking_waits, 1u);
}

// A read that left the socket empty makes the next blocking receive wait before it reads (one
// syscall less per wake-up): datagrams that came meanwhile are still received at once, and
// nothing lost or reordered; an empty wait still ends at its timeout.
TEST(UdpTransportTest, WaitFirstAfterADrainedReadMissesNothing) {
  PeerSocket peer;
  auto t = connect_to(peer.port());
  ASSERT_NE(t, nullptr);
  sockaddr_in dst = address_of(*t);
  auto send = [&](uint32_t seed) {
    const auto p = pattern(seed, 100);
    ASSERT_EQ(::sendto(peer.fd(), p.data(), p.size(), 0, reinterpret_cast<const sockaddr*>(&dst),
                       sizeof dst),
              static_cast<ssize_t>(p.size()));
  };
  std::vector<Datagram> out(8);
  t->set_spin(std::chrono::microseconds(0));
  send(1);
  auto n = t->recv_batch(out, std::chrono::seconds(10));  // reads first: finds it, drains
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  ASSERT_EQ(*n, 1u);
  for (int round = 0; round < 3; ++round) {
    send(10 + round);
    send(20 + round);
    // Both are in the socket before the call (loopback delivers within the sendto).
    const auto t0 = std::chrono::steady_clock::now();
    size_t got = 0;
    while (got < 2) {
      n = t->recv_batch(std::span<Datagram>(out).subspan(got), std::chrono::seconds(10));
      ASSERT_TRUE(n.ok()) << n.status().to_string();
      ASSERT_GT(*n, 0u);
      got += *n;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    ASSERT_EQ(got, 2u);
    EXPECT_EQ(std::vector<uint8_t>(out[0].begin(), out[0].end()), pattern(10 + round, 100));
    EXPECT_EQ(std::vector<uint8_t>(out[1].begin(), out[1].end()), pattern(20 + round, 100));
  }
  const auto t0 = std::chrono::steady_clock::now();
  n = t->recv_batch(out, std::chrono::milliseconds(50));
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(*n, 0u);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(49));
  EXPECT_EQ(t->counters().datagrams_received, 7u);
}

// Waits 50 ms on a socket nothing arrives at; returns how long the wait took.
std::chrono::steady_clock::duration time_empty_wait(UdpTransport& t) {
  std::vector<Datagram> out(4);
  const auto t0 = std::chrono::steady_clock::now();
  auto n = t.recv_batch(out, std::chrono::milliseconds(50));
  const auto dt = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(n.ok()) << n.status().to_string();
  if (n.ok()) {
    EXPECT_EQ(*n, 0u);
  }
  return dt;
}

// The spin never outlasts the wait: a budget longer than the timeout ends with it.
TEST(UdpTransportTest, SpinEndsAtTheTimeout) {
  PeerSocket peer;
  auto t = connect_to(peer.port());
  ASSERT_NE(t, nullptr);
  t->set_spin(std::chrono::seconds(30));
  const auto dt = time_empty_wait(*t);
  EXPECT_GE(dt, std::chrono::milliseconds(49));
  EXPECT_LT(dt, std::chrono::milliseconds(5000));
  EXPECT_EQ(t->counters().blocking_waits, 0u);  // the whole wait was polled
}

TEST(UdpTransportTest, RecvTimesOut) {
  PeerSocket peer;
  auto t = connect_to(peer.port());
  ASSERT_NE(t, nullptr);
  const auto dt = time_empty_wait(*t);
  EXPECT_GE(dt, std::chrono::milliseconds(49));
  EXPECT_LT(dt, std::chrono::milliseconds(1000));
}

TEST(UdpTransportTest, RefusalsAreCountedNotFatal) {
  uint16_t port;
  {
    PeerSocket gone;  // learn a free port, then close it: nothing listens there
    port = gone.port();
  }
  auto t = connect_to(port);
  ASSERT_NE(t, nullptr);
  const std::vector<uint8_t> p = pattern(0, 64);
  const std::span<const uint8_t> one[1] = {p};
  std::vector<Datagram> out(4);
  for (int i = 0; i < 10 && t->refusals() == 0; ++i) {
    ASSERT_TRUE(t->send_batch(one).ok());
    auto n = t->recv_batch(out, std::chrono::milliseconds(20));
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    EXPECT_EQ(*n, 0u);
  }
  EXPECT_GT(t->refusals(), 0u);
}

// The liveness probe (WIRE.md): an empty datagram to a live peer; to a port nothing listens on, a
// refusal, counted like a refused send's.
TEST(UdpTransportTest, ProbeIsAnEmptyDatagramAndCountsARefusal) {
  {
    PeerSocket peer;
    auto t = connect_to(peer.port());
    ASSERT_NE(t, nullptr);
    t->probe();
    pollfd p{peer.fd(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 2000), 1);
    uint8_t b[16];
    EXPECT_EQ(::recv(peer.fd(), b, sizeof b, 0), 0);  // a datagram of zero bytes
    EXPECT_EQ(t->refusals(), 0u);
  }
  uint16_t port;
  {
    PeerSocket gone;
    port = gone.port();
  }
  auto t = connect_to(port);
  ASSERT_NE(t, nullptr);
  std::vector<Datagram> out(4);
  for (int i = 0; i < 10 && t->refusals() == 0; ++i) {
    t->probe();
    auto n = t->recv_batch(out, std::chrono::milliseconds(20));
    ASSERT_TRUE(n.ok()) << n.status().to_string();
  }
  EXPECT_GT(t->refusals(), 0u);
}

TEST(UdpTransportTest, OversizedDatagramIsAnError) {
  PeerSocket peer;
  auto t = connect_to(peer.port());
  ASSERT_NE(t, nullptr);
  std::vector<uint8_t> big(UdpTransport::kMaxUdpPayload + 1);
  const std::span<const uint8_t> one[1] = {big};
  EXPECT_EQ(t->send_batch(one).code(), StatusCode::kInvalidArgument);
}

TEST(UdpTransportTest, UnknownHostNamesTheVariable) {
  UdpTransportOptions o;
  o.host = "no-such-host.invalid";
  auto t = UdpTransport::create(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("no-such-host.invalid"), std::string::npos);
  EXPECT_NE(t.status().message().find("INA_AGGREGATOR"), std::string::npos);
}

}  // namespace
}  // namespace ina::worker
