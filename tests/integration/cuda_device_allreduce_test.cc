// Device-buffer AllReduce on a real GPU (suite cuda): cudaMalloc'ed buffers through a local
// ina-aggregator, threads as ranks, with libina's CUDA DeviceOps. The result must be bitwise the
// one of the same AllReduce on host buffers and of the protocol model, for every dtype and op;
// the asynchronous form must order itself on a CUDA stream (an earlier copy on the stream fills
// the input, a later one reads the result). Without a usable device every test skips with the
// reason and the program exits 77 (Meson SKIP).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ina/ina.hpp"
#include "loopback_support.h"
#include "worker/communicator_impl.h"
#include "worker/device/device_ops.h"
#include "worker/transport/udp_transport.h"

namespace {

using namespace std::chrono_literals;
using ina::DType;
using ina::ReduceOp;
using ina::Status;
using ina::testing::AggregatorProcess;
using ina::testing::Case;

constexpr int kWorld = 2;
constexpr uint32_t kBlock = 256;

std::string device_skip_reason() {
  const Status s = ina::worker::make_cuda_device_ops()->available();
  return s.ok() ? "" : s.message();
}

std::string run_ranks(uint16_t port,
                      const std::function<std::string(int, ina::Communicator&)>& body) {
  std::vector<std::string> errs(kWorld);
  std::vector<std::thread> ts;
  for (int r = 0; r < kWorld; ++r) {
    ts.emplace_back([&, r] {
      ina::Config cfg;
      cfg.rank = r;
      cfg.world_size = kWorld;
      cfg.aggregator_port = port;
      cfg.block_elems = kBlock;
      cfg.timeout = 10000ms;
      cfg.device_chunk_elems = 64 * kBlock;
      ina::worker::UdpTransportOptions uo;
      uo.port = port;
      auto udp = ina::worker::UdpTransport::create(uo);
      if (!udp.ok()) {
        errs[r] = udp.status().to_string();
        return;
      }
      auto comm = ina::worker::create_communicator(cfg, std::move(udp.value()));
      if (!comm.ok()) {
        errs[r] = "create: " + comm.status().to_string();
        return;
      }
      errs[r] = body(r, **comm);
    });
  }
  for (auto& t : ts) t.join();
  std::string all;
  for (int r = 0; r < kWorld; ++r) {
    if (!errs[r].empty()) all += "rank " + std::to_string(r) + ": " + errs[r] + "\n";
  }
  return all;
}

#define CUDA_OR_RETURN(call)                                                        \
  do {                                                                              \
    const cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) return std::string(#call ": ") + cudaGetErrorString(e_); \
  } while (0)

TEST(CudaDeviceAllreduce, BitwiseEqualToHostBuffers) {
  const std::string why = device_skip_reason();
  if (!why.empty()) GTEST_SKIP() << "no usable CUDA device: " << why;
  AggregatorProcess agg;
  ASSERT_EQ(agg.start(kWorld), "");
  std::vector<Case> cs;
  for (DType t : {DType::kInt32, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      for (size_t n : {size_t{1}, size_t{7919}, size_t{1000003}})
        cs.push_back(Case{t, op, n, false});
    }
  }
  std::vector<std::vector<uint8_t>> expected(cs.size());
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    std::vector<std::vector<uint8_t>> inputs(kWorld);
    for (int r = 0; r < kWorld; ++r)
      ina::testing::fill_input(inputs[r], cs[ci], r, static_cast<int>(ci));
    expected[ci] = ina::testing::model_result(inputs, cs[ci], kBlock);
  }
  const std::string err =
      run_ranks(agg.port, [&](int rank, ina::Communicator& comm) -> std::string {
        for (size_t ci = 0; ci < cs.size(); ++ci) {
          const Case& c = cs[ci];
          std::vector<uint8_t> in;
          ina::testing::fill_input(in, c, rank, static_cast<int>(ci));
          void* d = nullptr;
          CUDA_OR_RETURN(cudaMalloc(&d, in.size()));
          CUDA_OR_RETURN(cudaMemcpy(d, in.data(), in.size(), cudaMemcpyHostToDevice));
          Status s = comm.allreduce(d, d, c.count, c.dtype, c.op);
          std::vector<uint8_t> dev(in.size());
          CUDA_OR_RETURN(cudaMemcpy(dev.data(), d, in.size(), cudaMemcpyDeviceToHost));
          CUDA_OR_RETURN(cudaFree(d));
          if (!s.ok()) return "case " + std::to_string(ci) + ": " + s.to_string();
          std::vector<uint8_t> host(in.size());
          s = comm.allreduce(in.data(), host.data(), c.count, c.dtype, c.op);
          if (!s.ok()) return "host case " + std::to_string(ci) + ": " + s.to_string();
          if (dev != host || dev != expected[ci]) return "case " + std::to_string(ci) + " differs";
        }
        return "";
      });
  EXPECT_EQ(err, "");
}

TEST(CudaDeviceAllreduce, AsyncOrderedOnAStream) {
  const std::string why = device_skip_reason();
  if (!why.empty()) GTEST_SKIP() << "no usable CUDA device: " << why;
  AggregatorProcess agg;
  ASSERT_EQ(agg.start(kWorld), "");
  const Case c{DType::kFloat32, ReduceOp::kSum, 3000017, false};
  std::vector<std::vector<uint8_t>> inputs(kWorld);
  for (int r = 0; r < kWorld; ++r) ina::testing::fill_input(inputs[r], c, r, 5);
  const std::vector<uint8_t> expected = ina::testing::model_result(inputs, c, kBlock);
  const std::string err =
      run_ranks(agg.port, [&](int rank, ina::Communicator& comm) -> std::string {
        const std::vector<uint8_t>& in = inputs[rank];
        void* pin = nullptr;
        void* pout = nullptr;
        void* d = nullptr;
        cudaStream_t st = nullptr;
        CUDA_OR_RETURN(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        CUDA_OR_RETURN(cudaMallocHost(&pin, in.size()));
        CUDA_OR_RETURN(cudaMallocHost(&pout, in.size()));
        CUDA_OR_RETURN(cudaMalloc(&d, in.size()));
        std::memcpy(pin, in.data(), in.size());
        CUDA_OR_RETURN(cudaMemsetAsync(d, 0, in.size(), st));
        CUDA_OR_RETURN(cudaMemcpyAsync(d, pin, in.size(), cudaMemcpyHostToDevice, st));
        auto req = comm.allreduce_async(d, d, c.count, c.dtype, c.op, st);
        if (!req.ok()) return "submit: " + req.status().to_string();
        CUDA_OR_RETURN(cudaMemcpyAsync(pout, d, in.size(), cudaMemcpyDeviceToHost, st));
        CUDA_OR_RETURN(cudaStreamSynchronize(st));  // the stream waited for the collective
        const bool same = std::memcmp(pout, expected.data(), expected.size()) == 0;
        Status s = (*req)->wait();
        CUDA_OR_RETURN(cudaFree(d));
        CUDA_OR_RETURN(cudaFreeHost(pin));
        CUDA_OR_RETURN(cudaFreeHost(pout));
        CUDA_OR_RETURN(cudaStreamDestroy(st));
        if (!s.ok()) return "wait: " + s.to_string();
        if (!same) return "the stream-ordered copy of the result differs from the model";
        return "";
      });
  EXPECT_EQ(err, "");
}

// Figures for `testbed/run.py gpu` (no assertion on speed): 2 ranks on loopback, float32 SUM of
// 16 Mi elements, device buffers (staged) vs host buffers, best of 3.
TEST(CudaDeviceAllreduceThroughput, DeviceVsHostBuffers) {
  const std::string why = device_skip_reason();
  if (!why.empty()) GTEST_SKIP() << "no usable CUDA device: " << why;
  AggregatorProcess agg;
  ASSERT_EQ(agg.start(kWorld), "");
  const size_t n = size_t{16} << 20;
  const std::string err =
      run_ranks(agg.port, [&](int rank, ina::Communicator& comm) -> std::string {
        std::vector<float> h(n, 1.0f + static_cast<float>(rank));
        void* d = nullptr;
        CUDA_OR_RETURN(cudaMalloc(&d, n * 4));
        CUDA_OR_RETURN(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
        double best_dev = 1e9, best_host = 1e9;
        for (int it = 0; it < 3; ++it) {
          auto t0 = std::chrono::steady_clock::now();
          Status s = comm.allreduce(d, d, n, DType::kFloat32, ReduceOp::kSum);
          CUDA_OR_RETURN(cudaDeviceSynchronize());
          auto t1 = std::chrono::steady_clock::now();
          if (!s.ok()) return s.to_string();
          s = comm.allreduce(h.data(), h.data(), n, DType::kFloat32, ReduceOp::kSum);
          auto t2 = std::chrono::steady_clock::now();
          if (!s.ok()) return s.to_string();
          best_dev = std::min(best_dev, std::chrono::duration<double>(t1 - t0).count());
          best_host = std::min(best_host, std::chrono::duration<double>(t2 - t1).count());
        }
        CUDA_OR_RETURN(cudaFree(d));
        if (rank == 0) {
          std::printf(
              "device-buffer allreduce float32 sum, %zu elements, %d ranks on loopback: "
              "device %.3f ms (%.2f GB/s), host buffers %.3f ms (%.2f GB/s)\n",
              n, kWorld, best_dev * 1e3, n * 4 / best_dev / 1e9, best_host * 1e3,
              n * 4 / best_host / 1e9);
        }
        return "";
      });
  EXPECT_EQ(err, "");
}

}  // namespace

// Exit status 77 when every test skipped (no device): Meson reports SKIP.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  if (rc == 0 && u.successful_test_count() == 0 && u.skipped_test_count() > 0) return 77;
  return rc;
}
