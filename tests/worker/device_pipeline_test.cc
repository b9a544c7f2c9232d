// The device-buffer pipeline (worker/device/device_pipeline.cc) on the GPU-less FakeDeviceOps:
// chunk boundaries, buffer rotation and reuse without hazards, prefetch depth, stream ordering
// of the start, counts 0/1/prime/1,000,003, and failures at every step (copy refused, copy
// failing on the device, the network step failing) with every copy drained and nothing leaked.
#include "worker/device/device_pipeline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "fake_device_ops.h"

namespace ina::worker {
namespace {

using ina::testing::FakeDeviceOps;

// 3x + 1 modulo 2^32 (unsigned, since the inputs' 3x overflows int32).
int32_t three_x_plus_1(int32_t x) {
  return static_cast<int32_t>(3u * static_cast<uint32_t>(x) + 1u);
}

// The "network" of these tests: each element x becomes 3x + 1 (a function of the element alone,
// so the right answer does not depend on the chunking); it also checks the buffer is at rest.
ChunkReduce transform(FakeDeviceOps& ops, std::vector<size_t>* sizes, std::vector<uint64_t>* depth,
                      size_t fail_at = SIZE_MAX) {
  return [&ops, sizes, depth, fail_at](void* buf, size_t n) -> Status {
    ops.check_host_access(buf, n * 4);
    if (sizes->size() == fail_at) return unavailable("network down (test)");
    sizes->push_back(n);
    depth->push_back(ops.shared()->copies_to_host.load());
    auto* v = static_cast<int32_t*>(buf);
    for (size_t i = 0; i < n; ++i) v[i] = three_x_plus_1(v[i]);
    return ok_status();
  };
}

std::vector<int32_t> iota_input(size_t n) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i * 2654435761u);
  return v;
}

TEST(DevicePipeline, ChunkSizeIsWholeBlocks) {
  EXPECT_EQ(chunk_elems_for(0, 256), 256u * 512);
  EXPECT_EQ(chunk_elems_for(1, 256), 256u);
  EXPECT_EQ(chunk_elems_for(256, 256), 256u);
  EXPECT_EQ(chunk_elems_for(257, 256), 512u);
  EXPECT_EQ(chunk_elems_for(1000, 7), 1001u);
}

struct Shape {
  size_t count;
  size_t chunk;
  uint32_t buffers;
};

class PipelineShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(PipelineShapes, EveryElementOnceInOrderWithoutHazards) {
  const Shape sh = GetParam();
  FakeDeviceOps::Options o;
  o.copy_delay_us = sh.count > 100000 ? 0 : 50;  // make the copies lag the host
  FakeDeviceOps ops(o);
  const std::vector<int32_t> in = iota_input(sh.count);
  const size_t bytes = sh.count * 4;
  void* dsend = ops.alloc_device(bytes);
  void* drecv = ops.alloc_device(bytes);
  if (bytes > 0) std::memcpy(dsend, in.data(), bytes);
  std::vector<size_t> sizes;
  std::vector<uint64_t> depth;
  {
    DevicePipeline p(ops);
    PipelineOptions po{sh.chunk, sh.buffers};
    ASSERT_TRUE(
        p.run(dsend, drecv, sh.count, DType::kInt32, po, nullptr, transform(ops, &sizes, &depth))
            .ok());
    const size_t chunks = (sh.count + sh.chunk - 1) / sh.chunk;
    ASSERT_EQ(sizes.size(), chunks);
    for (size_t k = 0; k < chunks; ++k) {
      EXPECT_EQ(sizes[k], std::min(sh.chunk, sh.count - k * sh.chunk)) << "chunk " << k;
      // When chunk k is on the network, the next buffers-1 chunks are already being copied in.
      const size_t n = std::min<size_t>(sh.buffers, chunks);
      EXPECT_EQ(depth[k], std::min(chunks, k + n)) << "chunk " << k;
    }
    EXPECT_EQ(p.stats().bytes_to_host, bytes);
    EXPECT_EQ(p.stats().bytes_to_device, bytes);
    EXPECT_EQ(p.stats().staging_allocations, std::min<size_t>(sh.buffers, chunks));
  }
  const auto* out = static_cast<const int32_t*>(drecv);
  for (size_t i = 0; i < sh.count; ++i) ASSERT_EQ(out[i], three_x_plus_1(in[i])) << "element " << i;
  EXPECT_EQ(ops.hazards(), std::vector<std::string>{});
  EXPECT_EQ(ops.shared()->live_pinned.load(), 0);
  EXPECT_EQ(ops.shared()->live_streams.load(), 0);
  EXPECT_EQ(ops.shared()->live_events.load(), 0);
  ops.free_device(dsend);
  ops.free_device(drecv);
}

INSTANTIATE_TEST_SUITE_P(Counts, PipelineShapes,
                         ::testing::Values(Shape{0, 64, 2}, Shape{1, 64, 2}, Shape{7, 64, 2},
                                           Shape{64, 64, 2}, Shape{65, 64, 2}, Shape{1009, 64, 1},
                                           Shape{1009, 64, 2}, Shape{1009, 64, 3},
                                           Shape{1009, 256, 16}, Shape{1000003, 4096, 2}));

TEST(DevicePipeline, InPlaceAndMixedHostDevice) {
  FakeDeviceOps ops;
  const size_t n = 1000;
  const std::vector<int32_t> in = iota_input(n);
  std::vector<size_t> sizes;
  std::vector<uint64_t> depth;
  DevicePipeline p(ops);
  void* d = ops.alloc_device(n * 4);
  std::memcpy(d, in.data(), n * 4);
  ASSERT_TRUE(p.run(d, d, n, DType::kInt32, {96, 2}, nullptr, transform(ops, &sizes, &depth)).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(static_cast<int32_t*>(d)[i], three_x_plus_1(in[i]));
  // Host send, device recv.
  std::vector<int32_t> out(n);
  ASSERT_TRUE(
      p.run(in.data(), d, n, DType::kInt32, {96, 2}, nullptr, transform(ops, &sizes, &depth)).ok());
  std::memcpy(out.data(), d, n * 4);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], three_x_plus_1(in[i]));
  // A larger chunk later grows the staging buffers.
  ASSERT_TRUE(
      p.run(in.data(), d, n, DType::kInt32, {512, 2}, nullptr, transform(ops, &sizes, &depth))
          .ok());
  EXPECT_EQ(p.stats().staging_allocations, 4u);
  EXPECT_EQ(ops.hazards(), std::vector<std::string>{});
  ops.free_device(d);
}

TEST(DevicePipeline, StartsAfterTheStreamsEarlierWork) {
  FakeDeviceOps ops;
  const size_t n = 300;
  void* d = ops.alloc_device(n * 4);
  auto user = ops.create_stream();
  ASSERT_TRUE(user.ok());
  // "A kernel" on the user's stream fills the input late; the start event is recorded after it.
  ASSERT_TRUE(ops.launch_host_func(*user,
                                   [d, n] {
                                     std::this_thread::sleep_for(std::chrono::milliseconds(30));
                                     for (size_t i = 0; i < n; ++i)
                                       static_cast<int32_t*>(d)[i] = static_cast<int32_t>(i);
                                   })
                  .ok());
  auto start = ops.create_event();
  ASSERT_TRUE(start.ok());
  ASSERT_TRUE(ops.record_event(*start, *user).ok());
  std::vector<size_t> sizes;
  std::vector<uint64_t> depth;
  {
    DevicePipeline p(ops);
    ASSERT_TRUE(
        p.run(d, d, n, DType::kInt32, {64, 2}, *start, transform(ops, &sizes, &depth)).ok());
  }
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(static_cast<int32_t*>(d)[i], three_x_plus_1(static_cast<int32_t>(i)));
  ops.destroy_event(*start);
  ops.destroy_stream(*user);
  ops.free_device(d);
}

// Copies are numbered: with N=2 and 5 chunks, D2H 1, 2; then H2D k and D2H k+2 alternate.
struct Fault {
  uint64_t refuse_copy = 0;
  uint64_t fail_copy = 0;
  size_t fail_chunk = SIZE_MAX;
  const char* expect;  // in the message
};

class PipelineFaults : public ::testing::TestWithParam<Fault> {};

TEST_P(PipelineFaults, ErrorNamesTheChunkAndDrainsEveryCopy) {
  const Fault f = GetParam();
  FakeDeviceOps::Options o;
  o.fail_enqueue_copy = f.refuse_copy;
  o.fail_run_copy = f.fail_copy;
  o.copy_delay_us = 100;
  FakeDeviceOps ops(o);
  const size_t n = 5 * 64;
  void* d = ops.alloc_device(n * 4);
  std::vector<size_t> sizes;
  std::vector<uint64_t> depth;
  {
    DevicePipeline p(ops);
    const Status s = p.run(d, d, n, DType::kInt32, {64, 2}, nullptr,
                           transform(ops, &sizes, &depth, f.fail_chunk));
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(f.expect), std::string::npos) << s.message();
    // Returned with nothing in flight.
    {
      std::lock_guard<std::mutex> lk(ops.shared()->mu);
      EXPECT_TRUE(ops.shared()->pending_reads.empty());
      EXPECT_TRUE(ops.shared()->pending_writes.empty());
    }
    // The pipeline is reusable after a failure.
    std::vector<size_t> sizes2;
    ASSERT_TRUE(
        p.run(d, d, n, DType::kInt32, {64, 2}, nullptr, transform(ops, &sizes2, &depth)).ok());
    EXPECT_EQ(sizes2.size(), 5u);
  }
  EXPECT_EQ(ops.shared()->live_pinned.load(), 0);
  EXPECT_EQ(ops.shared()->live_events.load(), 0);
  ops.free_device(d);
}

INSTANTIATE_TEST_SUITE_P(
    Steps, PipelineFaults,
    ::testing::Values(
        Fault{1, 0, SIZE_MAX, "device-to-host copy of chunk 0 of 5 (elements 0 .. 64)"},
        Fault{3, 0, SIZE_MAX, "host-to-device copy of chunk 0 of 5"},
        Fault{4, 0, SIZE_MAX, "device-to-host copy of chunk 2 of 5 (elements 128 .. 192)"},
        Fault{0, 2, SIZE_MAX, "device-to-host copy of chunk 1 of 5"},
        Fault{0, 0, 3, "reduction of chunk 3 of 5 (elements 192 .. 256): network down"}));

// The point of the pipeline: with copies and the network of equal length (10 ms each), chunk k's
// network step runs while chunk k+1 is copied in and chunk k-1 copied out. With 3 buffers
// (one per stage) 8 chunks take about 8 network steps plus one copy each way (~100 ms); with 2 a
// buffer's cycle is copy in, network, copy out for every 2 chunks (~130 ms); in sequence (1
// buffer) 8 x 3 steps (~240 ms). The margins allow for a loaded machine (sleeps, not CPU work).
double pipeline_ms(uint32_t buffers) {
  FakeDeviceOps::Options o;
  o.copy_delay_us = 10000;
  FakeDeviceOps ops(o);
  const size_t n = 8 * 64;
  void* d = ops.alloc_device(n * 4);
  DevicePipeline p(ops);
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = p.run(d, d, n, DType::kInt32, {64, buffers}, nullptr, [](void*, size_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return ok_status();
  });
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ops.free_device(d);
  return s.ok() ? ms : -1;
}

TEST(DevicePipeline, CopiesOverlapTheNetwork) {
  const double one = pipeline_ms(1), two = pipeline_ms(2), three = pipeline_ms(3);
  std::printf(
      "8 chunks, 10 ms per copy and per network step: 1 buffer %.0f ms, 2 buffers %.0f ms, "
      "3 buffers %.0f ms\n",
      one, two, three);
  EXPECT_GE(one, 230.0);
  EXPECT_GE(three, 90.0);
  EXPECT_LT(three, 160.0);
  EXPECT_LT(two, one - 50.0);
  EXPECT_LT(three, two);
}

// The blocking allreduce records its start event on the default stream, runs the pipeline and
// destroys the event. With a count of 0 the pipeline returns without waiting for the event, so
// it is destroyed while its record is still queued behind earlier work: legal in CUDA (released
// once the record completed), and the fake must keep it alive until then (this was a
// use-after-free that corrupted the heap or hung device_allreduce_test).
TEST(DevicePipeline, CountZeroWithAStartStillQueuedOnABusyStream) {
  FakeDeviceOps ops;
  auto user = ops.create_stream();
  ASSERT_TRUE(user.ok());
  ASSERT_TRUE(ops.launch_host_func(
                     *user, [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); })
                  .ok());
  auto start = ops.create_event();
  ASSERT_TRUE(start.ok());
  ASSERT_TRUE(ops.record_event(*start, *user).ok());
  std::vector<size_t> sizes;
  std::vector<uint64_t> depth;
  DevicePipeline p(ops);
  void* d = ops.alloc_device(4);
  ASSERT_TRUE(p.run(d, d, 0, DType::kInt32, {64, 2}, *start, transform(ops, &sizes, &depth)).ok());
  ops.destroy_event(*start);  // its record has not run yet
  EXPECT_EQ(ops.shared()->live_events.load(), 0);
  // A wait enqueued before the destruction also keeps the event alive.
  auto ev = ops.create_event();
  ASSERT_TRUE(ev.ok());
  ASSERT_TRUE(ops.launch_host_func(
                     *user, [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); })
                  .ok());
  ASSERT_TRUE(ops.record_event(*ev, *user).ok());
  auto other = ops.create_stream();
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(ops.stream_wait_event(*other, *ev).ok());
  ops.destroy_event(*ev);
  EXPECT_TRUE(ops.stream_synchronize(*user).ok());
  EXPECT_TRUE(ops.stream_synchronize(*other).ok());
  EXPECT_TRUE(sizes.empty());
  ops.free_device(d);
  ops.destroy_stream(*other);
  ops.destroy_stream(*user);
}

TEST(DevicePipeline, RejectsBadOptions) {
  FakeDeviceOps ops;
  DevicePipeline p(ops);
  std::vector<size_t> sizes;
  std::vector<uint64_t> depth;
  int32_t x = 0;
  EXPECT_EQ(p.run(&x, &x, 1, DType::kInt32, {0, 2}, nullptr, transform(ops, &sizes, &depth)).code(),
            StatusCode::kInvalidArgument);
  const Status s =
      p.run(&x, &x, 1, DType::kInt32, {64, 17}, nullptr, transform(ops, &sizes, &depth));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("buffers is 17, expected 1 .. 16"), std::string::npos);
}

}  // namespace
}  // namespace ina::worker
