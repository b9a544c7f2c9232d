// GPUDirect RDMA (suite rdma): CUDA device buffers registered with the NIC (dmabuf, else peer
// memory, else host staging) and moved by VerbsMesh between device buffers of two ranks. Needs an
// RDMA device and a CUDA GPU with its driver; exits 77 (Meson SKIP) naming what is missing.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "ina_config.h"

#if INA_HAVE_RDMA && INA_HAVE_CUDA
#include <cuda_runtime.h>
#include <infiniband/verbs.h>

#include "ina/kernels/cuda_probe.h"
#include "tests/host/harness.h"
#include "worker/rdma/gpudirect.h"
#include "worker/rdma/verbs_mesh.h"

namespace ina::rdma {
namespace {

using namespace std::chrono_literals;

struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : bytes(n) { EXPECT_EQ(cudaMalloc(&ptr, n), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  void* ptr = nullptr;
  size_t bytes;
};

TEST(GpuDirect, DevicePointersAreRecognised) {
  DeviceBuffer d(4096);
  std::vector<uint8_t> h(16);
  EXPECT_TRUE(is_device_pointer(d.ptr));
  EXPECT_FALSE(is_device_pointer(h.data()));
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 64), cudaSuccess);
  EXPECT_FALSE(is_device_pointer(pinned));
  cudaFreeHost(pinned);
}

TEST(GpuDirect, RegistrationPicksAKind) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_GT(n, 0);
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  DeviceBuffer d(1 << 20);
  DeviceRegistration reg = register_device_memory(pd, d.ptr, d.bytes, IBV_ACCESS_LOCAL_WRITE);
  std::printf("device registration: %s (%s)\n", device_reg_kind_name(reg.kind), reg.detail.c_str());
  if (reg.kind == DeviceRegKind::kHostStaging) {
    EXPECT_EQ(reg.mr, nullptr);
    EXPECT_FALSE(reg.detail.empty());  // says why neither dmabuf nor peer memory worked
  } else {
    ASSERT_NE(reg.mr, nullptr);
    EXPECT_GE(reg.mr->length, d.bytes);
  }
  deregister_device_memory(&reg);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

// Device -> device and host -> device through the verbs mesh, several chunks each.
TEST(GpuDirect, MeshMovesDeviceBuffers) {
  const size_t n = 3 * 65536 + 123;
  host::test::TempDir dir;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto store = host::FileStore::create(dir.path());
      ASSERT_TRUE(store.ok());
      VerbsMeshOptions o;
      o.slot_bytes = 65536;
      o.slots = 2;
      o.timeout = 20s;
      auto mesh = VerbsMesh::connect(**store, r, 2, o);
      ASSERT_TRUE(mesh.ok()) << mesh.status().to_string();
      std::vector<uint8_t> host(n);
      for (size_t i = 0; i < n; ++i) host[i] = static_cast<uint8_t>(i * 7 + r);
      DeviceBuffer src(n), dst(n), dst2(n);
      ASSERT_EQ(cudaMemcpy(src.ptr, host.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
      const int peer = 1 - r;
      host::Context& m = **mesh;
      const auto h1 = m.irecv(peer, dst.ptr, n);
      const auto h2 = m.irecv(peer, dst2.ptr, n);
      const auto h3 = m.isend(peer, src.ptr, n);
      const auto h4 = m.isend(peer, host.data(), n);
      ASSERT_TRUE(m.wait(h1).ok());
      ASSERT_TRUE(m.wait(h2).ok());
      ASSERT_TRUE(m.wait(h3).ok());
      ASSERT_TRUE(m.wait(h4).ok());
      std::vector<uint8_t> got(n), got2(n);
      ASSERT_EQ(cudaMemcpy(got.data(), dst.ptr, n, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got2.data(), dst2.ptr, n, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], static_cast<uint8_t>(i * 7 + peer)) << i;
        ASSERT_EQ(got2[i], static_cast<uint8_t>(i * 7 + peer)) << i;
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
  const ina::features::Probe gpu = ina::features::probe_cuda();
  if (!gpu.usable) {
    std::printf("SKIP: no CUDA GPU (%s)\n", gpu.detail.c_str());
    return 77;
  }
  if (!ina::rdma::cuda_driver_available(&why)) {
    std::printf("SKIP: %s\n", why.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

#else

int main() {
  std::printf("SKIP: GPUDirect needs libina built with the rdma and cuda features\n");
  return 77;
}

#endif
