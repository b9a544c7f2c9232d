// The device-buffer AllReduce pipeline.
//
// The buffer of `count` elements is cut into chunks of C elements (C a multiple of the block size
// K, so every chunk holds whole blocks of the buffer and each chunk's AllReduce quantizes exactly
// the blocks, with exactly the exponents, that one AllReduce of the whole buffer would: the
// result is bitwise the same). Chunk k uses staging buffer b = k mod N. Two streams of our own
// carry the copies, one per direction, so that PCIe's two directions overlap:
//
//   to_host:    [wait start] D2H(0)->b0 D2H(1)->b1 | wait out(b0) D2H(2)->b0 | wait out(b1) ...
//   host:                    sync in(b0) reduce(0) H2D(0)  sync in(b1) reduce(1) H2D(1)  ...
//   to_device:  [wait start]                     H2D(0)<-b0            H2D(1)<-b1         ...
//
// The first N device-to-host copies are enqueued up front. Then, for each chunk k in order, the
// host waits for chunk k's copy into b (event copied_in[b]), reduces b in place over the network
// (the engine, or the host fallback), enqueues the copy of b to recv and records copied_out[b],
// and enqueues the device-to-host copy of chunk k + N into b behind a device-side wait on
// copied_out[b]: the buffer is overwritten only after its previous content reached the device,
// and the host never blocks for it. So while chunk k is on the network, chunk k+1 (.. k+N-1) is
// being copied in and chunk k-1 is being copied out.
//
// Both streams first wait for `start` (an event recorded on the user's stream at submission), so
// the collective reads send and writes recv after the work the caller enqueued before it. On an
// error the remaining chunks are not started, both streams are drained (no copy may still target
// a staging buffer or recv when the call returns) and the first error is returned.
#include "worker/device/device_pipeline.h"

#include <algorithm>
#include <string>

namespace ina::worker {

size_t chunk_elems_for(size_t requested, uint32_t block_elems) {
  const size_t k = block_elems == 0 ? 1 : block_elems;
  if (requested == 0) return k * 512;
  return (requested + k - 1) / k * k;
}

DevicePipeline::~DevicePipeline() {
  for (void* p : staging_) ops_.free_pinned(p);
  for (void* p : retired_) ops_.free_pinned(p);
  for (void* e : copied_in_) ops_.destroy_event(e);
  for (void* e : copied_out_) ops_.destroy_event(e);
  if (to_host_ != nullptr) ops_.destroy_stream(to_host_);
  if (to_device_ != nullptr) ops_.destroy_stream(to_device_);
}

Status DevicePipeline::ensure(size_t chunk_bytes, uint32_t buffers) {
  if (to_host_ == nullptr) {
    INA_ASSIGN_OR_RETURN(to_host_, ops_.create_stream());
  }
  if (to_device_ == nullptr) {
    INA_ASSIGN_OR_RETURN(to_device_, ops_.create_stream());
  }
  if (chunk_bytes > staging_bytes_) {
    // Grow: every buffer is replaced (no copy is in flight between runs); see retired_.
    retired_.insert(retired_.end(), staging_.begin(), staging_.end());
    staging_.clear();
    staging_bytes_ = chunk_bytes;
  }
  while (staging_.size() < buffers) {
    INA_ASSIGN_OR_RETURN(void* p, ops_.alloc_pinned(staging_bytes_));
    staging_.push_back(p);
    ++stats_.staging_allocations;
  }
  while (copied_in_.size() < buffers) {
    INA_ASSIGN_OR_RETURN(void* e, ops_.create_event());
    copied_in_.push_back(e);
  }
  while (copied_out_.size() < buffers) {
    INA_ASSIGN_OR_RETURN(void* e, ops_.create_event());
    copied_out_.push_back(e);
  }
  return ok_status();
}

Status DevicePipeline::drain(Status first) {
  Status a = to_host_ != nullptr ? ops_.stream_synchronize(to_host_) : ok_status();
  Status b = to_device_ != nullptr ? ops_.stream_synchronize(to_device_) : ok_status();
  if (!first.ok()) return first;
  if (!a.ok()) return a;
  return b;
}

Status DevicePipeline::run(const void* send, void* recv, size_t count, DType dtype,
                           const PipelineOptions& opts, void* start, const ChunkReduce& reduce) {
  if (opts.chunk_elems == 0) return invalid_argument("device pipeline: chunk_elems is 0");
  if (opts.buffers < 1 || opts.buffers > PipelineOptions::kMaxBuffers) {
    return invalid_argument("device pipeline: buffers is " + std::to_string(opts.buffers) +
                            ", expected 1 .. " + std::to_string(PipelineOptions::kMaxBuffers));
  }
  ++stats_.runs;
  if (count == 0) return ok_status();
  const size_t es = dtype_size(dtype);
  const size_t c = opts.chunk_elems;
  const size_t chunks = (count + c - 1) / c;
  // Never more buffers than chunks, never a buffer larger than the buffer being reduced.
  const auto n = static_cast<uint32_t>(std::min<size_t>(opts.buffers, chunks));
  INA_RETURN_IF_ERROR(ensure(std::min(c, count) * es, n));

  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  auto len_of = [&](size_t k) { return std::min(c, count - k * c); };
  auto where = [&](size_t k, const char* step) {
    return std::string("device allreduce: ") + step + " of chunk " + std::to_string(k) + " of " +
           std::to_string(chunks) + " (elements " + std::to_string(k * c) + " .. " +
           std::to_string(k * c + len_of(k)) + "): ";
  };
  auto with_context = [&](const Status& s, size_t k, const char* step) {
    return Status(s.code(), where(k, step) + s.message());
  };
  auto copy_in = [&](size_t k) -> Status {
    const uint32_t b = static_cast<uint32_t>(k % n);
    if (k >= n) INA_RETURN_IF_ERROR(ops_.stream_wait_event(to_host_, copied_out_[b]));
    INA_RETURN_IF_ERROR(ops_.copy_async(staging_[b], in + k * c * es, len_of(k) * es, to_host_));
    stats_.bytes_to_host += len_of(k) * es;
    return ops_.record_event(copied_in_[b], to_host_);
  };

  if (start != nullptr) {
    Status s = ops_.stream_wait_event(to_host_, start);
    if (s.ok()) s = ops_.stream_wait_event(to_device_, start);
    if (!s.ok())
      return drain(Status(s.code(), "device allreduce: waiting for the stream: " + s.message()));
  }
  for (size_t k = 0; k < n; ++k) {
    const Status s = copy_in(k);
    if (!s.ok()) return drain(with_context(s, k, "device-to-host copy"));
  }
  for (size_t k = 0; k < chunks; ++k) {
    const uint32_t b = static_cast<uint32_t>(k % n);
    Status s = ops_.event_synchronize(copied_in_[b]);
    if (!s.ok()) return drain(with_context(s, k, "device-to-host copy"));
    s = reduce(staging_[b], len_of(k));
    if (!s.ok()) return drain(with_context(s, k, "reduction"));
    s = ops_.copy_async(out + k * c * es, staging_[b], len_of(k) * es, to_device_);
    if (s.ok()) s = ops_.record_event(copied_out_[b], to_device_);
    if (!s.ok()) return drain(with_context(s, k, "host-to-device copy"));
    stats_.bytes_to_device += len_of(k) * es;
    ++stats_.chunks;
    if (k + n < chunks) {
      s = copy_in(k + n);
      if (!s.ok()) return drain(with_context(s, k + n, "device-to-host copy"));
    }
  }
  return drain(ok_status());
}

}  // namespace ina::worker
