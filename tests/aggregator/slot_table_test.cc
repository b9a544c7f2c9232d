// Slot table: directed tests of each rule in slot_table.h, then randomized order independence:
// every dtype x op at several world sizes, the same ranks' blocks delivered in many arrival orders
// with losses (resent later, marked RETRANSMIT) and duplicates, must give identical bits, equal to
// the codec's reduction; and a two-level tree of tables (leaves deferring their float SUM, a root
// collecting PARTIAL exponents and words) must give the flat table's bits.
#include "aggregator/slot_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ina/base/half.h"
#include "ina/protocol/codec.h"
#include "ina/protocol/fp8.h"
#include "test_packets.h"

namespace ina::agg {
namespace {

using testing::data_header;
using testing::encode_packet;

std::unique_ptr<SlotTable> make_table(uint32_t world, uint32_t slots = 4, uint16_t elems = 16) {
  SlotTableConfig cfg;
  cfg.world_size = world;
  cfg.num_slots = slots;
  cfg.max_payload_bytes = uint32_t{elems} * 4;
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

// The result of an int32 round.
std::vector<int32_t> data_of(const CopyView& v) {
  std::vector<int32_t> out(v.count);
  std::memcpy(out.data(), v.result, out.size() * 4);
  return out;
}

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
      {{4, 0, 2}, "max_payload_bytes", "4..16384"},
      {{4, 16388, 2}, "max_payload_bytes", "4..16384"},
      {{4, 1022, 2}, "max_payload_bytes", "multiple of 4"},
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
  EXPECT_TRUE(SlotTable::create({32768, 4, 1}).ok());
  EXPECT_TRUE(SlotTable::create({1, 16384, 1}).ok());
  EXPECT_TRUE(SlotTable::create({1, 4, 65535}).ok());
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

// int32 reduces in int32, in the result's own words: SUM wraps modulo 2^32 at the accumulator
// (INT32_MAX + 1 is INT32_MIN, four INT32_MIN are 0), MIN/MAX keep the extreme values, at every
// length through the vector loops and their tails; and a copy's next round starts from its first
// contribution, not from the previous round's result in the same words.
TEST(SlotTableTest, Int32ReducesInItsOwnWordsAtEveryLength) {
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  for (uint16_t n = 1; n <= 45; ++n) {
    SCOPED_TRACE(n);
    auto t = make_table(4, 2, 64);
    const auto round = [&](BlockSeq seq, ReduceOp op, const std::vector<std::vector<int32_t>>& in) {
      for (uint16_t r = 0; r < 4; ++r) {
        wire::Header h = data_header(1, 0, r, 1, false, seq, n);
        h.op = op;
        EXPECT_EQ(feed(*t, h, in[r]), r == 3 ? Verdict::kCompleted : Verdict::kAdded);
      }
      return data_of(t->copy(1, false));
    };
    const std::vector<int32_t> max(n, kMax), min(n, kMin), one(n, 1), zero(n, 0), minus(n, -1);
    // INT32_MAX + 1 (+ 0 + 0) wraps to INT32_MIN; 4 x INT32_MIN to 0; 4 x INT32_MAX to -4.
    EXPECT_EQ(round(1, ReduceOp::kSum, {max, one, zero, zero}), min);
    EXPECT_EQ(round(3, ReduceOp::kSum, {min, min, min, min}), zero);
    EXPECT_EQ(round(5, ReduceOp::kSum, {max, max, max, max}), std::vector<int32_t>(n, -4));
    EXPECT_EQ(round(7, ReduceOp::kSum, {min, minus, one, zero}), min);
    // MIN/MAX at the edges, the extreme value from any rank, element by element.
    std::vector<int32_t> mixed(n), mixed2(n);
    for (uint16_t i = 0; i < n; ++i) {
      mixed[i] = i % 2 == 0 ? kMin : kMax;
      mixed2[i] = i % 3 == 0 ? kMax : -1;
    }
    std::vector<int32_t> want_min(n), want_max(n);
    for (uint16_t i = 0; i < n; ++i) {
      want_min[i] = std::min({mixed[i], mixed2[i], 0});
      want_max[i] = std::max({mixed[i], mixed2[i], 0});
    }
    EXPECT_EQ(round(9, ReduceOp::kMin, {zero, mixed, mixed2, zero}), want_min);
    EXPECT_EQ(round(11, ReduceOp::kMax, {mixed2, zero, zero, mixed}), want_max);
    EXPECT_EQ(round(13, ReduceOp::kMin, {max, max, max, max}), max);
    EXPECT_EQ(round(15, ReduceOp::kMax, {min, min, min, min}), min);
    // The previous round's INT32_MIN words are not folded into this MAX of -1s.
    EXPECT_EQ(round(17, ReduceOp::kMax, {minus, minus, minus, minus}), minus);
  }
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
  EXPECT_FALSE(t->copy(0, false).complete);  // (the result exists only once complete)

  wire::Header h1 = data_header(1, 0, 1, 0, false, 5, 2);
  EXPECT_EQ(feed(*t, h1, {10, 10}), Verdict::kCompleted);
  EXPECT_EQ(feed(*t, h1, {10, 10}), Verdict::kResendResult);
  EXPECT_EQ(feed(*t, rt, {3, 4}), Verdict::kResendResult);
  EXPECT_EQ(data_of(t->copy(0, false)), (std::vector<int32_t>{13, 14}));
}

// A contribution whose shape (count, dtype, op, elems, root) differs from the round's first
// poisons the round: it never completes; every rank's packet is recorded (which ranks sent the
// other shape), kMismatchPending until every rank is in, then kMismatch for every packet of the
// round (resends included). The collective id is not part of the shape.
TEST(SlotTableTest, MismatchPoisonsTheRoundUntilEveryRankIsIn) {
  wire::Header first = data_header(1, 0, 0, 1, false, 8, 3);
  first.elems = 1000;
  first.root = 3;
  wire::Header other = first;
  other.rank = 1;
  other.coll = 9;
  std::vector<wire::Header> bad(5, other);
  bad[0].count = 2;
  bad[1].dtype = DType::kFloat32;
  bad[2].op = ReduceOp::kMax;
  bad[3].elems = 1001;
  bad[4].root = wire::kNoRoot;
  for (const wire::Header& b : bad) {
    auto t = make_table(3);
    ASSERT_EQ(feed(*t, first, {1, 1, 1}), Verdict::kAdded);
    EXPECT_EQ(feed(*t, b, std::vector<int32_t>(b.count, 100)), Verdict::kMismatchPending);
    EXPECT_EQ(feed(*t, b, std::vector<int32_t>(b.count, 100)), Verdict::kMismatchPending);
    wire::Header third = first;
    third.rank = 2;
    EXPECT_EQ(feed(*t, third, {1, 1, 1}), Verdict::kMismatch);  // every rank in
    EXPECT_EQ(feed(*t, first, {1, 1, 1}), Verdict::kMismatch);  // and every resend told
    const CopyView v = t->copy(1, false);
    EXPECT_TRUE(v.poisoned);
    EXPECT_FALSE(v.complete);
    EXPECT_EQ(v.contributors, 3u);
    EXPECT_EQ(v.other_count, b.count);
    EXPECT_EQ(v.other_dtype, b.dtype);
    EXPECT_EQ(v.other_op, b.op);
    EXPECT_EQ(v.other_elems, b.elems);
    EXPECT_EQ(v.other_root, b.root);
    EXPECT_EQ(v.other_ranks[0], uint64_t{1} << 1);  // rank 1 alone sent the other shape
    // The slot's next round starts clean.
    wire::Header next = first;
    next.seq = first.seq + 2;
    EXPECT_EQ(feed(*t, next, {1, 1, 1}), Verdict::kAdded);
    EXPECT_FALSE(t->copy(1, false).poisoned);
  }
  auto t = make_table(2);
  ASSERT_EQ(feed(*t, first, {1, 1, 1}), Verdict::kAdded);
  other.coll = 9;
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
  // The block is in bytes: 16 16-bit elements fit where 9 int32 do not.
  wire::Header h16 = data_header(1, 0, 0, 0, false, 1, 16);
  h16.dtype = DType::kBFloat16;
  EXPECT_EQ(feed(*t, h16, std::vector<int32_t>(16, 0x3F80)), Verdict::kAdded);
  h16.count = 17;
  EXPECT_EQ(feed(*t, h16, std::vector<int32_t>(17, 0x3F80)), Verdict::kTooLarge);
  t->reset();
  for (uint16_t s = 0; s < 4; ++s) {
    EXPECT_FALSE(t->copy(s, false).used);
    EXPECT_FALSE(t->copy(s, true).used);
  }
  // A copy() beyond the table is an empty view, not a crash.
  EXPECT_FALSE(t->copy(4, false).used);
  EXPECT_EQ(t->copy(4, false).result, nullptr);
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

// The engine's receive pass stores a float SUM DATA packet's words while it verifies the tag
// (raw_words_for): only where nothing live is, so that a forged packet's words change nothing;
// the one that completes its round (raw_words_for's `completes`) it verifies in the datagram and
// leaves there (StoredWords::in_datagram). on_data(pkt, &stored) then gives what on_data(pkt)
// does.
TEST(SlotTableTest, RawWordsForPointsOnlyWhereNothingLiveIs) {
  for (const bool defer : {false, true}) {
    SlotTableConfig cfg;
    cfg.world_size = 3;
    cfg.num_slots = 2;
    cfg.max_payload_bytes = 64;
    cfg.defer_float_sum = defer;
    auto t = std::move(SlotTable::create(cfg)).value();
    auto plain = std::move(SlotTable::create(cfg)).value();  // the same packets, no receive pass
    auto f32 = [](uint16_t rank, BlockSeq seq) {
      wire::Header h = data_header(1, 0, rank, 1, false, seq, 2);
      h.dtype = DType::kFloat32;
      return h;
    };
    // Stores the words where raw_words_for points (as the receive pass would), then on_data.
    auto feed_stored = [&](const wire::Header& h, const std::vector<float>& v) {
      EXPECT_EQ(v.size(), h.count);
      std::vector<uint8_t> b(wire::packet_size(h));
      wire::encode_header(h, b.data());
      std::memcpy(b.data() + wire::kHeaderSize, v.data(), v.size() * 4);
      wire::PacketView pkt;
      EXPECT_EQ(wire::decode(b, &pkt), wire::DecodeError::kOk);
      const Verdict want = plain->on_data(pkt);
      bool completes = true;
      uint8_t* words = t->raw_words_for(h, &completes);
      if (words == nullptr) {
        EXPECT_FALSE(completes);
        return t->on_data(pkt);
      }
      StoredWords stored;
      stored.in_datagram = completes;
      if (!completes) std::memcpy(words, pkt.payload, pkt.payload_bytes);
      stored.scanned = h.rank % 2 == 0;  // both ways: scanned by the pass, or by the table
      stored.scan = codec::scan(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
      const Verdict got = t->on_data(pkt, &stored);
      EXPECT_EQ(got, want);
      return got;
    };
    EXPECT_NE(t->raw_words_for(f32(0, 5)), nullptr);  // an unused copy
    EXPECT_EQ(feed_stored(f32(0, 5), {1.5f, -2.0f}), Verdict::kAdded);
    EXPECT_EQ(t->raw_words_for(f32(0, 5)), nullptr);  // rank 0's words are the round's
    EXPECT_EQ(t->raw_words_for(f32(0, 7)), nullptr);  // even for a newer round (not yet taken)
    EXPECT_NE(t->raw_words_for(f32(1, 5)), nullptr);
    EXPECT_NE(t->raw_words_for(f32(1, 7)), nullptr);
    bool completes = true;
    EXPECT_NE(t->raw_words_for(f32(2, 5), &completes), nullptr);
    EXPECT_FALSE(completes);  // rank 1 still to come
    EXPECT_EQ(feed_stored(f32(1, 5), {0.25f, 8.0f}), Verdict::kAdded);
    // The last rank completes the round (not at a leaf, which keeps its words for the root);
    // not a packet of another shape, round or a rank already in.
    EXPECT_NE(t->raw_words_for(f32(2, 5), &completes), nullptr);
    EXPECT_EQ(completes, !defer);
    wire::Header other = f32(2, 5);
    other.count = 1;
    EXPECT_NE(t->raw_words_for(other, &completes), nullptr);
    EXPECT_FALSE(completes);
    EXPECT_NE(t->raw_words_for(f32(2, 7), &completes), nullptr);
    EXPECT_FALSE(completes);
    EXPECT_EQ(t->raw_words_for(f32(1, 5), &completes), nullptr);
    EXPECT_FALSE(completes);
    EXPECT_EQ(feed_stored(f32(2, 5), {1.0f, std::numeric_limits<float>::infinity()}),
              Verdict::kCompleted);
    // Complete: its words went into the result, unless a leaf waits for the root's exponent.
    for (uint16_t r = 0; r < 3; ++r) EXPECT_EQ(t->raw_words_for(f32(r, 7)) == nullptr, defer);
    const CopyView a = t->copy(1, false), b = plain->copy(1, false);
    EXPECT_EQ(a.exp, b.exp);
    EXPECT_EQ(a.nonfinite, b.nonfinite);
    EXPECT_TRUE(a.nonfinite);
    if (!defer) {
      EXPECT_EQ(0, std::memcmp(a.result, b.result, 8));
    }
    // The next round of the copy, finite, stored by the pass: the same bits as without it.
    for (uint16_t r = 0; r < 3; ++r) feed_stored(f32(r, 7), {0.5f * r, 1e-3f + r});
    const CopyView c = t->copy(1, false), d = plain->copy(1, false);
    EXPECT_TRUE(c.complete);
    EXPECT_FALSE(c.nonfinite);
    EXPECT_EQ(c.exp, d.exp);
    if (!defer) {
      EXPECT_EQ(0, std::memcmp(c.result, d.result, 8));
    }
    // Not float SUM DATA, or beyond the table: never a destination.
    wire::Header h = f32(0, 9);
    h.op = ReduceOp::kMax;
    EXPECT_EQ(t->raw_words_for(h), nullptr);
    EXPECT_EQ(t->raw_words_for(data_header(1, 0, 0, 1, false, 9, 2)), nullptr);  // int32
    h = f32(0, 9);
    h.flags = wire::kFlagPartial;
    EXPECT_EQ(t->raw_words_for(h), nullptr);
    h = f32(3, 9);
    EXPECT_EQ(t->raw_words_for(h), nullptr);  // rank beyond the world
    h = f32(0, 9);
    h.slot = 2;
    EXPECT_EQ(t->raw_words_for(h), nullptr);
    h = f32(0, 9);
    h.count = 17;
    EXPECT_EQ(t->raw_words_for(h), nullptr);  // beyond the block
  }
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
// Order independence and trees (wire v2)

// One rank's block of `n` elements of type t, as the bytes a worker sends.
std::vector<uint8_t> random_block(std::mt19937_64& rng, DType t, ReduceOp op, size_t n,
                                  bool allow_nonfinite) {
  std::vector<uint8_t> b(n * dtype_size(t));
  std::uniform_real_distribution<double> mag(-30, 30);
  for (size_t i = 0; i < n; ++i) {
    double x = std::exp2(mag(rng)) * ((rng() & 1) ? -1 : 1);
    if (rng() % 16 == 0) x = 0;
    if (allow_nonfinite && rng() % 400 == 0) x = op == ReduceOp::kSum ? NAN : INFINITY;
    switch (t) {
      case DType::kInt32: {
        const auto v = static_cast<int32_t>(rng());
        std::memcpy(&b[4 * i], &v, 4);
        break;
      }
      case DType::kFloat32: {
        const auto f = static_cast<float>(x);
        std::memcpy(&b[4 * i], &f, 4);
        break;
      }
      case DType::kFloat16: {
        const uint16_t h = float_to_half(static_cast<float>(x / 1e5));
        std::memcpy(&b[2 * i], &h, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t h = float_to_bf16(static_cast<float>(x));
        std::memcpy(&b[2 * i], &h, 2);
        break;
      }
      case DType::kFloat8E4M3: b[i] = double_to_e4m3(std::ldexp(x, -24)); break;
      case DType::kFloat8E5M2: b[i] = double_to_e5m2(std::ldexp(x, -16)); break;
    }
  }
  return b;
}

std::vector<uint8_t> packet(const wire::Header& h, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> b(wire::kHeaderSize + payload.size());
  wire::encode_header(h, b.data());
  if (!payload.empty()) std::memcpy(b.data() + wire::kHeaderSize, payload.data(), payload.size());
  return b;
}

Verdict feed_bytes(SlotTable& t, const std::vector<uint8_t>& bytes) {
  wire::PacketView pv;
  EXPECT_EQ(wire::decode(bytes, &pv), wire::DecodeError::kOk);
  return t.on_data(pv);
}

struct Outcome {
  std::vector<uint8_t> result;
  bool nonfinite = false;
  bool operator==(const Outcome&) const = default;
};

Outcome outcome_of(const CopyView& v) {
  Outcome o;
  o.result.assign(v.result, v.result + v.count * dtype_size(v.dtype));
  o.nonfinite = v.nonfinite;
  return o;
}

// The codec's reduction of the ranks' blocks, independently of the table.
Outcome reference(const std::vector<std::vector<uint8_t>>& ranks, DType t, ReduceOp op, size_t n) {
  const uint32_t world = static_cast<uint32_t>(ranks.size());
  Outcome o;
  o.result.resize(n * dtype_size(t));
  std::vector<int64_t> acc(n, 0);
  int16_t e = kNoExponent;
  for (const auto& r : ranks) {
    const codec::Scan s = codec::scan(r.data(), n, t, op);
    e = codec::max_exponent(e, s.exp);
    o.nonfinite = o.nonfinite || s.nonfinite;
  }
  const size_t es = dtype_size(t);
  if (t == DType::kInt32 && op == ReduceOp::kSum) {
    // The sum modulo 2^32 (two's complement).
    for (size_t i = 0; i < n; ++i) {
      uint32_t sum = 0;
      for (const auto& r : ranks) {
        uint32_t x;
        std::memcpy(&x, r.data() + i * 4, 4);
        sum += x;
      }
      std::memcpy(o.result.data() + i * 4, &sum, 4);
    }
  } else if (op != ReduceOp::kSum) {
    // The element of least (MIN) or greatest (MAX) value, -0 below +0, as it arrived (a NaN
    // anywhere makes the block non-finite below).
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* best = ranks[0].data() + i * es;
      for (const auto& r : ranks) {
        const uint8_t* x = r.data() + i * es;
        const double a = codec::widen(x, 0, t), b = codec::widen(best, 0, t);
        const bool below = a < b || (a == b && std::signbit(a) && !std::signbit(b));
        const bool above = a > b || (a == b && !std::signbit(a) && std::signbit(b));
        if (op == ReduceOp::kMin ? below : above) best = x;
      }
      std::memcpy(o.result.data() + i * es, best, es);
    }
  } else {
    for (const auto& r : ranks) codec::quantize_add(r.data(), n, t, e, world, acc.data());
    codec::dequantize(acc.data(), n, t, codec::scale_exponent(t, e, world), o.result.data());
  }
  if (o.nonfinite && t != DType::kInt32) codec::fill_nan(o.result.data(), n, t);
  return o;
}

struct OrderCase {
  DType t;
  ReduceOp op;
};

class OrderIndependence : public ::testing::TestWithParam<uint32_t> {};

TEST_P(OrderIndependence, SameBitsInEveryArrivalOrderWithLossAndDuplicates) {
  const uint32_t world = GetParam();
  std::mt19937_64 rng(0xC0FFEE + world);
  for (const DType t : {DType::kInt32, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::string(op_name(op)));
      const size_t block = 1024 / dtype_size(t);
      for (int round = 0; round < 3; ++round) {
        const size_t n = round == 0 ? block : 1 + rng() % block;
        std::vector<std::vector<uint8_t>> ranks;
        for (uint32_t r = 0; r < world; ++r)
          ranks.push_back(random_block(rng, t, op, n, round == 2));
        const Outcome want = reference(ranks, t, op, n);
        std::vector<uint8_t> first_bits;
        const int orders = world > 16 ? 4 : 12;
        for (int order = 0; order < orders; ++order) {
          SlotTableConfig cfg;
          cfg.world_size = world;
          cfg.num_slots = 2;
          auto table = std::move(SlotTable::create(cfg)).value();
          // The arrival sequence: every rank once, some lost (delivered later as a
          // retransmission), some duplicated.
          std::vector<std::pair<uint16_t, uint8_t>> arrivals;
          for (uint16_t r = 0; r < world; ++r) {
            if (rng() % 5 == 0) {
              arrivals.push_back({r, wire::kFlagRetransmit});  // the original was lost
            } else {
              arrivals.push_back({r, 0});
            }
            if (rng() % 4 == 0) arrivals.push_back({r, wire::kFlagRetransmit});  // a duplicate
          }
          std::shuffle(arrivals.begin(), arrivals.end(), rng);
          bool completed = false;
          for (const auto& [r, flags] : arrivals) {
            wire::Header h = data_header(1, 0, r, 1, true, 77, static_cast<uint16_t>(n));
            h.dtype = t;
            h.op = op;
            h.flags = flags;
            const Verdict v = feed_bytes(*table, packet(h, ranks[r]));
            if (v == Verdict::kCompleted) {
              EXPECT_FALSE(completed);
              completed = true;
            }
          }
          ASSERT_TRUE(completed);
          const CopyView c = table->copy(1, true);
          ASSERT_EQ(c.contributors, world);
          const Outcome got = outcome_of(c);
          EXPECT_TRUE(got == want) << "order " << order << " n " << n;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, OrderIndependence, ::testing::Values(1, 2, 3, 8, 64));

// A two-level tree of tables computes the flat table's bits: leaves complete locally (float SUM
// deferred), the root's exponent round takes the MAX of the leaves' exponents, the leaves quantize
// with it for the global world, the root adds their PARTIAL words and converts.
TEST(SlotTableTree, LeavesAndRootGiveTheFlatBits) {
  std::mt19937_64 rng(99);
  for (const uint32_t world : {2u, 3u, 8u, 64u}) {
    for (const DType t : {DType::kInt32, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
        SCOPED_TRACE(std::to_string(world) + " " + std::string(dtype_name(t)) + " " +
                     std::string(op_name(op)));
        const size_t n = 1 + rng() % (1024 / dtype_size(t));
        std::vector<std::vector<uint8_t>> ranks;
        for (uint32_t r = 0; r < world; ++r)
          ranks.push_back(random_block(rng, t, op, n, rng() % 4 == 0));
        const Outcome want = reference(ranks, t, op, n);
        const uint32_t leaves = world < 4 ? 2 : 4;
        std::vector<std::unique_ptr<SlotTable>> leaf(leaves);
        SlotTableConfig rc;
        rc.world_size = leaves;
        rc.num_slots = 1;
        auto root = std::move(SlotTable::create(rc)).value();
        auto base = [&](uint32_t i) { return static_cast<uint32_t>(uint64_t{i} * world / leaves); };
        std::vector<std::vector<uint8_t>> up(leaves);  // what each leaf sends the root first
        for (uint32_t i = 0; i < leaves; ++i) {
          SlotTableConfig lc;
          lc.world_size = base(i + 1) - base(i);
          lc.num_slots = 1;
          lc.defer_float_sum = true;
          lc.quant_world = world;
          leaf[i] = std::move(SlotTable::create(lc)).value();
          for (uint32_t r = base(i); r < base(i + 1); ++r) {
            wire::Header h = data_header(1, 0, static_cast<uint16_t>(r - base(i)), 0, false, 5,
                                         static_cast<uint16_t>(n));
            h.dtype = t;
            h.op = op;
            feed_bytes(*leaf[i], packet(h, ranks[r]));
          }
          const CopyView c = leaf[i]->copy(0, false);
          ASSERT_TRUE(c.complete);
          wire::Header h =
              data_header(1, 0, static_cast<uint16_t>(i), 0, false, 5, static_cast<uint16_t>(n));
          h.dtype = t;
          h.op = op;
          h.flags = c.nonfinite ? wire::kFlagNonFinite : 0;
          if (c.mode == CopyMode::kRaw) {
            h.flags |= wire::kFlagPartial;
            h.count = 0;
            h.exp = c.exp;
            up[i] = packet(h, {});
          } else {
            up[i] = packet(h, outcome_of(c).result);
          }
        }
        // The leaves' first packets reach the root in reverse order.
        Verdict last = Verdict::kAdded;
        for (uint32_t i = leaves; i-- > 0;) last = feed_bytes(*root, up[i]);
        if (codec::needs_exponent(t, op)) {
          ASSERT_EQ(last, Verdict::kExpCompleted);
          const CopyView answer = root->copy(0, false);
          for (uint32_t i = 0; i < leaves; ++i) {
            ASSERT_TRUE(
                leaf[i]->quantize_partial(0, false, 5, answer.answer_exp, answer.nonfinite));
            const CopyView c = leaf[i]->copy(0, false);
            wire::Header h =
                data_header(1, 0, static_cast<uint16_t>(i), 0, false, 5, static_cast<uint16_t>(n));
            h.dtype = t;
            h.op = op;
            h.flags = wire::kFlagPartial;
            const int scale = codec::scale_exponent(t, answer.answer_exp, world);
            h.exp = scale == codec::kNoScale ? kNoExponent : static_cast<int16_t>(scale);
            std::vector<uint8_t> words(c.partial, c.partial + n * wire::acc_bytes(t));
            last = feed_bytes(*root, packet(h, words));
            // A leaf that lost the answer asks again and gets it.
            wire::Header again = h;
            again.count = 0;
            again.exp = c.exp;
            again.flags = wire::kFlagPartial | wire::kFlagRetransmit;
            EXPECT_EQ(feed_bytes(*root, packet(again, {})), Verdict::kResendExp);
          }
        }
        ASSERT_EQ(last, Verdict::kCompleted);
        EXPECT_TRUE(outcome_of(root->copy(0, false)) == want);
      }
    }
  }
}

// A float MIN/MAX round keeps int32 keys from its first contribution's: a copy's next round
// does not see the previous round's keys, whatever the ops.
TEST(SlotTableTest, FloatMinMaxStartsFromTheFirstContribution) {
  auto t = make_table(2);
  auto bits = [](std::vector<float> v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  auto round = [&](BlockSeq seq, ReduceOp op, std::vector<float> a, std::vector<float> b) {
    for (uint16_t r = 0; r < 2; ++r) {
      wire::Header h = data_header(1, 0, r, 0, false, seq, static_cast<uint16_t>(a.size()));
      h.dtype = DType::kFloat32;
      h.op = op;
      feed_bytes(*t, packet(h, bits(r == 0 ? a : b)));
    }
    const CopyView c = t->copy(0, false);
    EXPECT_TRUE(c.complete);
    std::vector<float> out(c.count);
    std::memcpy(out.data(), c.result, out.size() * 4);
    return out;
  };
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round(1, ReduceOp::kMax, {inf, 1, -0.0f}, {2, -inf, 0.0f}),
            (std::vector<float>{inf, 1, 0.0f}));
  EXPECT_EQ(round(3, ReduceOp::kMin, {5, 6, 7}, {8, 9, 10}), (std::vector<float>{5, 6, 7}));
  EXPECT_EQ(round(5, ReduceOp::kMax, {-5, -6, -7}, {-8, -9, -10}),
            (std::vector<float>{-5, -6, -7}));
  const std::vector<float> z = round(7, ReduceOp::kMin, {0.0f, -0.0f, -inf}, {0.0f, 0.0f, 1});
  EXPECT_TRUE(std::signbit(z[1]) && !std::signbit(z[0]) && z[2] == -inf);
}

// A root reads a leaf's PARTIAL words at the width and number of its round (int32 words for the
// 16-bit types, added in int32): words of another type or count are a broken leaf's, refused
// without being read.
TEST(SlotTableTree, RootRefusesWordsOfAnotherWidthOrCount) {
  SlotTableConfig rc;
  rc.world_size = 2;
  rc.num_slots = 1;
  auto root = std::move(SlotTable::create(rc)).value();
  auto partial = [&](uint16_t leaf, DType t, uint16_t count, int16_t exp,
                     const std::vector<uint8_t>& words) {
    wire::Header h = data_header(1, 0, leaf, 0, false, 3, count);
    h.dtype = t;
    h.flags = wire::kFlagPartial;
    h.exp = exp;
    return feed_bytes(*root, packet(h, words));
  };
  EXPECT_EQ(partial(0, DType::kBFloat16, 0, 4, {}), Verdict::kAdded);
  EXPECT_EQ(partial(1, DType::kBFloat16, 0, 2, {}), Verdict::kExpCompleted);
  // Leaf 0's words: 1 and -2 units of 2^-25 (the scale the packets carry).
  const std::vector<uint8_t> w0 = {1, 0, 0, 0, 0xFE, 0xFF, 0xFF, 0xFF};
  // The first words of another type than the exponent round's: refused, nothing changed.
  EXPECT_EQ(partial(0, DType::kFloat32, 2, -25, std::vector<uint8_t>(16, 0xFF)),
            Verdict::kMismatch);
  EXPECT_EQ(partial(0, DType::kBFloat16, 2, -25, w0), Verdict::kAdded);
  // Leaf 1's words of another width or count, or at another scale.
  EXPECT_EQ(partial(1, DType::kFloat32, 2, -25, std::vector<uint8_t>(16, 0)), Verdict::kMismatch);
  EXPECT_EQ(partial(1, DType::kBFloat16, 1, -25, {3, 0, 0, 0}), Verdict::kMismatch);
  EXPECT_EQ(partial(1, DType::kBFloat16, 2, -24, w0), Verdict::kMismatch);
  // Its right words complete the round: (1 + 3) * 2^-25 and (-2 - 4) * 2^-25.
  const std::vector<uint8_t> w1 = {3, 0, 0, 0, 0xFC, 0xFF, 0xFF, 0xFF};
  ASSERT_EQ(partial(1, DType::kBFloat16, 2, -25, w1), Verdict::kCompleted);
  const CopyView c = root->copy(0, false);
  ASSERT_EQ(c.count, 2);
  uint16_t got[2];
  std::memcpy(got, c.result, 4);
  EXPECT_EQ(got[0], float_to_bf16(std::ldexp(4.0f, -25)));
  EXPECT_EQ(got[1], float_to_bf16(std::ldexp(-6.0f, -25)));
}

}  // namespace
}  // namespace ina::agg
