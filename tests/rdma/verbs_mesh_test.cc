// VerbsMesh on a real RDMA device (suite rdma): threads as ranks, each with its own VerbsMesh,
// rendezvous through a FileStore. Exits 77 (Meson SKIP) with the reason where libina was built
// without the rdma feature or the machine has no RDMA device (ibv_get_device_list found 0); a
// soft RoCE device (rdma_rxe) on loopback is enough to run it.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ina_config.h"
#include "tests/host/harness.h"
#include "worker/host/allreduce.h"
#include "worker/host/alltoall.h"
#include "worker/host/store.h"

#if INA_HAVE_RDMA
#include "worker/rdma/verbs_mesh.h"

namespace ina::rdma {
namespace {

using namespace std::chrono_literals;

// Runs fn(mesh) on `world` threads over VerbsMesh; small slots by default so that credits and
// chunking are exercised by modest messages.
void run_verbs(int world, const std::function<void(VerbsMesh&)>& fn, VerbsMeshOptions opts = {}) {
  host::test::TempDir dir;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto store = host::FileStore::create(dir.path());
      ASSERT_TRUE(store.ok()) << store.status().to_string();
      auto mesh = VerbsMesh::connect(**store, r, world, opts);
      ASSERT_TRUE(mesh.ok()) << "rank " << r << ": " << mesh.status().to_string();
      fn(**mesh);
    });
  }
  for (auto& t : threads) t.join();
}

// INA_VERBS_DEVICE / INA_VERBS_GID_INDEX pick the device (`testbed/run.py rdma` sets them).
VerbsMeshOptions small_slots() {
  VerbsMeshOptions o;
  auto sel =
      parse_verbs_selection(std::getenv("INA_VERBS_DEVICE"), std::getenv("INA_VERBS_GID_INDEX"));
  EXPECT_TRUE(sel.ok()) << sel.status().to_string();
  if (sel.ok()) {
    o.device = sel->device;
    o.port = sel->port;
    o.gid_index = sel->gid_index;
  }
  o.slot_bytes = 4096;
  o.slots = 4;
  o.timeout = 20s;
  return o;
}

std::vector<uint8_t> pattern(size_t n, int from, int to, int k) {
  std::vector<uint8_t> v(n);
  std::mt19937 g(static_cast<unsigned>(from * 1000003 + to * 101 + k));
  for (auto& b : v) b = static_cast<uint8_t>(g());
  return v;
}

// Every size around the chunk boundaries, posted all at once in both directions: ordered
// matching, chunking and credits (a 3 MB message through 4 slots of 4 KiB).
TEST(VerbsMesh, PairExchangeAllSizes) {
  const std::vector<size_t> sizes = {0, 1, 4095, 4096, 4097, 5 * 4096 + 3, 3u << 20, 0, 17};
  run_verbs(
      2,
      [&](VerbsMesh& m) {
        const int peer = 1 - m.rank();
        std::vector<std::vector<uint8_t>> out, in;
        std::vector<host::Context::Handle> hs;
        for (size_t k = 0; k < sizes.size(); ++k) {
          out.push_back(pattern(sizes[k], m.rank(), peer, static_cast<int>(k)));
          in.emplace_back(sizes[k]);
        }
        for (size_t k = 0; k < sizes.size(); ++k)
          hs.push_back(m.irecv(peer, in[k].data(), sizes[k]));
        for (size_t k = 0; k < sizes.size(); ++k)
          hs.push_back(m.isend(peer, out[k].data(), sizes[k]));
        ASSERT_TRUE(m.wait_all(hs).ok()) << m.error().to_string();
        for (size_t k = 0; k < sizes.size(); ++k)
          EXPECT_EQ(in[k], pattern(sizes[k], peer, m.rank(), static_cast<int>(k)))
              << "message " << k;
      },
      small_slots());
}

// The host collectives run unchanged over verbs and match a reference.
TEST(VerbsMesh, AllreduceAlgorithmsAndAlltoall) {
  for (int world : {2, 3, 4}) {
    for (auto algo : {host::AllreduceAlgorithm::kRing, host::AllreduceAlgorithm::kTree,
                      host::AllreduceAlgorithm::kHalvingDoubling}) {
      const size_t count = 100003;
      run_verbs(
          world,
          [&](VerbsMesh& m) {
            std::vector<int32_t> v(count);
            for (size_t i = 0; i < count; ++i)
              v[i] = static_cast<int32_t>(i % 1000) * (m.rank() + 1);
            host::AllreduceOptions o;
            o.algorithm = algo;
            ASSERT_TRUE(
                host::allreduce(m, v.data(), v.data(), count, DType::kInt32, ReduceOp::kSum, o)
                    .ok())
                << m.error().to_string();
            const int32_t f = world * (world + 1) / 2;
            for (size_t i = 0; i < count; i += 997)
              ASSERT_EQ(v[i], static_cast<int32_t>(i % 1000) * f);
            // AllToAll: block j of rank r holds r * 1000 + j.
            const size_t n = 1001;
            std::vector<int32_t> s(n * world), r(n * world, -1);
            for (int j = 0; j < world; ++j)
              for (size_t i = 0; i < n; ++i)
                s[j * n + i] = m.rank() * 1000 + j + static_cast<int32_t>(i);
            ASSERT_TRUE(host::alltoall(m, s.data(), r.data(), n, DType::kInt32).ok());
            for (int j = 0; j < world; ++j)
              for (size_t i = 0; i < n; ++i)
                ASSERT_EQ(r[j * n + i], j * 1000 + m.rank() + static_cast<int32_t>(i));
          },
          small_slots());
    }
  }
}

TEST(VerbsMesh, SizeMismatchNamesThePeer) {
  run_verbs(
      2,
      [](VerbsMesh& m) {
        std::vector<uint8_t> buf(10000);
        if (m.rank() == 0) {
          const Status s = m.wait(m.isend(1, buf.data(), 9000));
          EXPECT_TRUE(s.ok()) << s.to_string();
        } else {
          const Status s = m.wait(m.irecv(0, buf.data(), 10000));
          ASSERT_FALSE(s.ok());
          EXPECT_EQ(s.message(),
                    "rank 0 sent a message of another size than the 10000 bytes expected");
          EXPECT_EQ(m.wait(m.irecv(0, buf.data(), 1)).message(),
                    s.message());  // the mesh is broken
        }
      },
      small_slots());
}

TEST(VerbsMesh, SilentPeerTimesOutNamingIt) {
  VerbsMeshOptions o = small_slots();
  o.timeout = 300ms;
  run_verbs(
      3,
      [](VerbsMesh& m) {
        if (m.rank() != 0) return;  // ranks 1 and 2 send nothing
        uint8_t b[8];
        const auto t0 = std::chrono::steady_clock::now();
        const Status s = m.wait(m.irecv(2, b, sizeof b));
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
        EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
        EXPECT_EQ(s.message(), "rank 2 did not send within 300 ms");
        EXPECT_GE(ms, 290);
        EXPECT_LT(ms, 5000);
      },
      o);
}

// A second mesh through the same store meets the peers' second incarnation, not stale keys.
TEST(VerbsMesh, RebuiltMeshUsesFreshKeys) {
  host::test::TempDir dir;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto store = host::FileStore::create(dir.path());
      ASSERT_TRUE(store.ok());
      for (int round = 0; round < 2; ++round) {
        auto mesh = VerbsMesh::connect(**store, r, 2, small_slots());
        ASSERT_TRUE(mesh.ok()) << mesh.status().to_string();
        int v = r + 10 * round, got = -1;
        ASSERT_TRUE((*mesh)->sendrecv(1 - r, &v, sizeof v, 1 - r, &got, sizeof got).ok());
        EXPECT_EQ(got, 1 - r + 10 * round);
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace ina::rdma

int main(int argc, char** argv) {
  std::string why;
  if (ina::rdma::verbs_device_count(&why) == 0) {
    std::printf("SKIP: %s\n", why.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

#else  // !INA_HAVE_RDMA

int main() {
  std::printf("SKIP: libina built without the rdma feature (libibverbs-dev)\n");
  return 77;
}

#endif
