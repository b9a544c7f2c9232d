// Device-buffer AllReduce and asynchronous collectives through a real ina-aggregator on loopback,
// with the GPU-less FakeDeviceOps standing in for CUDA (threads as ranks, one communicator each).
// Checks that the staged pipeline's result is bitwise the one of the same AllReduce on host
// buffers (and of the protocol model) for every dtype and op and counts 0, 1, prime and
// 1,000,003; the request lifecycle (test, wait, detach, order with blocking calls); NCCL-style
// stream ordering; and a device failure mid-pipeline on every rank.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../worker/fake_device_ops.h"
#include "ina/ina.hpp"
#include "loopback_support.h"
#include "worker/communicator_impl.h"
#include "worker/transport/udp_transport.h"

namespace {

using namespace std::chrono_literals;
using ina::DType;
using ina::ReduceOp;
using ina::Status;
using ina::testing::AggregatorProcess;
using ina::testing::Case;
using ina::testing::FakeDeviceOps;

constexpr int kWorld = 3;
constexpr uint32_t kBlock = 64;
constexpr uint64_t kChunk = 1000;  // rounded up to 1024: 16 blocks per chunk

struct Rank {
  FakeDeviceOps* ops = nullptr;  // owned by comm
  std::unique_ptr<ina::Communicator> comm;
};

ina::Result<Rank> make_rank(int rank, uint16_t port, const FakeDeviceOps::Options& o) {
  ina::Config cfg;
  cfg.rank = rank;
  cfg.world_size = kWorld;
  cfg.aggregator_port = port;
  cfg.block_elems = kBlock;
  cfg.timeout = 5000ms;
  cfg.retransmit = 2000us;
  cfg.device_chunk_elems = kChunk;
  cfg.device_buffers = 2;
  ina::worker::UdpTransportOptions uo;
  uo.port = port;
  INA_ASSIGN_OR_RETURN(auto udp, ina::worker::UdpTransport::create(uo));
  auto ops = std::make_unique<FakeDeviceOps>(o);
  Rank r;
  r.ops = ops.get();
  INA_ASSIGN_OR_RETURN(r.comm,
                       ina::worker::create_communicator(cfg, std::move(udp), std::move(ops)));
  return r;
}

// Runs body(rank, Rank&) on kWorld threads; returns the failures, one line per rank.
std::string run_ranks(uint16_t port, const FakeDeviceOps::Options& o,
                      const std::function<std::string(int, Rank&)>& body) {
  std::vector<std::string> errs(kWorld);
  std::vector<std::thread> ts;
  for (int r = 0; r < kWorld; ++r) {
    ts.emplace_back([&, r] {
      auto rk = make_rank(r, port, o);
      if (!rk.ok()) {
        errs[r] = "create: " + rk.status().to_string();
        return;
      }
      errs[r] = body(r, *rk);
    });
  }
  for (auto& t : ts) t.join();
  std::string all;
  for (int r = 0; r < kWorld; ++r) {
    if (!errs[r].empty()) all += "rank " + std::to_string(r) + ": " + errs[r] + "\n";
  }
  return all;
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  for (DType t : {DType::kInt32, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{7919}}) cs.push_back(Case{t, op, n, false});
    }
  }
  cs.push_back(Case{DType::kFloat32, ReduceOp::kSum, 7919, true});  // a NaN block
  cs.push_back(Case{DType::kFloat32, ReduceOp::kSum, 1000003, false});
  cs.push_back(Case{DType::kBFloat16, ReduceOp::kMax, 1000003, false});
  return cs;
}

std::string describe(const Case& c) {
  return std::string(ina::dtype_name(c.dtype)) + " " + std::string(ina::op_name(c.op)) + " x" +
         std::to_string(c.count) + (c.nan ? " (NaN)" : "");
}

class DeviceAllreduce : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(agg_.start(kWorld), ""); }
  AggregatorProcess agg_;
};

TEST_F(DeviceAllreduce, BitwiseEqualToHostBuffersEveryDtypeOpAndCount) {
  const std::vector<Case> cs = cases();
  // The model needs every rank's input.
  std::vector<std::vector<uint8_t>> expected(cs.size());
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    std::vector<std::vector<uint8_t>> inputs(kWorld);
    for (int r = 0; r < kWorld; ++r)
      ina::testing::fill_input(inputs[r], cs[ci], r, static_cast<int>(ci));
    expected[ci] = ina::testing::model_result(inputs, cs[ci], kBlock);
  }
  const std::string err = run_ranks(agg_.port, {}, [&](int rank, Rank& rk) -> std::string {
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      const Case& c = cs[ci];
      std::vector<uint8_t> in;
      ina::testing::fill_input(in, c, rank, static_cast<int>(ci));
      const size_t bytes = in.size();
      void* d = rk.ops->alloc_device(bytes);
      if (bytes > 0) std::memcpy(d, in.data(), bytes);
      // In place on "device memory" (every third case out of place into another device buffer).
      void* dout = ci % 3 == 0 ? rk.ops->alloc_device(bytes) : d;
      const uint64_t copies0 = rk.ops->shared()->copies_to_host.load();
      Status s = rk.comm->allreduce(d, dout, c.count, c.dtype, c.op);
      std::vector<uint8_t> dev(static_cast<uint8_t*>(dout), static_cast<uint8_t*>(dout) + bytes);
      if (dout != d) rk.ops->free_device(dout);
      rk.ops->free_device(d);
      if (!s.ok()) return describe(c) + ": device allreduce: " + s.to_string();
      const uint64_t chunks = (c.count + 1023) / 1024;
      if (rk.ops->shared()->copies_to_host.load() - copies0 != chunks) {
        return describe(c) + ": expected " + std::to_string(chunks) + " chunks staged";
      }
      std::vector<uint8_t> host(bytes);
      s = rk.comm->allreduce(in.data(), host.data(), c.count, c.dtype, c.op);
      if (!s.ok()) return describe(c) + ": host allreduce: " + s.to_string();
      if (dev != host) return describe(c) + ": device result differs from the host buffers' one";
      if (dev != expected[ci]) return describe(c) + ": differs from the protocol model";
    }
    if (!rk.ops->hazards().empty()) return "hazard: " + rk.ops->hazards()[0];
    return "";
  });
  EXPECT_EQ(err, "");
}

// The same job sharded over two aggregators (the fixture's and a second one): device buffers,
// synchronous and asynchronous, go through the same sharded path and give the model's results.
TEST_F(DeviceAllreduce, ShardedOverTwoAggregators) {
  AggregatorProcess second;
  ASSERT_EQ(second.start(kWorld), "");
  const std::vector<Case> cs = {Case{DType::kFloat32, ReduceOp::kSum, 7919, false},
                                Case{DType::kInt32, ReduceOp::kSum, 100000, false},
                                Case{DType::kBFloat16, ReduceOp::kMax, 3001, false},
                                Case{DType::kFloat32, ReduceOp::kSum, 1000003, false}};
  std::vector<std::vector<uint8_t>> expected(cs.size());
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    std::vector<std::vector<uint8_t>> inputs(kWorld);
    for (int r = 0; r < kWorld; ++r)
      ina::testing::fill_input(inputs[r], cs[ci], r, static_cast<int>(ci));
    expected[ci] = ina::testing::model_result(inputs, cs[ci], kBlock);
  }
  std::vector<std::string> errs(kWorld);
  std::vector<std::thread> ts;
  for (int rank = 0; rank < kWorld; ++rank) {
    ts.emplace_back([&, rank] {
      errs[rank] = [&]() -> std::string {
        ina::Config cfg;
        cfg.rank = rank;
        cfg.world_size = kWorld;
        cfg.aggregators = {{"127.0.0.1", agg_.port}, {"127.0.0.1", second.port}};
        cfg.aggregator_port = agg_.port;
        cfg.block_elems = kBlock;
        cfg.timeout = 5000ms;
        cfg.retransmit = 2000us;
        cfg.device_chunk_elems = kChunk;
        cfg.device_buffers = 2;
        std::vector<std::unique_ptr<ina::worker::Transport>> transports;
        for (uint16_t port : {agg_.port, second.port}) {
          ina::worker::UdpTransportOptions uo;
          uo.port = port;
          auto udp = ina::worker::UdpTransport::create(uo);
          if (!udp.ok()) return "udp: " + udp.status().to_string();
          transports.push_back(std::move(udp.value()));
        }
        auto owned = std::make_unique<FakeDeviceOps>(FakeDeviceOps::Options{});
        FakeDeviceOps& ops = *owned;
        auto comm = ina::worker::create_communicator(cfg, std::move(transports), std::move(owned));
        if (!comm.ok()) return "create: " + comm.status().to_string();
        for (size_t ci = 0; ci < cs.size(); ++ci) {
          const Case& c = cs[ci];
          std::vector<uint8_t> in;
          ina::testing::fill_input(in, c, rank, static_cast<int>(ci));
          void* d = ops.alloc_device(in.size());
          std::memcpy(d, in.data(), in.size());
          Status s = (*comm)->allreduce(d, d, c.count, c.dtype, c.op);
          std::vector<uint8_t> dev(static_cast<uint8_t*>(d), static_cast<uint8_t*>(d) + in.size());
          ops.free_device(d);
          if (!s.ok()) return describe(c) + ": device allreduce: " + s.to_string();
          if (dev != expected[ci]) return describe(c) + ": device result differs from the model";
          std::vector<uint8_t> host = in;
          auto req =
              (*comm)->allreduce_async(host.data(), host.data(), c.count, c.dtype, c.op, nullptr);
          if (!req.ok()) return describe(c) + ": submit: " + req.status().to_string();
          s = (*req)->wait();
          if (!s.ok()) return describe(c) + ": async allreduce: " + s.to_string();
          if (host != expected[ci]) return describe(c) + ": async result differs from the model";
        }
        if ((*comm)->on_host_path()) return "on the host path";
        return "";
      }();
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(errs[r], "") << "rank " << r;
}

TEST_F(DeviceAllreduce, AsyncRequestsStreamOrderAndLifecycle) {
  FakeDeviceOps::Options o;
  o.copy_delay_us = 20;
  const size_t n = 5000;
  const Case c32{DType::kFloat32, ReduceOp::kSum, n, false};
  const Case c16{DType::kBFloat16, ReduceOp::kMax, n, false};
  const Case ci32{DType::kInt32, ReduceOp::kSum, n, false};
  std::vector<std::vector<uint8_t>> exp(3);
  {
    int idx = 0;
    for (const Case& c : {c32, c16, ci32}) {
      std::vector<std::vector<uint8_t>> inputs(kWorld);
      for (int r = 0; r < kWorld; ++r) ina::testing::fill_input(inputs[r], c, r, 100 + idx);
      exp[idx] = ina::testing::model_result(inputs, c, kBlock);
      ++idx;
    }
  }
  const std::string err = run_ranks(agg_.port, o, [&](int rank, Rank& rk) -> std::string {
    FakeDeviceOps& ops = *rk.ops;
    auto user = ops.create_stream();
    if (!user.ok()) return "stream";
    std::vector<std::vector<uint8_t>> in(3);
    std::vector<void*> dev(3);
    int idx = 0;
    for (const Case& c : {c32, c16, ci32}) {
      ina::testing::fill_input(in[idx], c, rank, 100 + idx);
      dev[idx] = ops.alloc_device(in[idx].size());
      ++idx;
    }
    // Earlier work on the stream writes the inputs late: the collectives must wait for it.
    if (!ops.launch_host_func(*user,
                              [&] {
                                std::this_thread::sleep_for(30ms);
                                for (int i = 0; i < 3; ++i)
                                  std::memcpy(dev[i], in[i].data(), in[i].size());
                              })
             .ok()) {
      return "host func";
    }
    std::vector<std::unique_ptr<ina::Request>> reqs;
    const Case* cs[3] = {&c32, &c16, &ci32};
    for (int i = 0; i < 3; ++i) {
      auto r = rk.comm->allreduce_async(dev[i], dev[i], n, cs[i]->dtype, cs[i]->op, *user);
      if (!r.ok()) return "submit: " + r.status().to_string();
      reqs.push_back(std::move(r.value()));
    }
    // Later work on the stream sees the results.
    std::vector<std::vector<uint8_t>> seen(3);
    if (!ops.launch_host_func(*user,
                              [&] {
                                for (int i = 0; i < 3; ++i) {
                                  auto* p = static_cast<uint8_t*>(dev[i]);
                                  seen[i].assign(p, p + in[i].size());
                                }
                              })
             .ok()) {
      return "host func";
    }
    bool done = false;
    Status s = reqs[0]->test(&done);
    if (!s.ok()) return "test: " + s.to_string();
    if (done) return "request 0 done before the stream's earlier work finished";
    auto t0 = std::chrono::steady_clock::now();
    while (!done && std::chrono::steady_clock::now() - t0 < 20s) {
      s = reqs[0]->test(&done);
      std::this_thread::sleep_for(1ms);
    }
    if (!done || !s.ok()) return "request 0: " + s.to_string();
    for (int i = 1; i < 3; ++i) {
      s = reqs[i]->wait();
      if (!s.ok()) return "wait " + std::to_string(i) + ": " + s.to_string();
    }
    if (!ops.stream_synchronize(*user).ok()) return "user stream";
    for (int i = 0; i < 3; ++i) {
      if (seen[i] != exp[i])
        return "stream-ordered read of result " + std::to_string(i) + " differs";
    }

    // Host buffers through the async form (no stream), then a request freed while pending,
    // followed by a blocking call: it runs after the detached one.
    std::vector<uint8_t> hin = in[0];
    {
      ina::testing::fill_input(hin, c32, rank, 100);
      auto r = rk.comm->allreduce_async(hin.data(), hin.data(), n, DType::kFloat32, ReduceOp::kSum,
                                        nullptr);
      if (!r.ok()) return "host async: " + r.status().to_string();
      s = (*r)->wait();
      if (!s.ok() || hin != exp[0]) return "host async result: " + s.to_string();
      s = (*r)->wait();  // waiting twice returns the same result
      if (!s.ok()) return "second wait: " + s.to_string();
    }
    // Host buffers ordered on a stream: start after the stream's earlier work, hold its later
    // work until done.
    {
      std::vector<uint8_t> late(in[2].size(), 0);
      std::vector<uint8_t> after;
      if (!ops.launch_host_func(*user,
                                [&] {
                                  std::this_thread::sleep_for(20ms);
                                  late = in[2];
                                })
               .ok()) {
        return "host func";
      }
      auto r = rk.comm->allreduce_async(late.data(), late.data(), n, DType::kInt32, ReduceOp::kSum,
                                        *user);
      if (!r.ok()) return "host async on a stream: " + r.status().to_string();
      if (!ops.launch_host_func(*user, [&] { after = late; }).ok()) return "host func";
      if (!ops.stream_synchronize(*user).ok()) return "user stream";
      if (after != exp[2]) return "host buffers on a stream: later stream work saw no result";
      s = (*r)->wait();
      if (!s.ok()) return "host buffers on a stream: " + s.to_string();
    }
    std::memcpy(dev[1], in[1].data(), in[1].size());
    {
      auto r =
          rk.comm->allreduce_async(dev[1], dev[1], n, DType::kBFloat16, ReduceOp::kMax, nullptr);
      if (!r.ok()) return "detached submit: " + r.status().to_string();
    }  // freed pending: detached
    std::vector<uint8_t> hout(in[2].size());
    s = rk.comm->allreduce(in[2].data(), hout.data(), n, DType::kInt32, ReduceOp::kSum);
    if (!s.ok() || hout != exp[2]) return "blocking after detached: " + s.to_string();
    if (std::memcmp(dev[1], exp[1].data(), exp[1].size()) != 0) return "detached result";
    if (!ops.hazards().empty()) return "hazard: " + ops.hazards()[0];
    for (void* p : dev) ops.free_device(p);
    ops.destroy_stream(*user);
    return "";
  });
  EXPECT_EQ(err, "");
}

TEST_F(DeviceAllreduce, CopyFailureMidPipelineOnEveryRankThenRecovers) {
  FakeDeviceOps::Options o;
  o.fail_run_copy = 6;  // D2H 1, 2, then (H2D k, D2H k+2): copy 6 is chunk 3's device-to-host
  const size_t n = 8 * 1024;
  const std::string err = run_ranks(agg_.port, o, [&](int rank, Rank& rk) -> std::string {
    const Case c{DType::kFloat32, ReduceOp::kSum, n, false};
    std::vector<uint8_t> in;
    ina::testing::fill_input(in, c, rank, 7);
    void* d = rk.ops->alloc_device(in.size());
    std::memcpy(d, in.data(), in.size());
    auto r = rk.comm->allreduce_async(d, d, n, c.dtype, c.op, nullptr);
    if (!r.ok()) return "submit: " + r.status().to_string();
    Status s = (*r)->wait();
    if (s.ok()) return "the failed copy went unnoticed";
    if (s.message().find("device-to-host copy of chunk 3 of 8") == std::string::npos) {
      return "message: " + s.message();
    }
    std::memcpy(d, in.data(), in.size());
    s = rk.comm->allreduce(d, d, n, c.dtype, c.op);
    std::vector<uint8_t> host(in.size());
    Status h = rk.comm->allreduce(in.data(), host.data(), n, c.dtype, c.op);
    const bool same = std::memcmp(d, host.data(), host.size()) == 0;
    rk.ops->free_device(d);
    if (!s.ok() || !h.ok()) return "after the failure: " + s.to_string() + " / " + h.to_string();
    if (!same) return "after the failure: device and host results differ";
    return "";
  });
  EXPECT_EQ(err, "");
}

TEST_F(DeviceAllreduce, StreamWithoutUsableDeviceIsAClearError) {
  FakeDeviceOps::Options o;
  o.available = false;
  const std::string err = run_ranks(agg_.port, o, [&](int, Rank& rk) -> std::string {
    int32_t x = 1;
    int dummy = 0;
    auto r = rk.comm->allreduce_async(&x, &x, 1, DType::kInt32, ReduceOp::kSum, &dummy);
    if (r.ok()) return "accepted a stream without a device";
    if (r.status().message().find("a CUDA stream was given but fake is not usable") ==
        std::string::npos) {
      return "message: " + r.status().message();
    }
    auto bad = rk.comm->allreduce_async(&x, &x, 1, static_cast<DType>(9), ReduceOp::kSum, nullptr);
    if (bad.ok() || bad.status().message().find("unknown dtype 9") == std::string::npos) {
      return "bad dtype accepted";
    }
    // Host buffers still work (also through the async form).
    Status s = rk.comm->allreduce(&x, &x, 1, DType::kInt32, ReduceOp::kSum);
    if (!s.ok() || x != kWorld) return "host allreduce: " + s.to_string();
    return "";
  });
  EXPECT_EQ(err, "");
}

}  // namespace
