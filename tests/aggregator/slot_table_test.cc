// Slot table: directed tests of each rule in slot_table.h, then a randomized replay that runs
// simulated workers on the real schedule (window of slots, alternating copies, the next use of a
// slot only after the previous use's result, seq per round, float-SUM priming rounds) through a
// network that reorders, loses, duplicates and delays packets, and checks that every rank gets
// every round's exact result and that nothing is ever added twice.
#include "aggregator/slot_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "test_packets.h"

namespace ina::agg {
namespace {

using testing::data_header;
using testing::encode_packet;

std::unique_ptr<SlotTable> make_table(uint32_t world, uint32_t slots = 4, uint16_t elems = 16) {
  SlotTableConfig cfg;
  cfg.world_size = world;
  cfg.num_slots = slots;
  cfg.max_elems = elems;
  auto t = SlotTable::create(cfg);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

// Feeds one packet (encoded and decoded, as the engine would) to the table.
Verdict feed(SlotTable& t, const wire::Header& h, const std::vector<int32_t>& payload) {
  const std::vector<uint8_t> bytes = encode_packet(h, payload);
  wire::PacketView pkt;
  EXPECT_EQ(wire::decode(bytes, &pkt), wire::DecodeError::kOk);
  return t.on_data(pkt);
}

std::vector<int32_t> data_of(const CopyView& v) { return {v.data, v.data + v.count}; }

bool has_rank(const CopyView& v, uint32_t r) { return (v.bitmap[r / 64] >> (r % 64)) & 1; }

// ---------------------------------------------------------------------------------------------
// Directed tests

TEST(SlotTableConfigTest, RejectsOutOfRangeFieldsByName) {
  struct Case {
    SlotTableConfig cfg;
    const char* field;
    const char* range;
  };
  const Case cases[] = {
      {{0, 256, 2}, "num_slots", "1..32768"},
      {{32769, 256, 2}, "num_slots", "1..32768"},
      {{4, 0, 2}, "max_elems", "1..16384"},
      {{4, 16385, 2}, "max_elems", "1..16384"},
      {{4, 256, 0}, "world_size", "1..65535"},
      {{4, 256, 65536}, "world_size", "1..65535"},
  };
  for (const Case& c : cases) {
    auto t = SlotTable::create(c.cfg);
    ASSERT_FALSE(t.ok()) << c.field;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.field), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(c.range), std::string::npos) << t.status().message();
  }
  // The limits themselves are valid.
  EXPECT_TRUE(SlotTable::create({32768, 1, 1}).ok());
  EXPECT_TRUE(SlotTable::create({1, 16384, 1}).ok());
  EXPECT_TRUE(SlotTable::create({1, 1, 65535}).ok());
}

TEST(SlotTableTest, SumCompletesWhenEveryRankContributed) {
  auto t = make_table(3);
  EXPECT_EQ(feed(*t, data_header(1, 0, 0, 2, true, 7, 3), {1, 2, 3}), Verdict::kAdded);
  EXPECT_EQ(feed(*t, data_header(1, 0, 2, 2, true, 7, 3), {10, 20, 30}), Verdict::kAdded);
  CopyView v = t->copy(2, true);
  EXPECT_TRUE(v.used);
  EXPECT_FALSE(v.complete);
  EXPECT_EQ(v.contributors, 2u);
  EXPECT_TRUE(has_rank(v, 0));
  EXPECT_FALSE(has_rank(v, 1));
  EXPECT_TRUE(has_rank(v, 2));
  EXPECT_EQ(feed(*t, data_header(1, 0, 1, 2, true, 7, 3), {100, -200, 300}), Verdict::kCompleted);
  v = t->copy(2, true);
  EXPECT_TRUE(v.complete);
  EXPECT_EQ(v.seq, 7u);
  EXPECT_EQ(data_of(v), (std::vector<int32_t>{111, -178, 333}));
  // The other copy of the slot is untouched.
  EXPECT_FALSE(t->copy(2, false).used);
}

TEST(SlotTableTest, SumWrapsModulo2To32) {
  auto t = make_table(2);
  const int32_t kMax = std::numeric_limits<int32_t>::max();
  const int32_t kMin = std::numeric_limits<int32_t>::min();
  feed(*t, data_header(1, 0, 0, 0, false, 1, 3), {kMax, kMin, -1});
  EXPECT_EQ(feed(*t, data_header(1, 0, 1, 0, false, 1, 3), {1, -1, kMin}), Verdict::kCompleted);
  EXPECT_EQ(data_of(t->copy(0, false)), (std::vector<int32_t>{kMin, kMax, kMax}));
}

TEST(SlotTableTest, MinAndMaxAreSigned) {
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    auto t = make_table(3);
    // 9 elements: the vector body (4 at a time) and the scalar tail both run.
    const std::vector<std::vector<int32_t>> in = {
        {5, -5, 0, 7, INT32_MIN, 3, 9, -9, 1},
        {-5, 5, 1, 7, INT32_MAX, 2, -9, 9, 1},
        {0, 0, -1, 6, 0, 4, 0, 0, 2},
    };
    std::vector<int32_t> want(in[0].size());
    for (size_t i = 0; i < want.size(); ++i) {
      want[i] = in[0][i];
      for (const auto& r : in) {
        want[i] = op == ReduceOp::kMin ? std::min(want[i], r[i]) : std::max(want[i], r[i]);
      }
    }
    for (uint16_t r = 0; r < 3; ++r) {
      wire::Header h = data_header(1, 0, r, 1, false, 3, 9);
      h.op = op;
      feed(*t, h, in[r]);
    }
    const CopyView v = t->copy(1, false);
    ASSERT_TRUE(v.complete);
    EXPECT_EQ(v.op, op);
    EXPECT_EQ(data_of(v), want) << op_name(op);
  }
}

// The 16-byte and the 32-byte (AVX2, where this CPU has it) payload loops agree with a scalar
// reference for every op, at sizes around both vector widths (body and scalar tail).
TEST(SlotTableTest, WideAndNarrowLoopsAgreeWithScalarReference) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> any(INT32_MIN, INT32_MAX);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
    for (uint16_t n : {1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 33, 64, 255, 1024}) {
      const uint32_t world = 3;
      std::vector<std::vector<int32_t>> in(world, std::vector<int32_t>(n));
      for (auto& r : in) {
        for (auto& x : r) x = any(rng);
      }
      std::vector<int32_t> want = in[0];
      for (uint32_t r = 1; r < world; ++r) {
        for (size_t i = 0; i < n; ++i) {
          if (op == ReduceOp::kSum) {
            want[i] = static_cast<int32_t>(static_cast<uint32_t>(want[i]) +
                                           static_cast<uint32_t>(in[r][i]));
          } else {
            want[i] = op == ReduceOp::kMin ? std::min(want[i], in[r][i])
                                           : std::max(want[i], in[r][i]);
          }
        }
      }
      for (bool wide : {false, true}) {
        SlotTableConfig cfg;
        cfg.world_size = world;
        cfg.num_slots = 2;
        cfg.max_elems = 1024;
        cfg.wide_vectors = wide;
        auto t = SlotTable::create(cfg);
        ASSERT_TRUE(t.ok());
        for (uint16_t r = 0; r < world; ++r) {
          wire::Header h = data_header(1, 0, r, 1, true, 9, n);
          h.op = op;
          feed(**t, h, in[r]);
        }
        const CopyView v = (*t)->copy(1, true);
        ASSERT_TRUE(v.complete);
        EXPECT_EQ(data_of(v), want) << op_name(op) << " n=" << n << " wide=" << wide;
      }
    }
  }
}

TEST(SlotTableTest, NextExpIsMaxAndNonFiniteIsOr) {
  auto t = make_table(3);
  wire::Header h = data_header(1, 0, 0, 0, false, 1, 1);
  h.dtype = DType::kFloat32;
  h.exp = 4;
  h.next_exp = kNoExponent;  // a block of zeros: the identity of MAX
  feed(*t, h, {1});
  h.rank = 1;
  h.next_exp = -3;
  h.flags = wire::kFlagNonFinite;
  feed(*t, h, {2});
  h.rank = 2;
  h.next_exp = -7;
  h.flags = 0;
  EXPECT_EQ(feed(*t, h, {3}), Verdict::kCompleted);
  const CopyView v = t->copy(0, false);
  EXPECT_EQ(v.next_exp, -3);
  EXPECT_EQ(v.exp, 4);
  EXPECT_TRUE(v.nonfinite);
  EXPECT_EQ(v.dtype, DType::kFloat32);

  // A round without non-finite contributors and only kNoExponent keeps both identities.
  auto t2 = make_table(2);
  feed(*t2, data_header(1, 0, 0, 0, false, 1, 1), {1});
  feed(*t2, data_header(1, 0, 1, 0, false, 1, 1), {1});
  EXPECT_FALSE(t2->copy(0, false).nonfinite);
  EXPECT_EQ(t2->copy(0, false).next_exp, kNoExponent);
}

TEST(SlotTableTest, PrimingRoundWithoutPayload) {
  auto t = make_table(2);
  wire::Header h = data_header(1, 0, 0, 3, false, 40, 0);
  h.dtype = DType::kBFloat16;
  h.next_exp = 12;
  EXPECT_EQ(feed(*t, h, {}), Verdict::kAdded);
  h.rank = 1;
  h.next_exp = 15;
  EXPECT_EQ(feed(*t, h, {}), Verdict::kCompleted);
  EXPECT_EQ(t->copy(3, false).count, 0);
  EXPECT_EQ(t->copy(3, false).next_exp, 15);
}

TEST(SlotTableTest, BitmapOfLargeWorldReachesLastRank) {
  constexpr uint32_t kWorld = 1024;
  auto t = make_table(kWorld, 2, 4);
  EXPECT_EQ(t->bitmap_words(), 16u);
  EXPECT_EQ(feed(*t, data_header(1, 0, 1023, 1, true, 9, 2), {1, 2}), Verdict::kAdded);
  CopyView v = t->copy(1, true);
  ASSERT_EQ(v.bitmap.size(), 16u);
  EXPECT_EQ(v.bitmap[15], uint64_t{1} << 63);
  for (size_t w = 0; w < 15; ++w) EXPECT_EQ(v.bitmap[w], 0u) << w;
  for (uint16_t r = 0; r < 1023; ++r) {
    const Verdict verdict = feed(*t, data_header(1, 0, r, 1, true, 9, 2), {1, 2});
    ASSERT_EQ(verdict, r == 1022 ? Verdict::kCompleted : Verdict::kAdded) << r;
  }
  v = t->copy(1, true);
  EXPECT_EQ(v.contributors, kWorld);
  for (uint64_t w : v.bitmap) EXPECT_EQ(w, ~uint64_t{0});
  EXPECT_EQ(data_of(v), (std::vector<int32_t>{1024, 2048}));
  // A world that is not a multiple of 64 leaves the spare bits clear.
  auto t2 = make_table(65, 1, 1);
  EXPECT_EQ(t2->bitmap_words(), 2u);
  feed(*t2, data_header(1, 0, 64, 0, false, 1, 1), {1});
  EXPECT_EQ(t2->copy(0, false).bitmap[1], 1u);
}

TEST(SlotTableTest, DuplicatesAreNeverAddedTwice) {
  auto t = make_table(2);
  const wire::Header h0 = data_header(1, 0, 0, 0, false, 5, 2);
  EXPECT_EQ(feed(*t, h0, {3, 4}), Verdict::kAdded);
  EXPECT_EQ(feed(*t, h0, {3, 4}), Verdict::kDuplicate);
  wire::Header rt = h0;
  rt.flags = wire::kFlagRetransmit;
  EXPECT_EQ(feed(*t, rt, {3, 4}), Verdict::kReportMissing);
  EXPECT_EQ(t->copy(0, false).contributors, 1u);
  EXPECT_EQ(data_of(t->copy(0, false)), (std::vector<int32_t>{3, 4}));

  wire::Header h1 = data_header(1, 0, 1, 0, false, 5, 2);
  EXPECT_EQ(feed(*t, h1, {10, 10}), Verdict::kCompleted);
  EXPECT_EQ(feed(*t, h1, {10, 10}), Verdict::kResendResult);
  EXPECT_EQ(feed(*t, rt, {3, 4}), Verdict::kResendResult);
  EXPECT_EQ(data_of(t->copy(0, false)), (std::vector<int32_t>{13, 14}));
}

TEST(SlotTableTest, MismatchedContributionIsDroppedAndRoundStillCompletes) {
  auto t = make_table(2);
  wire::Header first = data_header(1, 0, 0, 1, false, 8, 3);
  first.dtype = DType::kFloat32;
  first.exp = 5;
  ASSERT_EQ(feed(*t, first, {1, 1, 1}), Verdict::kAdded);

  wire::Header other = first;
  other.rank = 1;
  std::vector<wire::Header> bad(4, other);
  bad[0].count = 2;
  bad[1].dtype = DType::kFloat16;
  bad[2].op = ReduceOp::kMax;
  bad[3].exp = 6;
  for (const wire::Header& b : bad) {
    EXPECT_EQ(feed(*t, b, std::vector<int32_t>(b.count, 100)), Verdict::kMismatch);
  }
  const CopyView v = t->copy(1, false);
  EXPECT_EQ(v.contributors, 1u);
  EXPECT_FALSE(has_rank(v, 1));
  EXPECT_EQ(data_of(v), (std::vector<int32_t>{1, 1, 1}));
  // next_exp may differ per rank (it is a MAX), so it is no mismatch.
  other.next_exp = 9;
  EXPECT_EQ(feed(*t, other, {2, 2, 2}), Verdict::kCompleted);
  EXPECT_EQ(data_of(t->copy(1, false)), (std::vector<int32_t>{3, 3, 3}));
}

TEST(SlotTableTest, BadSlotRankAndSizeChangeNothing) {
  auto t = make_table(2, 4, 8);
  EXPECT_EQ(feed(*t, data_header(1, 0, 0, 4, false, 1, 1), {1}), Verdict::kBadSlot);
  EXPECT_EQ(feed(*t, data_header(1, 0, 0, wire::kMaxSlot, true, 1, 1), {1}), Verdict::kBadSlot);
  EXPECT_EQ(feed(*t, data_header(1, 0, 2, 0, false, 1, 1), {1}), Verdict::kBadRank);
  EXPECT_EQ(feed(*t, data_header(1, 0, 65535, 0, false, 1, 1), {1}), Verdict::kBadRank);
  EXPECT_EQ(feed(*t, data_header(1, 0, 0, 0, false, 1, 9), std::vector<int32_t>(9, 1)),
            Verdict::kTooLarge);
  for (uint16_t s = 0; s < 4; ++s) {
    EXPECT_FALSE(t->copy(s, false).used);
    EXPECT_FALSE(t->copy(s, true).used);
  }
  // A copy() beyond the table is an empty view, not a crash.
  EXPECT_FALSE(t->copy(4, false).used);
  EXPECT_EQ(t->copy(4, false).data, nullptr);
}

TEST(SlotTableTest, NewerRoundAbandonsIncompleteRound) {
  auto t = make_table(2);
  ASSERT_EQ(feed(*t, data_header(1, 0, 0, 0, false, 10, 2), {1000, 1000}), Verdict::kAdded);
  // The collective of seq 10 was abandoned; seq 12 reuses the copy.
  EXPECT_EQ(feed(*t, data_header(1, 0, 1, 0, false, 12, 2), {1, 2}), Verdict::kAdded);
  CopyView v = t->copy(0, false);
  EXPECT_EQ(v.seq, 12u);
  EXPECT_EQ(v.contributors, 1u);
  EXPECT_FALSE(has_rank(v, 0));
  // Rank 1's late packet of the abandoned round is stale; rank 0's new one completes seq 12
  // without the abandoned contribution.
  EXPECT_EQ(feed(*t, data_header(1, 0, 1, 0, false, 10, 2), {5, 5}), Verdict::kStale);
  EXPECT_EQ(feed(*t, data_header(1, 0, 0, 0, false, 12, 2), {10, 20}), Verdict::kCompleted);
  EXPECT_EQ(data_of(t->copy(0, false)), (std::vector<int32_t>{11, 22}));
  // A new round may have a different shape (another collective).
  wire::Header h = data_header(1, 0, 0, 0, false, 14, 1);
  h.op = ReduceOp::kMax;
  EXPECT_EQ(feed(*t, h, {-4}), Verdict::kAdded);
  EXPECT_EQ(t->copy(0, false).op, ReduceOp::kMax);
  EXPECT_EQ(t->copy(0, false).count, 1);
}

TEST(SlotTableTest, StaleUsesSerialNumberArithmetic) {
  auto t = make_table(1);
  EXPECT_EQ(feed(*t, data_header(1, 0, 0, 0, false, 0xFFFFFFFFu, 1), {1}), Verdict::kCompleted);
  EXPECT_EQ(feed(*t, data_header(1, 0, 0, 0, false, 0xFFFFFFFEu, 1), {1}), Verdict::kStale);
  // seq 1 is two ahead of 0xFFFFFFFF (it wrapped): a new round, not a stale one.
  EXPECT_EQ(feed(*t, data_header(1, 0, 0, 0, false, 1, 1), {7}), Verdict::kCompleted);
  EXPECT_EQ(t->copy(0, false).seq, 1u);
  EXPECT_EQ(feed(*t, data_header(1, 0, 0, 0, false, 0xFFFFFFFFu, 1), {1}), Verdict::kStale);
  EXPECT_EQ(data_of(t->copy(0, false)), (std::vector<int32_t>{7}));
}

TEST(SlotTableTest, ResetForgetsEveryRound) {
  auto t = make_table(2);
  feed(*t, data_header(1, 0, 0, 1, true, 100, 1), {1});
  feed(*t, data_header(1, 0, 1, 1, true, 100, 1), {1});
  ASSERT_TRUE(t->copy(1, true).complete);
  t->reset();
  EXPECT_FALSE(t->copy(1, true).used);
  EXPECT_EQ(t->copy(1, true).contributors, 0u);
  for (uint64_t w : t->copy(1, true).bitmap) EXPECT_EQ(w, 0u);
  // A new incarnation restarts its sequence: an "older" seq is accepted after the reset.
  EXPECT_EQ(feed(*t, data_header(1, 0, 0, 1, true, 1, 1), {4}), Verdict::kAdded);
  EXPECT_EQ(feed(*t, data_header(1, 0, 1, 1, true, 1, 1), {5}), Verdict::kCompleted);
  EXPECT_EQ(data_of(t->copy(1, true)), (std::vector<int32_t>{9}));
}

TEST(SlotTableTest, VerdictNames) {
  EXPECT_STREQ(verdict_name(Verdict::kAdded), "added");
  EXPECT_STREQ(verdict_name(Verdict::kReportMissing), "report_missing");
  EXPECT_STREQ(verdict_name(Verdict::kTooLarge), "too_large");
  for (size_t i = 0; i < static_cast<size_t>(Verdict::kCount_); ++i) {
    EXPECT_STRNE(verdict_name(static_cast<Verdict>(i)), "?") << i;
  }
}

// ---------------------------------------------------------------------------------------------
// Randomized replay

struct SimConfig {
  uint32_t world = 2;
  uint32_t num_slots = 4;
  uint16_t max_elems = 8;
  uint64_t seed = 1;
  BlockSeq seq0 = 0;
  double loss = 0.1;      // per packet, both directions
  double dup = 0.05;      // an extra copy, delivered in random order
  double delay = 0.03;    // an extra copy held back for hundreds of steps
  double spurious = 0.002;  // per step: a rank's timer fires although nothing was lost
  size_t target_packets = 20000;
};

// One use of a slot by the communicator; identical on every rank.
struct Round {
  BlockSeq seq = 0;
  uint16_t slot = 0;
  bool shadow = false;
  uint16_t count = 0;
  DType dtype = DType::kInt32;
  ReduceOp op = ReduceOp::kSum;
  bool uses_exp = false;        // float SUM: exp is the MAX next_exp of the previous use
  size_t prev_on_slot = SIZE_MAX;  // previous round on this slot within the collective
  size_t next_on_slot = SIZE_MAX;
  size_t collective = 0;
};

struct Collective {
  size_t first = 0, end = 0;  // rounds [first, end)
  uint32_t window = 1;
};

struct ResultMsg {
  uint32_t to = 0;
  wire::Header hdr;
  std::vector<int32_t> data;
};

class Replay {
 public:
  explicit Replay(const SimConfig& cfg) : cfg_(cfg), rng_(cfg.seed) {}

  // Verdicts seen, over the whole run.
  std::array<uint64_t, static_cast<size_t>(Verdict::kCount_)> verdicts{};

  void run() {
    build_schedule();
    SlotTableConfig tc;
    tc.world_size = cfg_.world;
    tc.num_slots = cfg_.num_slots;
    tc.max_elems = cfg_.max_elems;
    auto t = SlotTable::create(tc);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    table_ = std::move(t).value();

    ranks_.assign(cfg_.world, RankState{});
    for (uint32_t r = 0; r < cfg_.world; ++r) start_collective(r, 0);

    const size_t max_steps = 400 * cfg_.target_packets + 100000;
    size_t step = 0;
    for (; step < max_steps && !all_done(); ++step) {
      release_delayed(step);
      if (uniform() < cfg_.spurious) retransmit(pick(cfg_.world));
      const size_t to_rank = pending_results_.size();
      if (to_agg_.empty() && to_rank == 0) {
        // Nothing in flight: every rank's timer fires and it resends what has no result.
        for (uint32_t r = 0; r < cfg_.world; ++r) retransmit(r);
        if (to_agg_.empty()) continue;  // all lost again: next step retries
      }
      const size_t total = to_agg_.size() + pending_results_.size();
      if (pick(total) < to_agg_.size()) {
        deliver_to_aggregator(take(to_agg_));
      } else {
        deliver_to_rank(take(pending_results_));
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
    ASSERT_TRUE(all_done()) << "the replay did not finish in " << max_steps << " steps";

    // Late packets still in the network: every one must be recognised, none added.
    for (auto& d : delayed_) to_agg_.push_back(std::move(d.second));
    delayed_.clear();
    while (!to_agg_.empty() || !pending_results_.empty()) {
      if (!to_agg_.empty()) {
        deliver_to_aggregator(take(to_agg_));
      } else {
        deliver_to_rank(take(pending_results_));  // checked, then ignored: all rounds are done
      }
      if (::testing::Test::HasFatalFailure()) return;
    }

    // Every round completed exactly once, with every rank's contribution exactly once.
    for (size_t i = 0; i < rounds_.size(); ++i) {
      ASSERT_EQ(completions_[i], 1u) << "round " << i;
      ASSERT_EQ(added_[i].size(), cfg_.world) << "round " << i;
    }
    // Every rank got every round's result (checked against the reference on arrival).
    for (uint32_t r = 0; r < cfg_.world; ++r) {
      for (size_t i = 0; i < rounds_.size(); ++i) {
        ASSERT_TRUE(ranks_[r].got[i]) << "rank " << r << " round " << i;
      }
    }
  }

 private:
  struct RankState {
    size_t collective = 0;
    size_t received_in_collective = 0;
    std::vector<bool> got;               // per round
    std::vector<int16_t> exp;            // per round: the exponent this rank quantizes with
    std::set<size_t> outstanding;        // rounds sent, result not yet received
  };

  double uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  template <typename T>
  T take(std::vector<T>& v) {
    const size_t i = pick(v.size());
    std::swap(v[i], v.back());
    T x = std::move(v.back());
    v.pop_back();
    return x;
  }

  void build_schedule() {
    // Blocks per collective sized so that the run sends about target_packets packets.
    const size_t per_collective =
        std::clamp<size_t>(cfg_.target_packets / (4 * size_t{cfg_.world}), 1, 64);
    std::vector<uint32_t> use(cfg_.num_slots, 0);  // per-communicator use counter per slot
    BlockSeq seq = cfg_.seq0;
    for (size_t c = 0; c < 4; ++c) {
      const size_t blocks = 1 + pick(per_collective);
      const uint32_t window = static_cast<uint32_t>(std::min<size_t>(cfg_.num_slots, blocks));
      // Collective kinds: int32 SUM, MIN, MAX, float32 SUM (primed, exponents).
      const int kind = static_cast<int>(pick(4));
      const bool primed = kind == 3;
      const ReduceOp op = kind == 1 ? ReduceOp::kMin : kind == 2 ? ReduceOp::kMax : ReduceOp::kSum;
      const DType dtype = primed ? DType::kFloat32 : DType::kInt32;
      const uint16_t last_count = static_cast<uint16_t>(1 + pick(cfg_.max_elems));
      Collective col;
      col.first = rounds_.size();
      col.window = window;
      const size_t n_rounds = blocks + (primed ? window : 0);
      for (size_t j = 0; j < n_rounds; ++j) {
        Round rd;
        rd.collective = c;
        rd.slot = static_cast<uint16_t>(j % window);
        rd.shadow = (use[rd.slot]++ & 1) != 0;
        rd.seq = seq++;
        const bool priming = primed && j < window;
        const size_t block = primed ? j - window : j;
        rd.count = priming ? 0 : (block + 1 == blocks ? last_count : cfg_.max_elems);
        rd.dtype = dtype;
        rd.op = op;
        rd.uses_exp = primed;
        if (j >= window) {
          rd.prev_on_slot = col.first + j - window;
          rounds_[rd.prev_on_slot].next_on_slot = rounds_.size();
        }
        rounds_.push_back(rd);
      }
      col.end = rounds_.size();
      collectives_.push_back(col);
    }
    // Each rank's input per round.
    const size_t n = rounds_.size();
    payload_.assign(cfg_.world, std::vector<std::vector<int32_t>>(n));
    next_exp_.assign(cfg_.world, std::vector<int16_t>(n, kNoExponent));
    nonfinite_.assign(cfg_.world, std::vector<bool>(n, false));
    for (uint32_t r = 0; r < cfg_.world; ++r) {
      for (size_t i = 0; i < n; ++i) {
        const Round& rd = rounds_[i];
        auto& p = payload_[r][i];
        p.resize(rd.count);
        // Full-range values: SUM must wrap exactly like uint32 arithmetic.
        for (auto& x : p) x = static_cast<int32_t>(static_cast<uint32_t>(rng_()));
        if (rd.uses_exp && rd.next_on_slot != SIZE_MAX) {
          // Sometimes a block of zeros (kNoExponent).
          next_exp_[r][i] = pick(8) == 0 ? kNoExponent : static_cast<int16_t>(pick(60)) - 30;
        }
        nonfinite_[r][i] = rd.uses_exp && pick(50) == 0;
      }
    }
    completions_.assign(n, 0);
    added_.assign(n, {});
    expected_.assign(n, std::nullopt);
  }

  struct Expected {
    std::vector<int32_t> data;
    int16_t next_exp = kNoExponent;
    int16_t exp = kNoExponent;
    bool nonfinite = false;
  };

  const Expected& expected(size_t i) {
    if (expected_[i]) return *expected_[i];
    const Round& rd = rounds_[i];
    Expected e;
    e.data.resize(rd.count);
    for (size_t k = 0; k < rd.count; ++k) {
      uint32_t sum = 0;
      int32_t lo = INT32_MAX, hi = INT32_MIN;
      for (uint32_t r = 0; r < cfg_.world; ++r) {
        const int32_t x = payload_[r][i][k];
        sum += static_cast<uint32_t>(x);
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      e.data[k] = rd.op == ReduceOp::kSum   ? static_cast<int32_t>(sum)
                  : rd.op == ReduceOp::kMin ? lo
                                            : hi;
    }
    for (uint32_t r = 0; r < cfg_.world; ++r) {
      e.next_exp = std::max(e.next_exp, next_exp_[r][i]);
      e.nonfinite = e.nonfinite || nonfinite_[r][i];
    }
    if (rd.uses_exp && rd.prev_on_slot != SIZE_MAX) e.exp = expected(rd.prev_on_slot).next_exp;
    expected_[i] = std::move(e);
    return *expected_[i];
  }

  std::vector<uint8_t> packet_of(uint32_t r, size_t i, bool retransmit) {
    const Round& rd = rounds_[i];
    wire::Header h = data_header(1, 0, static_cast<uint16_t>(r), rd.slot, rd.shadow, rd.seq,
                                 rd.count);
    h.dtype = rd.dtype;
    h.op = rd.op;
    h.exp = ranks_[r].exp[i];
    h.next_exp = next_exp_[r][i];
    h.flags = static_cast<uint8_t>((retransmit ? wire::kFlagRetransmit : 0) |
                                   (nonfinite_[r][i] ? wire::kFlagNonFinite : 0));
    return encode_packet(h, payload_[r][i]);
  }

  void send_to_aggregator(std::vector<uint8_t> pkt) {
    if (uniform() < cfg_.dup) to_agg_.push_back(pkt);
    if (uniform() < cfg_.delay) {
      delayed_.emplace_back(0, pkt);
      delayed_.back().first = steps_hint_ + 100 + pick(2000 + 8 * size_t{cfg_.world});
    }
    if (uniform() < cfg_.loss) return;
    to_agg_.push_back(std::move(pkt));
  }

  void send_round(uint32_t r, size_t i) {
    RankState& st = ranks_[r];
    st.outstanding.insert(i);
    send_to_aggregator(packet_of(r, i, false));
  }

  void retransmit(uint32_t r) {
    for (size_t i : ranks_[r].outstanding) send_to_aggregator(packet_of(r, i, true));
  }

  void start_collective(uint32_t r, size_t c) {
    RankState& st = ranks_[r];
    if (st.got.empty()) {
      st.got.assign(rounds_.size(), false);
      st.exp.assign(rounds_.size(), kNoExponent);
    }
    st.collective = c;
    st.received_in_collective = 0;
    if (c >= collectives_.size()) return;
    const Collective& col = collectives_[c];
    for (size_t i = col.first; i < col.first + col.window; ++i) send_round(r, i);
  }

  bool all_done() const {
    for (const RankState& st : ranks_) {
      if (st.collective < collectives_.size()) return false;
    }
    return true;
  }

  void release_delayed(size_t step) {
    steps_hint_ = step;
    for (size_t k = 0; k < delayed_.size();) {
      if (delayed_[k].first <= step) {
        to_agg_.push_back(std::move(delayed_[k].second));
        delayed_[k] = std::move(delayed_.back());
        delayed_.pop_back();
      } else {
        ++k;
      }
    }
  }

  size_t round_of(BlockSeq seq) const { return static_cast<size_t>(seq - cfg_.seq0); }

  void post_result(uint32_t to, const CopyView& v) {
    if (uniform() < cfg_.loss) return;
    ResultMsg m;
    m.to = to;
    m.hdr.seq = v.seq;
    m.hdr.slot = v.slot;
    m.hdr.shadow = v.shadow;
    m.hdr.count = v.count;
    m.hdr.exp = v.exp;
    m.hdr.next_exp = v.next_exp;
    m.hdr.flags = v.nonfinite ? wire::kFlagNonFinite : 0;
    m.data.assign(v.data, v.data + v.count);
    if (uniform() < cfg_.dup) pending_results_.push_back(m);
    pending_results_.push_back(std::move(m));
  }

  void deliver_to_aggregator(const std::vector<uint8_t>& bytes) {
    wire::PacketView pkt;
    ASSERT_EQ(wire::decode(bytes, &pkt), wire::DecodeError::kOk);
    const wire::Header& h = pkt.hdr;
    const CopyView before = table_->copy(h.slot, h.shadow);
    const Verdict v = table_->on_data(pkt);
    ++verdicts[static_cast<size_t>(v)];
    const size_t i = round_of(h.seq);
    ASSERT_LT(i, rounds_.size());
    switch (v) {
      case Verdict::kAdded:
      case Verdict::kCompleted:
        ASSERT_TRUE(added_[i].insert(h.rank).second)
            << "rank " << h.rank << " added twice to round " << i;
        if (v == Verdict::kCompleted) {
          ++completions_[i];
          const CopyView c = table_->copy(h.slot, h.shadow);
          ASSERT_TRUE(c.complete);
          ASSERT_EQ(c.contributors, cfg_.world);
          for (uint32_t r = 0; r < cfg_.world; ++r) post_result(r, c);
        }
        break;
      case Verdict::kResendResult: {
        ASSERT_EQ(added_[i].count(h.rank), 1u);
        const CopyView c = table_->copy(h.slot, h.shadow);
        ASSERT_TRUE(c.complete);
        ASSERT_EQ(c.seq, h.seq);
        post_result(h.rank, c);
        break;
      }
      case Verdict::kDuplicate:
      case Verdict::kReportMissing: {
        ASSERT_EQ(added_[i].count(h.rank), 1u);
        ASSERT_EQ(v == Verdict::kReportMissing, h.has(wire::kFlagRetransmit));
        const CopyView c = table_->copy(h.slot, h.shadow);
        ASSERT_FALSE(c.complete);
        // The bitmap names exactly the ranks added so far.
        for (uint32_t r = 0; r < cfg_.world; ++r) {
          ASSERT_EQ(has_rank(c, r), added_[i].count(r) == 1) << "rank " << r;
        }
        break;
      }
      case Verdict::kStale:
        ASSERT_TRUE(before.used);
        ASSERT_GT(static_cast<int32_t>(before.seq - h.seq), 0);
        break;
      default:
        FAIL() << "unexpected verdict " << verdict_name(v) << " for round " << i << " rank "
               << h.rank;
    }
    // The copy's state never goes back to an older round.
    const CopyView after = table_->copy(h.slot, h.shadow);
    if (before.used) {
      ASSERT_GE(static_cast<int32_t>(after.seq - before.seq), 0);
    }
  }

  void deliver_to_rank(const ResultMsg& m) {
    const size_t i = round_of(m.hdr.seq);
    ASSERT_LT(i, rounds_.size());
    const Round& rd = rounds_[i];
    ASSERT_EQ(m.hdr.slot, rd.slot);
    ASSERT_EQ(m.hdr.shadow, rd.shadow);
    // Every result a rank ever sees, first or duplicate, is the exact reduction.
    const Expected& e = expected(i);
    ASSERT_EQ(m.data, e.data) << "round " << i << " op " << op_name(rd.op);
    ASSERT_EQ(m.hdr.next_exp, e.next_exp) << "round " << i;
    ASSERT_EQ(m.hdr.exp, e.exp) << "round " << i;
    ASSERT_EQ(m.hdr.has(wire::kFlagNonFinite), e.nonfinite) << "round " << i;

    RankState& st = ranks_[m.to];
    if (st.outstanding.erase(i) == 0) return;  // a duplicate or late result: ignored
    st.got[i] = true;
    // The next use of this slot quantizes with the MAX exponent this result carries.
    if (rd.next_on_slot != SIZE_MAX) {
      st.exp[rd.next_on_slot] = rd.uses_exp ? m.hdr.next_exp : kNoExponent;
      send_round(m.to, rd.next_on_slot);
    }
    const Collective& col = collectives_[rd.collective];
    if (++st.received_in_collective == col.end - col.first) start_collective(m.to, st.collective + 1);
  }

  SimConfig cfg_;
  std::mt19937_64 rng_;
  std::unique_ptr<SlotTable> table_;
  std::vector<Round> rounds_;
  std::vector<Collective> collectives_;
  std::vector<std::vector<std::vector<int32_t>>> payload_;  // [rank][round]
  std::vector<std::vector<int16_t>> next_exp_;
  std::vector<std::vector<bool>> nonfinite_;
  std::vector<RankState> ranks_;
  std::vector<std::vector<uint8_t>> to_agg_;
  std::vector<std::pair<size_t, std::vector<uint8_t>>> delayed_;
  std::vector<ResultMsg> pending_results_;
  std::vector<uint32_t> completions_;
  std::vector<std::set<uint32_t>> added_;
  std::vector<std::optional<Expected>> expected_;
  size_t steps_hint_ = 0;
};

class SlotTableReplayTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(SlotTableReplayTest, ExactResultsUnderLossDuplicationAndReordering) {
  const uint32_t world = GetParam();
  std::array<uint64_t, static_cast<size_t>(Verdict::kCount_)> seen{};
  const uint64_t seeds = world >= 1024 ? 3 : world >= 64 ? 4 : 12;
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    SCOPED_TRACE("world " + std::to_string(world) + " seed " + std::to_string(seed));
    std::mt19937_64 pick(seed * 7919 + world);
    SimConfig cfg;
    cfg.world = world;
    cfg.seed = seed;
    // Few slots in a large world, so that each copy serves several rounds in the budget.
    cfg.num_slots = 1 + static_cast<uint32_t>(pick() % (world >= 64 ? 3 : 8));
    cfg.max_elems = static_cast<uint16_t>(1 + pick() % 24);
    // Every other seed starts just before the sequence wraps.
    cfg.seq0 = (seed % 2 == 0) ? 0xFFFFFFFFu - static_cast<uint32_t>(pick() % 64)
                               : static_cast<uint32_t>(pick());
    cfg.loss = 0.02 + 0.18 * static_cast<double>(pick() % 100) / 100.0;
    cfg.target_packets = world >= 1024 ? 60000 : 30000;
    Replay replay(cfg);
    replay.run();
    if (HasFatalFailure()) return;
    for (size_t i = 0; i < seen.size(); ++i) seen[i] += replay.verdicts[i];
  }
  std::string summary;
  for (size_t i = 0; i < seen.size(); ++i) {
    summary += std::string(verdict_name(static_cast<Verdict>(i))) + "=" + std::to_string(seen[i]) + " ";
  }
  RecordProperty("verdicts", summary);
  // The replay exercised every rule it is meant to exercise.
  auto count = [&](Verdict v) { return seen[static_cast<size_t>(v)]; };
  EXPECT_GT(count(Verdict::kCompleted), 0u);
  EXPECT_GT(count(Verdict::kResendResult), 0u);
  EXPECT_GT(count(Verdict::kStale), 0u);
  if (world > 1) {
    EXPECT_GT(count(Verdict::kAdded), 0u);
    EXPECT_GT(count(Verdict::kDuplicate), 0u);
    EXPECT_GT(count(Verdict::kReportMissing), 0u);
  }
  EXPECT_EQ(count(Verdict::kMismatch), 0u);
}

std::string world_name(const ::testing::TestParamInfo<uint32_t>& p) {
  return "world" + std::to_string(p.param);
}
INSTANTIATE_TEST_SUITE_P(Worlds, SlotTableReplayTest, ::testing::Values(1, 2, 3, 8, 64, 1024),
                         world_name);

}  // namespace
}  // namespace ina::agg
