// TcpStore: a server thread in one "rank", clients over TCP on 127.0.0.1.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <thread>
#include <vector>

#include "tests/host/harness.h"
#include "worker/host/allreduce.h"
#include "worker/host/socket.h"
#include "worker/host/store.h"
#include "worker/host/tcp_mesh.h"

namespace ina::host {
namespace {

using std::chrono::milliseconds;

// The value of a Result that must be OK (a failed expectation and T{} otherwise).
template <typename T>
T val(Result<T> r) {
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : T{};
}

std::unique_ptr<TcpStore> server_store() {
  TcpStoreOptions opts;
  opts.port = 0;
  opts.is_server = true;
  opts.connect_timeout = milliseconds(5000);
  auto s = TcpStore::create(opts);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(*s) : nullptr;
}

std::unique_ptr<TcpStore> client_store(uint16_t port) {
  TcpStoreOptions opts;
  opts.port = port;
  opts.connect_timeout = milliseconds(5000);
  auto s = TcpStore::create(opts);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(HostTcpStore, SetGetWaitAddAcrossClients) {
  auto server = server_store();
  ASSERT_NE(server, nullptr);
  ASSERT_NE(server->port(), 0);
  auto client = client_store(server->port());
  ASSERT_NE(client, nullptr);

  ASSERT_TRUE(server->set("k", to_bytes("v1")).ok());
  EXPECT_EQ(to_string(val(client->get("k", milliseconds(1000)))), "v1");
  Bytes big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE(client->set("big", big).ok());
  EXPECT_EQ(val(server->get("big", milliseconds(1000))), big);
  ASSERT_TRUE(client->set("empty", {}).ok());
  EXPECT_TRUE(server->get("empty", milliseconds(1000))->empty());

  Status w = client->wait({"k", "absent-a", "absent-b"}, milliseconds(100));
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(w.message().find("absent-a, absent-b"), std::string::npos) << w.message();

  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_TRUE(server->set("late", to_bytes("x")).ok());
  });
  EXPECT_TRUE(client->wait({"late", "k"}, milliseconds(5000)).ok());
  late.join();

  constexpr int kClients = 4, kAdds = 50;
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c)
    threads.emplace_back([&] {
      auto s = client_store(server->port());
      ASSERT_NE(s, nullptr);
      for (int i = 0; i < kAdds; ++i) ASSERT_TRUE(s->add("n", 2).ok());
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(val(client->add("n", 0)), 2 * kClients * kAdds);
  EXPECT_EQ(client->add("k", 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(HostTcpStore, ClientRetriesUntilServerStartsAndGivesUpAtDeadline) {
  // Find a free port, then start the server on it only after the client began connecting.
  auto probe = listen_tcp("127.0.0.1", 0, 1);
  ASSERT_TRUE(probe.ok());
  const uint16_t port = val(local_port(*probe));
  close(*probe);

  TcpStoreOptions copts;
  copts.port = port;
  copts.connect_timeout = milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  auto none = TcpStore::create(copts);
  EXPECT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded) << none.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3000));

  std::unique_ptr<TcpStore> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    TcpStoreOptions sopts;
    sopts.port = port;
    sopts.is_server = true;
    auto s = TcpStore::create(sopts);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (s.ok()) server = std::move(*s);
  });
  copts.connect_timeout = milliseconds(5000);
  auto client = TcpStore::create(copts);
  starter.join();
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE((*client)->set("x", to_bytes("1")).ok());
  EXPECT_EQ(to_string(val(server->get("x", milliseconds(1000)))), "1");
}

TEST(HostTcpStore, FromEnv) {
  ASSERT_EQ(unsetenv("INA_STORE"), 0);
  ASSERT_EQ(unsetenv("MASTER_ADDR"), 0);
  ASSERT_EQ(unsetenv("MASTER_PORT"), 0);
  auto none = TcpStore::from_env(1, milliseconds(100));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("MASTER_ADDR"), std::string::npos);

  ASSERT_EQ(setenv("INA_STORE", "127.0.0.1:notaport", 1), 0);
  auto bad = TcpStore::from_env(0, milliseconds(100));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("INA_STORE"), std::string::npos);

  // Rank 0 serves (port 0: ephemeral) and is its own client.
  ASSERT_EQ(setenv("INA_STORE", "127.0.0.1:0", 1), 0);
  auto s0 = TcpStore::from_env(0, milliseconds(2000));
  ASSERT_TRUE(s0.ok()) << s0.status().to_string();
  EXPECT_NE((*s0)->port(), 0);
  ASSERT_TRUE((*s0)->set("a", to_bytes("b")).ok());

  // MASTER_ADDR/MASTER_PORT reach the same server from rank 1.
  ASSERT_EQ(unsetenv("INA_STORE"), 0);
  ASSERT_EQ(setenv("MASTER_ADDR", "127.0.0.1", 1), 0);
  ASSERT_EQ(setenv("MASTER_PORT", std::to_string((*s0)->port()).c_str(), 1), 0);
  auto s1 = TcpStore::from_env(1, milliseconds(2000));
  ASSERT_TRUE(s1.ok()) << s1.status().to_string();
  EXPECT_EQ(to_string(val((*s1)->get("a", milliseconds(1000)))), "b");
  ASSERT_EQ(unsetenv("MASTER_ADDR"), 0);
  ASSERT_EQ(unsetenv("MASTER_PORT"), 0);
}

TEST(HostTcpStore, MeshAndAllreduceThroughTcpStore) {
  auto server = server_store();
  ASSERT_NE(server, nullptr);
  constexpr int kWorld = 4;
  constexpr size_t kCount = 1009;
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r)
    threads.emplace_back([&, r] {
      auto base = client_store(server->port());
      ASSERT_NE(base, nullptr);
      PrefixStore store("job", *base);
      TcpMeshOptions opts;
      opts.timeout = milliseconds(10000);
      auto mesh = TcpMesh::connect(store, r, kWorld, opts);
      ASSERT_TRUE(mesh.ok()) << mesh.status().to_string();
      std::vector<int32_t> v(kCount);
      for (size_t i = 0; i < kCount; ++i) v[i] = static_cast<int32_t>(i) * (r + 1);
      AllreduceOptions ao;
      ao.algorithm = AllreduceAlgorithm::kRing;
      Status s = allreduce(**mesh, v.data(), v.data(), kCount, DType::kInt32, ReduceOp::kSum, ao);
      ASSERT_TRUE(s.ok()) << s.to_string();
      for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(v[i], static_cast<int32_t>(i) * 10) << i;
    });
  for (auto& t : threads) t.join();
  // The mesh published one address per rank under the prefix.
  EXPECT_TRUE(server->wait({"job/mesh/addr/0", "job/mesh/addr/3"}, milliseconds(100)).ok());
}

TEST(HostTcpMesh, SetupTimesOutNamingRanksThatNeverCame) {
  test::TempDir dir;
  auto store = FileStore::create(dir.path());
  ASSERT_TRUE(store.ok());
  TcpMeshOptions opts;
  opts.timeout = milliseconds(300);
  // Rank 0 of 3 alone: ranks 1 and 2 never connect.
  const auto start = std::chrono::steady_clock::now();
  auto mesh = TcpMesh::connect(**store, 0, 3, opts);
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(mesh.status().message().find("ranks 1, 2 did not connect"), std::string::npos)
      << mesh.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3000));
  // Rank 2 of 3 alone (a fresh store): rank 0's address never appears.
  test::TempDir dir2;
  auto store2 = FileStore::create(dir2.path());
  ASSERT_TRUE(store2.ok());
  auto mesh2 = TcpMesh::connect(**store2, 2, 3, opts);
  ASSERT_FALSE(mesh2.ok());
  EXPECT_NE(mesh2.status().message().find("mesh/addr/0"), std::string::npos)
      << mesh2.status().to_string();
}

TEST(HostTcpMesh, SizeMismatchAndTimeoutNameThePeer) {
  test::run_ranks(2, [](Context& ctx) {
    auto& mesh = static_cast<TcpMesh&>(ctx);
    mesh.set_timeout(milliseconds(300));
    if (ctx.rank() == 0) {
      // Rank 1 never sends: the wait fails after the timeout, naming it.
      uint8_t b[4];
      const auto start = std::chrono::steady_clock::now();
      Status s = ctx.wait(ctx.irecv(1, b, 4));
      EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
      EXPECT_EQ(s.message(), "rank 1 did not send within 300 ms");
      EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(300));
      // The mesh is broken from now on.
      EXPECT_FALSE(ctx.wait(ctx.isend(1, b, 4)).ok());
    } else {
      std::this_thread::sleep_for(milliseconds(800));  // alive, silent
    }
  });
  test::run_ranks(2, [](Context& ctx) {
    uint8_t b[16] = {};
    if (ctx.rank() == 0) {
      Status s = ctx.wait(ctx.isend(1, b, 16));
      EXPECT_TRUE(s.ok()) << s.to_string();
    } else {
      Status s = ctx.wait(ctx.irecv(0, b, 8));
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("rank 0 sent a message of another size"), std::string::npos)
          << s.to_string();
    }
  });
}

TEST(HostTcpMesh, StrayConnectionDuringSetupIsDropped) {
  // A client that is not a mesh peer connects first, sends garbage and stays connected.
  test::mesh_forms_despite(milliseconds(5000), [](int fd) {
    const char junk[16] = "GET / HTTP/1.0\n";
    EXPECT_TRUE(send_all(fd, junk, sizeof(junk), Clock::now() + milliseconds(1000), "stray").ok());
    return fd;
  });
}

TEST(HostFileStore, EmptyKeyIsRejected) {
  test::TempDir dir;
  auto store = FileStore::create(dir.path());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->set("", to_bytes("x")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->add("", 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ina::host
