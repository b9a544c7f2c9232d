// A communicator's in-network path over one or several aggregators (see sharded_engine.h).
#include "worker/sharded_engine.h"

#include <algorithm>
#include <string>
#include <utility>

#include "worker/shard_split.h"

namespace ina::worker {
namespace {

bool fallbackable(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

}  // namespace

ShardedEngine::ShardedEngine(const Config& cfg, std::vector<std::unique_ptr<Transport>> transports)
    : cfg_(cfg), results_(transports.size()) {
  for (auto& t : transports) {
    peers_.push_back(t->peer_name());
    engines_.push_back(std::make_unique<IncEngine>(cfg, std::move(t)));
  }
  payload_bytes_ = cfg.block_elems * 4;
  seq_before_.assign(engines_.size(), 0);
  coll_before_.assign(engines_.size(), 0);
  mismatched_.assign(engines_.size(), 0);
  if (engines_.size() > 1) {
    for (auto& e : engines_) e->set_cancel_flag(&abandon_);
  }
  for (size_t k = 1; k < engines_.size(); ++k)
    threads_.emplace_back([this, k] { shard_thread(k); });
}

ShardedEngine::~ShardedEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ShardedEngine::shard_thread(size_t k) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<Status(size_t)>* task = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      task = task_;
    }
    Status s = (*task)(k);
    {
      std::lock_guard<std::mutex> lock(mu_);
      results_[k] = std::move(s);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ShardedEngine::run_all(const std::function<Status(size_t)>& task) {
  if (engines_.size() == 1) {
    results_[0] = task(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &task;
    pending_ = engines_.size() - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  results_[0] = task(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  task_ = nullptr;
}

std::string ShardedEngine::shard_name(size_t k) const {
  return "shard " + std::to_string(k) + " of " + std::to_string(engines_.size()) + " (aggregator " +
         peers_[k] + ")";
}

Status ShardedEngine::combined(const char* what) const {
  if (engines_.size() == 1) return results_[0];  // one aggregator: its messages as they are
  size_t worst = engines_.size();
  size_t failed = 0;
  for (size_t k = 0; k < engines_.size(); ++k) {
    if (results_[k].ok()) continue;
    ++failed;
    if (worst == engines_.size() || (fallbackable(results_[worst]) && !fallbackable(results_[k]))) {
      worst = k;
    }
  }
  if (failed == 0) return ok_status();
  std::string m = std::string(what) + ": " + shard_name(worst) + ": " + results_[worst].message();
  if (failed > 1) m += " (and " + std::to_string(failed - 1) + " more shards failed)";
  return Status(results_[worst].code(), std::move(m));
}

Status ShardedEngine::join(std::chrono::milliseconds timeout, std::chrono::milliseconds refused) {
  run_all([&](size_t k) { return engines_[k]->join(timeout, refused); });
  INA_RETURN_IF_ERROR(combined("joining a sharded job"));
  uint32_t b = engines_[0]->payload_bytes();
  for (const auto& e : engines_) b = std::min(b, e->payload_bytes());
  for (const auto& e : engines_) e->lower_payload_bytes(b);
  payload_bytes_ = b;
  return ok_status();
}

Status ShardedEngine::allreduce(const void* send, void* recv, size_t count, DType dtype,
                                ReduceOp op) {
  if (engines_.size() == 1) {
    ++collectives_;
    last_single_ = engines_[0]->allreduce(send, recv, count, dtype, op);
    return last_single_;
  }
  for (const auto& e : engines_) {
    if (!e->joined())
      return failed_precondition("allreduce before the communicator joined its job");
  }
  ++collectives_;
  const size_t es = dtype_size(dtype);
  const uint64_t k_elems = payload_bytes_ / es;  // the block of this type, as every engine's
  const uint64_t n = (count + k_elems - 1) / k_elems;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const size_t shards = engines_.size();
  abandon_.store(false);
  for (size_t k = 0; k < shards; ++k) {
    seq_before_[k] = engines_[k]->next_seq();
    coll_before_[k] = engines_[k]->next_coll();
    mismatched_[k] = 0;
  }
  auto range = [&](size_t k) -> Status {
    const BlockRange r = shard_range(n, k, shards);
    if (r.empty()) return ok_status();
    const uint64_t first = r.first * k_elems;
    const uint64_t end = std::min<uint64_t>(r.end * k_elems, count);
    // The headers name the whole collective's count: a shard's mismatch report then names the
    // user's calls, and every shard's report reads the same.
    Status st =
        engines_[k]->allreduce(in + first * es, out + first * es, end - first, dtype, op, count);
    if (engines_[k]->last_mismatch()) {
      mismatched_[k] = 1;
      abandon_.store(true);
    }
    return st;
  };
  if (n <= 1) {
    // At most one non-empty range (the last shard's): run it here, without waking the threads.
    for (Status& r : results_) r = ok_status();
    if (n == 1) results_[shards - 1] = range(shards - 1);
  } else {
    run_all(range);
  }
  for (size_t k = 0; k < shards; ++k) {
    if (mismatched_[k] == 0) continue;
    // The ranks disagree: every shard moves on alike (the ones that saw the mismatch did so
    // already, from the same point), and every rank says the same, whichever shard told it.
    for (size_t j = 0; j < shards; ++j) engines_[j]->resync(seq_before_[j], coll_before_[j] + 1);
    return invalid_argument("sharded allreduce (collective " + std::to_string(collectives_) +
                            "): " + engines_[k]->mismatch_body());
  }
  return combined("sharded allreduce");
}

void ShardedEngine::received_blocks(size_t count, DType dtype, std::vector<uint8_t>* has) const {
  const uint64_t k_elems = payload_bytes_ / dtype_size(dtype);
  const uint64_t n = (count + k_elems - 1) / k_elems;
  has->assign(n, 0);
  const size_t shards = engines_.size();
  for (size_t k = 0; k < shards; ++k) {
    const BlockRange r = shards == 1 ? BlockRange{0, n} : shard_range(n, k, shards);
    const bool ok = shards == 1 ? last_single_.ok() : results_[k].ok();
    for (uint64_t b = r.first; b < r.end; ++b) {
      (*has)[b] = ok || engines_[k]->block_received(b - r.first) ? 1 : 0;
    }
  }
}

std::vector<BlockRange> ShardedEngine::tail_blocks(size_t count, DType dtype) const {
  const uint64_t k_elems = payload_bytes_ / dtype_size(dtype);
  const uint64_t n = (count + k_elems - 1) / k_elems;
  std::vector<BlockRange> tail;
  const size_t shards = engines_.size();
  for (size_t k = 0; k < shards; ++k) {
    const BlockRange r = shards == 1 ? BlockRange{0, n} : shard_range(n, k, shards);
    if (r.empty()) continue;
    const uint64_t w = std::min<uint64_t>(engines_[k]->window(), r.size());
    tail.push_back(BlockRange{r.end - w, r.end});
  }
  return tail;
}

CommStats ShardedEngine::stats() const {
  if (engines_.size() == 1) return engines_[0]->stats();
  CommStats t;
  for (const auto& e : engines_) {
    const CommStats& s = e->stats();
    add_packet_counters(s, &t);
    t.rto_us = std::max(t.rto_us, s.rto_us);
  }
  t.collectives = collectives_;
  return t;
}

}  // namespace ina::worker
