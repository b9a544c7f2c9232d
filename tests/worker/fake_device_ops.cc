// The GPU-less DeviceOps of the device pipeline tests (see fake_device_ops.h).
#include "fake_device_ops.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

namespace ina::testing {

// One thread running queued operations in order; the first failure is kept and reported by the
// next synchronize (then cleared, so a test can go on with the same stream).
class FakeDeviceOps::Stream {
 public:
  Stream() : thread_([this] { loop(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void enqueue(std::function<Status()> op) {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(std::move(op));
    cv_.notify_all();
  }
  Status synchronize() {
    std::unique_lock<std::mutex> lk(mu_);
    idle_cv_.wait(lk, [&] { return q_.empty() && !busy_; });
    Status e = error_;
    error_ = ok_status();
    return e;
  }
  // The failure of an operation that already ran (what an event recorded now reports).
  Status current_error() {
    std::lock_guard<std::mutex> lk(mu_);
    return error_;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      auto op = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
      const bool failed = !error_.ok();
      lk.unlock();
      // Later operations still run, so event records and host functions complete and no
      // waiter hangs.
      Status s = op();
      lk.lock();
      if (!s.ok() && !failed) error_ = s;
      busy_ = false;
      idle_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<Status()>> q_;
  bool busy_ = false;
  bool stop_ = false;
  Status error_;
  std::thread thread_;
};

struct FakeDeviceOps::Event {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;
  uint64_t completed = 0;
  Status error;  // a failure on the recording stream before the completed record
  void complete(uint64_t gen, Status e) {
    std::lock_guard<std::mutex> lk(mu);
    if (gen > completed) {
      completed = gen;
      error = std::move(e);
    }
    cv.notify_all();
  }
  void wait(uint64_t gen) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return completed >= gen; });
  }
};

FakeDeviceOps::FakeDeviceOps(const Options& o)
    : opts_(o), sh_(std::make_shared<Shared>()), default_stream_(std::make_unique<Stream>()) {}

FakeDeviceOps::~FakeDeviceOps() {
  default_stream_.reset();
  std::lock_guard<std::mutex> lk(sh_->mu);
  for (auto& [p, n] : sh_->device) std::free(reinterpret_cast<void*>(p));
  sh_->device.clear();
}

void* FakeDeviceOps::alloc_device(size_t bytes) {
  void* p = std::calloc(bytes == 0 ? 1 : bytes, 1);
  std::lock_guard<std::mutex> lk(sh_->mu);
  sh_->device[reinterpret_cast<uintptr_t>(p)] = bytes == 0 ? 1 : bytes;
  return p;
}

void FakeDeviceOps::free_device(void* p) {
  std::lock_guard<std::mutex> lk(sh_->mu);
  sh_->device.erase(reinterpret_cast<uintptr_t>(p));
  std::free(p);
}

std::vector<std::string> FakeDeviceOps::hazards() const {
  std::lock_guard<std::mutex> lk(sh_->mu);
  return sh_->hazards;
}

bool FakeDeviceOps::in(const std::map<uintptr_t, size_t>& m, const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return false;
  --it;
  return a < it->first + it->second;
}

void FakeDeviceOps::check_host_access(const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(sh_->mu);
  for (const auto* v : {&sh_->pending_reads, &sh_->pending_writes}) {
    for (auto [s, e] : *v) {
      if (s < a + bytes && a < e)
        sh_->hazards.push_back("host touched a staging buffer with a copy pending");
    }
  }
}

Status FakeDeviceOps::available() {
  return opts_.available ? ok_status() : unavailable("fake device switched off");
}

bool FakeDeviceOps::is_device_pointer(const void* p) {
  std::lock_guard<std::mutex> lk(sh_->mu);
  return opts_.available && in(sh_->device, p);
}

Result<void*> FakeDeviceOps::alloc_pinned(size_t bytes) {
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) return resource_exhausted("fake pinned allocation");
  std::lock_guard<std::mutex> lk(sh_->mu);
  sh_->pinned[reinterpret_cast<uintptr_t>(p)] = bytes == 0 ? 1 : bytes;
  ++sh_->live_pinned;
  return p;
}

void FakeDeviceOps::free_pinned(void* p) {
  std::lock_guard<std::mutex> lk(sh_->mu);
  sh_->pinned.erase(reinterpret_cast<uintptr_t>(p));
  --sh_->live_pinned;
  std::free(p);
}

Result<void*> FakeDeviceOps::create_stream() {
  ++sh_->live_streams;
  return static_cast<void*>(new Stream());
}
void FakeDeviceOps::destroy_stream(void* s) {
  --sh_->live_streams;
  delete static_cast<Stream*>(s);
}
// An event handle owns one reference to its Event; every operation enqueued on a stream that
// completes or waits for the event holds another. So destroying an event whose record has not
// run yet (legal in CUDA: "resources ... released automatically once the device has completed
// event") frees it only after the stream is done with it, as cudaEventDestroy does. The
// pipeline does this for a count of 0, which returns without waiting for its start event.
namespace {
using EventRef = std::shared_ptr<FakeDeviceOps::Event>;
EventRef& event_of(void* e) { return *static_cast<EventRef*>(e); }
}  // namespace

Result<void*> FakeDeviceOps::create_event() {
  ++sh_->live_events;
  return static_cast<void*>(new EventRef(std::make_shared<Event>()));
}
void FakeDeviceOps::destroy_event(void* e) {
  --sh_->live_events;
  delete static_cast<EventRef*>(e);
}

FakeDeviceOps::Stream* FakeDeviceOps::stream_of(void* s) {
  return s == nullptr ? default_stream_.get() : static_cast<Stream*>(s);
}

Status FakeDeviceOps::record_event(void* e, void* s) {
  EventRef ev = event_of(e);
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lk(ev->mu);
    gen = ++ev->recorded;
  }
  Stream* st = stream_of(s);
  st->enqueue([ev, gen, st] {
    ev->complete(gen, st->current_error());
    return ok_status();
  });
  return ok_status();
}

Status FakeDeviceOps::stream_wait_event(void* s, void* e) {
  EventRef ev = event_of(e);
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lk(ev->mu);
    gen = ev->recorded;
  }
  stream_of(s)->enqueue([ev, gen] {
    ev->wait(gen);
    return ok_status();
  });
  return ok_status();
}

Status FakeDeviceOps::event_synchronize(void* e) {
  const EventRef ev = event_of(e);
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lk(ev->mu);
    gen = ev->recorded;
  }
  ev->wait(gen);
  std::lock_guard<std::mutex> lk(ev->mu);
  return ev->error;
}

Status FakeDeviceOps::stream_synchronize(void* s) { return stream_of(s)->synchronize(); }

Status FakeDeviceOps::copy_async(void* dst, const void* src, size_t bytes, void* s) {
  const uint64_t n = ++sh_->copies_enqueued;
  if (n == opts_.fail_enqueue_copy)
    return internal_error("fake: copy " + std::to_string(n) + " refused");
  const bool fail = n == opts_.fail_run_copy;
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto r = reinterpret_cast<uintptr_t>(src);
  bool dst_pinned, src_pinned;
  {
    std::lock_guard<std::mutex> lk(sh_->mu);
    dst_pinned = in(sh_->pinned, dst);
    src_pinned = in(sh_->pinned, src);
    if (in(sh_->device, src)) ++sh_->copies_to_host;
    if (in(sh_->device, dst)) ++sh_->copies_to_device;
    if (dst_pinned) sh_->pending_writes.emplace_back(d, d + bytes);
    if (src_pinned) sh_->pending_reads.emplace_back(r, r + bytes);
  }
  const uint32_t delay = opts_.copy_delay_us;
  auto sh = sh_;
  stream_of(s)->enqueue([=]() -> Status {
    if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    auto erase = [](std::vector<std::pair<uintptr_t, uintptr_t>>& v, uintptr_t a, uintptr_t b) {
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (it->first == a && it->second == b) {
          v.erase(it);
          return;
        }
      }
    };
    {
      std::lock_guard<std::mutex> lk(sh->mu);
      if (dst_pinned) {
        erase(sh->pending_writes, d, d + bytes);
        // Overwriting a staging buffer whose content still waits to be copied out.
        for (auto [a, b] : sh->pending_reads) {
          if (a < d + bytes && d < b)
            sh->hazards.push_back("staging buffer overwritten before it was copied out");
        }
      }
      if (src_pinned) erase(sh->pending_reads, r, r + bytes);
    }
    if (fail) return internal_error("fake: copy " + std::to_string(n) + " failed on the device");
    std::memcpy(dst, src, bytes);
    return ok_status();
  });
  return ok_status();
}

Status FakeDeviceOps::launch_host_func(void* s, std::function<void()> fn) {
  ++sh_->host_funcs;
  stream_of(s)->enqueue([fn = std::move(fn)] {
    fn();
    return ok_status();
  });
  return ok_status();
}

}  // namespace ina::testing
