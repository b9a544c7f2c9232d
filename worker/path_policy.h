// Which path each AllReduce of a communicator takes, in-network or the host mesh, such that every
// rank takes the same one and returns the same bits: the agreement after a failure, the redo of
// the failed collective(s) on the host path, the probing of a lost aggregator and the following
// of a controller's re-placement. The reasoning is at the top of path_policy.cc.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ina/base/status.h"
#include "ina/ina.hpp"
#include "worker/host/allreduce.h"
#include "worker/host/context.h"
#include "worker/shard_split.h"
#include "worker/sharded_engine.h"

namespace ina::worker {

class PathPolicy {
 public:
  // The host path's AllReduce (exact mode reproduces the in-network bits; the communicator's), and
  // the host algorithm for a small int32 AllReduce of `bytes` (the cost model's choice).
  using HostAllreduce = std::function<Status(const void*, void*, size_t, DType, ReduceOp)>;
  using Algorithm = std::function<host::AllreduceOptions(size_t bytes)>;

  // `engine`: null for a host-only communicator. `mesh`: borrowed, null without a store (then no
  // agreement and no fallback: an in-network failure is the caller's error).
  // `not_served`: why there is no engine although an aggregator or a controller is configured
  // (empty: none, or host only by choice).
  PathPolicy(const Config& cfg, std::unique_ptr<ShardedEngine> engine, host::Context* mesh,
             HostAllreduce host_allreduce, Algorithm algorithm, std::string not_served = {});

  // Joins the aggregator(s); with a mesh, every rank agrees on the path (a join that fails for
  // want of an aggregator puts every rank on the host path).
  Status start();

  // An AllReduce on the agreed path (arguments already checked by the communicator).
  Status allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op);

  // Call before any host collective (allgather, barrier, ...): when in-network AllReduces
  // completed since the last agreement, agrees first, so that a rank still redoing one of them on
  // the host path meets this one there (the host collective's messages cannot be confused with
  // the agreement's). One small host AllReduce per switch from in-network AllReduces to a host
  // collective, none per AllReduce.
  Status before_host_collective();

  bool on_host_path() const { return host_path_; }
  bool has_engine() const { return engine_ != nullptr; }
  uint32_t block_elems() const { return block_elems_; }
  // The engine's counters (and those of engines replaced since) with the path's own
  // (host_collectives, fallbacks, probes); `host` is what the communicator ran on the mesh.
  CommStats stats(const CommStats& host) const;
  // Counts a host collective (not an AllReduce) in the path's counters.
  void count_host_collective() { ++host_collectives_; }

 private:
  // What this rank keeps of its last in-network AllReduce that completed: the blocks another rank
  // may still lack (per shard, the last window of blocks: see path_policy.cc), as bytes.
  struct Kept {
    bool valid = false;
    size_t count = 0;
    DType dtype = DType::kInt32;
    ReduceOp op = ReduceOp::kSum;
    std::vector<BlockRange> tail;  // block ranges kept, ascending
    std::vector<uint8_t> bytes;    // their bytes, in order
  };
  // One rank's view of the collective being recovered.
  struct View {
    size_t count = 0;
    DType dtype = DType::kInt32;
    ReduceOp op = ReduceOp::kSum;
    const uint8_t* input = nullptr;  // the rank's input (null: it has none left)
    uint8_t* output = nullptr;       // where the result goes (null: returned already)
    std::vector<uint8_t> has_result;
    std::vector<uint8_t> has_input;
    std::function<const uint8_t*(uint64_t block)> result;  // bytes of a block it has
  };
  // The outcome of an agreement.
  enum class Agreed { kNothing, kRecoverMine, kRecoverKept };

  Status in_network(const void* send, void* recv, size_t count, DType dtype, ReduceOp op);
  Status host_path_allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op);
  void keep_tail(const void* recv, size_t count, DType dtype, ReduceOp op);
  // Agrees with every rank: `flag` 0 (nothing failed here), 1 (a failure the host path absorbs), 2
  // (another failure). Returns what to do, or an error all ranks share.
  Result<Agreed> agree(int32_t flag, const Status& mine);
  Status recover(View& v);
  View kept_view();
  View failed_view(const void* send, void* recv, size_t count, DType dtype, ReduceOp op);
  Result<int32_t> agree_max(int32_t v, std::chrono::milliseconds wait);
  void enter_host_path();
  Status maybe_probe();
  void arm_silence();
  void follow_replacement();
  // Blocks are the job's payload bytes (block_elems_ 4-byte elements) over the element width.
  size_t block_elems(DType t) const { return size_t{block_elems_} * 4 / dtype_size(t); }
  size_t elem_offset(uint64_t block, DType t) const {
    return static_cast<size_t>(block) * block_elems(t);
  }

  // With Config::require_inc: the error every rank returns instead of running on the host path.
  Status required(const std::string& why) const;

  const Config cfg_;
  std::string not_served_;
  std::string lost_;  // why the job left the in-network path (the last fallback's reason)
  std::unique_ptr<ShardedEngine> engine_;
  host::Context* mesh_;
  HostAllreduce host_allreduce_;
  Algorithm algorithm_;
  Config engine_cfg_;  // the engine's placement (follow_replacement)
  CommStats retired_;  // counters of engines replaced since
  uint32_t block_elems_;
  bool host_path_ = false;
  // In-network AllReduces that completed at this rank (count 0 excepted), mod 3 in agreements:
  // two ranks differ by at most one (path_policy.cc).
  uint64_t done_ = 0;
  bool pending_ = false;  // in-network AllReduces completed since the last agreement
  Kept kept_;
  uint64_t straggle_state_;
  std::chrono::steady_clock::time_point next_probe_{};
  std::chrono::milliseconds probe_backoff_;
  uint64_t host_collectives_ = 0;
  uint64_t host_allreduces_ = 0;  // AllReduces on the host path (not attempted in-network)
  uint64_t fallbacks_ = 0;
  uint64_t probes_ = 0;
};

}  // namespace ina::worker
