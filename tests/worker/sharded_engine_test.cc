// Sharding a job over several aggregators: the split rule (worker/shard_split.h) and the sharded
// in-network path (worker/sharded_engine.h) against the real aggregator logic over in-memory
// networks (one per aggregator, lossy), one thread per rank. The sharded results must be bitwise
// those of the same collectives on one aggregator.
#include "worker/sharded_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ina/ina.hpp"
#include "tests/worker/mem_network.h"
#include "worker/inc_engine.h"
#include "worker/shard_split.h"

namespace ina::worker {
namespace {

using std::chrono::milliseconds;
using testing::MemNetwork;
using testing::NetFaults;

// ---- the split rule ----

// The ranges of n blocks over K shards: contiguous from 0 to n, every block in exactly one range,
// sizes floor(n/K) or ceil(n/K).
void expect_partition(uint64_t n, size_t shards) {
  SCOPED_TRACE("n = " + std::to_string(n) + ", K = " + std::to_string(shards));
  uint64_t next = 0;
  size_t nonempty = 0;
  for (size_t k = 0; k < shards; ++k) {
    const BlockRange r = shard_range(n, k, shards);
    EXPECT_EQ(r.first, next) << "range " << k << " does not start where range " << k - 1
                             << " ended";
    EXPECT_LE(r.first, r.end);
    EXPECT_GE(r.size(), n / shards);
    EXPECT_LE(r.size() - n / shards, 1u);
    nonempty += r.empty() ? 0 : 1;
    next = r.end;
  }
  EXPECT_EQ(next, n) << "the ranges do not end at the last block";
  EXPECT_EQ(nonempty, std::min<uint64_t>(n, shards));
}

TEST(ShardSplit, FewerBlocksThanShards) {
  for (size_t shards : {2, 3, 5, 64}) {
    for (uint64_t n = 0; n < shards; ++n) expect_partition(n, shards);
  }
  // One block over two shards: shard 0 is empty, shard 1 has it (floor(1/2) = 0).
  EXPECT_TRUE(shard_range(1, 0, 2).empty());
  EXPECT_EQ(shard_range(1, 1, 2).first, 0u);
  EXPECT_EQ(shard_range(1, 1, 2).end, 1u);
}

TEST(ShardSplit, AsManyBlocksAsShards) {
  for (size_t shards : {1, 2, 3, 7, 64}) {
    expect_partition(shards, shards);
    for (size_t k = 0; k < shards; ++k) {
      EXPECT_EQ(shard_range(shards, k, shards).first, k);
      EXPECT_EQ(shard_range(shards, k, shards).size(), 1u);
    }
  }
}

TEST(ShardSplit, LargeCounts) {
  for (size_t shards : {1, 2, 3, 4, 7, 64}) {
    for (uint64_t n : {uint64_t{1000}, uint64_t{262144}, uint64_t{1} << 40,
                       std::numeric_limits<uint64_t>::max()}) {
      expect_partition(n, shards);
    }
  }
  // The contract's formula: range k = [floor(k n / K), floor((k + 1) n / K)).
  EXPECT_EQ(shard_range(10, 0, 3).end, 3u);
  EXPECT_EQ(shard_range(10, 1, 3).end, 6u);
  EXPECT_EQ(shard_range(10, 2, 3).end, 10u);
}

// ---- the sharded engine ----

agg::JobConfig job_config(uint32_t world, uint16_t max_elems = 256) {
  agg::JobConfig j;
  j.job = 7;
  j.key = Key128{0xC0FFEE, 0x5EC0};  // the workers' key (rank_config)
  j.slots.world_size = world;
  j.slots.num_slots = 16;
  j.slots.max_payload_bytes = static_cast<uint32_t>(max_elems) * 4;
  return j;
}

Config rank_config(int rank, int world, milliseconds timeout = milliseconds(20000)) {
  Config c;
  c.rank = rank;
  c.world_size = world;
  c.job = 7;
  c.job_key = Key128{0xC0FFEE, 0x5EC0};
  c.block_elems = 256;
  c.window = 8;
  c.timeout = timeout;
  c.retransmit = std::chrono::microseconds(1000);
  return c;
}

void run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// A transport with its own name (MemNetwork's are all "mem-aggregator:1").
class Named final : public Transport {
 public:
  Named(std::unique_ptr<Transport> t, std::string name)
      : t_(std::move(t)), name_(std::move(name)) {}
  Status send_batch(std::span<const std::span<const uint8_t>> p) override {
    return t_->send_batch(p);
  }
  Result<size_t> recv_batch(std::span<Datagram> out, std::chrono::microseconds to) override {
    return t_->recv_batch(out, to);
  }
  size_t max_datagram() const override { return t_->max_datagram(); }
  std::string peer_name() const override { return name_; }

 private:
  std::unique_ptr<Transport> t_;
  std::string name_;
};

struct Case {
  DType dtype;
  ReduceOp op;
  size_t count;
};

// Floats spanning decades from block to block and both signs; int32 over the full range.
std::vector<uint8_t> make_input(const Case& c, int rank, int ci) {
  std::vector<uint8_t> b(c.count * dtype_size(c.dtype));
  uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank * 1000 + ci + 1);
  for (size_t i = 0; i < c.count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const double u = static_cast<double>(x >> 11) * 0x1p-53 * 2.0 - 1.0;
    const double v = u * std::pow(10.0, static_cast<int>((i / 200) % 7) - 3);
    if (c.dtype == DType::kInt32) {
      const auto w = static_cast<uint32_t>(x);
      std::memcpy(&b[4 * i], &w, 4);
    } else if (c.dtype == DType::kFloat32) {
      const float f = static_cast<float>(v);
      std::memcpy(&b[4 * i], &f, 4);
    } else {
      const auto h = static_cast<uint16_t>(x);  // any 16-bit pattern but non-finite ones
      const uint16_t safe = static_cast<uint16_t>(h & 0xBBFF);
      std::memcpy(&b[2 * i], &safe, 2);
    }
  }
  return b;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {DType::kFloat32, ReduceOp::kSum, 0},     {DType::kFloat32, ReduceOp::kSum, 1},
      {DType::kFloat32, ReduceOp::kSum, 255},   {DType::kFloat32, ReduceOp::kSum, 257},
      {DType::kFloat32, ReduceOp::kSum, 1000},  {DType::kInt32, ReduceOp::kSum, 20000},
      {DType::kFloat32, ReduceOp::kSum, 20001}, {DType::kFloat16, ReduceOp::kSum, 3000},
      {DType::kBFloat16, ReduceOp::kMax, 999},  {DType::kFloat32, ReduceOp::kMin, 5000},
      {DType::kInt32, ReduceOp::kMax, 513},
  };
  return c;
}

// Runs every case on every rank through `run` (in place for odd cases); outputs[case][rank].
using Runner = std::function<Status(int rank, const Case&, const void*, void*)>;
std::vector<std::vector<std::vector<uint8_t>>> run_cases(int world, const Runner& run,
                                                         const std::function<void(int)>& setup,
                                                         const std::function<void(int)>& done) {
  const auto& cs = cases();
  std::vector<std::vector<std::vector<uint8_t>>> out(cs.size(),
                                                     std::vector<std::vector<uint8_t>>(world));
  run_ranks(world, [&](int r) {
    setup(r);
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      const std::vector<uint8_t> in = make_input(cs[ci], r, static_cast<int>(ci));
      std::vector<uint8_t>& o = out[ci][r];
      o = in;
      const Status s =
          ci % 2 == 1 ? run(r, cs[ci], o.data(), o.data()) : run(r, cs[ci], in.data(), o.data());
      EXPECT_TRUE(s.ok()) << "rank " << r << " case " << ci << ": " << s.to_string();
    }
    done(r);
  });
  return out;
}

// What one aggregator returns (block size `block`), for reference.
std::vector<std::vector<std::vector<uint8_t>>> unsharded(int world, uint16_t block) {
  MemNetwork net(world, job_config(world, block));
  std::vector<std::unique_ptr<IncEngine>> e(world);
  return run_cases(
      world,
      [&](int r, const Case& c, const void* s, void* o) {
        return e[r]->allreduce(s, o, c.count, c.dtype, c.op);
      },
      [&](int r) {
        e[r] = std::make_unique<IncEngine>(rank_config(r, world), net.transport(r));
        ASSERT_TRUE(e[r]->join().ok());
      },
      [&](int r) { e[r].reset(); });
}

void expect_same(const std::vector<std::vector<std::vector<uint8_t>>>& got,
                 const std::vector<std::vector<std::vector<uint8_t>>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t ci = 0; ci < got.size(); ++ci) {
    for (size_t r = 0; r < got[ci].size(); ++r) {
      EXPECT_EQ(got[ci][r], want[ci][r]) << "case " << ci << " (count " << cases()[ci].count
                                         << ") rank " << r << " differs from one aggregator";
    }
  }
}

TEST(ShardedEngine, TwoAndThreeShardsMatchOneAggregatorBitwiseUnderLoss) {
  const int world = 3;
  const auto want = unsharded(world, 256);
  for (size_t shards : {2, 3}) {
    SCOPED_TRACE(std::to_string(shards) + " shards");
    std::vector<std::unique_ptr<MemNetwork>> nets;
    for (size_t k = 0; k < shards; ++k) {
      nets.push_back(
          std::make_unique<MemNetwork>(world, job_config(world), NetFaults{2, 2, 5, 11 + k}));
    }
    std::vector<std::unique_ptr<ShardedEngine>> e(world);
    std::vector<CommStats> stats(world);
    const auto got = run_cases(
        world,
        [&](int r, const Case& c, const void* s, void* o) {
          return e[r]->allreduce(s, o, c.count, c.dtype, c.op);
        },
        [&](int r) {
          std::vector<std::unique_ptr<Transport>> ts;
          for (auto& n : nets) ts.push_back(n->transport(r));
          e[r] = std::make_unique<ShardedEngine>(rank_config(r, world), std::move(ts));
          const Status s = e[r]->join();
          ASSERT_TRUE(s.ok()) << s.to_string();
          EXPECT_EQ(e[r]->shards(), shards);
        },
        [&](int r) {
          stats[r] = e[r]->stats();
          e[r].reset();  // stops the shard threads
        });
    expect_same(got, want);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(stats[r].collectives, cases().size()) << "one per sharded collective";
      EXPECT_GT(stats[r].retransmits, 0u) << "2% loss: some rounds resent";
    }
    // Every shard carried part of the traffic: each aggregator completed slots.
    for (auto& n : nets) {
      n->stop();
      EXPECT_GT(n->engine().counters().completed, 0u);
      EXPECT_EQ(n->engine().counters().mismatched, 0u);
    }
  }
}

TEST(ShardedEngine, AgreesOnTheSmallestBlockSize) {
  const int world = 2;
  const auto want = unsharded(world, 128);
  MemNetwork a(world, job_config(world, 256));
  MemNetwork b(world, job_config(world, 128));
  std::vector<std::unique_ptr<ShardedEngine>> e(world);
  const auto got = run_cases(
      world,
      [&](int r, const Case& c, const void* s, void* o) {
        return e[r]->allreduce(s, o, c.count, c.dtype, c.op);
      },
      [&](int r) {
        std::vector<std::unique_ptr<Transport>> ts;
        ts.push_back(a.transport(r));
        ts.push_back(b.transport(r));
        e[r] = std::make_unique<ShardedEngine>(rank_config(r, world), std::move(ts));
        ASSERT_TRUE(e[r]->join().ok());
        EXPECT_EQ(e[r]->block_elems(), 128u);
      },
      [&](int r) { e[r].reset(); });
  expect_same(got, want);
}

TEST(ShardedEngine, DeadShardFailsTheJoinNamingIt) {
  const int world = 2;
  MemNetwork live(world, job_config(world));
  MemNetwork dead(world, job_config(world), {}, /*alive=*/false);
  std::vector<Status> st(world);
  run_ranks(world, [&](int r) {
    std::vector<std::unique_ptr<Transport>> ts;
    ts.push_back(std::make_unique<Named>(live.transport(r), "10.0.0.1:47474"));
    ts.push_back(std::make_unique<Named>(dead.transport(r), "10.0.0.2:47474"));
    ShardedEngine e(rank_config(r, world, milliseconds(400)), std::move(ts));
    st[r] = e.join();
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kUnavailable) << st[r].to_string();
    EXPECT_NE(st[r].message().find("shard 1 of 2 (aggregator 10.0.0.2:47474)"), std::string::npos)
        << st[r].message();
  }
}

TEST(ShardedEngine, MissingRankInAShardIsNamedWithTheShard) {
  const int world = 3;
  MemNetwork a(world, job_config(world));
  MemNetwork b(world, job_config(world));
  std::vector<Status> st(world);
  std::atomic<int> finished{0};
  run_ranks(world, [&](int r) {
    std::vector<std::unique_ptr<Transport>> ts;
    ts.push_back(std::make_unique<Named>(a.transport(r), "10.0.0.1:47474"));
    ts.push_back(std::make_unique<Named>(b.transport(r), "10.0.0.2:47474"));
    ShardedEngine e(rank_config(r, world, milliseconds(800)), std::move(ts));
    ASSERT_TRUE(e.join().ok());
    if (r == 2) {  // joined, never calls allreduce; alive until the others gave up
      for (int i = 0; i < 1000 && finished.load() < 2; ++i)
        std::this_thread::sleep_for(milliseconds(5));
      return;
    }
    std::vector<float> buf(2000, 1.0f);
    st[r] = e.allreduce(buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
    ++finished;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kDeadlineExceeded) << st[r].to_string();
    EXPECT_NE(st[r].message().find("shard 0 of 2 (aggregator 10.0.0.1:47474)"), std::string::npos)
        << st[r].message();
    EXPECT_NE(st[r].message().find("rank 2 did not contribute"), std::string::npos)
        << st[r].message();
    EXPECT_NE(st[r].message().find("and 1 more shards failed"), std::string::npos)
        << st[r].message();
  }
}

}  // namespace
}  // namespace ina::worker
