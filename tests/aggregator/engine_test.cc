// Engine: decode, job/key checks, join barrier, slot table verdicts and the replies they produce.
//
// Length: one suite over one subject; its cases share the helpers above them and each one is
// independent (run one with --gtest_filter).
#include "aggregator/engine.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "alloc_counter.h"
#include "test_packets.h"

namespace ina::agg {
namespace {

using testing::data_header;
using testing::encode_packet;
using testing::ranks_in_bitmap;

constexpr JobId kJob = 7;
constexpr uint64_t kKey = 0xA5A5'0000'1234'BEEFull;

// A reply with its payload copied out (the engine's pointer dies at the next packet).
struct Sent {
  Reply::Target target = Reply::Target::kNone;
  wire::Header hdr;
  std::vector<int32_t> payload;
  int32_t sender_rank = -2;
  JobId sender_job = 0;
  Key128 key;  // what the backend seals it with
};

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override { add(kJob, kKey, 3); }

  // The workers seal with the incarnation key of the WELCOME's epoch (WIRE.md).
  void epoch_of_engine() {
    testing::epoch_of() = [this](JobId job, uint8_t) { return engine_.epoch(job); };
  }
  testing::ScopedEpochOf epochs_{[this](JobId job, uint8_t) { return engine_.epoch(job); }};

  void add(JobId job, uint64_t key, uint32_t world, uint32_t slots = 4, uint16_t elems = 8) {
    JobConfig cfg;
    cfg.job = job;
    cfg.key = key;
    cfg.slots.world_size = world;
    cfg.slots.num_slots = slots;
    cfg.slots.max_payload_bytes = uint32_t{elems} * 4;
    ASSERT_TRUE(engine_.add_job(cfg).ok());
  }

  Sent send_bytes(const std::vector<uint8_t>& bytes) {
    Sent s;
    const Reply r = engine_.on_packet(bytes, &s.sender_rank, &s.sender_job);
    s.target = r.target;
    s.hdr = r.hdr;
    s.key = r.key;
    if (r.target != Reply::Target::kNone && r.hdr.count > 0) {
      EXPECT_NE(r.payload, nullptr);
      std::vector<uint8_t> b(r.packet_size());
      wire::encode_header(r.hdr, b.data());
      std::memcpy(b.data() + wire::kHeaderSize, r.payload, r.payload_bytes());
      wire::PacketView pv;
      EXPECT_EQ(wire::decode(b, &pv), wire::DecodeError::kOk);
      s.payload = testing::payload_words(pv);
    }
    return s;
  }

  // `limit`: the rank's largest block in bytes, the HELLO's second word (0: a one-word HELLO).
  Sent hello(uint16_t rank, BlockSeq nonce, bool retransmit = false, uint32_t world = 3,
             JobId job = kJob, uint64_t key = kKey, uint32_t limit = 0) {
    wire::Header h;
    h.tag = key;  // the key encode_packet() seals with (test_packets.h)
    h.job = job;
    h.rank = rank;
    h.seq = nonce;
    h.flags = static_cast<uint8_t>(wire::kFlagHello | (retransmit ? wire::kFlagRetransmit : 0));
    std::vector<int32_t> words{static_cast<int32_t>(world)};
    if (limit != 0) words.push_back(static_cast<int32_t>(limit));
    return send_bytes(encode_packet(h, words));
  }

  // HELLO from every rank of the default job; returns the reply to the last one.
  Sent join_all(uint32_t world = 3, JobId job = kJob, uint64_t key = kKey) {
    Sent last;
    for (uint16_t r = 0; r < world; ++r) last = hello(r, 1000 + r, false, world, job, key);
    return last;
  }

  // A worker's DATA (or, with kFlagError, its abort) as it goes on the wire.
  std::vector<uint8_t> packet(uint16_t rank, uint16_t slot, bool shadow, BlockSeq seq,
                              const std::vector<int32_t>& v, uint8_t flags = 0, JobId job = kJob,
                              uint64_t key = kKey) {
    wire::Header h = data_header(job, key, rank, slot, shadow, seq, 0);
    h.flags = flags;
    return encode_packet(h, v);
  }

  Sent data(uint16_t rank, uint16_t slot, bool shadow, BlockSeq seq, std::vector<int32_t> v,
            uint8_t flags = 0, JobId job = kJob, uint64_t key = kKey) {
    return send_bytes(packet(rank, slot, shadow, seq, v, flags, job, key));
  }

  Engine engine_;
};

void expect_error(const Sent& s, wire::ErrorReason reason) {
  EXPECT_EQ(s.target, Reply::Target::kSender);
  EXPECT_EQ(s.hdr.flags, wire::kFlagError);
  ASSERT_GE(s.payload.size(), 1u);
  EXPECT_EQ(s.payload[0], static_cast<int32_t>(reason));
}

std::vector<uint32_t> error_bitmap(const Sent& s) {
  return ranks_in_bitmap(s.payload.data() + 1, s.payload.size() - 1);
}

TEST_F(EngineTest, AddJobValidates) {
  JobConfig dup;
  dup.job = kJob;
  EXPECT_EQ(engine_.add_job(dup).code(), StatusCode::kAlreadyExists);
  JobConfig bad;
  bad.job = 9;
  bad.slots.world_size = 0;
  const Status st = engine_.add_job(bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("world_size"), std::string::npos);
  EXPECT_EQ(engine_.world_size(9), 0u);
  EXPECT_EQ(engine_.world_size(kJob), 3u);
  EXPECT_TRUE(engine_.rank_counters(9).empty());
  EXPECT_EQ(engine_.slot_table(9), nullptr);
  EXPECT_NE(engine_.slot_table(kJob), nullptr);
}

TEST_F(EngineTest, WelcomeOnlyAfterEveryRankJoined) {
  Sent s = hello(0, 11);
  EXPECT_EQ(s.target, Reply::Target::kNone);
  EXPECT_EQ(s.sender_rank, 0);
  EXPECT_EQ(s.sender_job, kJob);
  EXPECT_FALSE(engine_.job_ready(kJob));
  s = hello(2, 33);
  EXPECT_EQ(s.target, Reply::Target::kNone);
  // A retransmitted HELLO to the open barrier learns who is missing.
  s = hello(0, 11, /*retransmit=*/true);
  expect_error(s, wire::ErrorReason::kMissingRanks);
  EXPECT_EQ(s.hdr.count, 2);  // reason + ceil(3/32) words
  EXPECT_EQ(error_bitmap(s), (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(s.hdr.job, kJob);

  EXPECT_EQ(engine_.epoch(kJob), 0u);
  s = hello(1, 22);
  EXPECT_TRUE(engine_.job_ready(kJob));
  // The incarnation's epoch: a function of the barrier's nonces (and the salt, 0 here).
  const uint64_t epoch = engine_.epoch(kJob);
  const BlockSeq nonces[3] = {11, 22, 33};
  EXPECT_EQ(epoch, wire::incarnation_epoch(Key128{kKey}, 0, nonces));
  const std::vector<int32_t> welcome = {4, 32, static_cast<int32_t>(epoch),
                                        static_cast<int32_t>(epoch >> 32)};
  // To every rank: the barrier's notice, seq 0, which no worker adopts (it asks again).
  EXPECT_EQ(s.target, Reply::Target::kAllRanks);
  EXPECT_EQ(s.hdr.flags, wire::kFlagHello | wire::kFlagResult);
  EXPECT_EQ(s.hdr.job, kJob);
  EXPECT_EQ(s.hdr.seq, 0u);
  EXPECT_EQ(s.payload, welcome);   // num_slots, max_payload_bytes, epoch
  EXPECT_EQ(s.key, Key128{kKey});  // WELCOME: sealed with the job's key

  // The WELCOME to rank 2 was lost: its retransmitted HELLO gets one, to it alone, naming its
  // HELLO's nonce (the one a worker adopts).
  s = hello(2, 33, /*retransmit=*/true);
  EXPECT_EQ(s.target, Reply::Target::kSender);
  EXPECT_EQ(s.hdr.flags, wire::kFlagHello | wire::kFlagResult);
  EXPECT_EQ(s.hdr.seq, 33u);
  EXPECT_EQ(s.payload, welcome);
  EXPECT_EQ(s.key, Key128{kKey});
  EXPECT_TRUE(engine_.job_ready(kJob));
  EXPECT_EQ(engine_.counters().hellos, 5u);
  EXPECT_EQ(engine_.rank_counters(kJob)[0].packets, 2u);
  EXPECT_EQ(engine_.rank_counters(kJob)[0].retransmits, 1u);
  EXPECT_EQ(engine_.counters().replies_out, 1u + 3u + 1u);

  // After the WELCOME, DATA and its replies carry the incarnation's key; the job's key alone
  // (a worker that ignored the epoch) no longer verifies.
  const Key128 traffic = wire::incarnation_key(Key128{kKey}, epoch);
  EXPECT_NE(traffic, Key128{kKey});
  data(0, 0, false, 1, {1});
  s = data(0, 0, false, 1, {1}, wire::kFlagRetransmit);
  expect_error(s, wire::ErrorReason::kMissingRanks);
  EXPECT_EQ(s.key, traffic);
  testing::epoch_of() = nullptr;
  const uint64_t bad_tag = engine_.counters().bad_tag;
  EXPECT_EQ(data(1, 0, false, 1, {1}).target, Reply::Target::kNone);
  EXPECT_EQ(engine_.counters().bad_tag, bad_tag + 1);
  epoch_of_engine();
}

// A copy counted elsewhere (the DPDK backend's HELLO copies to every lcore) joins the barrier and
// gets the same replies, but moves none of on_packet's counters.
TEST_F(EngineTest, CopyCountedElsewhereJoinsWithoutCounting) {
  auto hello_copy = [&](uint16_t rank, BlockSeq nonce) {
    wire::Header h = testing::hello_header(kJob, kKey, rank, nonce);
    const std::vector<uint8_t> b = encode_packet(h, std::vector<int32_t>{3});
    int32_t sender = -2;
    JobId job = 0;
    return std::make_pair(engine_.on_packet(b, 0, &sender, &job, /*counted_elsewhere=*/true),
                          sender);
  };
  hello(0, 11);
  EXPECT_EQ(hello_copy(1, 22).second, 1);  // the backend still learns the rank's address
  const auto [r, sender] = hello_copy(2, 33);
  EXPECT_EQ(sender, 2);
  EXPECT_EQ(r.target, Reply::Target::kAllRanks);  // the barrier completed
  EXPECT_TRUE(engine_.job_ready(kJob));
  EXPECT_EQ(engine_.counters().packets_in, 1u);
  EXPECT_EQ(engine_.counters().hellos, 1u);
  EXPECT_EQ(engine_.rank_counters(kJob)[1].packets, 0u);
  EXPECT_EQ(engine_.rank_counters(kJob)[0].packets, 1u);
  // A malformed copy (world mismatch) is answered but not counted either.
  wire::Header h;
  h.tag = kKey;  // the key encode_packet() seals with
  h.job = kJob;
  h.rank = 0;
  h.flags = wire::kFlagHello;
  int32_t sender2 = -2;
  JobId job2 = 0;
  const Reply e =
      engine_.on_packet(encode_packet(h, std::vector<int32_t>{5}), 0, &sender2, &job2, true);
  EXPECT_EQ(e.target, Reply::Target::kSender);
  EXPECT_EQ(engine_.counters().world_size_mismatch, 0u);
  EXPECT_EQ(engine_.counters().packets_in, 1u);
}

TEST_F(EngineTest, DuplicateHelloBeforeBarrierIsSilent) {
  hello(0, 5);
  EXPECT_EQ(hello(0, 5).target, Reply::Target::kNone);
  EXPECT_FALSE(engine_.job_ready(kJob));
  hello(1, 6);
  EXPECT_EQ(hello(2, 7).target, Reply::Target::kAllRanks);
}

TEST_F(EngineTest, NewIncarnationRestartsBarrierAndResetsSlots) {
  join_all();
  data(0, 0, false, 1, {5});
  ASSERT_TRUE(engine_.slot_table(kJob)->copy(0, false).used);

  // Rank 1 restarted (new nonce, the job's tag): its new incarnation waits for the next barrier;
  // the running ranks are not disturbed (the job stays ready, the half-finished round stays).
  EXPECT_EQ(hello(1, 1777).target, Reply::Target::kNone);
  EXPECT_TRUE(engine_.job_ready(kJob));
  EXPECT_TRUE(engine_.slot_table(kJob)->copy(0, false).used);
  Sent s = hello(1, 1777, /*retransmit=*/true);  // names the ranks the next barrier lacks
  expect_error(s, wire::ErrorReason::kMissingRanks);
  EXPECT_EQ(error_bitmap(s), (std::vector<uint32_t>{1}));
  EXPECT_EQ(s.sender_rank, 1);  // its (new) address is learned
  // A running rank's HELLO of its current incarnation is only a lost WELCOME.
  EXPECT_EQ(hello(0, 1000, /*retransmit=*/true).target, Reply::Target::kSender);
  EXPECT_TRUE(engine_.job_ready(kJob));

  // The whole job restarted: once every rank has a new incarnation, its barrier completes.
  EXPECT_EQ(hello(0, 2000).target, Reply::Target::kNone);
  s = hello(2, 2002);
  EXPECT_EQ(s.target, Reply::Target::kAllRanks);
  EXPECT_EQ(s.hdr.flags, wire::kFlagHello | wire::kFlagResult);
  EXPECT_TRUE(engine_.job_ready(kJob));
  // The half-finished round of the old incarnation is gone.
  EXPECT_FALSE(engine_.slot_table(kJob)->copy(0, false).used);
  // The new incarnation's sums start from scratch.
  data(0, 0, false, 1, {1});
  data(1, 0, false, 1, {2});
  s = data(2, 0, false, 1, {3});
  EXPECT_EQ(s.target, Reply::Target::kAllRanks);
  EXPECT_EQ(s.payload, (std::vector<int32_t>{6}));
  // Its nonces are the current ones: a HELLO with one is a lost WELCOME.
  EXPECT_EQ(hello(1, 1777).target, Reply::Target::kSender);
}

// Each rank's HELLO may name the largest block it can carry (its path's datagram): the barrier's
// WELCOME offers the smallest of them and the job's, a multiple of 4 bytes, so that every rank
// cuts its buffers into the same blocks. A one-word HELLO names none. Each incarnation's barrier
// computes it again from its own HELLOs.
TEST_F(EngineTest, WelcomeOffersTheSmallestBlockAnyRankNamed) {
  const uint64_t malformed = engine_.counters().malformed;
  // A limit below one 4-byte word, or a third word: malformed, dropped, nothing joins.
  EXPECT_EQ(hello(0, 1000, false, 3, kJob, kKey, 3).target, Reply::Target::kNone);
  {
    wire::Header h = testing::hello_header(kJob, kKey, 0, 1000);
    h.count = 3;
    send_bytes(encode_packet(h, std::vector<int32_t>{3, 16, 16}));
  }
  EXPECT_EQ(engine_.counters().malformed, malformed + 2);
  hello(1, 1001);  // names none
  Sent s = hello(1, 1001, /*retransmit=*/true);
  expect_error(s, wire::ErrorReason::kMissingRanks);
  EXPECT_EQ(error_bitmap(s), (std::vector<uint32_t>{1}));  // rank 0's HELLOs did not join

  hello(0, 1000, false, 3, kJob, kKey, 26);  // 24 usable: a multiple of 4
  s = hello(2, 1002, false, 3, kJob, kKey, 64);
  ASSERT_EQ(s.target, Reply::Target::kAllRanks);
  ASSERT_EQ(s.payload.size(), wire::kWelcomeWords);
  EXPECT_EQ(s.payload[1], 24);              // min(job's 32, 24, 64)
  s = hello(1, 1001, /*retransmit=*/true);  // a lost WELCOME: the same block
  ASSERT_EQ(s.target, Reply::Target::kSender);
  EXPECT_EQ(s.payload[1], 24);

  // The job restarted with larger limits everywhere: the job's own block is the smallest.
  hello(0, 2000, false, 3, kJob, kKey, 4096);
  hello(1, 2001, false, 3, kJob, kKey, 4096);
  s = hello(2, 2002, false, 3, kJob, kKey, 4096);
  ASSERT_EQ(s.target, Reply::Target::kAllRanks);
  EXPECT_EQ(s.payload[1], 32);
}

TEST_F(EngineTest, NewIncarnationBeforeTheBarrierCompletesRestartsIt) {
  hello(0, 1000);
  hello(1, 1001);
  // Rank 1 restarted before the barrier completed: everyone joins again.
  EXPECT_EQ(hello(1, 1777).target, Reply::Target::kNone);
  Sent s = hello(0, 1000, /*retransmit=*/true);
  expect_error(s, wire::ErrorReason::kMissingRanks);
  EXPECT_EQ(error_bitmap(s), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(hello(2, 1002).target, Reply::Target::kAllRanks);
  EXPECT_TRUE(engine_.job_ready(kJob));
}

TEST_F(EngineTest, WorldSizeMismatchIsReported) {
  Sent s = hello(0, 1, false, /*world=*/5);
  expect_error(s, wire::ErrorReason::kWorldSizeMismatch);
  EXPECT_EQ(s.payload, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(s.sender_rank, -1);  // not a member: its address is not learned
  // Even from a rank beyond our world (a worker configured for a larger one).
  s = hello(4, 1, false, /*world=*/5);
  expect_error(s, wire::ErrorReason::kWorldSizeMismatch);
  EXPECT_EQ(engine_.counters().world_size_mismatch, 2u);
  EXPECT_EQ(engine_.rank_counters(kJob)[0].packets, 0u);
  // It did not join.
  hello(1, 2);
  hello(2, 3);
  EXPECT_FALSE(engine_.job_ready(kJob));
}

// A HELLO older than its rank's newest incarnation is a replay (nonces only grow): it changes
// neither the running job nor an open barrier, nor where the rank's results go.
TEST_F(EngineTest, ReplayedOldHelloChangesNothing) {
  // An open barrier: the replay does not start it over.
  hello(0, 1000);
  Sent s = hello(1, 1001);
  EXPECT_EQ(s.sender_rank, 1);
  s = hello(1, 900);
  EXPECT_EQ(s.target, Reply::Target::kNone);
  EXPECT_EQ(s.sender_rank, -1);
  EXPECT_EQ(engine_.counters().stale_hellos, 1u);
  EXPECT_EQ(hello(1, 900, /*retransmit=*/true).target, Reply::Target::kNone);
  EXPECT_EQ(hello(2, 1002).target, Reply::Target::kAllRanks);  // completes: nothing was reset
  ASSERT_TRUE(engine_.job_ready(kJob));

  // A running job: the replay joins no next barrier.
  data(0, 0, false, 1, {5});
  s = hello(2, 1001);
  EXPECT_EQ(s.target, Reply::Target::kNone);
  EXPECT_EQ(s.sender_rank, -1);
  EXPECT_EQ(engine_.counters().stale_hellos, 3u);
  EXPECT_TRUE(engine_.job_ready(kJob));
  EXPECT_TRUE(engine_.slot_table(kJob)->copy(0, false).used);
  // Rank 2's newer incarnation waits for the next barrier; a replay of an incarnation older than
  // that one, but newer than the running one, is dropped as well.
  hello(2, 1500);
  EXPECT_EQ(hello(2, 1400).target, Reply::Target::kNone);
  EXPECT_EQ(engine_.counters().stale_hellos, 4u);
  // The running incarnation's own HELLO is still a lost WELCOME.
  EXPECT_EQ(hello(2, 1002, /*retransmit=*/true).target, Reply::Target::kSender);

  // After a restart opened the barrier again, the replayed old incarnation stays out.
  hello(0, 2000);
  hello(1, 2001);
  EXPECT_EQ(hello(1, 1001).target, Reply::Target::kNone);
  EXPECT_EQ(engine_.counters().stale_hellos, 5u);
}

// Where a rank's results go is learned only from packets that moved its job on; a replayed DATA
// (a duplicate, a completed round's) is answered to its sender and redirects nothing.
TEST_F(EngineTest, ReplayedDataRedirectsNothing) {
  join_all();
  Sent s = data(0, 0, false, 1, {1});
  EXPECT_EQ(s.sender_rank, 0);
  s = data(0, 0, false, 1, {1});  // duplicate of an incomplete round
  EXPECT_EQ(s.sender_rank, -1);
  data(1, 0, false, 1, {2});
  s = data(2, 0, false, 1, {3});
  EXPECT_EQ(s.target, Reply::Target::kAllRanks);
  EXPECT_EQ(s.sender_rank, 2);
  s = data(0, 0, false, 1, {1}, wire::kFlagRetransmit);  // the completed round, again
  EXPECT_EQ(s.target, Reply::Target::kSender);
  EXPECT_EQ(s.sender_rank, -1);
}

// A rank gives up on a round at its deadline (ERROR kAborted, WIRE.md): an incomplete round is
// marked aborted and a late rank's DATA for it is answered with the same words instead of
// completing it; a complete round stays answerable; the abort names its sender only; a newer
// round on the copy starts afresh; a round aborted before any DATA of it arrived never completes.
// A worker's liveness probe (WIRE.md): an empty datagram is counted as a packet, not as malformed,
// and answered by nothing (the ICMP of a dead aggregator's host is its only purpose).
TEST_F(EngineTest, EmptyDatagramIsALivenessProbe) {
  join_all();
  const uint64_t in = engine_.counters().packets_in;
  const uint64_t malformed = engine_.counters().malformed;
  const Sent s = send_bytes({});
  EXPECT_EQ(s.target, Reply::Target::kNone);
  EXPECT_EQ(s.sender_rank, -1);
  EXPECT_EQ(engine_.counters().packets_in, in + 1);
  EXPECT_EQ(engine_.counters().malformed, malformed);
}

TEST_F(EngineTest, AbortedRoundCannotBeCompletedByALateRank) {
  join_all();
  const std::vector<int32_t> abort0 = {static_cast<int32_t>(wire::ErrorReason::kAborted), 0,
                                       static_cast<int32_t>(wire::kAbortDeadline)};
  data(0, 0, false, 1, {1});
  data(1, 0, false, 1, {2});
  // The abort came before the round completed: it is answered with itself (the worker learns
  // that its abort won the race with any late block).
  Sent s = data(0, 0, false, 1, abort0, wire::kFlagError);
  expect_error(s, wire::ErrorReason::kAborted);
  EXPECT_EQ(s.target, Reply::Target::kSender);
  EXPECT_EQ(s.payload, abort0);
  EXPECT_EQ(engine_.counters().aborted_rounds, 1u);
  for (const uint8_t flags : {uint8_t{0}, wire::kFlagRetransmit}) {
    s = data(2, 0, false, 1, {3}, flags);
    expect_error(s, wire::ErrorReason::kAborted);
    EXPECT_EQ(s.payload, abort0);
    EXPECT_EQ(s.hdr.seq, 1u);
    EXPECT_EQ(s.sender_rank, -1);  // it moved nothing
  }
  EXPECT_FALSE(engine_.slot_table(kJob)->copy(0, false).complete);

  // An abort must name its sender: rank 1 cannot give up for rank 0.
  const uint64_t malformed = engine_.counters().malformed;
  data(1, 1, false, 2, {4});
  data(1, 1, false, 2, abort0, wire::kFlagError);
  EXPECT_EQ(engine_.counters().malformed, malformed + 1);
  EXPECT_EQ(engine_.counters().aborted_rounds, 1u);
  data(0, 1, false, 2, {5});
  s = data(2, 1, false, 2, {6});
  EXPECT_EQ(s.target, Reply::Target::kAllRanks);  // completes: nothing was aborted
  // A complete round stays as it is: a rank that lost the result still gets it, and an abort
  // that came after the round completed (a late block won the race) is answered with the result,
  // so that the rank that gave up returns it as the late rank does.
  s = data(0, 1, false, 2, abort0, wire::kFlagError);
  EXPECT_EQ(engine_.counters().aborted_rounds, 1u);
  EXPECT_EQ(s.target, Reply::Target::kSender);
  EXPECT_EQ(s.hdr.flags, wire::kFlagResult | wire::kFlagRetransmit);
  EXPECT_EQ(s.hdr.seq, 2u);
  EXPECT_EQ(s.hdr.count, 1u);
  EXPECT_EQ(s.hdr.dtype, DType::kInt32);
  EXPECT_EQ(s.payload, std::vector<int32_t>{15});
  s = data(0, 1, false, 2, {5}, wire::kFlagRetransmit);
  EXPECT_EQ(s.target, Reply::Target::kSender);
  EXPECT_EQ(s.hdr.flags, wire::kFlagResult | wire::kFlagRetransmit);

  // The next round on the aborted copy (a newer sequence) starts afresh and completes.
  data(0, 0, false, 5, {1});
  data(1, 0, false, 5, {1});
  s = data(2, 0, false, 5, {1});
  EXPECT_EQ(s.target, Reply::Target::kAllRanks);
  ASSERT_EQ(s.payload.size(), 1u);
  EXPECT_EQ(s.payload[0], 3);
  // An older abort (a replay) changes nothing, and nothing answers it.
  EXPECT_EQ(data(0, 0, false, 1, abort0, wire::kFlagError).target, Reply::Target::kNone);
  EXPECT_TRUE(engine_.slot_table(kJob)->copy(0, false).complete);

  // Given up before any DATA of the round arrived here (its DATA was lost): nobody completes it.
  data(0, 2, true, 7, abort0, wire::kFlagError);
  EXPECT_EQ(engine_.counters().aborted_rounds, 2u);
  for (uint16_t r = 0; r < 3; ++r)
    expect_error(data(r, 2, true, 7, {1}), wire::ErrorReason::kAborted);
}

// Replayed datagrams: the job restarts (every rank a new incarnation, the same key) and its block
// sequence starts again at 1. A DATA packet and an abort captured from the earlier incarnation,
// replayed when their seq names a live round, fail the tag (the incarnation is bound into it,
// WIRE.md): counted as bad_tag, unanswered, no address learned, the rounds unchanged.
TEST_F(EngineTest, PacketsOfAnEarlierIncarnationChangeNothing) {
  join_all();
  const std::vector<int32_t> abort0 = {static_cast<int32_t>(wire::ErrorReason::kAborted), 0,
                                       static_cast<int32_t>(wire::kAbortDeadline)};
  const std::vector<uint8_t> old_data = packet(0, 0, false, 1, {100});
  const std::vector<uint8_t> old_abort = packet(0, 1, false, 2, abort0, wire::kFlagError);
  EXPECT_EQ(send_bytes(old_data).sender_rank, 0);  // added in its own incarnation
  send_bytes(old_abort);
  EXPECT_EQ(engine_.counters().aborted_rounds, 1u);

  for (uint16_t r = 0; r < 3; ++r) hello(r, 2000 + r);  // the job's next incarnation
  ASSERT_TRUE(engine_.job_ready(kJob));
  EXPECT_FALSE(engine_.slot_table(kJob)->copy(0, false).used);  // the barrier reset the slots
  data(1, 0, false, 1, {7});
  data(1, 1, false, 2, {8});

  const uint64_t bad_tag = engine_.counters().bad_tag;
  for (const auto* replay : {&old_data, &old_abort}) {
    const Sent s = send_bytes(*replay);
    EXPECT_EQ(s.target, Reply::Target::kNone);
    EXPECT_EQ(s.sender_rank, -1);
  }
  EXPECT_EQ(engine_.counters().bad_tag, bad_tag + 2);
  EXPECT_EQ(engine_.job_counters(kJob)->bad_tag, 2u);
  EXPECT_EQ(engine_.counters().aborted_rounds, 1u);
  const CopyView c = engine_.slot_table(kJob)->copy(0, false);
  EXPECT_EQ(c.contributors, 1u);
  EXPECT_EQ(ranks_in_bitmap(reinterpret_cast<const int32_t*>(c.bitmap.data()), 1),
            std::vector<uint32_t>{1});

  // The live rounds complete with the new incarnation's packets, without the replayed words.
  data(0, 0, false, 1, {9});
  Sent s = data(2, 0, false, 1, {1});
  EXPECT_EQ(s.target, Reply::Target::kAllRanks);
  EXPECT_EQ(s.payload, std::vector<int32_t>{17});
  data(0, 1, false, 2, {1});
  s = data(2, 1, false, 2, {1});
  EXPECT_EQ(s.target, Reply::Target::kAllRanks);  // not aborted
  EXPECT_EQ(s.payload, std::vector<int32_t>{10});
}

// Before the job's first barrier completes there is no incarnation, hence no key a DATA packet
// could carry (WIRE.md, "Incarnations"): sealed with the job's key (a worker of an incarnation
// this aggregator never saw, e.g. before it restarted, has another) it is unauthenticated. (A
// tree leaf's ranks of the previous incarnation, while the leaf waits for its parent, are told
// kJobNotReady: tree_test.)
TEST_F(EngineTest, DataBeforeBarrierIsUnauthenticated) {
  hello(0, 1);
  hello(2, 3);
  for (const uint8_t flags : {uint8_t{0}, wire::kFlagRetransmit}) {
    const Sent s = data(0, 0, false, 1, {9}, flags);
    EXPECT_EQ(s.target, Reply::Target::kNone);
    EXPECT_EQ(s.sender_rank, -1);  // it moved nothing: no address is learned from it
  }
  EXPECT_EQ(engine_.counters().bad_tag, 2u);
  EXPECT_EQ(engine_.counters().not_ready, 0u);
  EXPECT_FALSE(engine_.slot_table(kJob)->copy(0, false).used);
}

// Float SUM DATA is verified by the pass that stores its words in the slot table (raw_words_for)
// where nothing live is, and before anything else where something is. Either way a packet that
// fails the tag changes nothing: no bitmap bit, no exponent or non-finite mark, no new round, no
// words in a result, no reply and no address learned; float32 (verified, copied and scanned in
// one pass) and bfloat16 (verified and copied, then scanned where stored).
TEST_F(EngineTest, ForgedFloatSumDataChangesNothing) {
  join_all();
  for (const DType dt : {DType::kFloat32, DType::kBFloat16}) {
    const uint16_t slot = dt == DType::kFloat32 ? 1 : 2;
    // Two elements of the type, from float values (exact in both: small dyadic ones).
    auto block = [&](uint16_t rank, BlockSeq seq, float x0, float x1, uint8_t flags = 0,
                     bool forge = false) {
      wire::Header h = data_header(kJob, kKey, rank, slot, false, seq, 2);
      h.dtype = dt;
      h.flags = flags;
      std::vector<uint8_t> b(wire::packet_size(h));
      wire::encode_header(h, b.data());
      for (int i = 0; i < 2; ++i) {
        const float x = i == 0 ? x0 : x1;
        if (dt == DType::kFloat32) {
          std::memcpy(b.data() + wire::kHeaderSize + 4 * i, &x, 4);
        } else {
          const uint16_t hi = static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16);
          std::memcpy(b.data() + wire::kHeaderSize + 2 * i, &hi, 2);
        }
      }
      testing::seal_test_datagram(b, kKey);
      if (forge) b[wire::kHeaderSize] ^= 0x40;  // the first element changed after sealing
      return b;
    };
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    auto unchanged = [&](const CopyView& before, const char* what) {
      const CopyView c = engine_.slot_table(kJob)->copy(slot, false);
      EXPECT_EQ(c.seq, before.seq) << what;
      EXPECT_EQ(c.contributors, before.contributors) << what;
      EXPECT_EQ(c.exp, before.exp) << what;
      EXPECT_EQ(c.nonfinite, before.nonfinite) << what;
      EXPECT_EQ(c.complete, before.complete) << what;
      EXPECT_EQ(std::vector<uint64_t>(c.bitmap.begin(), c.bitmap.end()),
                std::vector<uint64_t>(before.bitmap.begin(), before.bitmap.end()))
          << what;
    };
    auto forged = [&](const std::vector<uint8_t>& b, const char* what) {
      const uint64_t bad = engine_.counters().bad_tag;
      const CopyView before = engine_.slot_table(kJob)->copy(slot, false);
      const std::vector<uint64_t> bits(before.bitmap.begin(), before.bitmap.end());
      const Sent s = send_bytes(b);
      EXPECT_EQ(s.target, Reply::Target::kNone) << what;
      EXPECT_EQ(s.sender_rank, -1) << what;
      EXPECT_EQ(engine_.counters().bad_tag, bad + 1) << what;
      CopyView was = before;
      was.bitmap = bits;
      unchanged(was, what);
    };
    EXPECT_EQ(send_bytes(block(0, 5, 1.5f, -0.25f)).sender_rank, 0);
    // A rank not yet in (its words stored as they are verified), huge and non-finite values.
    forged(block(1, 5, inf, 3e38f, 0, true), "a new rank's forged words");
    forged(block(2, 5, nan, 1.0f, wire::kFlagNonFinite, true), "a forged NONFINITE");
    // Rank 0 again (its words are the round's: verified before anything).
    forged(block(0, 5, nan, nan, wire::kFlagRetransmit, true), "a forged duplicate");
    // A newer round (it would abandon this one).
    forged(block(1, 6, 2.0f, 2.0f, 0, true), "a forged newer round");
    EXPECT_EQ(send_bytes(block(1, 5, 2.25f, 0.5f)).target, Reply::Target::kNone);
    // The last rank's words (verified in the datagram, where the completion would read them).
    forged(block(2, 5, nan, inf, 0, true), "a forged last contribution");
    forged(block(2, 5, 1e30f, 1.0f, wire::kFlagNonFinite, true), "a forged last NONFINITE");
    Sent s = send_bytes(block(2, 5, -0.75f, 0.25f));
    ASSERT_EQ(s.target, Reply::Target::kAllRanks);
    EXPECT_EQ(s.hdr.flags, wire::kFlagResult);  // no forged NaN got in
    auto elems = [&](const Sent& r) {           // payload_words: one element per word
      std::vector<float> out;
      for (const int32_t w : r.payload) {
        const uint32_t u = static_cast<uint32_t>(w);
        out.push_back(std::bit_cast<float>(dt == DType::kFloat32 ? u : u << 16));
      }
      return out;
    };
    EXPECT_EQ(elems(s), (std::vector<float>{3.0f, 0.5f}));
    // The round complete, a forged next round's words land in its rank's consumed words: a
    // resent result is still the round's, and the next round adds only genuine words.
    forged(block(0, 7, nan, inf, 0, true), "a forged round after a complete one");
    s = send_bytes(block(1, 5, 2.25f, 0.5f, wire::kFlagRetransmit));
    ASSERT_EQ(s.target, Reply::Target::kSender);
    EXPECT_EQ(elems(s), (std::vector<float>{3.0f, 0.5f}));
    send_bytes(block(0, 7, 1.0f, 1.0f));
    send_bytes(block(1, 7, 1.0f, 2.0f));
    forged(block(2, 7, 1.0f, 4.0f, 0, true), "a forged last contribution of the next round");
    s = send_bytes(block(2, 7, 1.0f, 4.0f));
    ASSERT_EQ(s.target, Reply::Target::kAllRanks);
    EXPECT_EQ(s.hdr.flags, wire::kFlagResult);
    EXPECT_EQ(elems(s), (std::vector<float>{3.0f, 7.0f}));
  }
  EXPECT_EQ(engine_.job_counters(kJob)->bad_tag, 16u);
}

// A tag the backend verified already (the DPDK loop checks a burst's at once) is taken only
// under the key the engine would verify with (the incarnation's, for DATA): told of another key,
// or for a HELLO, the engine verifies as usual, so a forged packet still changes nothing. Float
// SUM words taken so are copied and scanned where stored: the same sums and non-finite marks.
TEST_F(EngineTest, ATagTheBackendCheckedCountsOnlyUnderTheIncarnationsKey) {
  join_all();
  Key128 traffic, up;
  ASSERT_TRUE(engine_.current_keys(kJob, &traffic, &up));
  ASSERT_NE(traffic, Key128{kKey});
  auto send = [&](const std::vector<uint8_t>& b, const Key128* checked) {
    int32_t rank = -2;
    JobId job = 0;
    const Reply r = engine_.on_packet(b, 0, &rank, &job, false, checked);
    return std::make_pair(r.target, rank);
  };
  const Key128 job_key{kKey};
  std::vector<uint8_t> forged = packet(0, 0, false, 1, {9, 9, 9});
  forged[wire::kHeaderSize + 1] ^= 1;
  EXPECT_EQ(send(forged, &job_key), std::make_pair(Reply::Target::kNone, -1));
  EXPECT_EQ(engine_.counters().bad_tag, 1u);
  EXPECT_EQ(engine_.slot_table(kJob)->copy(0, false).contributors, 0u);
  EXPECT_EQ(send(packet(0, 0, false, 1, {1, 2, 3}), &traffic).second, 0);
  std::vector<uint8_t> hello_forged;
  {
    wire::Header h;
    h.tag = kKey;
    h.job = kJob;
    h.rank = 1;
    h.seq = 5000;  // a new incarnation, were it genuine
    h.flags = wire::kFlagHello;
    hello_forged = encode_packet(h, {3});
    hello_forged[wire::kOffSeq] ^= 1;
  }
  EXPECT_EQ(send(hello_forged, &traffic).first, Reply::Target::kNone);
  EXPECT_EQ(engine_.counters().bad_tag, 2u);
  EXPECT_EQ(engine_.epoch(kJob) != 0, true);
  EXPECT_EQ(send(packet(1, 0, false, 1, {10, 20, 30}), &traffic).second, 1);
  EXPECT_EQ(send(packet(2, 0, false, 1, {100, 200, 300}), &traffic).first,
            Reply::Target::kAllRanks);
  EXPECT_EQ(engine_.counters().completed, 1u);

  auto fblock = [&](uint16_t rank, BlockSeq seq, float x0, float x1) {
    wire::Header h = data_header(kJob, kKey, rank, 1, false, seq, 2);
    h.dtype = DType::kFloat32;
    std::vector<uint8_t> b(wire::packet_size(h));
    wire::encode_header(h, b.data());
    std::memcpy(b.data() + wire::kHeaderSize, &x0, 4);
    std::memcpy(b.data() + wire::kHeaderSize + 4, &x1, 4);
    testing::seal_test_datagram(b, kKey);
    return b;
  };
  for (int round = 0; round < 2; ++round) {
    const BlockSeq seq = static_cast<BlockSeq>(2 + round);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(send(fblock(0, seq, 1.5f, -0.25f), &traffic).second, 0);
    EXPECT_EQ(send(fblock(1, seq, 2.25f, round == 1 ? nan : 0.5f), &traffic).second, 1);
    int32_t rank;
    JobId job;
    const Reply r =
        engine_.on_packet(fblock(2, seq, -0.75f, 0.25f), 0, &rank, &job, false, &traffic);
    ASSERT_EQ(r.target, Reply::Target::kAllRanks);
    if (round == 1) {
      EXPECT_TRUE(r.hdr.has(wire::kFlagNonFinite)) << "the stored words were scanned";
      continue;
    }
    EXPECT_EQ(r.hdr.flags, wire::kFlagResult);
    ASSERT_EQ(r.hdr.count, 2u);
    float got[2];
    std::memcpy(got, r.payload, 8);
    EXPECT_EQ(got[0], 3.0f);
    EXPECT_EQ(got[1], 0.5f);
  }
  EXPECT_EQ(engine_.counters().bad_tag, 2u);
}

TEST_F(EngineTest, CompletedRoundGoesToEveryRank) {
  join_all();
  wire::Header h = data_header(kJob, kKey, 0, 3, true, 42, 0);
  h.coll = 77;
  h.elems = 1003;
  EXPECT_EQ(send_bytes(encode_packet(h, std::vector<int32_t>{1, -2, 3})).target,
            Reply::Target::kNone);
  h.rank = 1;
  EXPECT_EQ(send_bytes(encode_packet(h, std::vector<int32_t>{10, -20, 30})).target,
            Reply::Target::kNone);
  h.rank = 2;
  const Sent s = send_bytes(encode_packet(h, std::vector<int32_t>{100, -200, 300}));
  EXPECT_EQ(s.target, Reply::Target::kAllRanks);
  EXPECT_EQ(s.hdr.flags, wire::kFlagResult);
  EXPECT_EQ(s.hdr.job, kJob);
  EXPECT_EQ(s.hdr.seq, 42u);
  EXPECT_EQ(s.hdr.slot, 3);
  EXPECT_TRUE(s.hdr.shadow);
  EXPECT_EQ(s.hdr.count, 3);
  EXPECT_EQ(s.hdr.dtype, DType::kInt32);
  EXPECT_EQ(s.hdr.op, ReduceOp::kSum);
  EXPECT_EQ(s.hdr.coll, 77u);
  EXPECT_EQ(s.hdr.elems, 1003u);
  EXPECT_EQ(s.hdr.root, wire::kNoRoot);
  EXPECT_EQ(s.hdr.exp, kNoExponent);
  EXPECT_EQ(s.payload, (std::vector<int32_t>{111, -222, 333}));
  EXPECT_EQ(engine_.counters().completed, 1u);
  EXPECT_EQ(engine_.counters().by_verdict[static_cast<size_t>(Verdict::kAdded)], 2u);
  EXPECT_EQ(engine_.counters().by_verdict[static_cast<size_t>(Verdict::kCompleted)], 1u);
}

TEST_F(EngineTest, FloatSumRoundsOnceAndMarksNonFinite) {
  join_all();
  // float32 SUM: raw floats in, the correctly rounded sum out, in one round trip.
  const float a[3][2] = {{1.5f, -0.25f}, {2.25f, 1e-3f}, {-0.75f, 0.5f}};
  auto send_f = [&](uint16_t rank, BlockSeq seq, const float* v, uint8_t flags) {
    wire::Header h = data_header(kJob, kKey, rank, 1, false, seq, 2);
    h.dtype = DType::kFloat32;
    h.flags = flags;
    std::vector<uint8_t> b(wire::packet_size(h));
    wire::encode_header(h, b.data());
    std::memcpy(b.data() + wire::kHeaderSize, v, 8);
    testing::seal_test_datagram(b, kKey);
    return send_bytes(b);
  };
  send_f(0, 5, a[0], 0);
  send_f(1, 5, a[1], 0);
  Sent s = send_f(2, 5, a[2], 0);
  ASSERT_EQ(s.target, Reply::Target::kAllRanks);
  EXPECT_EQ(s.hdr.flags, wire::kFlagResult);
  EXPECT_EQ(s.hdr.dtype, DType::kFloat32);
  ASSERT_EQ(s.payload.size(), 2u);
  EXPECT_EQ(std::bit_cast<float>(s.payload[0]), 3.0f);
  EXPECT_EQ(std::bit_cast<float>(s.payload[1]), static_cast<float>(-0.25 + double{1e-3f} + 0.5));
  // A NaN in one rank's block: NONFINITE, every element NaN.
  const float nan_block[2] = {std::numeric_limits<float>::quiet_NaN(), 1.0f};
  send_f(0, 7, a[0], 0);
  send_f(1, 7, nan_block, 0);
  s = send_f(2, 7, a[2], 0);
  EXPECT_EQ(s.hdr.flags, wire::kFlagResult | wire::kFlagNonFinite);
  EXPECT_TRUE(std::isnan(std::bit_cast<float>(s.payload[0])));
  EXPECT_TRUE(std::isnan(std::bit_cast<float>(s.payload[1])));
  EXPECT_EQ(engine_.counters().nonfinite_blocks, 1u);
  // A worker's NONFINITE mark on DATA is ORed too.
  send_f(0, 9, a[0], wire::kFlagNonFinite);
  send_f(1, 9, a[1], 0);
  EXPECT_EQ(send_f(2, 9, a[2], 0).hdr.flags, wire::kFlagResult | wire::kFlagNonFinite);

  // A finite round has no NONFINITE flag.
  data(0, 0, false, 43, {1});
  data(1, 0, false, 43, {1});
  EXPECT_EQ(data(2, 0, false, 43, {1}).hdr.flags, wire::kFlagResult);
}

TEST_F(EngineTest, RetransmissionsAndDuplicates) {
  join_all();
  data(0, 1, false, 5, {1, 1});
  data(2, 1, false, 5, {2, 2});
  // A plain duplicate to the incomplete copy: silence.
  Sent s = data(0, 1, false, 5, {1, 1});
  EXPECT_EQ(s.target, Reply::Target::kNone);
  // A retransmission: the bitmap of who has contributed, so the worker can name rank 1.
  s = data(2, 1, false, 5, {2, 2}, wire::kFlagRetransmit);
  expect_error(s, wire::ErrorReason::kMissingRanks);
  EXPECT_EQ(error_bitmap(s), (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(s.hdr.seq, 5u);
  EXPECT_EQ(s.hdr.slot, 1);
  EXPECT_EQ(s.hdr.rank, 2);

  s = data(1, 1, false, 5, {4, 4});
  ASSERT_EQ(s.target, Reply::Target::kAllRanks);
  EXPECT_EQ(s.payload, (std::vector<int32_t>{7, 7}));
  // Rank 0 lost its result: the retransmission gets it again, to rank 0 only, not re-added.
  s = data(0, 1, false, 5, {1, 1}, wire::kFlagRetransmit);
  EXPECT_EQ(s.target, Reply::Target::kSender);
  // Marked as a resend, so that the worker can tell it from the multicast original.
  EXPECT_EQ(s.hdr.flags, wire::kFlagResult | wire::kFlagRetransmit);
  EXPECT_EQ(s.payload, (std::vector<int32_t>{7, 7}));

  const EngineCounters& c = engine_.counters();
  EXPECT_EQ(c.duplicates, 3u);
  EXPECT_EQ(c.resent_results, 1u);
  EXPECT_EQ(c.completed, 1u);
  const auto rc = engine_.rank_counters(kJob);
  EXPECT_EQ(rc[0].packets, 1u + 3u);  // HELLO + 3 DATA
  EXPECT_EQ(rc[0].retransmits, 1u);
  EXPECT_EQ(rc[0].duplicates, 2u);
  EXPECT_EQ(rc[1].duplicates, 0u);
  EXPECT_EQ(rc[2].duplicates, 1u);
  EXPECT_EQ(rc[2].retransmits, 1u);
}

// A round older than its copy holds is counted and changes nothing; its sender is told the
// copy's round (ERROR kSuperseded: a rank still waiting for the old round fails at once, others
// ignore it).
TEST_F(EngineTest, StaleIsCountedAndAnsweredWithTheNewerRound) {
  join_all();
  for (uint16_t r = 0; r < 3; ++r) data(r, 0, false, 10, {1});
  for (uint16_t r = 0; r < 2; ++r) data(r, 0, false, 12, {2});
  const Sent s = data(1, 0, false, 10, {1}, wire::kFlagRetransmit);
  expect_error(s, wire::ErrorReason::kSuperseded);
  EXPECT_EQ(s.payload, (std::vector<int32_t>{6, 12}));
  EXPECT_EQ(s.hdr.seq, 10u);
  EXPECT_EQ(s.sender_rank, -1);
  EXPECT_EQ(engine_.counters().stale, 1u);
  EXPECT_EQ(engine_.slot_table(kJob)->copy(0, false).contributors, 2u);
}

// The tag (WIRE.md): every datagram carries SipHash-2-4 under the job's key over all its bytes.
// Anything built from a captured genuine packet (a bit flipped anywhere, the tag included; cut
// short with a matching count; resealed under another key) is dropped before any state changes:
// no slot, no barrier, no address (sender_rank stays -1), no reply.
TEST_F(EngineTest, TamperedPacketsAreDroppedBeforeAnyState) {
  join_all();
  data(0, 0, false, 1, {1, 2, 3, 4});
  const std::vector<uint8_t> genuine =
      encode_packet(data_header(kJob, kKey, 1, 0, false, 1, 0), std::vector<int32_t>{5, 6, 7, 8});
  auto untouched = [&](const char* what, size_t i) {
    EXPECT_EQ(engine_.slot_table(kJob)->copy(0, false).contributors, 1u) << what << " " << i;
    EXPECT_TRUE(engine_.job_ready(kJob)) << what << " " << i;
  };
  const EngineCounters before = engine_.counters();
  uint64_t dropped = 0, bad_tags = 0;
  for (size_t i = 0; i < genuine.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      std::vector<uint8_t> x = genuine;
      x[i] ^= static_cast<uint8_t>(1u << b);
      const uint64_t bt = engine_.counters().bad_tag;
      const Sent sent = send_bytes(x);
      EXPECT_EQ(sent.target, Reply::Target::kNone) << "byte " << i << " bit " << b;
      EXPECT_EQ(sent.sender_rank, -1) << "byte " << i << " bit " << b;
      ++dropped;
      // Flips of the fields decode() checks may fail decoding, or name another job; every
      // other flip (seq, rank, slot, coll, elems, root, tag, payload) is a bad tag.
      const bool decoded_field = i < 8 || (i >= 16 && i < 20) || (i >= 28 && i < 30);
      if (!decoded_field) {
        EXPECT_EQ(engine_.counters().bad_tag, bt + 1) << "byte " << i << " bit " << b;
        ++bad_tags;
      }
      untouched("flip", i);
    }
  }
  // Cut short by one word, count lowered to match: well-formed, but the tag no longer fits.
  std::vector<uint8_t> cut(genuine.begin(), genuine.end() - 4);
  wire::put_u16(cut.data() + wire::kOffCount, 3);
  EXPECT_EQ(send_bytes(cut).target, Reply::Target::kNone);
  ++dropped, ++bad_tags;
  untouched("cut", 0);
  // The right tag under the wrong key (another job's, the zero key, one bit off).
  for (uint64_t k : {uint64_t{0x9999}, uint64_t{0}, kKey ^ 1}) {
    std::vector<uint8_t> x = genuine;
    testing::seal_test_datagram(x, k);
    EXPECT_EQ(send_bytes(x).sender_rank, -1);
    ++dropped, ++bad_tags;
    untouched("key", 0);
  }
  // A sender that writes no tag at all.
  std::vector<uint8_t> zero = genuine;
  std::memset(zero.data() + wire::kOffTag, 0, wire::kTagSize);
  EXPECT_EQ(send_bytes(zero).target, Reply::Target::kNone);
  ++dropped, ++bad_tags;
  const EngineCounters& c = engine_.counters();
  EXPECT_GE(c.bad_tag - before.bad_tag, bad_tags);
  EXPECT_EQ((c.bad_tag - before.bad_tag) + (c.malformed - before.malformed) +
                (c.unknown_job - before.unknown_job),
            dropped);
  EXPECT_EQ(engine_.job_counters(kJob)->bad_tag, c.bad_tag);
  EXPECT_EQ(c.by_verdict[static_cast<size_t>(Verdict::kAdded)],
            before.by_verdict[static_cast<size_t>(Verdict::kAdded)]);
  EXPECT_EQ(engine_.rank_counters(kJob)[1].packets, 1u);  // its HELLO only
  // The genuine packet still completes nothing alone, and is added once.
  EXPECT_EQ(send_bytes(genuine).sender_rank, 1);
  EXPECT_EQ(engine_.slot_table(kJob)->copy(0, false).contributors, 2u);
}

// The attack that reopened the join barrier: a HELLO naming a real rank with a new nonce. Without
// the job's key it is a bad tag and changes nothing; the running ranks stay ready, the next
// barrier does not count it, and no address is learned.
TEST_F(EngineTest, ForgedHelloWithNewNonceChangesNothing) {
  join_all();
  data(0, 0, false, 1, {5});
  for (uint64_t k : {uint64_t{0}, uint64_t{kKey ^ (uint64_t{1} << 63)}, uint64_t{0x1234}}) {
    wire::Header h = testing::hello_header(kJob, k, 1, 0xBAD0 + static_cast<BlockSeq>(k));
    const Sent s = send_bytes(encode_packet(h, std::vector<int32_t>{3}));
    EXPECT_EQ(s.target, Reply::Target::kNone);
    EXPECT_EQ(s.sender_rank, -1);
  }
  // The old attack's shape: a 36-byte HELLO (v1's size) is not even a packet now.
  std::vector<uint8_t> v1(36, 0);
  wire::put_u16(v1.data(), wire::kMagic);
  v1[wire::kOffVersion] = 1;
  v1[wire::kOffFlags] = wire::kFlagHello;
  EXPECT_EQ(send_bytes(v1).sender_rank, -1);
  EXPECT_EQ(engine_.counters().decode.by_error[static_cast<size_t>(wire::DecodeError::kTruncated)],
            1u);
  EXPECT_EQ(engine_.counters().bad_tag, 3u);
  EXPECT_EQ(engine_.counters().hellos, 3u);  // the three genuine ones of join_all
  EXPECT_TRUE(engine_.job_ready(kJob));
  EXPECT_TRUE(engine_.slot_table(kJob)->copy(0, false).used);
  // The genuine restart of rank 1 is the first member of the next barrier, alone.
  const Sent s = hello(1, 4242, /*retransmit=*/true);
  expect_error(s, wire::ErrorReason::kMissingRanks);
  EXPECT_EQ(error_bitmap(s), (std::vector<uint32_t>{1}));
  // The round in flight completes as if nothing happened.
  data(1, 0, false, 1, {6});
  EXPECT_EQ(data(2, 0, false, 1, {7}).payload, (std::vector<int32_t>{18}));
}

// Replays: a genuine DATA of a completed round sent again is stale (or answered from the shadow)
// and is never added twice; the same packet with seq XOR 2^20 (a round "ahead") is a bad tag, and
// the slot does not move.
TEST_F(EngineTest, ReplayedDataIsStaleAndShiftedSeqIsBadTag) {
  join_all();
  const auto pkt = [&](uint16_t r, BlockSeq seq, int32_t v) {
    return encode_packet(data_header(kJob, kKey, r, 0, false, seq, 0), std::vector<int32_t>{v});
  };
  const std::vector<uint8_t> old = pkt(0, 10, 1);
  send_bytes(old);
  send_bytes(pkt(1, 10, 2));
  EXPECT_EQ(send_bytes(pkt(2, 10, 3)).payload, (std::vector<int32_t>{6}));
  for (uint16_t r = 0; r < 2; ++r) send_bytes(pkt(r, 12, 10));  // the next round, in flight
  const uint64_t stale = engine_.counters().stale;
  const Sent replay = send_bytes(old);  // answered to its sender only: the copy's newer round
  expect_error(replay, wire::ErrorReason::kSuperseded);
  EXPECT_EQ(replay.sender_rank, -1);
  EXPECT_EQ(engine_.counters().stale, stale + 1);
  std::vector<uint8_t> ahead = old;
  wire::put_u32(ahead.data() + wire::kOffSeq,
                wire::get_u32(old.data() + wire::kOffSeq) ^ (1u << 20));
  EXPECT_EQ(send_bytes(ahead).target, Reply::Target::kNone);
  EXPECT_EQ(engine_.counters().bad_tag, 1u);
  const CopyView c = engine_.slot_table(kJob)->copy(0, false);
  EXPECT_EQ(c.seq, 12u);
  EXPECT_EQ(c.contributors, 2u);
  EXPECT_EQ(send_bytes(pkt(2, 12, 10)).payload, (std::vector<int32_t>{30}));
}

// With the tag check off (benchmarks only) the same forged packet would be accepted: the check
// is what stops it.
TEST(EngineTagOption, CheckOffAcceptsAnyTag) {
  EngineOptions o;
  o.check_tag = false;
  Engine e(o);
  JobConfig cfg;
  cfg.job = 3;
  cfg.key = Key128{1, 2};
  cfg.slots.world_size = 1;
  cfg.slots.num_slots = 2;
  cfg.slots.max_payload_bytes = 16;
  ASSERT_TRUE(e.add_job(cfg).ok());
  int32_t rank = -2;
  JobId job = 0;
  const Reply r = e.on_packet(
      encode_packet(testing::hello_header(3, 0, 0, 1), std::vector<int32_t>{1}), &rank, &job);
  EXPECT_EQ(r.target, Reply::Target::kAllRanks);
  EXPECT_EQ(r.key, (Key128{1, 2}));  // replies carry the job's key, for the backend to seal
  EXPECT_EQ(e.counters().bad_tag, 0u);
}

// A round the ranks disagree on: nothing until every rank is in, then each packet of the round
// (resends) gets the same words: both shapes and the ranks of the other one.
TEST_F(EngineTest, RoundMismatchTellsEveryRankBothShapes) {
  join_all();
  EXPECT_EQ(data(0, 2, true, 3, {1, 2, 3, 4}).target, Reply::Target::kNone);
  EXPECT_EQ(data(1, 2, true, 3, {1, 2}).target, Reply::Target::kNone);  // rank 2 not in yet
  const Sent s = data(2, 2, true, 3, {5, 6, 7, 8});
  // The rank that brings the last contribution in moves on at once: every rank is told now.
  EXPECT_EQ(s.target, Reply::Target::kAllRanks);
  EXPECT_EQ(s.hdr.flags, wire::kFlagError);
  // [reason, count, elems, dtype | op << 8 | root << 16, the other's, ranks of the other shape]
  const int32_t shape = static_cast<int32_t>(DType::kInt32) |
                        static_cast<int32_t>(ReduceOp::kSum) << 8 |
                        static_cast<int32_t>(wire::kNoRoot) << 16;
  const std::vector<int32_t> want{4, 4, 0, shape, 0, shape, 0b010};
  EXPECT_EQ(s.payload, want);
  EXPECT_EQ(s.hdr.seq, 3u);
  const Sent again = data(0, 2, true, 3, {1, 2, 3, 4}, wire::kFlagRetransmit);
  expect_error(again, wire::ErrorReason::kRoundMismatch);
  EXPECT_EQ(again.payload, want);
  EXPECT_EQ(engine_.counters().mismatched, 3u);
  EXPECT_TRUE(engine_.slot_table(kJob)->copy(2, true).poisoned);

  // Ranks 1 and 2 moved on (their next collective's round takes the copy); rank 0's answer was
  // lost, and its resend of the poisoned round must get the same words, never kSuperseded (which
  // would fail it otherwise than the others, and leave its block sequence behind theirs).
  EXPECT_EQ(data(1, 2, true, 1u << 24, {1, 1, 1, 1}).target, Reply::Target::kNone);
  const Sent late = data(0, 2, true, 3, {1, 2, 3, 4}, wire::kFlagRetransmit);
  expect_error(late, wire::ErrorReason::kRoundMismatch);
  EXPECT_EQ(late.payload, want);
  EXPECT_EQ(late.hdr.seq, 3u);
  // A stale round of another collective still gets kSuperseded.
  wire::Header oh = data_header(kJob, kKey, 0, 2, true, 2, 0);
  oh.flags = wire::kFlagRetransmit;
  oh.coll = 77;
  const Sent stale = send_bytes(encode_packet(oh, std::vector<int32_t>{1, 2, 3, 4}));
  expect_error(stale, wire::ErrorReason::kSuperseded);
}

// A packet for a job this engine does not serve cannot be verified: counted and dropped.
TEST_F(EngineTest, UnknownJobIsDroppedSilently) {
  join_all();
  data(0, 0, false, 1, {1, 1});
  Sent s = data(1, 0, false, 1, {1000, 1000}, wire::kFlagRetransmit, kJob + 1, kKey);
  EXPECT_EQ(s.target, Reply::Target::kNone);
  EXPECT_EQ(s.sender_rank, -1);
  EXPECT_TRUE(engine_.job_ready(kJob));
  EXPECT_EQ(engine_.counters().unknown_job, 1u);
  EXPECT_EQ(engine_.slot_table(kJob)->copy(0, false).contributors, 1u);
  data(1, 0, false, 1, {2, 2});
  s = data(2, 0, false, 1, {3, 3});
  EXPECT_EQ(s.payload, (std::vector<int32_t>{6, 6}));
  // Rejected packets never count against a rank.
  EXPECT_EQ(engine_.rank_counters(kJob)[1].packets, 2u);  // HELLO + the good DATA
}

TEST_F(EngineTest, JobsAreIsolated) {
  add(8, 0x8888, 2);
  join_all();
  join_all(2, 8, 0x8888);
  data(0, 0, false, 1, {1});
  data(0, 0, false, 1, {50}, 0, 8, 0x8888);
  Sent s = data(1, 0, false, 1, {60}, 0, 8, 0x8888);
  EXPECT_EQ(s.target, Reply::Target::kAllRanks);
  EXPECT_EQ(s.hdr.job, 8u);
  EXPECT_EQ(s.payload, (std::vector<int32_t>{110}));
  EXPECT_EQ(engine_.slot_table(kJob)->copy(0, false).contributors, 1u);
}

// on_packet() keeps the last job looked up: a removed job must stop being served at once, and a
// job removed and added again under the same id must be served with its new configuration.
TEST_F(EngineTest, RemovedOrReplacedJobIsNotServedFromTheLastJobCache) {
  join_all();
  data(0, 0, false, 1, {1, 1});  // job kJob is now the cached one
  ASSERT_TRUE(engine_.remove_job(kJob).ok());
  Sent s = data(1, 0, false, 1, {2, 2});
  EXPECT_EQ(s.target, Reply::Target::kNone);
  EXPECT_EQ(s.sender_rank, -1);
  EXPECT_EQ(engine_.counters().unknown_job, 1u);

  // Same id, another world: it completes with 2 ranks (before the join, DATA has no incarnation
  // whose key it could carry).
  add(kJob, kKey ^ 0xFF, 2);
  s = data(0, 0, false, 1, {1, 1}, 0, kJob, kKey ^ 0xFF);
  EXPECT_EQ(s.target, Reply::Target::kNone);
  EXPECT_EQ(engine_.counters().bad_tag, 1u);
  join_all(2, kJob, kKey ^ 0xFF);
  // The old job's key is not the new one's.
  s = data(0, 0, false, 1, {1, 1}, 0, kJob, kKey);
  EXPECT_EQ(engine_.counters().bad_tag, 2u);
  data(0, 0, false, 1, {10, 20}, 0, kJob, kKey ^ 0xFF);
  s = data(1, 0, false, 1, {1, 2}, 0, kJob, kKey ^ 0xFF);
  EXPECT_EQ(s.target, Reply::Target::kAllRanks);
  EXPECT_EQ(s.payload, (std::vector<int32_t>{11, 22}));

  // Alternating between two jobs goes to the right one each time.
  add(9, 0x9999, 2);
  join_all(2, 9, 0x9999);
  data(0, 1, false, 1, {5}, 0, 9, 0x9999);
  data(0, 1, false, 2, {7, 7}, 0, kJob, kKey ^ 0xFF);
  s = data(1, 1, false, 1, {6}, 0, 9, 0x9999);
  EXPECT_EQ(s.payload, (std::vector<int32_t>{11}));
  s = data(1, 1, false, 2, {1, 1}, 0, kJob, kKey ^ 0xFF);
  EXPECT_EQ(s.payload, (std::vector<int32_t>{8, 8}));
}

TEST_F(EngineTest, EveryMalformedKindIsCounted) {
  join_all();
  const uint64_t before = engine_.counters().malformed;
  const std::vector<uint8_t> good =
      encode_packet(data_header(kJob, kKey, 0, 0, false, 1, 0), std::vector<int32_t>{1, 2});
  auto mutate = [&](size_t off, uint8_t v) {
    std::vector<uint8_t> b = good;
    b[off] = v;
    return b;
  };
  struct Case {
    std::vector<uint8_t> bytes;
    wire::DecodeError err;
  };
  std::vector<Case> cases = {
      {std::vector<uint8_t>(good.begin(), good.begin() + 31), wire::DecodeError::kTruncated},
      {{0x49}, wire::DecodeError::kTruncated},  // (an empty datagram is a liveness probe)
      {mutate(wire::kOffMagic, 0x00), wire::DecodeError::kBadMagic},
      {mutate(wire::kOffVersion, 1), wire::DecodeError::kBadVersion},
      {mutate(wire::kOffExp, 0x00), wire::DecodeError::kBadExponent},
      {mutate(wire::kOffFlags, wire::kFlagPartial), wire::DecodeError::kBadPartial},
      {mutate(wire::kOffFlags, 0x80), wire::DecodeError::kUnknownFlags},
      {mutate(wire::kOffDtype, 9), wire::DecodeError::kUnknownDtype},
      {mutate(wire::kOffOp, 0), wire::DecodeError::kUnknownOp},
      {std::vector<uint8_t>(good.begin(), good.end() - 1), wire::DecodeError::kCountBeyondPayload},
      {[&] {
         auto b = good;
         b.push_back(0);
         return b;
       }(),
       wire::DecodeError::kTrailingBytes},
  };
  for (const Case& c : cases) {
    const uint64_t n = engine_.counters().decode.by_error[static_cast<size_t>(c.err)];
    const Sent s = send_bytes(c.bytes);
    EXPECT_EQ(s.target, Reply::Target::kNone) << wire::decode_error_name(c.err);
    EXPECT_EQ(s.sender_rank, -1);
    EXPECT_EQ(engine_.counters().decode.by_error[static_cast<size_t>(c.err)], n + 1)
        << wire::decode_error_name(c.err);
  }
  EXPECT_EQ(engine_.counters().decode.total_rejected(), cases.size());

  // Well-formed packets a worker must never send, and DATA the slot table rejects.
  const uint8_t kinds[] = {wire::kFlagResult, wire::kFlagError,
                           wire::kFlagHello | wire::kFlagResult,
                           wire::kFlagResult | wire::kFlagRetransmit};
  for (uint8_t f : kinds) {
    EXPECT_EQ(data(0, 0, false, 1, {1}, f).target, Reply::Target::kNone) << int{f};
  }
  wire::Header h0;
  h0.tag = kKey;  // the key encode_packet() seals with
  h0.job = kJob;
  h0.flags = wire::kFlagHello;
  EXPECT_EQ(send_bytes(encode_packet(h0, std::vector<int32_t>{})).target,
            Reply::Target::kNone);  // HELLO without world size
  EXPECT_EQ(send_bytes(encode_packet(h0, std::vector<int32_t>{3, 3})).target,
            Reply::Target::kNone);                                    // HELLO with extra words
  EXPECT_EQ(hello(3, 1).target, Reply::Target::kNone);                // HELLO rank beyond world
  EXPECT_EQ(data(0, 4, false, 1, {1}).target, Reply::Target::kNone);  // slot beyond the table
  EXPECT_EQ(data(3, 0, false, 1, {1}).target, Reply::Target::kNone);  // rank beyond world
  EXPECT_EQ(data(0, 0, false, 1, std::vector<int32_t>(9, 1)).target,
            Reply::Target::kNone);  // more than max_payload_bytes
  const EngineCounters& c = engine_.counters();
  EXPECT_EQ(c.malformed - before, cases.size() + 4 + 3 + 3);
  EXPECT_EQ(c.by_verdict[static_cast<size_t>(Verdict::kBadSlot)], 1u);
  EXPECT_EQ(c.by_verdict[static_cast<size_t>(Verdict::kBadRank)], 1u);
  EXPECT_EQ(c.by_verdict[static_cast<size_t>(Verdict::kTooLarge)], 1u);
  // None of it touched a slot.
  for (uint16_t s = 0; s < 4; ++s) EXPECT_FALSE(engine_.slot_table(kJob)->copy(s, false).used);
  EXPECT_EQ(c.packets_in, 3u + cases.size() + 4 + 3 + 3);
}

// The packet path (decode, barrier, slot table, every kind of reply) never allocates.
TEST_F(EngineTest, PacketPathDoesNotAllocate) {
  add(9, 0, 100);  // scratch_ sized for the larger bitmap in add_job
  // The packets are built before the engine sees the HELLOs: their workers' epoch, computed.
  const BlockSeq nonces[3] = {5, 5, 5};
  const uint64_t epoch = wire::incarnation_epoch(Key128{kKey}, 0, nonces);
  testing::epoch_of() = [epoch](JobId job, uint8_t) { return job == kJob ? epoch : 0; };
  std::vector<std::vector<uint8_t>> pkts;
  auto hello_pkt = [](JobId job, uint64_t key, uint16_t rank, uint32_t world, uint8_t flags) {
    wire::Header h;
    h.tag = key;  // the key encode_packet() seals with (test_packets.h)
    h.job = job;
    h.rank = rank;
    h.seq = 5;
    h.flags = static_cast<uint8_t>(wire::kFlagHello | flags);
    return encode_packet(h, std::vector<int32_t>{static_cast<int32_t>(world)});
  };
  for (uint16_t r = 0; r < 3; ++r) pkts.push_back(hello_pkt(kJob, kKey, r, 3, 0));
  pkts.push_back(hello_pkt(kJob, kKey, 1, 3, wire::kFlagRetransmit));  // WELCOME again
  pkts.push_back(hello_pkt(kJob, kKey, 1, 4, 0));                      // world mismatch
  pkts.push_back(hello_pkt(9, 0, 5, 100, wire::kFlagRetransmit));      // missing ranks (100)
  for (BlockSeq seq = 1; seq < 50; ++seq) {
    for (uint16_t r = 0; r < 3; ++r) {
      const auto slot = static_cast<uint16_t>(seq % 4);
      const bool shadow = (seq / 4) % 2 == 1;
      pkts.push_back(encode_packet(data_header(kJob, kKey, r, slot, shadow, seq, 8),
                                   std::vector<int32_t>(8, seq)));
      if (r == 1) {  // retransmission to the incomplete copy
        auto h = data_header(kJob, kKey, r, slot, shadow, seq, 8);
        h.flags = wire::kFlagRetransmit;
        pkts.push_back(encode_packet(h, std::vector<int32_t>(8, seq)));
      }
    }
    pkts.push_back(encode_packet(
        data_header(kJob, kKey, 0, static_cast<uint16_t>(seq % 4), (seq / 4) % 2 == 1, seq, 8),
        std::vector<int32_t>(8, seq)));  // resend result
  }
  // A poisoned round (rank 1 disagrees on the count): nothing, nothing, then the mismatch ERROR
  // to the last rank in and to a resend.
  for (uint16_t r = 0; r < 3; ++r) {
    pkts.push_back(encode_packet(data_header(kJob, kKey, r, 0, true, 100, r == 1 ? 3 : 8),
                                 std::vector<int32_t>(r == 1 ? 3 : 8, 1)));
  }
  pkts.push_back(
      encode_packet(data_header(kJob, kKey, 0, 0, true, 100, 8), std::vector<int32_t>(8, 1)));
  pkts.push_back({1, 2, 3});  // malformed
  pkts.push_back(encode_packet(data_header(kJob + 77, 1, 0, 0, false, 1, 1),
                               {std::vector<int32_t>{1}}));  // unknown job
  size_t replies = 0;
  int32_t rank;
  JobId job;
  const size_t before = testing::g_counted_allocs.load();
  {
    testing::CountAllocs counting;
    for (const auto& p : pkts) {
      if (engine_.on_packet(p, &rank, &job).target != Reply::Target::kNone) ++replies;
    }
  }
  EXPECT_EQ(testing::g_counted_allocs.load() - before, 0u);
  EXPECT_GT(replies, 150u);
  EXPECT_EQ(engine_.counters().completed, 49u);
  EXPECT_EQ(engine_.counters().mismatched, 3u);
  EXPECT_EQ(engine_.counters().resent_results, 49u);
  // The counter really counts: an allocation on a counting thread is seen.
  {
    testing::CountAllocs counting;
    void* volatile p = ::operator new(16);  // volatile: not elided
    ::operator delete(p);
  }
  EXPECT_EQ(testing::g_counted_allocs.load() - before, 1u);
}

TEST_F(EngineTest, BitmapWordsOfALargerWorld) {
  add(9, 0, 100);
  for (uint16_t r : {0, 31, 32, 63, 64, 99}) hello(r, 1, false, 100, 9, 0);
  const Sent s = hello(99, 1, true, 100, 9, 0);
  expect_error(s, wire::ErrorReason::kMissingRanks);
  EXPECT_EQ(s.hdr.count, 1 + 4);  // ceil(100 / 32) words
  EXPECT_EQ(error_bitmap(s), (std::vector<uint32_t>{0, 31, 32, 63, 64, 99}));
  // Low half of each uint64 first.
  EXPECT_EQ(static_cast<uint32_t>(s.payload[1]), 0x80000001u);
  EXPECT_EQ(static_cast<uint32_t>(s.payload[2]), 0x80000001u);
  EXPECT_EQ(static_cast<uint32_t>(s.payload[3]), 0x1u);
  EXPECT_EQ(static_cast<uint32_t>(s.payload[4]), 0x8u);
}

}  // namespace
}  // namespace ina::agg
