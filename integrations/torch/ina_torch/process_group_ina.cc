// ProcessGroupINA: the "ina" c10d backend for PyTorch 1.13 (a c10d::ProcessGroup over libina).
//
// Every collective is validated on the caller's thread (CPU, strided, a supported dtype and op:
// a clear error right away), then queued to this process group's progress thread, which runs the
// queue in order on one ina::Communicator (the engine takes one caller at a time). The caller gets
// a Work at once; its future completes with the output tensors (DistributedDataParallel's reducer
// chains its gradient hooks on it).
//
// Paths: AllReduce goes in-network through the aggregator of INA_AGGREGATOR, or the one
// INA_CONTROLLER admits the job to (with libina's host fallback); allgather, reduce_scatter,
// broadcast, barrier and alltoall run on libina's host TCP mesh. Rendezvous: the mesh meets through
// the c10d::Store the backend receives (ina::Config::external_store), so libina never starts its
// own store on MASTER_PORT, where PyTorch's TCPStore already listens.
//
// Reductions take float32, float16, bfloat16 and int32 (what the aggregator sums); AVG is SUM,
// then a division by the world size on this rank (floats only). The collectives that only move
// data (broadcast, allgather, alltoall) move any dtype as raw 16- or 32-bit words, so that
// PyTorch's own int64 metadata exchanges (DDP's parameter shape check) work too.
#include <ATen/ATen.h>
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "ina/ina.hpp"

namespace ina::torch_backend {
namespace {

// The aggregator serves one job: the first live "ina" process group of a process uses it, any
// other one at the same time (dist.new_group) runs on the host mesh only.
std::atomic<bool> g_aggregator_taken{false};

[[noreturn]] void fail(const std::string& what, const Status& s) {
  TORCH_CHECK(false, "ProcessGroupINA ", what, ": ", status_code_name(s.code()), ": ", s.message());
}

// PyTorch's store (a PrefixStore per process group) as libina's rendezvous store.
class C10dStore final : public ExternalStore {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  Status set(const std::string& key, const std::vector<uint8_t>& value) override {
    try {
      store_->set(key, value);
      return ok_status();
    } catch (const std::exception& e) {
      return unavailable("c10d store: set('" + key + "') failed: " + e.what());
    }
  }

  Result<std::vector<uint8_t>> get(const std::string& key,
                                   std::chrono::milliseconds timeout) override {
    try {
      store_->wait({key}, timeout);
      return store_->get(key);
    } catch (const std::exception& e) {
      // c10d reports a wait timeout as an exception: the key (a peer's mesh address) is missing.
      return deadline_exceeded("c10d store: key '" + key + "' not available within " +
                               std::to_string(timeout.count()) + " ms: " + e.what());
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// A queued collective. Its future carries the output tensors, as Gloo's work objects do.
class InaWork final : public c10d::Work {
 public:
  InaWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  void complete(std::exception_ptr error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// dtype of a reduction; a clear error for the others. (libina's float8 types have no torch 1.13
// counterpart: at::kFloat8_e4m3fn / kFloat8_e5m2 came with torch 2.1; see README.md.)
DType reduce_dtype(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kInt: return DType::kInt32;
    default: break;
  }
  TORCH_CHECK(false, "ProcessGroupINA ", what, ": dtype ", t.scalar_type(),
              " is not supported; reductions take float32, float16, bfloat16 or int32");
}

// How a data-moving collective sends `bytes` bytes: as 32-bit words, else 16-bit words.
struct Words {
  DType dtype;
  size_t per_byte_divisor;
};
Words move_words(const at::Tensor& t, size_t block_bytes, const char* what) {
  if (block_bytes % 4 == 0) return {DType::kInt32, 4};
  if (block_bytes % 2 == 0) return {DType::kFloat16, 2};
  TORCH_CHECK(false, "ProcessGroupINA ", what, ": a block of ", block_bytes, " bytes (dtype ",
              t.scalar_type(),
              ") is not a whole number of 16-bit words; 1-byte dtypes need an even element "
              "count per block");
}

ReduceOp reduce_op(const c10d::ReduceOp& op, const at::Tensor& t, const char* what, bool* average) {
  *average = false;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::kSum;
    case c10d::ReduceOp::MIN: return ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return ReduceOp::kMax;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(t.is_floating_point(), "ProcessGroupINA ", what,
                  ": ReduceOp.AVG needs a floating-point tensor (got ", t.scalar_type(), ")");
      *average = true;
      return ReduceOp::kSum;
    default: break;
  }
  const char* name = "this op";
  switch (op.op_) {
    case c10d::ReduceOp::PRODUCT: name = "PRODUCT"; break;
    case c10d::ReduceOp::BAND: name = "BAND"; break;
    case c10d::ReduceOp::BOR: name = "BOR"; break;
    case c10d::ReduceOp::BXOR: name = "BXOR"; break;
    case c10d::ReduceOp::PREMUL_SUM: name = "PREMUL_SUM"; break;
    default: break;
  }
  TORCH_CHECK(false, "ProcessGroupINA ", what, ": ReduceOp.", name,
              " is not supported; use SUM, MIN, MAX or AVG");
}

void check_cpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), "ProcessGroupINA ", what,
              ": only CPU tensors are supported (got ", t.device(), ")");
  TORCH_CHECK(t.layout() == at::kStrided, "ProcessGroupINA ", what,
              ": only dense (strided) tensors are supported");
}

void check_single(const std::vector<at::Tensor>& ts, const char* what) {
  TORCH_CHECK(ts.size() == 1, "ProcessGroupINA ", what, ": expects one tensor per call (got ",
              ts.size(), ")");
  check_cpu(ts[0], what);
}

// A contiguous tensor with the data of `t` (t itself when already contiguous).
at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// Copies `work` back into `t` when they are different storage.
void write_back(at::Tensor& t, const at::Tensor& work) {
  if (!work.is_same(t)) t.copy_(work);
}

class ProcessGroupINA final : public c10d::ProcessGroup {
 public:
  ProcessGroupINA(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)
      : ProcessGroup(rank, size), store_(store) {
    // libina's own rules with PyTorch's store as the rendezvous: INA_AGGREGATOR or
    // INA_CONTROLLER (admission) for the in-network path, neither (or INA_TRANSPORT=host): the
    // host mesh only; Communicator::create logs why at info level when it takes the host mesh.
    Result<Config> env = Config::from_env_with_store();
    if (!env.ok()) fail("configuration", env.status());
    Config cfg = std::move(env.value());
    cfg.rank = rank;
    cfg.world_size = size;
    cfg.external_store = &store_;
    bool expected = false;
    owns_aggregator_ = !cfg.host_only && g_aggregator_taken.compare_exchange_strong(expected, true);
    cfg.host_only = !owns_aggregator_;
    Result<std::unique_ptr<Communicator>> comm = Communicator::create(cfg);
    if (!comm.ok()) {
      if (owns_aggregator_) g_aggregator_taken = false;
      fail("rank " + std::to_string(rank) + " of " + std::to_string(size) + " could not join",
           comm.status());
    }
    comm_ = std::move(comm.value());
    thread_ = std::thread([this] { run(); });
  }

  ~ProcessGroupINA() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    comm_.reset();
    if (owns_aggregator_) g_aggregator_taken = false;
  }

  const std::string getBackendName() const override { return "ina"; }

  // libina's counters and path, read on the progress thread after the collectives queued so far
  // (the communicator is not to be read while it runs one).
  std::pair<CommStats, bool> snapshot() {
    CommStats stats;
    bool in_network = false;
    auto work = enqueue(c10d::OpType::UNKNOWN, {}, [&] {
      stats = comm_->stats();
      in_network = owns_aggregator_ && !comm_->on_host_path();
    });
    work->wait();
    return {stats, in_network};
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    static constexpr const char* kWhat = "allreduce";
    check_single(tensors, kWhat);
    at::Tensor t = tensors[0];
    const DType dtype = reduce_dtype(t, kWhat);
    bool average = false;
    const ReduceOp op = reduce_op(opts.reduceOp, t, kWhat, &average);
    return enqueue(c10d::OpType::ALLREDUCE, {t}, [this, t, dtype, op, average]() mutable {
      at::Tensor w = dense(t);
      check(kWhat, comm_->allreduce(w.data_ptr(), w.data_ptr(), w.numel(), dtype, op));
      if (average) w.div_(size_);
      write_back(t, w);
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    static constexpr const char* kWhat = "broadcast";
    check_single(tensors, kWhat);
    TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "ProcessGroupINA broadcast: root ",
                opts.rootRank, " is not a rank of this group (size ", size_, ")");
    at::Tensor t = tensors[0];
    const size_t bytes = t.numel() * t.element_size();
    const Words wd = move_words(t, bytes, kWhat);
    const int root = static_cast<int>(opts.rootRank);
    return enqueue(c10d::OpType::BROADCAST, {t}, [this, t, bytes, wd, root]() mutable {
      at::Tensor w = dense(t);
      check(kWhat, comm_->broadcast(w.data_ptr(), bytes / wd.per_byte_divisor, wd.dtype, root));
      write_back(t, w);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    static constexpr const char* kWhat = "allgather";
    check_single(inputs, kWhat);
    TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(size_),
                "ProcessGroupINA allgather: expects one list of ", size_, " output tensors");
    at::Tensor in = inputs[0];
    for (const auto& o : outputs[0]) {
      check_cpu(o, kWhat);
      TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                  "ProcessGroupINA allgather: every output tensor must have the input's numel (",
                  in.numel(), ") and dtype (", in.scalar_type(), ")");
    }
    const size_t bytes = in.numel() * in.element_size();
    const Words wd = move_words(in, bytes, kWhat);
    std::vector<at::Tensor> outs = outputs[0];
    return enqueue(c10d::OpType::ALLGATHER, outs, [this, in, outs, bytes, wd]() mutable {
      at::Tensor src = dense(in);
      at::Tensor flat = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
      check(kWhat, comm_->allgather(src.data_ptr(), flat.data_ptr(), bytes / wd.per_byte_divisor,
                                    wd.dtype));
      for (int r = 0; r < size_; ++r) {
        outs[r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view(outs[r].sizes()));
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    static constexpr const char* kWhat = "_allgather_base";
    check_cpu(input, kWhat);
    check_cpu(output, kWhat);
    TORCH_CHECK(
        output.numel() == input.numel() * size_ && output.scalar_type() == input.scalar_type(),
        "ProcessGroupINA _allgather_base: output must hold world size (", size_,
        ") x input numel (", input.numel(), ") elements of the input's dtype");
    const size_t bytes = input.numel() * input.element_size();
    const Words wd = move_words(input, bytes, kWhat);
    at::Tensor in = input;
    at::Tensor out = output;
    return enqueue(c10d::OpType::_ALLGATHER_BASE, {out}, [this, in, out, bytes, wd]() mutable {
      at::Tensor src = dense(in);
      at::Tensor w = dense(out);
      check(kWhat,
            comm_->allgather(src.data_ptr(), w.data_ptr(), bytes / wd.per_byte_divisor, wd.dtype));
      write_back(out, w);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    static constexpr const char* kWhat = "reduce_scatter";
    check_single(outputs, kWhat);
    TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_),
                "ProcessGroupINA reduce_scatter: expects one list of ", size_, " input tensors");
    at::Tensor out = outputs[0];
    for (const auto& i : inputs[0]) {
      check_cpu(i, kWhat);
      TORCH_CHECK(i.numel() == out.numel() && i.scalar_type() == out.scalar_type(),
                  "ProcessGroupINA reduce_scatter: every input tensor must have the output's "
                  "numel (",
                  out.numel(), ") and dtype (", out.scalar_type(), ")");
    }
    const DType dtype = reduce_dtype(out, kWhat);
    bool average = false;
    const ReduceOp op = reduce_op(opts.reduceOp, out, kWhat, &average);
    std::vector<at::Tensor> ins = inputs[0];
    return enqueue(
        c10d::OpType::REDUCE_SCATTER, {out}, [this, out, ins, dtype, op, average]() mutable {
          std::vector<at::Tensor> flat_ins;
          flat_ins.reserve(ins.size());
          for (const auto& i : ins) flat_ins.push_back(i.reshape({-1}));
          at::Tensor send = at::cat(flat_ins);
          at::Tensor w = dense(out);
          check(kWhat,
                comm_->reduce_scatter(send.data_ptr(), w.data_ptr(), out.numel(), dtype, op));
          if (average) w.div_(size_);
          write_back(out, w);
        });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    static constexpr const char* kWhat = "_reduce_scatter_base";
    check_cpu(input, kWhat);
    check_cpu(output, kWhat);
    TORCH_CHECK(
        input.numel() == output.numel() * size_ && output.scalar_type() == input.scalar_type(),
        "ProcessGroupINA _reduce_scatter_base: input must hold world size (", size_,
        ") x output numel (", output.numel(), ") elements of the output's dtype");
    const DType dtype = reduce_dtype(output, kWhat);
    bool average = false;
    const ReduceOp op = reduce_op(opts.reduceOp, output, kWhat, &average);
    at::Tensor in = input;
    at::Tensor out = output;
    return enqueue(
        c10d::OpType::_REDUCE_SCATTER_BASE, {out}, [this, in, out, dtype, op, average]() mutable {
          at::Tensor src = dense(in);
          at::Tensor w = dense(out);
          check(kWhat, comm_->reduce_scatter(src.data_ptr(), w.data_ptr(), out.numel(), dtype, op));
          if (average) w.div_(size_);
          write_back(out, w);
        });
  }

  // alltoall_single: dim 0 split in equal parts, or by the split sizes (rows).
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override {
    static constexpr const char* kWhat = "alltoall_base";
    check_cpu(input, kWhat);
    check_cpu(output, kWhat);
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "ProcessGroupINA ", kWhat,
                ": input and output dtypes differ (", input.scalar_type(), " vs ",
                output.scalar_type(), ")");
    const std::vector<size_t> send_counts = split_counts(input, input_splits, "input_split_sizes");
    const std::vector<size_t> recv_counts =
        split_counts(output, output_splits, "output_split_sizes");
    at::Tensor in = input;
    at::Tensor out = output;
    return enqueue(c10d::OpType::ALLTOALL_BASE, {out},
                   [this, in, out, send_counts, recv_counts]() mutable {
                     at::Tensor src = dense(in);
                     at::Tensor w = dense(out);
                     if (w.data_ptr() == src.data_ptr())
                       w = w.clone();  // libina: send and recv disjoint
                     run_alltoallv(src, send_counts, w, recv_counts);
                     write_back(out, w);
                   });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    static constexpr const char* kWhat = "alltoall";
    TORCH_CHECK(
        outputs.size() == static_cast<size_t>(size_) && inputs.size() == static_cast<size_t>(size_),
        "ProcessGroupINA alltoall: expects ", size_, " input and ", size_, " output tensors (got ",
        inputs.size(), " and ", outputs.size(), ")");
    std::vector<size_t> send_counts;
    std::vector<size_t> recv_counts;
    for (int r = 0; r < size_; ++r) {
      check_cpu(inputs[r], kWhat);
      check_cpu(outputs[r], kWhat);
      TORCH_CHECK(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                      outputs[r].scalar_type() == inputs[0].scalar_type(),
                  "ProcessGroupINA alltoall: every tensor must have dtype ",
                  inputs[0].scalar_type());
      send_counts.push_back(inputs[r].numel());
      recv_counts.push_back(outputs[r].numel());
    }
    std::vector<at::Tensor> ins = inputs;
    std::vector<at::Tensor> outs = outputs;
    return enqueue(c10d::OpType::ALLTOALL, outs,
                   [this, ins, outs, send_counts, recv_counts]() mutable {
                     std::vector<at::Tensor> flat_ins;
                     for (const auto& i : ins) flat_ins.push_back(i.reshape({-1}));
                     at::Tensor send = at::cat(flat_ins);
                     size_t total = 0;
                     for (size_t c : recv_counts) total += c;
                     at::Tensor recv = at::empty({static_cast<int64_t>(total)}, send.options());
                     run_alltoallv(send, send_counts, recv, recv_counts);
                     int64_t off = 0;
                     for (auto& o : outs) {
                       o.copy_(recv.narrow(0, off, o.numel()).view(o.sizes()));
                       off += o.numel();
                     }
                   });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return enqueue(c10d::OpType::BARRIER, {}, [this] { check("barrier", comm_->barrier()); });
  }

 private:
  void check(const char* what, const Status& s) const {
    if (!s.ok()) fail(std::string(what) + " (rank " + std::to_string(rank_) + ")", s);
  }

  // Elements per peer of dim-0 splits (rows); equal parts when `splits` is empty.
  std::vector<size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits,
                                   const char* name) const {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const int64_t row_elems = rows == 0 ? 0 : t.numel() / rows;
    std::vector<size_t> counts(size_);
    if (splits.empty()) {
      TORCH_CHECK(rows % size_ == 0, "ProcessGroupINA alltoall_base: dim 0 (", rows,
                  ") is not divisible by the world size (", size_, "); pass ", name);
      for (auto& c : counts) c = static_cast<size_t>(rows / size_ * row_elems);
      return counts;
    }
    TORCH_CHECK(splits.size() == static_cast<size_t>(size_),
                "ProcessGroupINA alltoall_base: ", name, " has ", splits.size(),
                " entries, expected the world size (", size_, ")");
    int64_t sum = 0;
    for (int r = 0; r < size_; ++r) {
      TORCH_CHECK(splits[r] >= 0, "ProcessGroupINA alltoall_base: ", name, "[", r, "] is negative");
      sum += splits[r];
      counts[r] = static_cast<size_t>(splits[r] * row_elems);
    }
    TORCH_CHECK(sum == rows, "ProcessGroupINA alltoall_base: ", name, " sum to ", sum,
                " rows, the tensor has ", rows);
    return counts;
  }

  // alltoallv on raw words of the dtype's size (any dtype of 2, 4 or 8 bytes; 1-byte dtypes with
  // even counts).
  void run_alltoallv(const at::Tensor& send, const std::vector<size_t>& send_counts,
                     at::Tensor& recv, const std::vector<size_t>& recv_counts) {
    const size_t es = send.element_size();
    size_t unit = es % 4 == 0 ? 4 : 2;
    for (size_t c : send_counts)
      if (c * es % unit != 0) unit = 1;
    for (size_t c : recv_counts)
      if (c * es % unit != 0) unit = 1;
    TORCH_CHECK(unit != 1, "ProcessGroupINA alltoall: 1-byte dtype ", send.scalar_type(),
                " needs even counts for every peer");
    const DType dtype = unit == 4 ? DType::kInt32 : DType::kFloat16;
    std::vector<size_t> sc(size_), sd(size_), rc(size_), rd(size_);
    size_t so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
      sc[r] = send_counts[r] * es / unit;
      sd[r] = so;
      so += sc[r];
      rc[r] = recv_counts[r] * es / unit;
      rd[r] = ro;
      ro += rc[r];
    }
    check("alltoall", comm_->alltoallv(send.data_ptr(), sc.data(), sd.data(), recv.data_ptr(),
                                       rc.data(), rd.data(), dtype));
  }

  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                         std::function<void()> fn) {
    auto work = c10::make_intrusive<InaWork>(rank_, type, std::move(outputs));
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace_back(work, std::move(fn));
    }
    cv_.notify_one();
    return work;
  }

  // The progress thread: runs the queue in order.
  void run() {
    for (;;) {
      std::pair<c10::intrusive_ptr<InaWork>, std::function<void()>> item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        item.second();
      } catch (...) {
        error = std::current_exception();
      }
      item.first->complete(error);
    }
  }

  C10dStore store_;
  std::unique_ptr<Communicator> comm_;
  bool owns_aggregator_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<c10::intrusive_ptr<InaWork>, std::function<void()>>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size, std::chrono::milliseconds) {
  return c10::make_intrusive<ProcessGroupINA>(store, rank, size);
}

// Counters of a process group created by this backend ({} for another backend's).
pybind11::dict stats(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  pybind11::dict d;
  auto* ina = dynamic_cast<ProcessGroupINA*>(pg.get());
  if (ina == nullptr) return d;
  std::pair<CommStats, bool> snap;
  {
    pybind11::gil_scoped_release no_gil;  // the progress thread may run Python future callbacks
    snap = ina->snapshot();
  }
  const CommStats& s = snap.first;
  const bool in_network = snap.second;
  d["collectives"] = s.collectives;
  d["packets_sent"] = s.packets_sent;
  d["retransmits"] = s.retransmits;
  d["host_collectives"] = s.host_collectives;
  d["fallbacks"] = s.fallbacks;
  d["in_network"] = in_network;
  return d;
}

}  // namespace
}  // namespace ina::torch_backend

PYBIND11_MODULE(_C, m) {
  m.doc() = "The INA c10d backend (ProcessGroupINA); import ina_torch to register it.";
  m.def("create_process_group", &ina::torch_backend::create, pybind11::arg("store"),
        pybind11::arg("rank"), pybind11::arg("world_size"), pybind11::arg("timeout"),
        "Creates an 'ina' process group (the creator function given to register_backend).");
  m.def("stats", &ina::torch_backend::stats, pybind11::arg("process_group"),
        "libina's counters of an 'ina' process group.");
}
