// Engine multi-tenancy: several jobs at once, each in its own slot range of the aggregator's
// memory, the per-job key checked on every packet, jobs added and removed while others run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "aggregator/engine.h"
#include "test_packets.h"

namespace ina::agg {
namespace {

using testing::data_header;
using testing::encode_packet;

struct Tenant {
  JobId job;
  uint64_t key;
  uint32_t world;
  uint32_t slots;
  uint32_t base;
};

JobConfig config_of(const Tenant& t) {
  JobConfig c;
  c.job = t.job;
  c.key = t.key;
  c.slots.world_size = t.world;
  c.slots.num_slots = t.slots;
  c.slots.max_payload_bytes = static_cast<uint32_t>(16) * 4;
  c.slot_base = t.base;
  return c;
}

class MultiTenancyTest : public ::testing::Test {
 protected:
  Reply send(const std::vector<uint8_t>& b) {
    int32_t rank;
    JobId job;
    return engine_.on_packet(b, &rank, &job);
  }
  void join(const Tenant& t) {
    Reply last;
    for (uint16_t r = 0; r < t.world; ++r) {
      wire::Header h = testing::hello_header(t.job, t.key, r, 77 + r);
      last = send(encode_packet(h, std::vector<int32_t>{static_cast<int32_t>(t.world)}));
    }
    ASSERT_EQ(last.target, Reply::Target::kAllRanks);
    ASSERT_TRUE(engine_.job_ready(t.job));
  }
  // The workers seal with the incarnation key of the WELCOME's epoch (WIRE.md).
  testing::ScopedEpochOf epochs_{[this](JobId job, uint8_t) { return engine_.epoch(job); }};
  Engine engine_;
};

// Two jobs with the same slot numbers (relative to their ranges), interleaved packet by packet
// in a random order: every result is the exact sum of its own job's contributions.
TEST_F(MultiTenancyTest, TwoJobsAtOnceExactAndIsolated) {
  engine_.set_slot_capacity(64);
  const Tenant a{11, 0x1111'2222'3333'4444ull, 4, 8, 0};
  const Tenant b{12, 0x5555'6666'7777'8888ull, 3, 8, 8};
  ASSERT_TRUE(engine_.add_job(config_of(a)).ok());
  ASSERT_TRUE(engine_.add_job(config_of(b)).ok());
  join(a);
  join(b);

  struct Pkt {
    std::vector<uint8_t> bytes;
    JobId job;
  };
  std::vector<Pkt> pkts;
  constexpr BlockSeq kRounds = 8;  // one round per slot
  for (const Tenant& t : {a, b}) {
    for (BlockSeq seq = 1; seq <= kRounds; ++seq) {
      for (uint16_t r = 0; r < t.world; ++r) {
        std::vector<int32_t> v(16);
        // Distinct per job, rank, round and element, so any cross-talk shows in the sum.
        for (int i = 0; i < 16; ++i)
          v[i] = static_cast<int32_t>(t.job * 100000 + r * 1000 + seq * 17 + i);
        pkts.push_back(
            {encode_packet(
                 data_header(t.job, t.key, r, static_cast<uint16_t>(seq - 1), false, seq, 16), v),
             t.job});
      }
    }
  }
  std::mt19937 rng(5);
  std::shuffle(pkts.begin(), pkts.end(), rng);
  std::map<JobId, int> completions;
  for (const Pkt& p : pkts) {
    const Reply r = send(p.bytes);
    if (r.target == Reply::Target::kNone) continue;
    ASSERT_EQ(r.target, Reply::Target::kAllRanks);
    ASSERT_EQ(r.hdr.job, p.job);
    const Tenant& t = p.job == a.job ? a : b;
    const BlockSeq seq = r.hdr.seq;
    for (int i = 0; i < 16; ++i) {
      int64_t want = 0;
      for (uint32_t rk = 0; rk < t.world; ++rk) want += t.job * 100000 + rk * 1000 + seq * 17 + i;
      EXPECT_EQ(reinterpret_cast<const int32_t*>(r.payload)[i], static_cast<int32_t>(want))
          << "job " << p.job << " seq " << seq;
    }
    ++completions[p.job];
  }
  EXPECT_EQ(completions[a.job], static_cast<int>(kRounds));
  EXPECT_EQ(completions[b.job], static_cast<int>(kRounds));
  EXPECT_EQ(engine_.job_counters(a.job)->completed, kRounds);
  EXPECT_EQ(engine_.job_counters(b.job)->completed, kRounds);
  EXPECT_EQ(engine_.counters().bad_tag, 0u);
}

// A spoofed packet (right job, rank, slot and seq; sealed with a wrong key: another tenant's,
// zero, one bit off) is dropped as a bad tag, counted against the job it names, and changes
// nothing: not the sum, not the contributor bitmap, not the barrier.
TEST_F(MultiTenancyTest, SpoofedKeyChangesNothing) {
  engine_.set_slot_capacity(16);
  const Tenant a{21, 0xABCDEFull, 2, 4, 0};
  const Tenant b{22, 0x123456ull, 2, 4, 4};
  ASSERT_TRUE(engine_.add_job(config_of(a)).ok());
  ASSERT_TRUE(engine_.add_job(config_of(b)).ok());
  join(a);
  join(b);
  EXPECT_EQ(send(encode_packet(data_header(a.job, a.key, 0, 0, false, 1, 2), {5, 6})).target,
            Reply::Target::kNone);
  // Spoofs: a's job with b's key, with key 0, one bit off, a retransmission, and a HELLO with a
  // new nonce that would have restarted a's barrier.
  for (uint64_t bad : {b.key, uint64_t{0}, a.key ^ 1}) {
    EXPECT_EQ(send(encode_packet(data_header(a.job, bad, 1, 0, false, 1, 2), {999, 999})).target,
              Reply::Target::kNone);
  }
  auto re = data_header(a.job, b.key, 1, 0, false, 1, 2);
  re.flags = wire::kFlagRetransmit;
  EXPECT_EQ(send(encode_packet(re, {999, 999})).target, Reply::Target::kNone);
  wire::Header hello = testing::hello_header(a.job, 42, 1, 4242);
  EXPECT_EQ(send(encode_packet(hello, std::vector<int32_t>{2})).target, Reply::Target::kNone);
  EXPECT_TRUE(engine_.job_ready(a.job));
  EXPECT_EQ(engine_.job_counters(a.job)->bad_tag, 5u);
  EXPECT_EQ(engine_.job_counters(b.job)->bad_tag, 0u);
  EXPECT_EQ(engine_.counters().bad_tag, 5u);
  const CopyView c = engine_.slot_table(a.job)->copy(0, false);
  EXPECT_EQ(c.contributors, 1u);
  EXPECT_FALSE(c.complete);  // (v2 keeps the sum out of the result until complete)
  // The real rank 1 completes the round with the exact sum.
  const Reply r = send(encode_packet(data_header(a.job, a.key, 1, 0, false, 1, 2), {1, 2}));
  ASSERT_EQ(r.target, Reply::Target::kAllRanks);
  EXPECT_EQ(reinterpret_cast<const int32_t*>(r.payload)[0], 6);
  EXPECT_EQ(reinterpret_cast<const int32_t*>(r.payload)[1], 8);
  // b's state is untouched.
  EXPECT_FALSE(engine_.slot_table(b.job)->copy(0, false).used);
}

// Slot ranges: inside the capacity, never overlapping; a slot beyond the job's own range is
// dropped (a job cannot reach its neighbour's memory).
TEST_F(MultiTenancyTest, SlotRangesAreConfined) {
  engine_.set_slot_capacity(16);
  ASSERT_TRUE(engine_.add_job(config_of({1, 1, 2, 8, 0})).ok());
  Status st = engine_.add_job(config_of({2, 2, 2, 8, 4}));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("overlaps job 1"), std::string::npos) << st.message();
  st = engine_.add_job(config_of({2, 2, 2, 9, 8}));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("capacity of 16"), std::string::npos) << st.message();
  ASSERT_TRUE(engine_.add_job(config_of({2, 2, 2, 8, 8})).ok());
  EXPECT_EQ(engine_.jobs().size(), 2u);

  join({1, 1, 2, 8, 0});
  const uint64_t malformed = engine_.counters().malformed;
  // Slot 8 is job 2's first slot in aggregator memory, but relative to job 1 it is out of range.
  EXPECT_EQ(send(encode_packet(data_header(1, 1, 0, 8, false, 1, 1), {1})).target,
            Reply::Target::kNone);
  EXPECT_EQ(engine_.counters().malformed, malformed + 1);
  EXPECT_FALSE(engine_.slot_table(2)->copy(0, false).used);
}

// Removing a job frees its range and leaves a running job undisturbed mid-round.
TEST_F(MultiTenancyTest, AddAndRemoveAtRunTimeDoNotDisturbOthers) {
  engine_.set_slot_capacity(8);
  const Tenant a{1, 10, 2, 4, 0};
  ASSERT_TRUE(engine_.add_job(config_of(a)).ok());
  join(a);
  send(encode_packet(data_header(a.job, a.key, 0, 0, false, 1, 1), {40}));
  const Tenant b{2, 20, 2, 4, 4};
  ASSERT_TRUE(engine_.add_job(config_of(b)).ok());
  join(b);
  EXPECT_EQ(engine_.remove_job(b.job).code(), StatusCode::kOk);
  EXPECT_EQ(engine_.remove_job(b.job).code(), StatusCode::kNotFound);
  const uint64_t unknown = engine_.counters().unknown_job;
  send(encode_packet(data_header(b.job, b.key, 0, 0, false, 1, 1), {1}));
  EXPECT_EQ(engine_.counters().unknown_job, unknown + 1);
  // The freed range can be given to a new job, with the same id even.
  ASSERT_TRUE(engine_.add_job(config_of({2, 21, 3, 4, 4})).ok());
  EXPECT_EQ(engine_.world_size(2), 3u);
  EXPECT_FALSE(engine_.job_ready(2));
  // a finishes its round with the exact sum.
  const Reply r = send(encode_packet(data_header(a.job, a.key, 1, 0, false, 1, 1), {2}));
  ASSERT_EQ(r.target, Reply::Target::kAllRanks);
  EXPECT_EQ(r.payload[0], 42);
}

}  // namespace
}  // namespace ina::agg
