// The in-network path of a communicator: one IncEngine per aggregator of the job. With one
// aggregator it is that engine, called on the caller's thread. A job sharded over K aggregators
// (Config::aggregators) splits each AllReduce into K block ranges (shard_split.h) and runs them
// concurrently: range 0 on the caller's thread, ranges 1 .. K-1 on K-1 threads this object owns
// (started at construction, stopped and joined by the destructor; no global state).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ina/base/status.h"
#include "ina/ina.hpp"
#include "worker/inc_engine.h"
#include "worker/shard_split.h"
#include "worker/transport/transport.h"

namespace ina::worker {

class ShardedEngine {
 public:
  // One transport per shard, in shard order (transports[k] reaches aggregator k); at least one.
  // `cfg` must be valid.
  ShardedEngine(const Config& cfg, std::vector<std::unique_ptr<Transport>> transports);
  ~ShardedEngine();
  ShardedEngine(const ShardedEngine&) = delete;
  ShardedEngine& operator=(const ShardedEngine&) = delete;

  // Joins every aggregator (concurrently); OK only when all of them WELCOMEd this rank. Then every
  // shard uses the smallest of their adopted block sizes. A failure names the shard and its
  // aggregator (and, as IncEngine::join, the ranks that have not joined).
  Status join(std::chrono::milliseconds timeout = std::chrono::milliseconds::zero(),
              std::chrono::milliseconds refused = IncEngine::kRefusedJoin);

  // IncEngine::allreduce over all shards: range k of the blocks on aggregator k (empty ranges
  // are skipped). Waits for every shard. When shards fail, returns the first shard's error that
  // the host path cannot absorb (not kUnavailable / kDeadlineExceeded), else the first shard's
  // error, its message prefixed with the shard and aggregator.
  Status allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op);

  // After allreduce(count) returned: has[b] = 1 for each block b of the collective whose result is
  // in recv (every block of a shard that succeeded), else 0.
  void received_blocks(size_t count, DType dtype, std::vector<uint8_t>* has) const;
  // The blocks of a collective of `count` elements whose result another rank may lack when this
  // one has them all: per shard, the last min(window, range) blocks of its range (a rank sends
  // block i + W' of a slot only after it received block i's result; inc_engine.cc).
  std::vector<BlockRange> tail_blocks(size_t count, DType dtype) const;

  // IncEngine::set_silence_limit on every shard.
  void set_silence_limit(std::chrono::milliseconds limit) {
    for (auto& e : engines_) e->set_silence_limit(limit);
  }

  size_t shards() const { return engines_.size(); }
  // The block agreed at join, in bytes, in 4-byte elements and in elements of each type.
  uint32_t payload_bytes() const { return payload_bytes_; }
  uint32_t block_elems() const { return payload_bytes_ / 4; }
  uint32_t block_elems(DType t) const {
    return payload_bytes_ / static_cast<uint32_t>(dtype_size(t));
  }
  // The engines' counters summed (collectives: the sharded collectives; rto_us: the largest).
  CommStats stats() const;

 private:
  // Runs task(k) for every shard k, k >= 1 on the shard threads and k = 0 here; waits for all.
  void run_all(const std::function<Status(size_t)>& task);
  void shard_thread(size_t k);
  Status combined(const char* what) const;
  std::string shard_name(size_t k) const;

  const Config cfg_;
  std::vector<std::unique_ptr<IncEngine>> engines_;
  std::vector<std::string> peers_;  // the aggregators' names, for messages
  uint32_t payload_bytes_ = 0;
  uint64_t collectives_ = 0;
  Status last_single_;  // one shard: the last allreduce's Status (results_ holds the others')

  // The shard threads' hand-off: a generation counter, the task and one Status per shard.
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;
  size_t pending_ = 0;
  bool stop_ = false;
  const std::function<Status(size_t)>* task_ = nullptr;
  std::vector<Status> results_;
  // A mismatched collective (IncEngine::last_mismatch): each shard's counters before it, which
  // shards reported the mismatch (each written by its own thread), and the flag that makes the
  // other shards give up at once (a shard whose blocks only some ranks sent would wait for its
  // deadline). Every shard then moves to the point every rank moves to (IncEngine::resync), so
  // all of them, also those that saw no poisoned round, line up for the next collective.
  std::vector<BlockSeq> seq_before_;
  std::vector<uint32_t> coll_before_;
  std::vector<uint8_t> mismatched_;
  std::atomic<bool> abandon_{false};
  std::vector<std::thread> threads_;
};

}  // namespace ina::worker
