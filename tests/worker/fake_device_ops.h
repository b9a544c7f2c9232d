// A DeviceOps without a GPU, for the pipeline and asynchronous-collective tests: "device memory"
// is host memory the fake allocated (is_device_pointer knows it by address), each stream is a
// thread running its queue in order, events are generation counters (released, as in CUDA, only
// once no enqueued record or wait still uses them). It also checks what a GPU
// would not: a copy that overwrites a staging buffer whose previous content has not been copied
// out yet, and host access to a staging buffer with a copy still pending (hazards()). Faults:
// make the n-th copy fail when enqueued or when it runs (reported at the next synchronize).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worker/device/device_ops.h"

namespace ina::testing {

class FakeDeviceOps final : public worker::DeviceOps {
 public:
  struct Options {
    uint32_t copy_delay_us = 0;      // each copy sleeps this long on its stream
    uint64_t fail_enqueue_copy = 0;  // the n-th copy_async (1-based) returns an error; 0: never
    uint64_t fail_run_copy = 0;      // the n-th copy fails when it runs; 0: never
    bool available = true;
  };

  // Counters, shared so a test can keep reading them after the ops moved into a communicator.
  struct Shared {
    std::atomic<uint64_t> copies_enqueued{0};
    std::atomic<uint64_t> copies_to_host{0};    // enqueued with a device source
    std::atomic<uint64_t> copies_to_device{0};  // enqueued with a device destination
    std::atomic<uint64_t> host_funcs{0};
    std::atomic<int64_t> live_pinned{0};
    std::atomic<int64_t> live_streams{0};
    std::atomic<int64_t> live_events{0};
    std::mutex mu;
    std::vector<std::string> hazards;
    std::map<uintptr_t, size_t> device;  // start -> bytes
    std::map<uintptr_t, size_t> pinned;
    // Pending (enqueued, not yet run) copies touching pinned memory: [start, end).
    std::vector<std::pair<uintptr_t, uintptr_t>> pending_reads, pending_writes;
  };

  FakeDeviceOps() : FakeDeviceOps(Options{}) {}
  explicit FakeDeviceOps(const Options& o);
  ~FakeDeviceOps() override;

  std::shared_ptr<Shared> shared() const { return sh_; }

  // Device memory of the fake (zeroed) and its release.
  void* alloc_device(size_t bytes);
  void free_device(void* p);
  // Hazards seen so far (empty when the schedule was safe).
  std::vector<std::string> hazards() const;
  // Records a hazard if a copy into or out of [p, p + bytes) is still pending (for the host
  // steps of a test: the pipeline's reduction must only see staging buffers at rest).
  void check_host_access(const void* p, size_t bytes);

  const char* name() const override { return "fake"; }
  Status available() override;
  bool is_device_pointer(const void* p) override;
  Status use_device_of(const void*) override { return ok_status(); }
  Result<void*> alloc_pinned(size_t bytes) override;
  void free_pinned(void* p) override;
  Result<void*> create_stream() override;
  void destroy_stream(void* s) override;
  Result<void*> create_event() override;
  void destroy_event(void* e) override;
  Status record_event(void* e, void* s) override;
  Status stream_wait_event(void* s, void* e) override;
  Status event_synchronize(void* e) override;
  Status stream_synchronize(void* s) override;
  Status copy_async(void* dst, const void* src, size_t bytes, void* s) override;
  Status launch_host_func(void* s, std::function<void()> fn) override;

  class Stream;
  struct Event;

 private:
  Stream* stream_of(void* s);
  bool in(const std::map<uintptr_t, size_t>& m, const void* p);

  Options opts_;
  std::shared_ptr<Shared> sh_;
  std::unique_ptr<Stream> default_stream_;
};

}  // namespace ina::testing
