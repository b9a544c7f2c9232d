// Setup of the host path over real sockets: the TCP self-connect is never returned, the mesh
// survives a reset and a slow accept during its handshake, and the mesh address is found as Gloo
// and NCCL find theirs (host/mesh_address.h).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "tests/host/harness.h"
#include "worker/host/mesh_address.h"
#include "worker/host/socket.h"
#include "worker/host/store.h"
#include "worker/host/tcp_mesh.h"

namespace ina::host {
namespace {

using std::chrono::milliseconds;

// A TCP socket bound to 127.0.0.1:port and connected to that same address: Linux completes the
// simultaneous open, so the socket is connected to itself.
int self_connected_socket() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(HostSocket, SelfConnectIsRecognised) {
  const int self = self_connected_socket();
  ASSERT_GE(self, 0) << std::strerror(errno);
  EXPECT_TRUE(is_self_connect(self));
  close(self);

  // An ordinary connection to a listener is not one.
  auto lfd = listen_tcp("127.0.0.1", 0, 4);
  ASSERT_TRUE(lfd.ok()) << lfd.status().to_string();
  auto port = local_port(*lfd);
  ASSERT_TRUE(port.ok());
  auto c = connect_tcp("127.0.0.1", *port, Clock::now() + milliseconds(2000));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(is_self_connect(*c));
  close(*c);
  close(*lfd);
}

// In a network namespace of its own whose ephemeral range is one port, P, a connect to
// 127.0.0.1:P with no listener always connects to itself (the kernel picks P as the source port):
// the self-connect of a client that retries before its server starts, made certain. connect_tcp
// must keep retrying and fail at its deadline, and the port stays free for the server.
// Runs in a child process (the namespace and the sysctl are per process); root only.
TEST(HostSocket, ConnectRetriesPastSelfConnectsUntilTheDeadline) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a network namespace of its own";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWNET) != 0) _exit(77);
    const int ctl = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    if (ctl < 0 || ioctl(ctl, SIOCGIFFLAGS, &ifr) != 0) _exit(77);
    ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
    if (ioctl(ctl, SIOCSIFFLAGS, &ifr) != 0) _exit(77);
    close(ctl);
    const uint16_t port = 40123;
    const int f = open("/proc/sys/net/ipv4/ip_local_port_range", O_WRONLY | O_CLOEXEC);
    const std::string range = std::to_string(port) + " " + std::to_string(port);
    if (f < 0 || write(f, range.data(), range.size()) != static_cast<ssize_t>(range.size()))
      _exit(77);
    close(f);
    const auto start = Clock::now();
    Result<int> c = connect_tcp("127.0.0.1", port, start + milliseconds(300));
    if (c.ok()) {
      std::fprintf(stderr, "connect_tcp returned a socket (self-connected: %d)\n",
                   is_self_connect(*c) ? 1 : 0);
      _exit(1);
    }
    if (c.status().code() != StatusCode::kDeadlineExceeded ||
        c.status().message().find("self-connect") == std::string::npos) {
      std::fprintf(stderr, "unexpected: %s\n", c.status().to_string().c_str());
      _exit(2);
    }
    // The port is free: a server binds it.
    Result<int> l = listen_tcp("127.0.0.1", port, 4);
    if (!l.ok()) {
      std::fprintf(stderr, "server cannot bind afterwards: %s\n", l.status().to_string().c_str());
      _exit(4);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "cannot set up a network namespace";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the child's message above";
}

// A client's self-connect holds the store's port for an instant: the server's bind retries past
// it (here it is held 100 ms) instead of failing with "Address already in use".
TEST(HostSocket, StoreServerBindsPastATransientSelfConnect) {
  const int self = self_connected_socket();
  ASSERT_GE(self, 0) << std::strerror(errno);
  const uint16_t port = local_port(self).value();
  std::thread release([self] {
    std::this_thread::sleep_for(milliseconds(100));
    linger lg{1, 0};
    (void)setsockopt(self, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(self);
  });
  TcpStoreOptions opts;
  opts.port = port;
  opts.is_server = true;
  opts.connect_timeout = milliseconds(5000);
  auto server = TcpStore::create(opts);
  release.join();
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  EXPECT_EQ((*server)->port(), port);
  ASSERT_TRUE((*server)->set("k", to_bytes("v")).ok());
}

// This test plays rank 0 of a world of 2 by hand: it publishes its own listener as rank 0's mesh
// address, resets the first connection rank 1 makes (SO_LINGER 0), accepts the next one only
// after `accept_delay`, then answers the handshake. TcpMesh::connect at rank 1 must retry and
// form the mesh, and a message must cross it.
void fake_rank0_resets_then_answers(milliseconds accept_delay) {
  test::TempDir dir;
  auto store = FileStore::create(dir.path());
  ASSERT_TRUE(store.ok());
  auto lfd = listen_tcp("127.0.0.1", 0, 4);
  ASSERT_TRUE(lfd.ok());
  const uint16_t port = local_port(*lfd).value();
  ASSERT_TRUE((*store)->set("mesh/addr/0", to_bytes("127.0.0.1:" + std::to_string(port))).ok());

  Result<std::unique_ptr<TcpMesh>> m1 = unavailable("not run");
  std::thread rank1([&] {
    TcpMeshOptions opts;
    opts.timeout = milliseconds(10000);
    m1 = TcpMesh::connect(**store, 1, 2, opts);
  });
  const auto deadline = Clock::now() + milliseconds(10000);
  auto first = accept_tcp(*lfd, deadline);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  linger lg{1, 0};
  ASSERT_EQ(setsockopt(*first, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
  close(*first);  // RST
  std::this_thread::sleep_for(accept_delay);
  int fd = -1;
  uint8_t hello[16];
  for (;;) {  // a connection rank 1 made before it saw the reset may come first: it is closed
    auto next = accept_tcp(*lfd, deadline);
    ASSERT_TRUE(next.ok()) << next.status().to_string();
    if (recv_all(*next, hello, sizeof(hello), deadline, "rank 1").ok()) {
      fd = *next;
      break;
    }
    close(*next);
  }
  EXPECT_EQ(get_u32(hello), 0x4D414E49u);
  EXPECT_EQ(get_u32(hello + 4), 1u);
  EXPECT_EQ(get_u32(hello + 8), 2u);
  uint8_t mine[16] = {};
  put_u32(mine, 0x4D414E49u);
  put_u32(mine + 4, 0);
  put_u32(mine + 8, 2);
  ASSERT_TRUE(send_all(fd, mine, sizeof(mine), deadline, "rank 1").ok());
  rank1.join();
  ASSERT_TRUE(m1.ok()) << m1.status().to_string();
  // One message from rank 1: the 8-byte length, then the body.
  const uint32_t x = 0xC0FFEE;
  ASSERT_TRUE((*m1)->wait((*m1)->isend(0, &x, 4)).ok());
  uint8_t got[12];
  ASSERT_TRUE(recv_all(fd, got, sizeof(got), deadline, "rank 1").ok());
  EXPECT_EQ(get_u64(got), 4u);
  EXPECT_EQ(get_u32(got + 8), 0xC0FFEEu);
  close(fd);
  close(*lfd);
}

TEST(HostTcpMesh, HandshakeResetIsRetried) { fake_rank0_resets_then_answers(milliseconds(0)); }

TEST(HostTcpMesh, SlowAcceptAfterAResetStillForms) {
  fake_rank0_resets_then_answers(milliseconds(700));
}

// A peer that connects and resets before its hello does not fail the rank accepting it.
TEST(HostTcpMesh, ResetBeforeHelloIsDropped) {
  test::mesh_forms_despite(milliseconds(10000), [](int fd) {
    EXPECT_TRUE(send_all(fd, "INA", 3, Clock::now() + milliseconds(1000), "early").ok());
    linger lg{1, 0};
    EXPECT_EQ(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    close(fd);
    return -1;
  });
}

TEST(HostMeshAddress, FoundAsGlooAndNcclFindTheirs) {
  // INA_MESH_ADDR wins over everything.
  MeshAddressInputs in;
  in.mesh_addr = "10.1.2.3";
  in.ifname = "lo";
  in.store_host = "127.0.0.1";
  auto a = find_mesh_address(in);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->address, "10.1.2.3");
  EXPECT_EQ(a->how, "INA_MESH_ADDR");
  // Then the interface's address.
  in.mesh_addr.clear();
  a = find_mesh_address(in);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->address, "127.0.0.1");
  EXPECT_EQ(a->how, "INA_SOCKET_IFNAME=lo");
  // An interface that does not exist is an error naming it.
  in.ifname = "nosuchif0";
  a = find_mesh_address(in);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("INA_SOCKET_IFNAME=\"nosuchif0\""), std::string::npos)
      << a.status().message();
  // Then the route to the store's host: from the loopback, the loopback.
  in.ifname.clear();
  in.store_port = 29500;
  a = find_mesh_address(in);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->address, "127.0.0.1");
  EXPECT_NE(a->how.find("route"), std::string::npos);
  EXPECT_EQ(source_address_towards("127.0.0.2", 1).value(), "127.0.0.1");
  // Nothing to go by: the loopback, as a job on one host.
  a = find_mesh_address(MeshAddressInputs{});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->address, "127.0.0.1");
}

}  // namespace
}  // namespace ina::host
