// The in-network collective engine against the real aggregator logic (ina::agg::Engine) over an
// in-memory network with loss, duplication and reordering: one thread per rank.
//
// Length: one suite over one subject; its cases share the helpers above them and each one is
// independent (run one with --gtest_filter).
#include "worker/inc_engine.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../free_port.h"
#include "ina/base/half.h"
#include "ina/ina.hpp"
#include "ina/protocol/fp8.h"
#include "ina/protocol/quantize.h"
#include "tests/worker/mem_network.h"
#include "worker/communicator_impl.h"
#include "worker/transport/fault_transport.h"

namespace ina::worker {
namespace {

using std::chrono::milliseconds;
using testing::MemNetwork;
using testing::NetFaults;

constexpr DType kDtypes[] = {DType::kInt32, DType::kFloat32, DType::kFloat16, DType::kBFloat16};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax};

agg::JobConfig job_config(uint32_t world, uint32_t slots = 64, uint16_t max_elems = 256) {
  agg::JobConfig j;
  j.job = 7;
  j.key = Key128{0xC0FFEE, 0x5EC0};  // the workers' key (rank_config)
  j.slots.world_size = world;
  j.slots.num_slots = slots;
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
  c.window = 16;
  c.timeout = timeout;
  c.retransmit = std::chrono::microseconds(1000);
  return c;
}

// Runs fn(rank) on one thread per rank and waits for all.
void run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// ---- test data ----

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A value in (-1, 1) scaled by a magnitude that changes from block to block (256 elements), so
// blocks have different exponents, including tiny and large ones.
double gen_value(int rank, int test_case, size_t i) {
  const uint64_t h = mix((uint64_t(rank) << 48) ^ (uint64_t(test_case) << 32) ^ i);
  const double u = static_cast<double>(h >> 11) * 0x1p-53 * 2.0 - 1.0;
  const int scale = static_cast<int>((i / 256 + static_cast<size_t>(test_case)) % 9) - 4;
  return u * std::pow(10.0, scale);
}

void store(DType t, void* buf, size_t i, double v) {
  switch (t) {
    case DType::kInt32: {
      const auto x = static_cast<int32_t>(static_cast<uint32_t>(mix(std::bit_cast<uint64_t>(v))));
      std::memcpy(static_cast<uint8_t*>(buf) + 4 * i, &x, 4);
      break;
    }
    case DType::kFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(static_cast<uint8_t*>(buf) + 4 * i, &f, 4);
      break;
    }
    case DType::kFloat16: {
      const uint16_t h = float_to_half(static_cast<float>(v));
      std::memcpy(static_cast<uint8_t*>(buf) + 2 * i, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t h = float_to_bf16(static_cast<float>(v));
      std::memcpy(static_cast<uint8_t*>(buf) + 2 * i, &h, 2);
      break;
    }
    case DType::kFloat8E4M3: static_cast<uint8_t*>(buf)[i] = double_to_e4m3(v); break;
    case DType::kFloat8E5M2: static_cast<uint8_t*>(buf)[i] = double_to_e5m2(v); break;
  }
}

double load(DType t, const void* buf, size_t i) {
  const auto* p = static_cast<const uint8_t*>(buf);
  switch (t) {
    case DType::kInt32: {
      int32_t x;
      std::memcpy(&x, p + 4 * i, 4);
      return x;
    }
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return half_to_float(h);
    }
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return bf16_to_float(h);
    }
    case DType::kFloat8E4M3: return e4m3_to_float(p[i]);
    case DType::kFloat8E5M2: return e5m2_to_float(p[i]);
  }
  return 0;
}

uint32_t load_u32(const void* buf, size_t i) {
  uint32_t x;
  std::memcpy(&x, static_cast<const uint8_t*>(buf) + 4 * i, 4);
  return x;
}

std::vector<uint8_t> make_input(DType t, int rank, int test_case, size_t count) {
  std::vector<uint8_t> buf(count * dtype_size(t) + 1);  // +1: never a zero-size vector
  for (size_t i = 0; i < count; ++i) store(t, buf.data(), i, gen_value(rank, test_case, i));
  return buf;
}

// Checks `out` of rank `rank` against the exact reduction of every rank's input.
// Blocks listed in `nan_blocks` must be all NaN.
void check_result(DType t, ReduceOp op, int world, int test_case, size_t count, size_t block,
                  const std::vector<std::vector<uint8_t>>& inputs, const void* out,
                  const std::vector<size_t>& nan_blocks = {}) {
  const std::string where = std::string(dtype_name(t)) + " " + std::string(op_name(op)) +
                            " count " + std::to_string(count) + " case " +
                            std::to_string(test_case);
  int failures = 0;
  for (size_t b0 = 0; b0 < count; b0 += block) {
    const size_t b1 = std::min(count, b0 + block);
    const bool want_nan =
        std::find(nan_blocks.begin(), nan_blocks.end(), b0 / block) != nan_blocks.end();
    double block_max = 0;
    for (int r = 0; r < world; ++r) {
      for (size_t i = b0; i < b1; ++i)
        block_max = std::max(block_max, std::fabs(load(t, inputs[r].data(), i)));
    }
    for (size_t i = b0; i < b1 && failures < 5; ++i) {
      const double got = load(t, out, i);
      if (want_nan) {
        if (!std::isnan(got)) {
          ADD_FAILURE() << where << ": element " << i << " should be NaN, got " << got;
          ++failures;
        }
        continue;
      }
      if (t == DType::kInt32) {
        uint32_t want = 0;
        if (op == ReduceOp::kSum) {
          for (int r = 0; r < world; ++r) want += load_u32(inputs[r].data(), i);
        } else {
          int32_t m = static_cast<int32_t>(load_u32(inputs[0].data(), i));
          for (int r = 1; r < world; ++r) {
            const auto v = static_cast<int32_t>(load_u32(inputs[r].data(), i));
            m = op == ReduceOp::kMin ? std::min(m, v) : std::max(m, v);
          }
          want = static_cast<uint32_t>(m);
        }
        if (load_u32(out, i) != want) {
          ADD_FAILURE() << where << ": element " << i << " is " << int32_t(load_u32(out, i))
                        << ", want " << int32_t(want);
          ++failures;
        }
        continue;
      }
      double want = load(t, inputs[0].data(), i);
      for (int r = 1; r < world; ++r) {
        const double v = load(t, inputs[r].data(), i);
        if (op == ReduceOp::kSum) want += v;
        if (op == ReduceOp::kMin) want = std::min(want, v);
        if (op == ReduceOp::kMax) want = std::max(want, v);
      }
      if (op == ReduceOp::kSum) {
        const double bound =
            quant::sum_error_bound(t, block_max, static_cast<uint32_t>(world), want);
        if (!(std::fabs(got - want) <= bound)) {
          ADD_FAILURE() << where << ": element " << i << " is " << got << ", want " << want
                        << " +- " << bound;
          ++failures;
        }
      } else if (got != want) {  // MIN/MAX are exact
        ADD_FAILURE() << where << ": element " << i << " is " << got << ", want exactly " << want;
        ++failures;
      }
    }
  }
}

// ---- join ----

TEST(IncEngineJoin, AdoptsTheSmallerBlockAndWindow) {
  MemNetwork net(2, job_config(2, /*slots=*/8, /*max_elems=*/128));
  std::vector<uint32_t> blocks(2), windows(2);
  run_ranks(2, [&](int r) {
    Config c = rank_config(r, 2);
    c.block_elems = 1024;
    c.window = 100;
    IncEngine e(c, net.transport(r));
    ASSERT_TRUE(e.join().ok());
    blocks[r] = e.block_elems();
    windows[r] = e.window();
  });
  EXPECT_EQ(blocks, (std::vector<uint32_t>{128, 128}));
  EXPECT_EQ(windows, (std::vector<uint32_t>{8, 8}));
}

TEST(IncEngineJoin, KeepsTheConfiguredSizesWhenSmaller) {
  MemNetwork net(1, job_config(1, 64, 256));
  Config c = rank_config(0, 1);
  c.block_elems = 100;
  c.window = 3;
  IncEngine e(c, net.transport(0));
  ASSERT_TRUE(e.join().ok());
  EXPECT_EQ(e.block_elems(), 100u);
  EXPECT_EQ(e.window(), 3u);
}

TEST(IncEngineJoin, WorldSizeMismatchNamesBothSizes) {
  MemNetwork net(1, job_config(2));
  IncEngine e(rank_config(0, 3, milliseconds(3000)), net.transport(0));
  const Status s = e.join();
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("world size 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("world size 2"), std::string::npos) << s.message();
}

TEST(IncEngineJoin, DeadlineNamesRanksThatHaveNotJoined) {
  MemNetwork net(3, job_config(4));
  std::vector<Status> st(3);
  run_ranks(3, [&](int r) {  // rank 3 never starts
    IncEngine e(rank_config(r, 4, milliseconds(400)), net.transport(r));
    st[r] = e.join();
  });
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
    EXPECT_NE(s.message().find("ranks 3 have not joined"), std::string::npos) << s.message();
  }
}

TEST(IncEngineJoin, SilentAggregatorIsUnavailable) {
  MemNetwork net(1, job_config(1), {}, /*alive=*/false);
  IncEngine e(rank_config(0, 1, milliseconds(200)), net.transport(0));
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = e.join();
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("no answer from aggregator mem-aggregator:1"), std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find("refused"), std::string::npos) << s.message();
  EXPECT_GE(elapsed, milliseconds(200));
  EXPECT_LT(elapsed, milliseconds(1200));
  EXPECT_GT(e.stats().retransmits, 0u);  // HELLO was retransmitted while waiting
}

TEST(IncEngineJoin, RefusingAggregatorIsNamed) {
  MemNetwork net(1, job_config(1), {}, /*alive=*/false, /*refuse=*/true);
  IncEngine e(rank_config(0, 1, milliseconds(100)), net.transport(0));
  const Status s = e.join();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("aggregator mem-aggregator:1 refused (no process listening?)"),
            std::string::npos)
      << s.message();
}

TEST(IncEngineJoin, AllreduceBeforeJoinFails) {
  MemNetwork net(1, job_config(1));
  IncEngine e(rank_config(0, 1), net.transport(0));
  int32_t x = 1;
  EXPECT_EQ(e.allreduce(&x, &x, 1, DType::kInt32, ReduceOp::kSum).code(),
            StatusCode::kFailedPrecondition);
}

// ---- allreduce correctness ----

struct SweepParams {
  int world;
  NetFaults faults;
};

void PrintTo(const SweepParams& p, std::ostream* os) {
  *os << "world " << p.world << ", drop " << p.faults.drop_percent << "%, dup "
      << p.faults.dup_percent << "%, reorder " << p.faults.reorder_percent << "%";
}

class IncEngineSweep : public ::testing::TestWithParam<SweepParams> {};

// Every dtype x op x count on persistent communicators (so slot copies and seq carry over from
// collective to collective), alternating in place and out of place.
TEST_P(IncEngineSweep, EveryDtypeOpAndCount) {
  const SweepParams p = GetParam();
  const int world = p.world;
  MemNetwork net(world, job_config(world, 64, 256), p.faults);
  const size_t counts[] = {0, 1, 255, 256, 257, 1000, 20000};
  std::vector<CommStats> stats(world);
  // inputs[test_case][rank]
  struct Case {
    DType t;
    ReduceOp op;
    size_t count;
    bool in_place;
  };
  std::vector<Case> cases;
  for (DType t : kDtypes) {
    for (ReduceOp op : kOps) {
      for (size_t n : counts) cases.push_back({t, op, n, cases.size() % 2 == 0});
    }
  }
  std::vector<std::vector<std::vector<uint8_t>>> inputs(cases.size());
  for (size_t c = 0; c < cases.size(); ++c) {
    for (int r = 0; r < world; ++r) {
      inputs[c].push_back(make_input(cases[c].t, r, static_cast<int>(c), cases[c].count));
    }
  }
  std::vector<std::vector<std::vector<uint8_t>>> outputs(cases.size(),
                                                         std::vector<std::vector<uint8_t>>(world));
  std::vector<uint32_t> block(world);
  run_ranks(world, [&](int r) {
    IncEngine e(rank_config(r, world), net.transport(r));
    const Status js = e.join();
    ASSERT_TRUE(js.ok()) << js.to_string();
    block[r] = e.block_elems();
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& k = cases[c];
      std::vector<uint8_t>& out = outputs[c][r];
      out = inputs[c][r];
      const void* send = k.in_place ? out.data() : inputs[c][r].data();
      if (!k.in_place) std::fill(out.begin(), out.end(), 0xAB);
      const Status s = e.allreduce(send, out.data(), k.count, k.t, k.op);
      ASSERT_TRUE(s.ok()) << "rank " << r << " case " << c << ": " << s.to_string();
    }
    stats[r] = e.stats();
  });
  for (size_t c = 0; c < cases.size(); ++c) {
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + (cases[c].in_place ? " in place" : ""));
      // The block is in bytes (wire v2): block_elems() 4-byte elements.
      check_result(cases[c].t, cases[c].op, world, static_cast<int>(c), cases[c].count,
                   block[r] * 4 / dtype_size(cases[c].t), inputs[c], outputs[c][r].data());
    }
    // Every rank holds the same result, bit for bit (integer sums are order independent).
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(std::memcmp(outputs[c][0].data(), outputs[c][r].data(),
                            cases[c].count * dtype_size(cases[c].t)),
                0)
          << "case " << c << ": rank " << r << " differs from rank 0";
    }
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(stats[r].collectives, cases.size());
    EXPECT_EQ(stats[r].malformed, 0u);
    if (p.faults.drop_percent > 0) {
      EXPECT_GT(stats[r].retransmits, 0u) << "rank " << r;
    }
  }
  if (p.faults.dup_percent > 0) {
    uint64_t dups = 0;
    for (const CommStats& s : stats) dups += s.duplicate_results;
    EXPECT_GT(dups, 0u);
  }
  net.stop();
  // Each rank's every round reached the aggregator exactly once as a contribution.
  EXPECT_EQ(net.engine().counters().mismatched, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Networks, IncEngineSweep,
    ::testing::Values(SweepParams{1, {}}, SweepParams{3, {}},
                      SweepParams{4, {/*drop=*/5, /*dup=*/5, /*reorder=*/20, /*seed=*/11}}),
    [](const ::testing::TestParamInfo<SweepParams>& param_info) {
      return "world" + std::to_string(param_info.param.world) +
             (param_info.param.faults.drop_percent > 0 ? "_lossy" : "_clean");
    });

TEST(IncEngineAllreduce, LargeCountThroughASmallWindow) {
  const int world = 2;
  MemNetwork net(world, job_config(world, 4, 64), {2, 2, 10, 5});
  const size_t count = 100003;  // not a multiple of the block; ~25 rounds per slot
  std::vector<std::vector<uint8_t>> in(world), out(world);
  for (int r = 0; r < world; ++r) {
    in[r] = make_input(DType::kFloat32, r, 99, count);
    out[r] = in[r];
  }
  run_ranks(world, [&](int r) {
    IncEngine e(rank_config(r, world), net.transport(r));
    ASSERT_TRUE(e.join().ok());
    ASSERT_EQ(e.window(), 4u);
    const Status s =
        e.allreduce(out[r].data(), out[r].data(), count, DType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << s.to_string();
  });
  for (int r = 0; r < world; ++r) {
    check_result(DType::kFloat32, ReduceOp::kSum, world, 99, count, 64, in, out[r].data());
  }
}

// Waiting (inc_engine.cc): a rank polls for its results while its last few rounds are
// outstanding (a small collective, a large one's tail) and blocks at once otherwise (blocks left
// to send, however small the window), and while joining.
TEST(IncEngineAllreduce, PollsForResultsOnlyWithFewRoundsOutstanding) {
  EXPECT_GT(IncEngine::spin_for(1, 1).count(), 0);
  EXPECT_EQ(IncEngine::spin_for(IncEngine::kSpinRounds, IncEngine::kSpinRounds), IncEngine::kSpin);
  EXPECT_EQ(IncEngine::spin_for(IncEngine::kSpinRounds + 1, IncEngine::kSpinRounds + 1).count(), 0);
  EXPECT_EQ(IncEngine::spin_for(128, 128).count(), 0);
  // A small window in the middle of a large collective: the window hides the wake-up.
  EXPECT_EQ(IncEngine::spin_for(1, 2).count(), 0);
  EXPECT_EQ(IncEngine::spin_for(IncEngine::kSpinRounds, 2048).count(), 0);

  // What the engine asks its transport for, call by call.
  struct Calls {
    std::mutex m;
    std::vector<int64_t> spins;
    void add(int64_t us) {
      std::lock_guard<std::mutex> l(m);
      spins.push_back(us);
    }
  };
  class SpinRecorder final : public Transport {
   public:
    SpinRecorder(std::unique_ptr<Transport> t, Calls* c) : t_(std::move(t)), c_(c) {}
    Status send_batch(std::span<const std::span<const uint8_t>> p) override {
      return t_->send_batch(p);
    }
    Result<size_t> recv_batch(std::span<Datagram> out, std::chrono::microseconds t) override {
      return t_->recv_batch(out, t);
    }
    void set_spin(std::chrono::microseconds budget) override { c_->add(budget.count()); }
    size_t max_datagram() const override { return t_->max_datagram(); }
    std::string peer_name() const override { return t_->peer_name(); }

   private:
    std::unique_ptr<Transport> t_;
    Calls* c_;
  };

  const int world = 2;
  MemNetwork net(world, job_config(world, 4, 64));
  std::vector<Calls> calls(world);
  std::vector<std::vector<int64_t>> joined(world), small(world), large(world);
  run_ranks(world, [&](int r) {
    IncEngine e(rank_config(r, world), std::make_unique<SpinRecorder>(net.transport(r), &calls[r]));
    ASSERT_TRUE(e.join().ok());
    {
      std::lock_guard<std::mutex> l(calls[r].m);
      joined[r] = calls[r].spins;
      calls[r].spins.clear();
    }
    std::vector<int32_t> v(2, r + 1);  // 8 bytes: one round
    ASSERT_TRUE(e.allreduce(v.data(), v.data(), v.size(), DType::kInt32, ReduceOp::kSum).ok());
    EXPECT_EQ(v[0], 3);
    {
      std::lock_guard<std::mutex> l(calls[r].m);
      small[r] = calls[r].spins;
      calls[r].spins.clear();
    }
    // 64 blocks through at most 4 outstanding rounds (4 slots): blocks while blocks are left to
    // send, polls for the last rounds only.
    std::vector<int32_t> big(64 * 64, r + 1);
    ASSERT_TRUE(
        e.allreduce(big.data(), big.data(), big.size(), DType::kInt32, ReduceOp::kSum).ok());
    EXPECT_EQ(big.back(), 3);
    std::lock_guard<std::mutex> l(calls[r].m);
    large[r] = calls[r].spins;
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_FALSE(joined[r].empty()) << "rank " << r;
    for (int64_t us : joined[r]) EXPECT_EQ(us, 0) << "rank " << r << " polled while joining";
    ASSERT_FALSE(small[r].empty()) << "rank " << r;
    for (int64_t us : small[r]) EXPECT_EQ(us, IncEngine::kSpin.count()) << "rank " << r;
    // Each wait of the stream is one call; the window of 4 frees the last block after at least
    // 60 results, so most waits block and only a suffix polls.
    ASSERT_FALSE(large[r].empty()) << "rank " << r;
    const auto first_poll = std::find(large[r].begin(), large[r].end(), IncEngine::kSpin.count());
    EXPECT_NE(large[r].front(), IncEngine::kSpin.count()) << "rank " << r;
    for (auto it = large[r].begin(); it != first_poll; ++it) EXPECT_EQ(*it, 0) << "rank " << r;
    for (auto it = first_poll; it != large[r].end(); ++it) {
      EXPECT_EQ(*it, IncEngine::kSpin.count()) << "rank " << r << ": polled, then blocked again";
    }
  }
}

// A lost round goes out again once a round this rank sent after it has its result (the loss
// detector, congestion.h), not when its timer fires: with a 500 ms timer and 2% loss each way,
// only a loss among the last rounds of the collective (nothing sent after it) waits for the timer.
TEST(IncEngineAllreduce, LostRoundsAreResentBeforeTheirTimer) {
  const int world = 2;
  MemNetwork net(world, job_config(world, 16, 64), {/*drop=*/2, 0, 0, /*seed=*/5});
  const size_t count = 64 * 400;  // 400 blocks, 25 rounds per slot
  std::vector<std::vector<uint8_t>> in(world), out(world);
  std::vector<CommStats> stats(world);
  for (int r = 0; r < world; ++r) {
    in[r] = make_input(DType::kFloat32, r, 5, count);
    out[r].resize(in[r].size());
  }
  run_ranks(world, [&](int r) {
    Config c = rank_config(r, world);
    c.retransmit = std::chrono::microseconds(500000);
    IncEngine e(c, net.transport(r));
    ASSERT_TRUE(e.join().ok());
    const Status s =
        e.allreduce(in[r].data(), out[r].data(), count, DType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << s.to_string();
    stats[r] = e.stats();
  });
  ASSERT_GT(net.dropped(), 0u);
  uint64_t fast = 0, timer = 0;
  for (int r = 0; r < world; ++r) {
    check_result(DType::kFloat32, ReduceOp::kSum, world, 5, count, 64, in, out[r].data());
    EXPECT_LE(stats[r].fast_retransmits, stats[r].retransmits);
    fast += stats[r].fast_retransmits;
    timer += stats[r].retransmits - stats[r].fast_retransmits;
  }
  std::printf("%llu datagrams dropped; resent: %llu presumed lost, %llu by the timer\n",
              static_cast<unsigned long long>(net.dropped()), static_cast<unsigned long long>(fast),
              static_cast<unsigned long long>(timer));
  EXPECT_GE(fast, 5u);
  EXPECT_LT(timer, fast);
}

// A block holding a NaN (or, for SUM, an Inf) on one rank comes back all NaN on every rank; the
// other blocks are unaffected. For MIN/MAX an Inf is an ordinary value.
TEST(IncEngineAllreduce, NonFiniteBlocksBecomeNaN) {
  const int world = 3;
  const size_t count = 1000;  // blocks of 256: 0..3
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (ReduceOp op : kOps) {
      MemNetwork net(world, job_config(world));
      std::vector<std::vector<uint8_t>> in(world), out(world);
      for (int r = 0; r < world; ++r) in[r] = make_input(t, r, 5, count);
      // Blocks of 1024 bytes: 256 float32 elements (blocks 0..3), 512 16-bit ones (0..1).
      const size_t k = 1024 / dtype_size(t);
      store(t, in[1].data(), k + 44, std::numeric_limits<double>::quiet_NaN());  // block 1
      if (k == 256) store(t, in[2].data(), 800, std::numeric_limits<double>::infinity());  // 3
      if (k == 512) store(t, in[2].data(), 100, std::numeric_limits<double>::infinity());  // 0
      std::vector<uint64_t> nonfinite(world);
      run_ranks(world, [&](int r) {
        out[r].assign(in[r].size(), 0);
        IncEngine e(rank_config(r, world), net.transport(r));
        ASSERT_TRUE(e.join().ok());
        ASSERT_TRUE(e.allreduce(in[r].data(), out[r].data(), count, t, op).ok());
        nonfinite[r] = e.stats().nonfinite_blocks;
      });
      const std::vector<size_t> nan_blocks = op != ReduceOp::kSum ? std::vector<size_t>{1}
                                             : k == 256           ? std::vector<size_t>{1, 3}
                                                                  : std::vector<size_t>{0, 1};
      for (int r = 0; r < world; ++r) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::string(op_name(op)));
        check_result(t, op, world, 5, count, k, in, out[r].data(), nan_blocks);
        EXPECT_EQ(nonfinite[r], nan_blocks.size());
      }
      if (op == ReduceOp::kMax) {
        EXPECT_EQ(load(t, out[0].data(), k == 256 ? 800 : 100), HUGE_VAL);
      }
    }
  }
}

// ---- failures ----

TEST(IncEngineAllreduce, MissingRankIsNamedAtTheDeadline) {
  const int world = 3;
  MemNetwork net(world, job_config(world));
  std::atomic<int> done{0};
  std::vector<Status> st(world);
  std::vector<double> elapsed_ms(world);
  run_ranks(world, [&](int r) {
    IncEngine e(rank_config(r, world, milliseconds(1500)), net.transport(r));
    ASSERT_TRUE(e.join().ok());
    if (r == 2) {
      // Rank 2 joins but never calls allreduce; it stays alive until the others gave up.
      for (int i = 0; i < 1000 && done.load() < 2; ++i)
        std::this_thread::sleep_for(milliseconds(5));
      return;
    }
    std::vector<float> buf(1000, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    st[r] = e.allreduce(buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
    elapsed_ms[r] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ++done;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kDeadlineExceeded) << st[r].to_string();
    EXPECT_NE(st[r].message().find("rank 2 did not contribute (aggregator bitmap)"),
              std::string::npos)
        << st[r].message();
    EXPECT_NE(st[r].message().find("allreduce of 1000 float32 elements"), std::string::npos)
        << st[r].message();
    EXPECT_NE(st[r].message().find("deadline 1500 ms exceeded"), std::string::npos)
        << st[r].message();
    EXPECT_GE(elapsed_ms[r], 1500);
    EXPECT_LT(elapsed_ms[r], 2500);
  }
}

// Ranks that call one collective with different arguments: every rank gets the same
// kInvalidArgument naming both groups of ranks and both shapes (the poisoned rounds answer all of
// them alike), within the deadline; then the communicator resynchronizes and the next matched
// collective succeeds on every rank. Counts of the same and of different block counts, a dtype
// of another width, another op; three rounds of each so that the resync is exercised repeatedly.
TEST(IncEngineAllreduce, MismatchGivesEveryRankTheSameErrorAndTheNextCollectiveWorks) {
  constexpr int kWorld = 3;
  struct Kind {
    const char* name;
    size_t count_odd;  // rank 2's count (the others: 1000)
    DType dtype_odd;
    ReduceOp op_odd;
    const char* odd_text;  // how the message names rank 2's call
  };
  const Kind kinds[] = {
      {"count, same blocks", 1001, DType::kInt32, ReduceOp::kSum, "1001 int32 elements (sum)"},
      {"count, more blocks", 2600, DType::kInt32, ReduceOp::kSum, "2600 int32 elements (sum)"},
      {"dtype", 1000, DType::kFloat16, ReduceOp::kSum, "1000 float16 elements (sum)"},
      {"op", 1000, DType::kInt32, ReduceOp::kMax, "1000 int32 elements (max)"},
  };
  MemNetwork net(kWorld, job_config(kWorld));
  std::vector<std::unique_ptr<IncEngine>> engines(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    engines[r] =
        std::make_unique<IncEngine>(rank_config(r, kWorld, milliseconds(2000)), net.transport(r));
  }
  run_ranks(kWorld, [&](int r) { ASSERT_TRUE(engines[r]->join().ok()); });
  for (int round = 0; round < 3; ++round) {
    for (const Kind& k : kinds) {
      SCOPED_TRACE(std::string(k.name) + ", round " + std::to_string(round));
      std::vector<Status> st(kWorld), after(kWorld);
      std::vector<double> ms(kWorld);
      std::vector<std::vector<int32_t>> out(kWorld);
      run_ranks(kWorld, [&](int r) {
        std::vector<uint8_t> buf(4 * 2600, 1);
        const bool odd = r == 2;
        const auto t0 = std::chrono::steady_clock::now();
        st[r] = engines[r]->allreduce(buf.data(), buf.data(), odd ? k.count_odd : 1000,
                                      odd ? k.dtype_odd : DType::kInt32,
                                      odd ? k.op_odd : ReduceOp::kSum);
        ms[r] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
      });
      run_ranks(kWorld, [&](int r) {
        out[r].assign(1000, r + 1);
        after[r] = engines[r]->allreduce(out[r].data(), out[r].data(), 1000, DType::kInt32,
                                         ReduceOp::kSum);
      });
      for (int r = 0; r < kWorld; ++r) {
        EXPECT_EQ(st[r].code(), StatusCode::kInvalidArgument)
            << "rank " << r << ": " << st[r].to_string();
        EXPECT_EQ(st[r].message(), st[0].message()) << "rank " << r;
        EXPECT_LT(ms[r], 2000) << "rank " << r;
        EXPECT_TRUE(after[r].ok()) << "rank " << r << ": " << after[r].to_string();
        EXPECT_EQ(out[r], std::vector<int32_t>(1000, 6)) << "rank " << r;
      }
      const std::string& m = st[0].message();
      EXPECT_NE(m.find("ranks 0-1: 1000 int32 elements (sum); ranks 2: " + std::string(k.odd_text)),
                std::string::npos)
          << m;
    }
  }
}

// A rank that comes after the others' deadline (recovery): the others fail with the
// deadline naming it and give their rounds up (ERROR kAborted), so the late rank cannot complete
// them and return success: it fails too, within its own deadline, naming the rank that gave up.
// The next collective, called alike by every rank, succeeds on every rank with the exact sum. One
// collective within the window (every round outstanding at the deadline) and one of several
// rounds per slot (the late rank's first rounds hit the aborted copies). The late rank starts
// when the others have returned, not after a fixed sleep (on a loaded machine a rank descheduled
// past the sleep had not yet sent its aborts), and each collective starts on every rank at once
// (a rank thread started late by the scheduler made the others miss the short deadline).
TEST(IncEngineAllreduce, LateRankFailsAsTheOthersDidAndTheNextCollectiveWorks) {
  constexpr int kWorld = 3;
  constexpr int kLate = 2;
  const milliseconds deadline(300);
  MemNetwork net(kWorld, job_config(kWorld));
  std::vector<std::unique_ptr<IncEngine>> engines(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    engines[r] = std::make_unique<IncEngine>(rank_config(r, kWorld, deadline), net.transport(r));
  }
  run_ranks(kWorld, [&](int r) { ASSERT_TRUE(engines[r]->join().ok()); });
  for (const size_t count : {size_t{1000}, size_t{100000}}) {
    SCOPED_TRACE("count " + std::to_string(count));
    std::vector<Status> st(kWorld), after(kWorld);
    std::vector<std::vector<int32_t>> out(kWorld);
    std::mutex m;
    std::condition_variable cv;
    int failed = 0;  // ranks other than the late one that have returned
    std::barrier begin(kWorld);
    run_ranks(kWorld, [&](int r) {
      begin.arrive_and_wait();
      // The late rank starts once the others have failed (and sent their aborts).
      if (r == kLate) {
        std::unique_lock<std::mutex> l(m);
        cv.wait(l, [&] { return failed == kWorld - 1; });
      }
      std::vector<int32_t> buf(count, r + 1);
      st[r] = engines[r]->allreduce(buf.data(), buf.data(), count, DType::kInt32, ReduceOp::kSum);
      if (r != kLate) {
        std::lock_guard<std::mutex> l(m);
        ++failed;
        cv.notify_all();
      }
    });
    std::barrier start(kWorld);
    run_ranks(kWorld, [&](int r) {
      out[r].assign(count, r + 1);
      start.arrive_and_wait();
      after[r] =
          engines[r]->allreduce(out[r].data(), out[r].data(), count, DType::kInt32, ReduceOp::kSum);
    });
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(st[r].code(), StatusCode::kDeadlineExceeded)
          << "rank " << r << ": " << st[r].to_string();
      EXPECT_TRUE(after[r].ok()) << "rank " << r << ": " << after[r].to_string();
      EXPECT_EQ(out[r], std::vector<int32_t>(count, 6)) << "rank " << r;
    }
    for (int r = 0; r < kWorld; ++r) {
      if (r == kLate) continue;
      EXPECT_NE(st[r].message().find("rank 2 did not contribute"), std::string::npos)
          << st[r].message();
    }
    EXPECT_NE(st[kLate].message().find("aborted: rank "), std::string::npos) << st[kLate].message();
  }
}

// The abort window: ranks 0 and 1 reach their deadline with every round outstanding,
// and the late rank's blocks reach the aggregator before their aborts do (the aborts are held in
// their transports until the late rank has returned). The rounds complete there, so the late
// rank returns success; the ranks that gave up must too, with the same bits, or the ranks would
// disagree on the collective's outcome. The late rank starts once both are held, so both have
// sent every block whatever the scheduler did (starting when the first one was held left the
// other short of blocks when a loaded machine had descheduled it past that deadline, and every
// rank failed); each collective starts on every rank at once. The aggregator answers each late
// abort with the round's result, and a rank waits for those answers at its deadline
// (IncEngine::kAbortSettle). Without that wait, ranks 0 and 1 returned kDeadlineExceeded while rank
// 2 returned OK.
TEST(IncEngineAllreduce, AbortThatLosesTheRaceToALateBlockGetsTheResult) {
  // Holds every send that carries an abort (ERROR) until released; everything else passes.
  struct Gate {
    std::mutex m;
    std::condition_variable cv;
    int aborting = 0;  // ranks held with their aborts
    bool released = false;
  };
  class HoldAborts final : public Transport {
   public:
    HoldAborts(std::unique_ptr<Transport> t, Gate* g) : t_(std::move(t)), g_(g) {}
    Status send_batch(std::span<const std::span<const uint8_t>> p) override {
      bool abort = false;
      for (const auto& d : p)
        abort |= d.size() > wire::kOffFlags && d[wire::kOffFlags] == wire::kFlagError;
      if (abort) {
        std::unique_lock<std::mutex> l(g_->m);
        if (!held_) g_->aborting++;
        held_ = true;
        g_->cv.notify_all();
        g_->cv.wait(l, [&] { return g_->released; });
      }
      return t_->send_batch(p);
    }
    Result<size_t> recv_batch(std::span<Datagram> out, std::chrono::microseconds t) override {
      return t_->recv_batch(out, t);
    }
    size_t max_datagram() const override { return t_->max_datagram(); }
    std::string peer_name() const override { return t_->peer_name(); }

   private:
    std::unique_ptr<Transport> t_;
    Gate* g_;
    bool held_ = false;
  };

  constexpr int kWorld = 3;
  constexpr int kLate = 2;
  const milliseconds deadline(300);
  MemNetwork net(kWorld, job_config(kWorld));
  Gate gate;
  std::vector<std::unique_ptr<IncEngine>> engines(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    std::unique_ptr<Transport> t = net.transport(r);
    if (r != kLate) t = std::make_unique<HoldAborts>(std::move(t), &gate);
    engines[r] = std::make_unique<IncEngine>(rank_config(r, kWorld, deadline), std::move(t));
  }
  run_ranks(kWorld, [&](int r) { ASSERT_TRUE(engines[r]->join().ok()); });
  constexpr size_t kCount = 1000;  // 4 blocks of 256: all outstanding at the deadline
  std::vector<Status> st(kWorld);
  std::vector<std::vector<int32_t>> out(kWorld);
  std::barrier begin(kWorld), again(kWorld);  // each collective starts on every rank at once
  run_ranks(kWorld, [&](int r) {
    out[r].assign(kCount, r + 1);
    begin.arrive_and_wait();
    if (r == kLate) {
      {
        std::unique_lock<std::mutex> l(gate.m);
        gate.cv.wait(l, [&] { return gate.aborting == kWorld - 1; });
      }
      st[r] = engines[r]->allreduce(out[r].data(), out[r].data(), kCount, DType::kInt32,
                                    ReduceOp::kSum);
      std::lock_guard<std::mutex> l(gate.m);
      gate.released = true;
      gate.cv.notify_all();
      return;
    }
    st[r] =
        engines[r]->allreduce(out[r].data(), out[r].data(), kCount, DType::kInt32, ReduceOp::kSum);
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
    EXPECT_EQ(out[r], std::vector<int32_t>(kCount, 6)) << "rank " << r;
  }
  // Both ranks that gave up completed late, from the answers to their aborts.
  EXPECT_EQ(engines[kLate]->stats().late_completions, 0u);
  EXPECT_GE(engines[0]->stats().late_completions, 1u);
  EXPECT_GE(engines[1]->stats().late_completions, 1u);
  // The next collective, within the deadline, succeeds everywhere.
  run_ranks(kWorld, [&](int r) {
    out[r].assign(kCount, 2 * r);
    again.arrive_and_wait();
    st[r] =
        engines[r]->allreduce(out[r].data(), out[r].data(), kCount, DType::kInt32, ReduceOp::kSum);
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
    EXPECT_EQ(out[r], std::vector<int32_t>(kCount, 6)) << "rank " << r;
  }
}

// A transport that talks to network `a` until `second` is set, then to network `b` (an aggregator
// that answers the join, then goes silent), and counts the engine's liveness probes.
class Switchable final : public Transport {
 public:
  Switchable(std::unique_ptr<Transport> a, std::unique_ptr<Transport> b)
      : a_(std::move(a)), b_(std::move(b)) {}
  Status send_batch(std::span<const std::span<const uint8_t>> p) override {
    return cur()->send_batch(p);
  }
  Result<size_t> recv_batch(std::span<Datagram> out, std::chrono::microseconds t) override {
    return cur()->recv_batch(out, t);
  }
  size_t max_datagram() const override { return 65507; }
  std::string peer_name() const override { return "switch:2"; }
  void probe() override { ++probes; }
  bool second = false;
  int probes = 0;

 private:
  Transport* cur() { return second ? b_.get() : a_.get(); }
  std::unique_ptr<Transport> a_, b_;
};

TEST(IncEngineAllreduce, NoAnswerDuringCollectiveIsUnavailable) {
  // The aggregator answers the join, then goes silent: simulated by a second network whose
  // aggregator is dead, reached through a transport switch.
  MemNetwork live(1, job_config(1));
  MemNetwork dead(1, job_config(1), {}, /*alive=*/false);
  auto sw = std::make_unique<Switchable>(live.transport(0), dead.transport(0));
  Switchable* swp = sw.get();
  IncEngine e(rank_config(0, 1, milliseconds(300)), std::move(sw));
  ASSERT_TRUE(e.join().ok());
  swp->second = true;
  std::vector<float> buf(10, 1.0f);
  const Status s = e.allreduce(buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("no answer from aggregator switch:2"), std::string::npos)
      << s.message();
  // The communicator's counters moved on, so the next collective (aggregator back) still works.
  swp->second = false;
  const Status s2 =
      e.allreduce(buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
  EXPECT_TRUE(s2.ok()) << s2.to_string();
}

// A silent aggregator is probed (Transport::probe) every kSilenceProbe of silence, so that a dead
// one's host refuses a datagram long before a retransmission timer (here 1 s) would send one.
// A silent aggregator (inc_failure.cc): one restarted on its port has no key for the rank's
// incarnation, so it drops every DATA as a bad tag and answers nothing. Armed (as the path policy
// does where the host path takes over), the collective ends with Unavailable long before its
// deadline; unarmed, only the deadline ends it.
TEST(IncEngineAllreduce, SilentAggregatorEndsTheCollectiveWhenArmed) {
  MemNetwork live(1, job_config(1));
  MemNetwork restarted(1, job_config(1));  // a fresh aggregator: nobody joined its incarnation
  auto sw = std::make_unique<Switchable>(live.transport(0), restarted.transport(0));
  Switchable* swp = sw.get();
  IncEngine e(rank_config(0, 1, milliseconds(20000)), std::move(sw));
  e.set_silence_limit(IncEngine::kSilenceLimit);
  ASSERT_TRUE(e.join().ok());
  swp->second = true;
  std::vector<float> buf(10, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = e.allreduce(buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("aggregator switch:2 is silent"), std::string::npos) << s.message();
  EXPECT_GE(took, IncEngine::kSilenceLimit);
  EXPECT_LT(took, milliseconds(10000)) << "the deadline is 20000 ms";  // a bound, not a timing
  EXPECT_GE(e.stats().retransmits, IncEngine::kSilentResends);
  // Back to the live aggregator: the next collective works.
  swp->second = false;
  EXPECT_TRUE(
      e.allreduce(buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum).ok());
}

TEST(IncEngineAllreduce, SilentAggregatorWaitsForTheDeadlineWhenUnarmed) {
  MemNetwork live(1, job_config(1));
  MemNetwork restarted(1, job_config(1));
  auto sw = std::make_unique<Switchable>(live.transport(0), restarted.transport(0));
  Switchable* swp = sw.get();
  const milliseconds deadline = 4 * IncEngine::kSilenceLimit;
  IncEngine e(rank_config(0, 1, deadline), std::move(sw));
  ASSERT_TRUE(e.join().ok());
  swp->second = true;
  std::vector<float> buf(10, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = e.allreduce(buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, deadline);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("no answer from aggregator switch:2"), std::string::npos)
      << s.message();
}

// A rank that waits seconds for a straggler hears the aggregator's contributor bitmaps in answer
// to its retransmissions: that is not silence, and the collective completes.
TEST(IncEngineAllreduce, StragglerIsNotSilence) {
  const int world = 2;
  MemNetwork net(world, job_config(world));
  std::vector<Status> st(world);
  std::vector<std::vector<int32_t>> v(world, std::vector<int32_t>(1000));
  run_ranks(world, [&](int r) {
    IncEngine e(rank_config(r, world), net.transport(r));
    e.set_silence_limit(IncEngine::kSilenceLimit);
    ASSERT_TRUE(e.join().ok());
    for (size_t i = 0; i < v[r].size(); ++i) v[r][i] = static_cast<int32_t>(i) + r;
    if (r == 1) std::this_thread::sleep_for(3 * IncEngine::kSilenceLimit);
    st[r] = e.allreduce(v[r].data(), v[r].data(), v[r].size(), DType::kInt32, ReduceOp::kSum);
    if (r == 0) {
      EXPECT_GE(e.stats().retransmits, IncEngine::kSilentResends);
    }
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
    for (size_t i = 0; i < v[r].size(); ++i) ASSERT_EQ(v[r][i], 2 * static_cast<int32_t>(i) + 1);
  }
}

TEST(IncEngineAllreduce, SilentAggregatorIsProbed) {
  MemNetwork live(1, job_config(1));
  MemNetwork dead(1, job_config(1), {}, /*alive=*/false);
  auto t = std::make_unique<Switchable>(live.transport(0), dead.transport(0));
  Switchable* tp = t.get();
  Config cfg = rank_config(0, 1, milliseconds(300));
  cfg.retransmit = std::chrono::seconds(1);
  IncEngine e(cfg, std::move(t));
  ASSERT_TRUE(e.join().ok());
  std::vector<float> buf(10, 1.0f);
  ASSERT_TRUE(
      e.allreduce(buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum).ok());
  const int probes_alive = tp->probes;
  tp->second = true;  // the aggregator falls silent
  const Status s = e.allreduce(buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
  EXPECT_FALSE(s.ok());
  // 300 ms of silence, a probe per 20 ms of it (fewer on a loaded machine, never none).
  EXPECT_GE(tp->probes - probes_alive, 3) << s.to_string();
  EXPECT_LE(tp->probes - probes_alive, 16) << s.to_string();
}

TEST(IncEngineAllreduce, RankRestartJoinsTheNextBarrierOnly) {
  const int world = 2;
  MemNetwork net(3, job_config(world));  // endpoint 2: rank 1's second incarnation
  std::vector<std::unique_ptr<IncEngine>> e(2);
  run_ranks(world, [&](int r) {
    e[r] = std::make_unique<IncEngine>(rank_config(r, world, milliseconds(800)), net.transport(r));
    ASSERT_TRUE(e[r]->join().ok());
  });
  // Rank 1 restarts alone: its new incarnation waits for the next barrier (rank 0 has not
  // restarted), and it does not reopen the barrier of the running job.
  IncEngine again(rank_config(1, world, milliseconds(300)), net.transport(2));
  const Status j = again.join();
  EXPECT_EQ(j.code(), StatusCode::kDeadlineExceeded) << j.to_string();
  EXPECT_NE(j.message().find("ranks 0 have not joined"), std::string::npos) << j.message();
  // Rank 0 still runs in the old incarnation; its collective waits for the old rank 1.
  std::vector<int32_t> buf(10, 1);
  const Status s =
      e[0]->allreduce(buf.data(), buf.data(), buf.size(), DType::kInt32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_EQ(s.message().find("not ready"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank 1 did not contribute"), std::string::npos) << s.message();
}

// Every reply is preceded by a forged copy (one byte changed, the tag kept): each is counted as a
// bad tag and dropped, and every collective completes with the genuine replies' exact results.
TEST(IncEngineAllreduce, RepliesWithABadTagAreDroppedAndCounted) {
  const int world = 3;
  NetFaults f;
  f.forge_replies = true;
  MemNetwork net(world, job_config(world), f);
  std::vector<CommStats> st(world);
  run_ranks(world, [&](int r) {
    IncEngine e(rank_config(r, world), net.transport(r));
    ASSERT_TRUE(e.join().ok());
    std::vector<int32_t> buf(1000);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<int32_t>(i) * (r + 1);
    ASSERT_TRUE(
        e.allreduce(buf.data(), buf.data(), buf.size(), DType::kInt32, ReduceOp::kSum).ok());
    for (size_t i = 0; i < buf.size(); ++i) EXPECT_EQ(buf[i], static_cast<int32_t>(i) * 6) << i;
    st[r] = e.stats();
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_GE(st[r].bad_tag, 5u) << "rank " << r;  // the WELCOME and 4 blocks' results
    EXPECT_EQ(st[r].malformed, 0u) << "rank " << r;
  }
}

// A transport that loses the first DATA datagram of a collective on its way to the aggregator and
// hands the rank, in its place, a forged RESULT for that very round (its header, a payload of
// NaN-looking bytes, a tag the key does not give): the rank must drop it, retransmit its DATA
// (read again from the user's buffer, which in place is also the result's) and finish with the
// exact sum. A forged RESULT copied into the buffer before its tag was checked would have
// replaced the retransmitted DATA there.
class ForgesOneResult final : public Transport {
 public:
  explicit ForgesOneResult(std::unique_ptr<Transport> t) : t_(std::move(t)) {}
  Status send_batch(std::span<const std::span<const uint8_t>> pkts) override {
    for (const std::span<const uint8_t> d : pkts) {
      wire::PacketView pv;
      if (armed && !forged_ready_ && wire::decode(d, &pv) == wire::DecodeError::kOk &&
          pv.hdr.flags == 0) {
        forged_.assign(d.begin(), d.end());
        forged_[wire::kOffFlags] = wire::kFlagResult;
        std::fill(forged_.begin() + wire::kHeaderSize, forged_.end(), uint8_t{0x7F});
        forged_ready_ = true;
        armed = false;
        ++forged;
        continue;  // lost
      }
      const std::span<const uint8_t> one[1] = {d};
      INA_RETURN_IF_ERROR(t_->send_batch(one));
    }
    return ok_status();
  }
  Result<size_t> recv_batch(std::span<Datagram> out, std::chrono::microseconds t) override {
    if (forged_ready_ && !out.empty()) {
      forged_ready_ = false;
      out[0] = forged_;
      return size_t{1};
    }
    return t_->recv_batch(out, t);
  }
  size_t max_datagram() const override { return t_->max_datagram(); }
  std::string peer_name() const override { return t_->peer_name(); }
  bool armed = false;
  int forged = 0;

 private:
  std::unique_ptr<Transport> t_;
  std::vector<uint8_t> forged_;
  bool forged_ready_ = false;
};

TEST(IncEngineAllreduce, AForgedResultNeverReplacesDataStillToBeResent) {
  // In place and out of place (where the RESULT's payload is copied into the user's buffer as its
  // tag is verified), float32 and int32: the exact sums, the forgery counted as a bad tag.
  for (const bool in_place : {true, false}) {
    for (const DType dt : {DType::kFloat32, DType::kInt32}) {
      SCOPED_TRACE(std::string(in_place ? "in place " : "out of place ") +
                   std::string(dtype_name(dt)));
      const int world = 2;
      MemNetwork net(world, job_config(world));
      std::vector<CommStats> st(world);
      std::vector<int> forged(world);
      run_ranks(world, [&](int r) {
        auto t = std::make_unique<ForgesOneResult>(net.transport(static_cast<size_t>(r)));
        ForgesOneResult* tp = t.get();
        Config c = rank_config(r, world);
        c.retransmit = std::chrono::microseconds(5000);
        IncEngine e(c, std::move(t));
        ASSERT_TRUE(e.join().ok());
        tp->armed = true;
        constexpr size_t kCount = 700;  // three blocks
        std::vector<int32_t> in(kCount), out(kCount, 0x55);
        for (size_t i = 0; i < kCount; ++i) {
          in[i] = dt == DType::kInt32 ? static_cast<int32_t>(i) * (r + 1)
                                      : std::bit_cast<int32_t>(static_cast<float>(i) * (r + 1));
        }
        std::vector<int32_t>& buf = in_place ? in : out;
        ASSERT_TRUE(e.allreduce(in.data(), buf.data(), kCount, dt, ReduceOp::kSum).ok());
        for (size_t i = 0; i < kCount; ++i) {
          const int32_t want = dt == DType::kInt32
                                   ? static_cast<int32_t>(i) * 3
                                   : std::bit_cast<int32_t>(static_cast<float>(i) * 3);
          ASSERT_EQ(buf[i], want) << "rank " << r << " element " << i;
        }
        st[static_cast<size_t>(r)] = e.stats();
        forged[static_cast<size_t>(r)] = tp->forged;
      });
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(forged[static_cast<size_t>(r)], 1) << "rank " << r;
        EXPECT_GE(st[static_cast<size_t>(r)].bad_tag, 1u) << "rank " << r;
        EXPECT_GE(st[static_cast<size_t>(r)].retransmits, 1u) << "rank " << r;
      }
    }
  }
}

// A worker whose key is not the job's: the aggregator drops its HELLOs as bad tags, unanswered,
// and the join fails with a message that names the key as a cause.
TEST(IncEngineJoin, WrongKeyIsDroppedAndTheErrorSaysSo) {
  MemNetwork net(1, job_config(1));
  Config c = rank_config(0, 1, milliseconds(300));
  c.job_key = Key128{0xC0FFEE, 0x5EC1};  // one bit off
  IncEngine e(c, net.transport(0));
  const Status s = e.join();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("with this key?"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("INA_JOB_KEY"), std::string::npos) << s.message();
  net.stop();
  EXPECT_GE(net.engine().counters().bad_tag, 1u);
  EXPECT_EQ(net.engine().counters().hellos, 0u);
}

TEST(IncEngineAllreduce, StragglerDelayIsApplied) {
  const int world = 2;
  MemNetwork net(world, job_config(world));
  std::vector<double> ms(world);
  run_ranks(world, [&](int r) {
    Config c = rank_config(r, world);
    if (r == 1) c.fault.delay_us = 100000;
    IncEngine e(c, net.transport(r));
    ASSERT_TRUE(e.join().ok());
    int32_t x = r + 1;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(e.allreduce(&x, &x, 1, DType::kInt32, ReduceOp::kSum).ok());
    ms[r] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(x, 3);
  });
  EXPECT_GE(ms[0], 50.0);  // rank 0 waited for the straggler (slack for a slow scheduler)
  EXPECT_GE(ms[1], 100.0);
}

TEST(IncEngineAllreduce, IntermittentStragglerDelaysSomeCollectives) {
  // The draw: 0% never, 100% always, 30% about 30 of 100 (seeded, so reproducible).
  FaultInjection f;
  f.delay_us = 7;
  f.straggle_delay_us = 1000;
  uint64_t st = 42;
  f.straggle_percent = 0;
  for (int i = 0; i < 100; ++i) EXPECT_EQ(collective_delay_us(f, &st), 7u);
  f.straggle_percent = 100;
  for (int i = 0; i < 100; ++i) EXPECT_EQ(collective_delay_us(f, &st), 1007u);
  f.straggle_percent = 30;
  int slow = 0;
  for (int i = 0; i < 10000; ++i) slow += collective_delay_us(f, &st) == 1007u ? 1 : 0;
  EXPECT_GT(slow, 2700);
  EXPECT_LT(slow, 3300);

  // Applied by the engine: rank 1 straggles on every collective at 100%.
  const int world = 2;
  MemNetwork net(world, job_config(world));
  std::vector<double> ms(world);
  run_ranks(world, [&](int r) {
    Config c = rank_config(r, world);
    if (r == 1) {
      c.fault.straggle_percent = 100;
      c.fault.straggle_delay_us = 40000;
    }
    IncEngine e(c, net.transport(r));
    ASSERT_TRUE(e.join().ok());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 2; ++i) {
      int32_t x = r + 1;
      ASSERT_TRUE(e.allreduce(&x, &x, 1, DType::kInt32, ReduceOp::kSum).ok());
      EXPECT_EQ(x, 3);
    }
    ms[r] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  });
  EXPECT_GE(ms[1], 80.0);
  EXPECT_GE(ms[0], 40.0);  // rank 0 waited for the straggler (slack for a slow scheduler)
}

// ---- communicator argument checks and fault injection ----

TEST(CommunicatorTest, ValidatesArguments) {
  MemNetwork net(1, job_config(1));
  Result<std::unique_ptr<Communicator>> c =
      create_communicator(rank_config(0, 1), net.transport(0));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  Communicator& comm = *c.value();
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_TRUE(comm.allreduce(nullptr, nullptr, 0, DType::kFloat32, ReduceOp::kSum).ok());
  Status s = comm.allreduce(nullptr, buf, 4, DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("send is null"), std::string::npos) << s.message();
  s = comm.allreduce(buf, nullptr, 4, DType::kFloat32, ReduceOp::kSum);
  EXPECT_NE(s.message().find("recv is null"), std::string::npos) << s.message();
  s = comm.allreduce(buf, buf, 4, static_cast<DType>(9), ReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dtype 9"), std::string::npos) << s.message();
  s = comm.allreduce(buf, buf, 4, DType::kFloat32, static_cast<ReduceOp>(0));
  EXPECT_NE(s.message().find("op 0"), std::string::npos) << s.message();
  s = comm.allreduce(buf, buf + 1, 4, DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.message();
  // Adjacent, non-overlapping buffers are fine.
  ASSERT_TRUE(comm.allreduce(buf, buf + 4, 4, DType::kFloat32, ReduceOp::kMax).ok());
  EXPECT_EQ(buf[4], 1.0f);
  EXPECT_EQ(buf[7], 4.0f);
}

TEST(CommunicatorTest, RejectsInvalidConfigBeforeTouchingTheNetwork) {
  MemNetwork net(1, job_config(1));
  Config c = rank_config(0, 1);
  c.window = 0;
  Result<std::unique_ptr<Communicator>> r = create_communicator(c, net.transport(0));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("window"), std::string::npos);
}

TEST(CommunicatorTest, FaultInjectionStillProducesExactResults) {
  const int world = 2;
  MemNetwork net(world, job_config(world));
  std::vector<std::vector<int32_t>> out(world);
  run_ranks(world, [&](int r) {
    Config c = rank_config(r, world);
    c.fault.drop_send_percent = 10;
    c.fault.drop_recv_percent = 10;
    c.fault.dup_send_percent = 10;
    Result<std::unique_ptr<Communicator>> comm = create_communicator(c, net.transport(r));
    ASSERT_TRUE(comm.ok()) << comm.status().to_string();
    out[r].resize(50000);  // ~200 blocks: a 10% loss cannot miss them all
    for (size_t i = 0; i < out[r].size(); ++i) out[r][i] = static_cast<int32_t>(i * (r + 1));
    const Status s = comm.value()->allreduce(out[r].data(), out[r].data(), out[r].size(),
                                             DType::kInt32, ReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_GT(comm.value()->stats().retransmits, 0u);
  });
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < out[r].size(); ++i) ASSERT_EQ(out[r][i], static_cast<int32_t>(3 * i));
  }
}

TEST(FaultInjectingTransportTest, SeededDecisionsAreReproducibleAndCounted) {
  // A sink transport that records what reaches it.
  class Sink final : public Transport {
   public:
    explicit Sink(std::vector<size_t>* log) : log_(log) {}
    Status send_batch(std::span<const std::span<const uint8_t>> p) override {
      for (const auto& d : p) log_->push_back(d[0]);
      return ok_status();
    }
    Result<size_t> recv_batch(std::span<Datagram>, std::chrono::microseconds) override {
      return size_t{0};
    }
    size_t max_datagram() const override { return 100; }
    std::string peer_name() const override { return "sink"; }

   private:
    std::vector<size_t>* log_;
  };
  FaultInjection f;
  f.drop_send_percent = 30;
  f.dup_send_percent = 20;
  std::vector<uint8_t> bytes(200);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  std::vector<std::span<const uint8_t>> pkts;
  for (size_t i = 0; i < bytes.size(); ++i) pkts.emplace_back(&bytes[i], 1);
  std::vector<size_t> log1, log2, log3;
  FaultInjectingTransport t1(std::make_unique<Sink>(&log1), f, 42);
  FaultInjectingTransport t2(std::make_unique<Sink>(&log2), f, 42);
  FaultInjectingTransport t3(std::make_unique<Sink>(&log3), f, 43);
  ASSERT_TRUE(t1.send_batch(pkts).ok());
  ASSERT_TRUE(t2.send_batch(pkts).ok());
  ASSERT_TRUE(t3.send_batch(pkts).ok());
  EXPECT_EQ(log1, log2);
  EXPECT_NE(log1, log3);
  const FaultCounters& c = t1.counters();
  EXPECT_EQ(log1.size(), pkts.size() - c.dropped_on_send + c.duplicated_on_send);
  EXPECT_GT(c.dropped_on_send, 30u);  // ~60 expected of 200
  EXPECT_LT(c.dropped_on_send, 90u);
  EXPECT_GT(c.duplicated_on_send, 10u);
  EXPECT_TRUE(FaultInjectingTransport::wanted(f));
  EXPECT_FALSE(FaultInjectingTransport::wanted(FaultInjection{}));
}

// ---- the host path: every rank takes it when any rank fails in-network ----

// Passes sends through; once `deaf` is set, swallows everything received (this rank's results
// are lost while its packets still reach the aggregator).
class DeafTransport final : public Transport {
 public:
  DeafTransport(std::unique_ptr<Transport> inner, std::atomic<bool>* deaf)
      : inner_(std::move(inner)), deaf_(deaf) {}
  Status send_batch(std::span<const std::span<const uint8_t>> p) override {
    return inner_->send_batch(p);
  }
  Result<size_t> recv_batch(std::span<Datagram> out, std::chrono::microseconds t) override {
    INA_ASSIGN_OR_RETURN(size_t n, inner_->recv_batch(out, t));
    return deaf_->load() ? size_t{0} : n;
  }
  size_t max_datagram() const override { return inner_->max_datagram(); }
  std::string peer_name() const override { return inner_->peer_name(); }

 private:
  std::unique_ptr<Transport> inner_;
  std::atomic<bool>* deaf_;
};

TEST(CommunicatorTest, OneRankLosesItsResultsAndEveryRankTakesTheHostPath) {
  const int world = 3;
  // The aggregator offers 128 elements per block: the host path must use the adopted size.
  MemNetwork net(world, job_config(world, 64, 128));
  const uint16_t port = ina::testing::free_loopback_port();
  ASSERT_NE(port, 0);
  std::atomic<bool> deaf{false};
  std::vector<std::vector<float>> in_network(world), host(world);
  run_ranks(world, [&](int r) {
    Config c = rank_config(r, world, milliseconds(1000));
    c.store = "127.0.0.1:" + std::to_string(port);
    std::unique_ptr<Transport> t = net.transport(r);
    if (r == 2) t = std::make_unique<DeafTransport>(std::move(t), &deaf);
    Result<std::unique_ptr<Communicator>> comm = create_communicator(c, std::move(t));
    ASSERT_TRUE(comm.ok()) << comm.status().to_string();
    Communicator& cm = *comm.value();
    std::vector<float> x(1000);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r) *
                                std::pow(10.0, static_cast<double>(i % 9) - 4));
    }
    // 1. In-network.
    in_network[r].resize(x.size());
    ASSERT_TRUE(
        cm.allreduce(x.data(), in_network[r].data(), x.size(), DType::kFloat32, ReduceOp::kSum)
            .ok());
    EXPECT_FALSE(cm.on_host_path());
    // 2. int32, 4 blocks on 4 slots in one batch: rank 2 sends all of them, then hears nothing;
    // ranks 0 and 1 get every result and return (no agreement when nothing failed), rank 2 misses
    // its deadline and calls the agreement.
    std::vector<int32_t> v(512);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i) * (r + 1);
    if (r == 2) deaf.store(true);
    const Status s = cm.allreduce(v.data(), v.data(), v.size(), DType::kInt32, ReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << s.to_string();
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<int32_t>(i) * 6) << i;
    // 3. The first collective again: ranks 0 and 1 try it in-network, where rank 2 never
    // contributes; at their deadline they meet rank 2 in the agreement, give it the results of
    // collective 2 it lacks, and redo this one on the host path (exact mode): the same bytes.
    host[r] = x;
    ASSERT_TRUE(
        cm.allreduce(host[r].data(), host[r].data(), x.size(), DType::kFloat32, ReduceOp::kSum)
            .ok());
    EXPECT_TRUE(cm.on_host_path());
    EXPECT_EQ(cm.stats().fallbacks, 1u);
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(std::memcmp(in_network[r].data(), host[r].data(), host[r].size() * 4), 0)
        << "rank " << r;
    EXPECT_EQ(std::memcmp(in_network[r].data(), in_network[0].data(), host[r].size() * 4), 0);
  }
}

// ---- path agreement only on failure: the aggregator dies in a collective's last rounds ----

struct KillRun {
  std::vector<std::vector<uint8_t>> out;  // per rank: collective 2's output
  std::vector<Status> status;             // per rank: collective 2's Status
  std::vector<int> next_ok;               // per rank: collective 3 returned the right sum
  std::vector<int> host_path;             // per rank: on the host path after collective 3
  uint64_t replies_before = 0;            // replies when every rank finished collective 1
  uint64_t replies_after = 0;             // ... collective 2 (calibration only)
};

// 4 ranks, 4 slots of 64 elements: collective 1 (float32 SUM 1000), a barrier of the threads, then
// collective 2 (float32 SUM 1000: 4 priming rounds + 16 blocks = 80 replies; in place on ranks 1
// and 3) and collective 3 (int32 SUM). `kill`: the reply number the aggregator dies before (0:
// never; then the threads also wait for each other after collective 2, to count its replies).
KillRun run_kill(uint64_t kill) {
  constexpr int kWorld = 4;
  MemNetwork net(kWorld, job_config(kWorld, /*slots=*/4, /*max_elems=*/64));
  net.kill_before_reply(kill);
  const uint16_t port = ina::testing::free_loopback_port();
  KillRun run;
  run.out.resize(kWorld);
  run.status.resize(kWorld);
  run.next_ok.assign(kWorld, 0);
  run.host_path.assign(kWorld, 0);
  std::barrier sync(kWorld, [&]() noexcept {
    if (run.replies_before == 0) {
      run.replies_before = net.replies();
    } else {
      run.replies_after = net.replies();
    }
  });
  run_ranks(kWorld, [&](int r) {
    Config c = rank_config(r, kWorld, milliseconds(5000));
    c.block_elems = 64;
    c.retransmit = milliseconds(500);  // no spurious resend shifts the reply count
    c.store = "127.0.0.1:" + std::to_string(port);
    Result<std::unique_ptr<Communicator>> comm = create_communicator(c, net.transport(r));
    if (!comm.ok()) {
      ADD_FAILURE() << comm.status().to_string();
      sync.arrive_and_drop();
      return;
    }
    Communicator& cm = *comm.value();
    std::vector<float> a(1000), b(1000);
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = static_cast<float>(std::sin(0.11 * static_cast<double>(i) + r) *
                                std::pow(10.0, static_cast<double>(i % 7) - 3));
      b[i] = static_cast<float>(std::cos(0.29 * static_cast<double>(i) * (r + 1)) *
                                std::pow(10.0, static_cast<double>((i / 64) % 5) - 2));
    }
    std::vector<float> first(a.size());
    EXPECT_TRUE(
        cm.allreduce(a.data(), first.data(), a.size(), DType::kFloat32, ReduceOp::kSum).ok());
    sync.arrive_and_wait();
    std::vector<float> out(b.size());
    if (r % 2 == 1) {
      out = b;
      run.status[r] =
          cm.allreduce(out.data(), out.data(), out.size(), DType::kFloat32, ReduceOp::kSum);
    } else {
      run.status[r] =
          cm.allreduce(b.data(), out.data(), out.size(), DType::kFloat32, ReduceOp::kSum);
    }
    run.out[r].assign(reinterpret_cast<const uint8_t*>(out.data()),
                      reinterpret_cast<const uint8_t*>(out.data() + out.size()));
    if (kill == 0) sync.arrive_and_wait();
    std::vector<int32_t> v(300);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i) + r;
    const Status s = cm.allreduce(v.data(), v.data(), v.size(), DType::kInt32, ReduceOp::kSum);
    bool right = s.ok();
    for (size_t i = 0; i < v.size() && right; ++i) right = v[i] == 4 * static_cast<int32_t>(i) + 6;
    EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s.to_string();
    run.next_ok[r] = right ? 1 : 0;
    run.host_path[r] = cm.on_host_path() ? 1 : 0;
  });
  return run;
}

TEST(PathAgreement, AggregatorKilledInTheLastRoundsEveryRankReturnsTheSameBits) {
  const KillRun calib = run_kill(0);
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(calib.status[r].ok()) << calib.status[r].to_string();
    ASSERT_EQ(calib.out[r], calib.out[0]) << "rank " << r;
    EXPECT_EQ(calib.host_path[r], 0) << "rank " << r;
  }
  const uint64_t first = calib.replies_before;
  const uint64_t last = calib.replies_after;  // collective 2's last reply is number `last`
  // 16 blocks (wire v2: no priming round), 4 copies of each result; more when a rank stalled past
  // its timeout (a loaded machine) and a resend was answered. Then the kill points below shift a
  // little, and every rank must still return the same bits.
  ASSERT_GE(last - first, 64u);
  // Dies before reply k: the last round's results reach some ranks and not others (last - 3 ..
  // last), the last two rounds (last - 7 ..), half the collective, or none of it (first + 1).
  for (const uint64_t k :
       {last, last - 1, last - 2, last - 3, last - 5, last - 7, first + 33, first + 1}) {
    SCOPED_TRACE("the aggregator dies before reply " + std::to_string(k) + " (collective 2: " +
                 std::to_string(first + 1) + " .. " + std::to_string(last) + ")");
    const KillRun run = run_kill(k);
    EXPECT_EQ(run.replies_before, first);
    for (int r = 0; r < 4; ++r) {
      EXPECT_TRUE(run.status[r].ok()) << "rank " << r << ": " << run.status[r].to_string();
      EXPECT_EQ(run.out[r], calib.out[0]) << "rank " << r << ": not the in-network bits";
      EXPECT_EQ(run.next_ok[r], 1) << "rank " << r;
      EXPECT_EQ(run.host_path[r], 1) << "rank " << r;
    }
  }
}

TEST(CommunicatorTest, StragglerHookAppliesOnTheHostPath) {
  // Host only (no aggregator): rank 1 straggles by 40 ms on every collective (100%).
  const int world = 2;
  const uint16_t port = ina::testing::free_loopback_port();
  ASSERT_NE(port, 0);
  std::vector<double> ms(world);
  run_ranks(world, [&](int r) {
    Config c = rank_config(r, world, milliseconds(5000));
    c.store = "127.0.0.1:" + std::to_string(port);
    if (r == 1) {
      c.fault.straggle_percent = 100;
      c.fault.straggle_delay_us = 40000;
    }
    Result<std::unique_ptr<Communicator>> comm = create_communicator(c, nullptr);
    ASSERT_TRUE(comm.ok()) << comm.status().to_string();
    ASSERT_TRUE(comm.value()->on_host_path());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 2; ++i) {
      int32_t x = r + 1;
      ASSERT_TRUE(comm.value()->allreduce(&x, &x, 1, DType::kInt32, ReduceOp::kSum).ok());
      EXPECT_EQ(x, 3);
    }
    ms[r] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  });
  EXPECT_GE(ms[1], 80.0);
  EXPECT_GE(ms[0], 40.0);  // rank 0 waited for the straggler
}

}  // namespace
}  // namespace ina::worker
