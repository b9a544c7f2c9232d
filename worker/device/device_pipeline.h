// The device-buffer AllReduce pipeline: moves a buffer in device memory through N pinned host
// staging buffers, chunk by chunk, so that device-to-host copies, the network and
// host-to-device copies of different chunks overlap. The schedule is explained at the top of
// device_pipeline.cc. Pure schedule over DeviceOps: no CUDA here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "ina/base/status.h"
#include "ina/protocol/types.h"
#include "worker/device/device_ops.h"

namespace ina::worker {

struct PipelineOptions {
  size_t chunk_elems = 0;  // elements per chunk; must be a multiple of the block size (the
                           // caller rounds: see chunk_elems_for)
  uint32_t buffers = 3;    // pinned staging buffers in rotation, 1 .. kMaxBuffers
  static constexpr uint32_t kMaxBuffers = 16;
};

// The chunk size for a requested one: rounded up to a multiple of `block_elems` (so that the
// chunks' blocks are the blocks of the whole buffer and the result is bitwise that of one
// AllReduce over it); 0 asks for the default, 512 blocks.
size_t chunk_elems_for(size_t requested, uint32_t block_elems);

// Reduces `count` elements of host memory `buf` in place over all ranks (the network step).
using ChunkReduce = std::function<Status(void* buf, size_t count)>;

class DevicePipeline {
 public:
  struct Stats {
    uint64_t runs = 0;
    uint64_t chunks = 0;
    uint64_t bytes_to_host = 0;
    uint64_t bytes_to_device = 0;
    uint64_t staging_allocations = 0;  // pinned buffers allocated (reused across runs)
  };

  explicit DevicePipeline(DeviceOps& ops) : ops_(ops) {}
  ~DevicePipeline();
  DevicePipeline(const DevicePipeline&) = delete;
  DevicePipeline& operator=(const DevicePipeline&) = delete;

  // Reduces count elements of send into recv (either may be device or host memory; recv may
  // equal send). Work starts after the last record of `start` (null: at once) and the call
  // returns when recv holds the result and no copy is in flight, also on error. A failure names
  // the chunk and its element range.
  Status run(const void* send, void* recv, size_t count, DType dtype, const PipelineOptions& opts,
             void* start, const ChunkReduce& reduce);

  // Creates the streams and events and allocates `buffers` staging buffers of chunk_bytes now
  // (run does it on first use otherwise). The asynchronous path calls it on the caller's thread
  // before it holds the user's stream, so no allocation that may synchronize the device
  // happens while a stream waits for the collective.
  Status prepare(size_t chunk_bytes, uint32_t buffers) { return ensure(chunk_bytes, buffers); }

  const Stats& stats() const { return stats_; }

 private:
  Status ensure(size_t chunk_bytes, uint32_t buffers);
  Status drain(Status first);

  DeviceOps& ops_;
  void* to_host_ = nullptr;    // stream of the device-to-host copies
  void* to_device_ = nullptr;  // stream of the host-to-device copies
  std::vector<void*> staging_;
  // Buffers replaced by larger ones, freed with the pipeline: freeing pinned memory
  // (cudaFreeHost) synchronizes the whole device, which would deadlock against a user stream
  // held by the asynchronous collective that is growing them.
  std::vector<void*> retired_;
  std::vector<void*> copied_in_;   // per buffer: its device-to-host copy finished
  std::vector<void*> copied_out_;  // per buffer: its host-to-device copy finished (reusable)
  size_t staging_bytes_ = 0;
  Stats stats_;
};

}  // namespace ina::worker
