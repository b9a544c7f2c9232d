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

}  // namespace ina::host::test
