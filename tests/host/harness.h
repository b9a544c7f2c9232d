// Threads as ranks over a real TcpMesh on 127.0.0.1, rendezvous through a FileStore in a fresh
// temporary directory (Gloo's base_test.h pattern).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "worker/host/socket.h"
#include "worker/host/store.h"
#include "worker/host/tcp_mesh.h"

namespace ina::host::test {

// A fresh directory under TMPDIR (or /tmp), removed at destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base ? base : "/tmp") + "/ina-host-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    const char* made = mkdtemp(buf.data());
    if (made == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      return;
    }
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs fn(ctx) on `world` threads, each with its own FileStore client and TcpMesh. Mesh setup
// failures are test failures; fn runs only when every rank has its mesh.
inline void run_ranks(int world, const std::function<void(Context&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  TempDir dir;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto store = FileStore::create(dir.path());
      ASSERT_TRUE(store.ok()) << store.status().to_string();
      TcpMeshOptions opts;
      opts.timeout = timeout;
      auto mesh = TcpMesh::connect(**store, r, world, opts);
      ASSERT_TRUE(mesh.ok()) << "rank " << r << ": " << mesh.status().to_string();
      fn(**mesh);
    });
  }
  for (auto& t : threads) t.join();
}

// A two-rank mesh whose rank 0 is reached first by something that is not rank 1: rank 0
// connects in a thread; once it listens, `intrude` gets a TCP connection to its listening address
// (a stray client, a peer that resets before its hello) and returns an fd to close once rank 0
// is done (-1: none). Then rank 1 connects. Both meshes must form and carry a word each way.
inline void mesh_forms_despite(std::chrono::milliseconds timeout,
                               const std::function<int(int fd)>& intrude) {
  using std::chrono::milliseconds;
  TempDir dir;
  auto store = FileStore::create(dir.path());
  ASSERT_TRUE(store.ok());
  TcpMeshOptions opts;
  opts.timeout = timeout;
  Result<std::unique_ptr<TcpMesh>> m0 = unavailable("not run");
  std::thread rank0([&] { m0 = TcpMesh::connect(**store, 0, 2, opts); });
  auto addr = (*store)->get("mesh/addr/0", milliseconds(5000));
  ASSERT_TRUE(addr.ok());
  auto hp = parse_host_port(to_string(*addr));
  ASSERT_TRUE(hp.ok());
  auto fd = connect_tcp(hp->host, hp->port, Clock::now() + milliseconds(2000));
  ASSERT_TRUE(fd.ok());
  const int keep = intrude(*fd);
  auto m1 = TcpMesh::connect(**store, 1, 2, opts);
  rank0.join();
  if (keep >= 0) close(keep);
  ASSERT_TRUE(m0.ok()) << m0.status().to_string();
  ASSERT_TRUE(m1.ok()) << m1.status().to_string();
  for (int from = 0; from < 2; ++from) {
    Context& a = from == 0 ? **m0 : **m1;
    Context& b = from == 0 ? **m1 : **m0;
    uint32_t x = 42 + from, y = 0;
    Context::Handle h = a.isend(1 - from, &x, 4);
    ASSERT_TRUE(b.wait(b.irecv(from, &y, 4)).ok());
    ASSERT_TRUE(a.wait(h).ok());
    EXPECT_EQ(y, x);
  }
}

}  // namespace ina::host::test
