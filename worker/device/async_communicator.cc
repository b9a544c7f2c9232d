// Device buffers, CUDA streams and asynchronous collectives over the host Communicator.
//
// Threading: asynchronous collectives run on one progress thread per communicator, started at
// the first allreduce_async, in submission order. A worker thread rather than progress inside
// test/wait, because trainers submit a gradient bucket and go on with the backward pass without
// calling into the library for milliseconds: with progress-on-wait the network would idle until
// then, and a stream-ordered collective (whose completion the GPU waits for) would need the host
// to call wait before the stream could move at all. The engine's rule of one caller at a time
// holds because the blocking calls (allreduce, allgather, ...) first wait until the progress
// thread has run everything submitted before them, and then run on the caller's thread while
// the progress thread idles; so at any moment exactly one thread is inside the engine, and
// every rank issues the collectives in its call order.
//
// Streams (NCCL's semantics): at submission an event is recorded on the caller's stream (the
// collective's start) and a host function is enqueued on it that blocks until the collective
// completes (so later work on the stream waits for it). The copies run on the pipeline's own
// non-blocking streams behind the start event. A host-buffer collective with a stream waits for
// the start event on the host. The blocking allreduce with device pointers records its start on
// the default stream.
//
// Device pointers: DeviceOps::is_device_pointer (cudaPointerGetAttributes) on send and recv; if
// either is device memory the device pipeline (device_pipeline.cc) stages the buffer through
// pinned host memory, and each chunk is reduced by the host Communicator's allreduce: the
// in-network engine, which sends the values as they are (wire v2: the aggregator quantizes), or
// the host fallback. No kernel runs on the device: a chunk crosses PCIe once each way at the
// user's width (a 16-bit gradient at 2 bytes per element). The other collectives with device
// buffers are staged whole (copy in, host collective, copy out).
#include "worker/device/async_communicator.h"

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "ina/base/log.h"
#include "worker/device/device_pipeline.h"

namespace ina::worker {
namespace {

// Completion shared by the request handle, the progress thread and the stream's host function.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool detached = false;  // the Request was destroyed before completion
  Status status;

  void complete(Status s) {
    std::lock_guard<std::mutex> lk(mu);
    status = std::move(s);
    done = true;
    if (detached && !status.ok()) {
      INA_WARN("worker", "asynchronous collective failed (request already freed): %s",
               status.message().c_str());
    }
    cv.notify_all();
  }
  Status wait() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done; });
    return status;
  }
};

class RequestImpl final : public Request {
 public:
  explicit RequestImpl(std::shared_ptr<Completion> c) : c_(std::move(c)) {}
  ~RequestImpl() override {
    std::lock_guard<std::mutex> lk(c_->mu);
    c_->detached = true;
  }
  Status test(bool* done) override {
    std::lock_guard<std::mutex> lk(c_->mu);
    *done = c_->done;
    return c_->done ? c_->status : ok_status();
  }
  Status wait() override { return c_->wait(); }

 private:
  std::shared_ptr<Completion> c_;
};

Status check_args(const char* what, const void* send, const void* recv, size_t count, DType dtype,
                  ReduceOp op) {
  if (!is_valid_dtype(static_cast<uint8_t>(dtype))) {
    return invalid_argument(std::string(what) + ": unknown dtype " +
                            std::to_string(static_cast<int>(dtype)) +
                            " (int32, float32, float16, bfloat16, float8_e4m3, float8_e5m2)");
  }
  if (!is_valid_op(static_cast<uint8_t>(op))) {
    return invalid_argument(std::string(what) + ": unknown op " +
                            std::to_string(static_cast<int>(op)) + " (sum, min, max)");
  }
  if (count > 0 && (send == nullptr || recv == nullptr)) {
    return invalid_argument(std::string(what) + ": " + (send == nullptr ? "send" : "recv") +
                            " is null with count " + std::to_string(count));
  }
  const auto s = reinterpret_cast<uintptr_t>(send);
  const auto r = reinterpret_cast<uintptr_t>(recv);
  const size_t bytes = count * dtype_size(dtype);
  if (s != r && count > 0 && s < r + bytes && r < s + bytes) {
    return invalid_argument(std::string(what) +
                            ": send and recv overlap without being equal (in place needs "
                            "send == recv)");
  }
  return ok_status();
}

class AsyncCommunicator final : public Communicator {
 public:
  AsyncCommunicator(std::unique_ptr<Communicator> inner, std::unique_ptr<DeviceOps> ops,
                    const Config& cfg)
      : inner_(std::move(inner)), ops_(std::move(ops)), pipeline_(*ops_), cfg_(cfg) {}

  ~AsyncCommunicator() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();  // runs what was submitted first
  }

  Status allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    drain();
    if (!device_path(send, recv)) return inner_->allreduce(send, recv, count, dtype, op);
    INA_RETURN_IF_ERROR(check_args("allreduce", send, recv, count, dtype, op));
    INA_RETURN_IF_ERROR(bind_device(send, recv));
    INA_RETURN_IF_ERROR(prepare_pipeline());
    void* start = nullptr;
    INA_ASSIGN_OR_RETURN(start, ops_->create_event());
    Status s = ops_->record_event(start, nullptr);
    if (s.ok()) s = device_allreduce(send, recv, count, dtype, op, start);
    ops_->destroy_event(start);
    return s;
  }

  Result<std::unique_ptr<Request>> allreduce_async(const void* send, void* recv, size_t count,
                                                   DType dtype, ReduceOp op,
                                                   void* stream) override {
    INA_RETURN_IF_ERROR(check_args("allreduce_async", send, recv, count, dtype, op));
    if (stream != nullptr) {
      const Status a = ops_->available();
      if (!a.ok()) {
        return Status(a.code(), "allreduce_async: a CUDA stream was given but " +
                                    std::string(ops_->name()) + " is not usable: " + a.message());
      }
    }
    const bool device = device_path(send, recv);
    if (device) {
      INA_RETURN_IF_ERROR(bind_device(send, recv));
      INA_RETURN_IF_ERROR(prepare_pipeline());
    }
    auto done = std::make_shared<Completion>();
    void* start = nullptr;
    if (stream != nullptr) {
      INA_ASSIGN_OR_RETURN(start, ops_->create_event());
      Status s = ops_->record_event(start, stream);
      if (s.ok()) s = ops_->launch_host_func(stream, [done] { (void)done->wait(); });
      if (!s.ok()) {
        ops_->destroy_event(start);
        return Status(s.code(), "allreduce_async: ordering on the stream: " + s.message());
      }
    }
    std::function<Status()> work = [=, this]() -> Status {
      Status s;
      if (device) {
        s = bind_device(send, recv);
        if (s.ok()) s = device_allreduce(send, recv, count, dtype, op, start);
      } else {
        if (start != nullptr) s = ops_->event_synchronize(start);
        if (s.ok()) s = inner_->allreduce(send, recv, count, dtype, op);
      }
      if (start != nullptr) ops_->destroy_event(start);
      return s;
    };
    submit(std::move(work), done);
    return std::unique_ptr<Request>(std::make_unique<RequestImpl>(done));
  }

  Status allgather(const void* send, void* recv, size_t count, DType dtype) override {
    drain();
    const size_t es = dtype_size(dtype);
    const size_t world = static_cast<size_t>(size());
    return staged(send, count * es, recv, count * es * world,
                  [&](const void* s, void* r) { return inner_->allgather(s, r, count, dtype); });
  }
  Status reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                        ReduceOp op) override {
    drain();
    const size_t es = dtype_size(dtype);
    const size_t world = static_cast<size_t>(size());
    return staged(send, count * es * world, recv, count * es, [&](const void* s, void* r) {
      return inner_->reduce_scatter(s, r, count, dtype, op);
    });
  }
  Status broadcast(void* buf, size_t count, DType dtype, int root) override {
    drain();
    const size_t bytes = count * dtype_size(dtype);
    return staged(buf, bytes, buf, bytes,
                  [&](const void*, void* r) { return inner_->broadcast(r, count, dtype, root); });
  }
  Status barrier() override {
    drain();
    return inner_->barrier();
  }
  Status alltoall(const void* send, void* recv, size_t count, DType dtype) override {
    drain();
    const size_t bytes = count * dtype_size(dtype) * static_cast<size_t>(size());
    return staged(send, bytes, recv, bytes,
                  [&](const void* s, void* r) { return inner_->alltoall(s, r, count, dtype); });
  }
  Status alltoallv(const void* send, const size_t* send_counts, const size_t* send_displs,
                   void* recv, const size_t* recv_counts, const size_t* recv_displs,
                   DType dtype) override {
    drain();
    if (device_path(send, recv)) {
      return invalid_argument(
          "alltoallv: device buffers are not supported (copy them to host memory first)");
    }
    return inner_->alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype);
  }

  // After the submitted collectives (one of them may switch the path).
  bool on_host_path() const override {
    const_cast<AsyncCommunicator*>(this)->drain();
    return inner_->on_host_path();
  }
  uint32_t block_elems() const override { return inner_->block_elems(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const CommStats& stats() const override {
    // Read while the progress thread may run a collective: wait for it, as the other calls do.
    const_cast<AsyncCommunicator*>(this)->drain();
    return inner_->stats();
  }

 private:
  struct Job {
    std::function<Status()> work;
    std::shared_ptr<Completion> done;
  };

  // Makes the device of the device buffer among send/recv current on this thread.
  Status bind_device(const void* send, const void* recv) {
    const void* p = send != nullptr && ops_->is_device_pointer(send) ? send : recv;
    return ops_->use_device_of(p);
  }

  bool device_path(const void* send, const void* recv) {
    if (send == nullptr && recv == nullptr) return false;
    if (!ops_->available().ok()) return false;
    return (send != nullptr && ops_->is_device_pointer(send)) ||
           (recv != nullptr && ops_->is_device_pointer(recv));
  }

  PipelineOptions pipeline_options() const {
    PipelineOptions opts;
    // Chunks of whole blocks of every width: the block is block_elems() * 4 bytes, so a multiple
    // of twice block_elems() elements is whole 4-byte and 2-byte blocks alike (wire v2: 16-bit
    // data travels, and is staged, at 2 bytes per element).
    opts.chunk_elems = chunk_elems_for(cfg_.device_chunk_elems, inner_->block_elems() * 2);
    opts.buffers = cfg_.device_buffers;
    return opts;
  }

  // Allocates the staging buffers for the largest chunk (4-byte elements) once, on the caller's
  // thread, with no collective running (see DevicePipeline::prepare). Later runs allocate nothing.
  Status prepare_pipeline() {
    if (pipeline_ready_) return ok_status();
    drain();
    const PipelineOptions opts = pipeline_options();
    INA_RETURN_IF_ERROR(pipeline_.prepare(opts.chunk_elems * 4, opts.buffers));
    pipeline_ready_ = true;
    return ok_status();
  }

  Status device_allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                          void* start) {
    const PipelineOptions opts = pipeline_options();
    return pipeline_.run(send, recv, count, dtype, opts, start, [&](void* buf, size_t n) {
      return inner_->allreduce(buf, buf, n, dtype, op);
    });
  }

  // A host collective on device buffers, staged whole through pinned memory. In and out are
  // separate allocations so in-place calls (broadcast) work. Host buffers go straight through.
  Status staged(const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                const std::function<Status(const void*, void*)>& run) {
    if (!device_path(send, recv)) return run(send, recv);
    INA_RETURN_IF_ERROR(bind_device(send, recv));
    void* stream = nullptr;
    INA_ASSIGN_OR_RETURN(stream, ops_->create_stream());
    void* hin = nullptr;
    void* hout = nullptr;
    Status s;
    auto in_r = ops_->alloc_pinned(send_bytes == 0 ? 1 : send_bytes);
    if (!in_r.ok())
      s = in_r.status();
    else
      hin = *in_r;
    if (s.ok()) {
      auto out_r = ops_->alloc_pinned(recv_bytes == 0 ? 1 : recv_bytes);
      if (!out_r.ok())
        s = out_r.status();
      else
        hout = *out_r;
    }
    void* start = nullptr;
    if (s.ok()) {
      auto e = ops_->create_event();
      if (!e.ok())
        s = e.status();
      else
        start = *e;
    }
    if (s.ok()) s = ops_->record_event(start, nullptr);
    if (s.ok()) s = ops_->stream_wait_event(stream, start);
    const bool in_place = send == recv;
    if (s.ok() && send_bytes > 0) {
      s = ops_->copy_async(in_place ? hout : hin, send, send_bytes, stream);
    }
    if (s.ok()) s = ops_->stream_synchronize(stream);
    if (s.ok()) s = run(in_place ? hout : hin, hout);
    if (s.ok() && recv_bytes > 0) s = ops_->copy_async(recv, hout, recv_bytes, stream);
    const Status drained = ops_->stream_synchronize(stream);  // also after a failed step
    if (s.ok()) s = drained;
    if (start != nullptr) ops_->destroy_event(start);
    if (hin != nullptr) ops_->free_pinned(hin);
    if (hout != nullptr) ops_->free_pinned(hout);
    ops_->destroy_stream(stream);
    return s;
  }

  void submit(std::function<Status()> work, std::shared_ptr<Completion> done) {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(Job{std::move(work), std::move(done)});
    if (!thread_.joinable()) thread_ = std::thread([this] { progress(); });
    cv_.notify_all();
  }

  // Waits until every submitted collective completed.
  void drain() {
    std::unique_lock<std::mutex> lk(mu_);
    idle_cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
  }

  void progress() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      Job job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lk.unlock();
      Status s;
      try {
        s = job.work();
      } catch (const std::bad_alloc&) {
        s = resource_exhausted("asynchronous collective: out of memory");
      } catch (const std::exception& e) {
        s = internal_error(std::string("asynchronous collective: ") + e.what());
      }
      job.done->complete(std::move(s));
      lk.lock();
      busy_ = false;
      idle_cv_.notify_all();
    }
  }

  std::unique_ptr<Communicator> inner_;
  std::unique_ptr<DeviceOps> ops_;
  DevicePipeline pipeline_;
  bool pipeline_ready_ = false;  // caller's thread only
  const Config cfg_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<Job> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Communicator> make_async_communicator(std::unique_ptr<Communicator> inner,
                                                      std::unique_ptr<DeviceOps> ops,
                                                      const Config& cfg) {
  return std::make_unique<AsyncCommunicator>(std::move(inner), std::move(ops), cfg);
}

}  // namespace ina::worker
