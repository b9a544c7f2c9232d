// Two-level aggregation trees in the aggregator engine: two leaf Engines and a root
// Engine wired in process (8 ranks, 4 per leaf) against a flat 8-rank Engine fed the same data,
// on a simulated network that shuffles, duplicates and drops packets in every direction, with
// simulated workers whose retransmission timer fires whenever the network goes quiet. Every rank's
// result of every block must equal the flat run's bitwise (payload and non-finite mark; float SUM
// goes through the PARTIAL exponent round, WIRE.md) and, for int32, the model (wrapping SUM, MIN,
// MAX). Plus the leaf's join barrier, the parent's
// packets it accepts or refuses, error bitmaps in global ranks (the root's missing leaves turned
// into the other leaves' ranks) and the configuration checks.
//
// Length: one suite over one subject; its cases share the helpers above them and each one is
// independent (run one with --gtest_filter).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "aggregator/engine.h"
#include "tests/aggregator/test_packets.h"

namespace ina::agg {
namespace {

using testing::encode_packet;
using testing::payload_words;

constexpr JobId kJob = 7;
constexpr uint64_t kKey = 0x5EC2E7;
constexpr uint32_t kWorld = 8;
constexpr uint32_t kPerLeaf = 4;
constexpr uint16_t kSlots = 4;
constexpr uint16_t kElems = 16;

// Node ids on the simulated network: workers are their ranks.
constexpr int kLeafNode = 100;  // + child index
constexpr int kRootNode = 200;
constexpr int kFlatNode = 300;

// A reply as the backend sends it: encoded, sealed with its job's key.
std::vector<uint8_t> encode_reply(const Reply& r) {
  std::vector<uint8_t> b = encode_packet(r.hdr, r.payload);
  wire::seal(b, r.key);
  return b;
}

JobConfig flat_job(uint32_t world) {
  JobConfig c;
  c.job = kJob;
  c.key = kKey;
  c.slots.world_size = world;
  c.slots.num_slots = kSlots;
  c.slots.max_payload_bytes = static_cast<uint32_t>(kElems) * 4;
  return c;
}

JobConfig leaf_job(uint32_t child, uint32_t rank_base, uint32_t local, uint32_t parent_world) {
  JobConfig c = flat_job(kWorld);
  c.tree.role = TreeRole::kLeaf;
  c.tree.child_index = child;
  c.tree.rank_base = rank_base;
  c.tree.local_ranks = local;
  c.tree.parent_world = parent_world;
  c.tree.parent = "root:1";
  return c;
}

// One block's data for every rank.
struct Block {
  DType dtype = DType::kInt32;
  ReduceOp op = ReduceOp::kSum;
  std::vector<std::vector<int32_t>> words;  // [rank][elem] (4-byte dtypes: the element's bits)
  std::vector<bool> nonfinite;              // [rank]: its block holds a NaN
};

// What a rank kept of a block's result.
struct Got {
  bool have = false;
  std::vector<int32_t> words;
  bool nonfinite = false;
};

const int32_t* W(const Reply& r) { return reinterpret_cast<const int32_t*>(r.payload); }

struct Msg {
  int from = 0;
  int to = 0;
  std::vector<uint8_t> bytes;
};

// A network of engines and simulated workers. `tree` chooses 2 leaves + root or one flat engine.
class Sim {
 public:
  Sim(bool tree, std::vector<Block> blocks, double drop_pct, double dup_pct, uint64_t seed,
      uint32_t leaf0_parent_world = 2)
      : tree_(tree), blocks_(std::move(blocks)), drop_(drop_pct), dup_(dup_pct), rng_(seed) {
    if (tree_) {
      EXPECT_TRUE(engines_[kLeafNode].add_job(leaf_job(0, 0, kPerLeaf, leaf0_parent_world)).ok());
      EXPECT_TRUE(engines_[kLeafNode + 1].add_job(leaf_job(1, kPerLeaf, kPerLeaf, 2)).ok());
      EXPECT_TRUE(engines_[kRootNode].add_job(flat_job(2)).ok());
    } else {
      EXPECT_TRUE(engines_[kFlatNode].add_job(flat_job(kWorld)).ok());
    }
    got_.assign(kWorld, std::vector<Got>(blocks_.size()));
    next_block_.assign(kWorld, 0);
    joined_.assign(kWorld, false);
    traffic_.assign(kWorld, Key128{});
  }

  // Runs to completion (every rank has every block's result) or fails after `max_timeouts`
  // retransmission rounds.
  void run(int max_timeouts = 400) {
    for (uint32_t r = 0; r < kWorld; ++r) send_hello(r, false);
    for (int t = 0; t <= max_timeouts; ++t) {
      drain();
      if (done()) return;
      ++timeouts_;
      // Every worker's timer: resend what has no answer yet.
      for (uint32_t r = 0; r < kWorld; ++r) {
        if (!joined_[r]) {
          send_hello(r, true);
          continue;
        }
        for (size_t b = 0; b < blocks_.size(); ++b) {
          if (b < next_block_[r] && !got_[r][b].have) send_data(r, b, true);
        }
      }
    }
    FAIL() << "not done after " << max_timeouts << " timeouts";
  }

  const Got& got(uint32_t rank, size_t block) const { return got_[rank][block]; }
  const Engine& engine(int node) { return engines_[node]; }
  int timeouts() const { return timeouts_; }

 private:
  int aggregator_of(uint32_t rank) const {
    return tree_ ? kLeafNode + static_cast<int>(rank / kPerLeaf) : kFlatNode;
  }
  bool done() const {
    for (uint32_t r = 0; r < kWorld; ++r) {
      for (const Got& g : got_[r]) {
        if (!g.have) return false;
      }
    }
    return true;
  }

  void send(int from, int to, std::vector<uint8_t> bytes) {
    std::uniform_real_distribution<double> pct(0.0, 100.0);
    if (pct(rng_) < drop_) return;
    if (pct(rng_) < dup_) net_.push_back(Msg{from, to, bytes});
    net_.push_back(Msg{from, to, std::move(bytes)});
  }

  void send_hello(uint32_t r, bool retransmit) {
    wire::Header h;
    h.tag = kKey;  // the key encode_packet() seals with
    h.flags = wire::kFlagHello | (retransmit ? wire::kFlagRetransmit : uint8_t{0});
    h.job = kJob;
    h.seq = nonce(r);
    h.rank = static_cast<uint16_t>(r);
    send(static_cast<int>(r), aggregator_of(r), encode_packet(h, std::vector<int32_t>{kWorld}));
  }

  void send_data(uint32_t r, size_t b, bool retransmit) {
    const Block& blk = blocks_[b];
    wire::Header h = testing::data_header(kJob, kKey, static_cast<uint16_t>(r),
                                          static_cast<uint16_t>(b % kSlots), (b / kSlots) % 2 == 1,
                                          static_cast<BlockSeq>(1000 + b), 0);
    h.flags = (retransmit ? wire::kFlagRetransmit : uint8_t{0}) |
              (blk.nonfinite[r] ? wire::kFlagNonFinite : uint8_t{0});
    h.dtype = blk.dtype;
    h.op = blk.op;
    std::vector<uint8_t> pkt = encode_packet(h, blk.words[r]);
    wire::seal(pkt, traffic_[r]);  // the incarnation's key (WIRE.md)
    send(static_cast<int>(r), aggregator_of(r), std::move(pkt));
  }

  static BlockSeq nonce(uint32_t r) { return 0xA000 + r; }  // the rank's incarnation nonce

  // A worker's receive path.
  void on_worker(uint32_t r, const std::vector<uint8_t>& bytes) {
    wire::PacketView p;
    ASSERT_EQ(wire::decode(bytes, &p), wire::DecodeError::kOk);
    const wire::Header& h = p.hdr;
    if (h.has(wire::kFlagError)) return;  // the timer resends
    ASSERT_TRUE(h.has(wire::kFlagResult));
    // A WELCOME carries the job's key, anything after it the incarnation's (WIRE.md).
    EXPECT_TRUE(wire::tag_ok(bytes, h.has(wire::kFlagHello) ? Key128{kKey} : traffic_[r]))
        << "rank " << r << " flags " << int{h.flags};
    if (h.has(wire::kFlagHello)) {
      if (joined_[r]) return;
      ASSERT_EQ(h.count, wire::kWelcomeWords);
      EXPECT_EQ(p.word(0), kSlots);
      EXPECT_EQ(p.word(1), kElems * 4);
      if (h.seq != nonce(r)) {
        // The barrier's notice to every rank: ask for this rank's own WELCOME at once.
        EXPECT_EQ(h.seq, 0u);
        send_hello(r, false);
        return;
      }
      traffic_[r] = wire::incarnation_key(Key128{kKey}, wire::welcome_epoch(p));
      joined_[r] = true;
      for (size_t b = 0; b < std::min<size_t>(kSlots, blocks_.size()); ++b) {
        send_data(r, b, false);
        next_block_[r] = b + 1;
      }
      return;
    }
    const size_t b = h.seq - 1000;
    ASSERT_LT(b, blocks_.size());
    ASSERT_EQ(h.slot, b % kSlots);
    ASSERT_EQ(h.shadow, (b / kSlots) % 2 == 1);
    Got& g = got_[r][b];
    if (g.have) {
      // A duplicate result must say the same.
      EXPECT_EQ(g.words, payload_words(p)) << "rank " << r << " block " << b;
      return;
    }
    g.have = true;
    g.words = payload_words(p);
    g.nonfinite = h.has(wire::kFlagNonFinite);
    EXPECT_EQ(h.dtype, blocks_[b].dtype);
    EXPECT_EQ(h.op, blocks_[b].op);
    // Blocks go out in order, each once the previous round on its slot is done.
    while (next_block_[r] < blocks_.size() && got_[r][next_block_[r] - kSlots].have) {
      send_data(r, next_block_[r], false);
      ++next_block_[r];
    }
  }

  void on_engine(int node, const Msg& m) {
    int32_t rank = -1;
    JobId job = 0;
    const Reply rep = engines_[node].on_packet(m.bytes, &rank, &job);
    if (rep.target == Reply::Target::kNone) return;
    const std::vector<uint8_t> out = encode_reply(rep);
    switch (rep.target) {
      case Reply::Target::kNone: return;
      case Reply::Target::kSender: send(node, m.from, out); return;
      case Reply::Target::kParent:
        ASSERT_TRUE(node == kLeafNode || node == kLeafNode + 1) << "kParent from node " << node;
        send(node, kRootNode, out);
        return;
      case Reply::Target::kAllRanks:
        if (node == kRootNode) {
          for (int c = 0; c < 2; ++c) send(node, kLeafNode + c, out);
        } else if (node == kFlatNode) {
          for (uint32_t r = 0; r < kWorld; ++r) send(node, static_cast<int>(r), out);
        } else {
          const uint32_t base = static_cast<uint32_t>(node - kLeafNode) * kPerLeaf;
          for (uint32_t r = base; r < base + kPerLeaf; ++r) send(node, static_cast<int>(r), out);
        }
        return;
    }
  }

  // Delivers in random order until nothing is in flight.
  void drain() {
    while (!net_.empty()) {
      const size_t i = rng_() % net_.size();
      Msg m = std::move(net_[i]);
      net_[i] = std::move(net_.back());
      net_.pop_back();
      if (m.to < static_cast<int>(kWorld)) {
        on_worker(static_cast<uint32_t>(m.to), m.bytes);
      } else {
        on_engine(m.to, m);
      }
    }
  }

  bool tree_;
  std::vector<Block> blocks_;
  double drop_, dup_;
  std::mt19937_64 rng_;
  std::map<int, Engine> engines_;
  std::vector<Key128> traffic_;  // [rank]: its incarnation's key, from its WELCOME
  std::vector<Msg> net_;
  std::vector<std::vector<Got>> got_;
  std::vector<size_t> next_block_;
  std::vector<bool> joined_;
  int timeouts_ = 0;
};

// Blocks of one dtype/op with random data (floats: finite values over many binades, one block
// with a NaN from one rank).
std::vector<Block> make_blocks(size_t n, DType dtype, ReduceOp op, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Block> out(n);
  for (size_t b = 0; b < n; ++b) {
    Block& blk = out[b];
    blk.dtype = dtype;
    blk.op = op;
    const bool fl = dtype != DType::kInt32;
    const size_t count = b % 3 == 2 ? kElems - 3 : kElems;  // a short last block now and then
    blk.words.assign(kWorld, std::vector<int32_t>(count));
    blk.nonfinite.assign(kWorld, false);
    for (uint32_t r = 0; r < kWorld; ++r) {
      // Large values: the int32 sum wraps, which must not matter.
      for (int32_t& w : blk.words[r]) {
        w = static_cast<int32_t>(rng());
        if (fl) {
          const float f = std::ldexp(static_cast<float>(static_cast<int32_t>(rng()) >> 8),
                                     static_cast<int>(rng() % 40) - 30);
          w = std::bit_cast<int32_t>(f);
        }
      }
    }
    if (fl && b == 5) {
      blk.nonfinite[6] = true;
      blk.words[6][0] = 0x7FC00000;  // NaN
    }
  }
  return out;
}

// The model of one block's result.
std::vector<int32_t> model(const Block& blk) {
  std::vector<int32_t> acc = blk.words[0];
  for (uint32_t r = 1; r < kWorld; ++r) {
    for (size_t i = 0; i < acc.size(); ++i) {
      const int32_t v = blk.words[r][i];
      switch (blk.op) {
        case ReduceOp::kSum:
          acc[i] = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) + static_cast<uint32_t>(v));
          break;
        case ReduceOp::kMin: acc[i] = std::min(acc[i], v); break;
        case ReduceOp::kMax: acc[i] = std::max(acc[i], v); break;
      }
    }
  }
  return acc;
}

struct Case {
  DType dtype;
  ReduceOp op;
  double drop;
  double dup;
};

class TreeVsFlat : public ::testing::TestWithParam<Case> {};

TEST_P(TreeVsFlat, EveryRankGetsTheFlatResultBitwise) {
  const Case c = GetParam();
  uint64_t reforwards = 0, parent_results = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::vector<Block> blocks = make_blocks(24, c.dtype, c.op, seed);
    Sim tree(true, blocks, c.drop, c.dup, seed * 77);
    Sim flat(false, blocks, c.drop, c.dup, seed * 77);
    tree.run();
    flat.run();
    if (::testing::Test::HasFatalFailure()) return;
    for (size_t b = 0; b < blocks.size(); ++b) {
      const std::vector<int32_t> want = model(blocks[b]);
      bool want_nonfinite = false;
      for (uint32_t r = 0; r < kWorld; ++r)
        want_nonfinite = want_nonfinite || blocks[b].nonfinite[r];
      for (uint32_t r = 0; r < kWorld; ++r) {
        const Got& t = tree.got(r, b);
        const Got& f = flat.got(r, b);
        ASSERT_TRUE(t.have && f.have);
        EXPECT_EQ(t.words, f.words) << "rank " << r << " block " << b;
        if (c.dtype == DType::kInt32) {
          EXPECT_EQ(t.words, want) << "rank " << r << " block " << b;
        }
        EXPECT_EQ(t.nonfinite, f.nonfinite);
        EXPECT_EQ(t.nonfinite, want_nonfinite);
      }
    }
    for (int leaf = 0; leaf < 2; ++leaf) {
      const EngineCounters& lc = tree.engine(kLeafNode + leaf).counters();
      // Each block completes once per leaf and is forwarded once, plus re-forwards.
      EXPECT_EQ(lc.completed, blocks.size());
      EXPECT_EQ(lc.forwarded, blocks.size());
      EXPECT_EQ(lc.parent_results, blocks.size());
      EXPECT_EQ(lc.malformed, 0u);
      const JobCounters* jc = tree.engine(kLeafNode + leaf).job_counters(kJob);
      ASSERT_NE(jc, nullptr);
      EXPECT_TRUE(jc->parent_joined);
      EXPECT_EQ(jc->forwarded, blocks.size());
      reforwards += lc.reforwarded;
      parent_results += lc.parent_results;
    }
    EXPECT_EQ(tree.engine(kRootNode).counters().completed, blocks.size());
    EXPECT_EQ(tree.engine(kRootNode).counters().malformed, 0u);
    if (c.drop == 0 && c.dup == 0) {
      EXPECT_EQ(tree.timeouts(), 0);
      EXPECT_EQ(tree.engine(kLeafNode).counters().reforwarded, 0u);
    }
  }
  if (c.drop > 0) {
    // Loss between leaf and root was repaired by re-forwarding on the workers' retransmissions.
    EXPECT_GT(reforwards, 0u);
  }
  EXPECT_GT(parent_results, 0u);
}

INSTANTIATE_TEST_SUITE_P(Ops, TreeVsFlat,
                         ::testing::Values(Case{DType::kInt32, ReduceOp::kSum, 0, 0},
                                           Case{DType::kInt32, ReduceOp::kSum, 10, 5},
                                           Case{DType::kFloat32, ReduceOp::kSum, 0, 0},
                                           Case{DType::kFloat32, ReduceOp::kSum, 10, 5},
                                           Case{DType::kInt32, ReduceOp::kMin, 10, 5},
                                           Case{DType::kFloat32, ReduceOp::kMax, 10, 5},
                                           Case{DType::kFloat32, ReduceOp::kMin, 0, 0}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string s = i.param.dtype == DType::kInt32 ? "int32_" : "float32_";
                           s += i.param.op == ReduceOp::kSum   ? "sum"
                                : i.param.op == ReduceOp::kMin ? "min"
                                                               : "max";
                           s += i.param.drop > 0 ? "_lossy" : "_clean";
                           return s;
                         });

// A leaf with an unknown parent world guesses it, learns the root's from its ERROR and joins.
TEST(TreeLeaf, LearnsTheParentWorldFromTheRoot) {
  const std::vector<Block> blocks = make_blocks(8, DType::kInt32, ReduceOp::kSum, 3);
  // Leaf 0 has no parent world configured: its guess, ceil(8 / 4) = 2, is right for even leaves.
  Sim tree(true, blocks, 0, 0, 5, /*leaf0_parent_world=*/0);
  tree.run();
  EXPECT_EQ(tree.engine(kLeafNode).counters().parent_errors, 0u);
  EXPECT_EQ(tree.got(0, 7).words, model(blocks[7]));

  // Uneven leaves: 8 ranks as 4 + 2 + 2 (3 leaves); the 4-rank leaf guesses ceil(8/4) = 2.
  Engine leaf;
  JobConfig lc = leaf_job(0, 0, 4, 0);
  ASSERT_TRUE(leaf.add_job(lc).ok());
  Engine root;
  ASSERT_TRUE(root.add_job(flat_job(3)).ok());
  int32_t rank;
  JobId job;
  Reply up;
  for (uint16_t r = 0; r < 4; ++r) {
    wire::Header h = testing::hello_header(kJob, kKey, r, 50 + r);
    up = leaf.on_packet(encode_packet(h, std::vector<int32_t>{kWorld}), &rank, &job);
  }
  ASSERT_EQ(up.target, Reply::Target::kParent);
  ASSERT_TRUE(up.hdr.has(wire::kFlagHello));
  EXPECT_EQ(up.hdr.rank, 0);
  EXPECT_EQ(W(up)[0], 2);  // the guess
  const Reply err = root.on_packet(encode_reply(up), &rank, &job);
  ASSERT_TRUE(err.hdr.has(wire::kFlagError));
  EXPECT_EQ(W(err)[1], 3);
  const Reply again = leaf.on_packet(encode_reply(err), &rank, &job);
  EXPECT_EQ(rank, -1);  // the parent is not a rank of the leaf
  ASSERT_EQ(again.target, Reply::Target::kParent);
  EXPECT_EQ(W(again)[0], 3);
  EXPECT_EQ(leaf.counters().parent_errors, 1u);
  EXPECT_EQ(root.on_packet(encode_reply(again), &rank, &job).target,
            Reply::Target::kNone);  // joined; the root waits for its other two leaves
  EXPECT_EQ(rank, 0);
}

// The epoch a test that plays a leaf's parent names in its WELCOME.
constexpr uint64_t kParentEpoch = 0x7EA7'0000'0001ull;

// Seals as a leaf's workers do (DATA: the leaf's epoch) and as its parent does (RESULT, ERROR:
// `parent`'s epoch) (WIRE.md, "Incarnations").
testing::EpochOf leaf_and_parent_epochs(const Engine& leaf, const uint64_t& parent) {
  return [&leaf, &parent](JobId job, uint8_t flags) {
    return (flags & (wire::kFlagResult | wire::kFlagError)) != 0 ? parent : leaf.epoch(job);
  };
}

// The parent's WELCOME to the leaf's HELLO `nonce`: [slots, block bytes, epoch].
wire::Header parent_welcome(BlockSeq nonce) {
  wire::Header h;
  h.tag = kKey;  // the key encode_packet() seals with
  h.flags = wire::kFlagHello | wire::kFlagResult;
  h.job = kJob;
  h.seq = nonce;
  return h;
}
std::vector<int32_t> welcome_words(int32_t slots, int32_t bytes, uint64_t epoch) {
  return {slots, bytes, static_cast<int32_t>(epoch), static_cast<int32_t>(epoch >> 32)};
}

// Below the fixture: a leaf's reply fed into a root; a root every leaf has joined.
Reply to_root(Engine& root, const Reply& up);
void join_root(Engine& root, uint32_t leaves, const Reply& leaf_hello, uint16_t leaf_child);

class TreeLeafUnit : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(leaf_.add_job(leaf_job(1, 4, 4, 2)).ok()); }

  Reply send(const wire::Header& h, const std::vector<int32_t>& payload) {
    Reply r = leaf_.on_packet(encode_packet(h, payload), &rank_, &job_);
    if (r.target == Reply::Target::kParent && r.hdr.has(wire::kFlagHello)) {
      parent_nonce_ = r.hdr.seq;  // what the parent's WELCOME names
    }
    return r;
  }
  Reply hello(uint16_t global_rank, BlockSeq nonce, bool retransmit = false) {
    wire::Header h;
    h.tag = kKey;  // the key encode_packet() seals with
    h.flags = wire::kFlagHello | (retransmit ? wire::kFlagRetransmit : uint8_t{0});
    h.job = kJob;
    h.seq = nonce;
    h.rank = global_rank;
    return send(h, {static_cast<int32_t>(kWorld)});
  }
  Reply welcome_from_parent(int32_t slots = kSlots, int32_t elems = kElems) {
    return send(parent_welcome(parent_nonce_), welcome_words(slots, elems, parent_epoch_));
  }
  Reply data(uint16_t global_rank, uint16_t slot, BlockSeq seq, int32_t v,
             bool retransmit = false) {
    wire::Header h = testing::data_header(kJob, kKey, global_rank, slot, false, seq, 2);
    if (retransmit) h.flags |= wire::kFlagRetransmit;
    return send(h, {v, v * 2});
  }
  void join_all() {
    for (uint16_t r = 4; r < 8; ++r) hello(r, 900 + r);
    const Reply w = welcome_from_parent();
    ASSERT_EQ(w.target, Reply::Target::kAllRanks);
  }
  // This leaf (leaf 1 of 2) and `root` joined for real: the root's WELCOME to the leaf's HELLO,
  // with the root's epoch, reaches the local ranks.
  void join_under(Engine& root) {
    for (uint16_t r = 4; r < 7; ++r) hello(r, 900 + r);
    const Reply up_hello = hello(7, 907);
    join_root(root, 2, up_hello, 1);
    parent_epoch_ = root.epoch(kJob);
    ASSERT_EQ(to_root(leaf_, to_root(root, up_hello)).target, Reply::Target::kAllRanks);
  }

  Engine leaf_;
  int32_t rank_ = -1;
  JobId job_ = 0;
  BlockSeq parent_nonce_ = 0;  // of the leaf's last HELLO to its parent
  uint64_t parent_epoch_ = kParentEpoch;
  testing::ScopedEpochOf epochs_{leaf_and_parent_epochs(leaf_, parent_epoch_)};
};

TEST_F(TreeLeafUnit, WelcomesItsRanksOnlyAfterTheParentWelcomedIt) {
  for (uint16_t r = 4; r < 7; ++r) {
    EXPECT_EQ(hello(r, 900 + r).target, Reply::Target::kNone);
    EXPECT_EQ(rank_, r - 4);  // the backend's address table index: the served rank
  }
  // A rank of another leaf is not served here.
  EXPECT_EQ(hello(2, 77).target, Reply::Target::kNone);
  EXPECT_EQ(rank_, -1);
  const Reply up = hello(7, 907);
  ASSERT_EQ(up.target, Reply::Target::kParent);
  EXPECT_EQ(up.hdr.flags, wire::kFlagHello);
  EXPECT_EQ(up.hdr.rank, 1);  // child_index
  EXPECT_EQ(up.hdr.job, kJob);
  EXPECT_EQ(W(up)[0], 2);
  const BlockSeq nonce = up.hdr.seq;
  EXPECT_FALSE(leaf_.job_ready(kJob));
  // Data before the parent's WELCOME is not taken: there is no incarnation yet whose key it
  // could carry.
  EXPECT_EQ(data(4, 0, 1, 5).target, Reply::Target::kNone);
  EXPECT_EQ(leaf_.counters().bad_tag, 1u);
  // A worker's retransmitted HELLO repeats the leaf's HELLO to the parent, same nonce.
  const Reply re = hello(5, 905, true);
  ASSERT_EQ(re.target, Reply::Target::kParent);
  EXPECT_EQ(re.hdr.seq, nonce);
  EXPECT_TRUE(re.hdr.has(wire::kFlagRetransmit));
  // The parent's WELCOME (with a smaller window) goes to the local ranks, capped.
  // Only the WELCOME naming the leaf's HELLO: the parent's notice (seq 0) gets that HELLO again.
  const Reply notice = send(parent_welcome(0), welcome_words(2, 100, parent_epoch_));
  ASSERT_EQ(notice.target, Reply::Target::kParent);
  EXPECT_EQ(notice.hdr.seq, nonce);
  EXPECT_FALSE(leaf_.job_ready(kJob));
  const Reply w = welcome_from_parent(2, 100);
  ASSERT_EQ(w.target, Reply::Target::kAllRanks);
  EXPECT_EQ(w.hdr.flags, wire::kFlagHello | wire::kFlagResult);
  EXPECT_EQ(w.hdr.seq, 0u);  // the leaf's own notice to its ranks
  EXPECT_EQ(W(w)[0], 2);
  EXPECT_EQ(W(w)[1], kElems * 4);  // bytes: at most what this leaf holds
  EXPECT_TRUE(leaf_.job_ready(kJob));
  const uint64_t epoch = leaf_.epoch(kJob);
  EXPECT_NE(epoch, 0u);
  EXPECT_NE(epoch, parent_epoch_);  // the leaf names its ranks' incarnation itself
  // A second WELCOME from the parent is stale; a worker's lost WELCOME is answered here.
  EXPECT_EQ(welcome_from_parent().target, Reply::Target::kNone);
  EXPECT_EQ(leaf_.counters().parent_stale, 2u);  // and the notice
  const Reply again = hello(6, 906, true);
  EXPECT_EQ(again.target, Reply::Target::kSender);
  EXPECT_EQ(again.hdr.seq, 906u);
  EXPECT_EQ(W(again)[2], static_cast<int32_t>(epoch));

  // A new incarnation of rank 6 alone does not disturb the running ranks; once every local rank
  // has a new incarnation (the job restarted), the leaf rejoins the parent with another nonce.
  EXPECT_EQ(hello(6, 5555).target, Reply::Target::kNone);
  EXPECT_TRUE(leaf_.job_ready(kJob));
  EXPECT_TRUE(leaf_.job_counters(kJob)->parent_joined);
  hello(4, 5554);
  hello(5, 5553);
  const Reply up2 = hello(7, 5557);
  EXPECT_FALSE(leaf_.job_ready(kJob));
  EXPECT_FALSE(leaf_.job_counters(kJob)->parent_joined);
  ASSERT_EQ(up2.target, Reply::Target::kParent);
  EXPECT_NE(up2.hdr.seq, nonce);
  // Until the parent WELCOMEs the new leaf incarnation the previous one's key stands: a rank
  // still running it is told the job is not ready.
  EXPECT_EQ(leaf_.epoch(kJob), epoch);
  EXPECT_EQ(data(4, 0, 1, 5).target, Reply::Target::kNone);
  EXPECT_EQ(leaf_.counters().not_ready, 1u);
  const Reply not_ready = data(4, 0, 1, 5, true);
  ASSERT_TRUE(not_ready.hdr.has(wire::kFlagError));
  EXPECT_EQ(W(not_ready)[0], static_cast<int32_t>(wire::ErrorReason::kJobNotReady));
  // The parent's WELCOME: a new epoch, under whose key the old rank's DATA no longer verifies.
  ASSERT_EQ(welcome_from_parent().target, Reply::Target::kAllRanks);
  EXPECT_NE(leaf_.epoch(kJob), epoch);
  const uint64_t bad_tag = leaf_.counters().bad_tag;
  testing::epoch_of() = [epoch](JobId, uint8_t) { return epoch; };
  EXPECT_EQ(data(4, 0, 1, 5).target, Reply::Target::kNone);
  EXPECT_EQ(leaf_.counters().bad_tag, bad_tag + 1);
}

TEST_F(TreeLeafUnit, ForwardsPartialsAndTakesOnlyTheResultItWaitsFor) {
  join_all();
  for (uint16_t r = 4; r < 7; ++r) EXPECT_EQ(data(r, 1, 10, r).target, Reply::Target::kNone);
  const Reply up = data(7, 1, 10, 7);
  ASSERT_EQ(up.target, Reply::Target::kParent);
  EXPECT_EQ(up.hdr.flags, 0);
  EXPECT_EQ(up.hdr.rank, 1);
  EXPECT_EQ(up.hdr.slot, 1);
  EXPECT_EQ(up.hdr.seq, 10u);
  ASSERT_EQ(up.hdr.count, 2);
  EXPECT_EQ(W(up)[0], 4 + 5 + 6 + 7);
  EXPECT_EQ(W(up)[1], 2 * (4 + 5 + 6 + 7));

  // A plain duplicate while waiting: nothing; a retransmission re-forwards the partial.
  EXPECT_EQ(data(5, 1, 10, 5).target, Reply::Target::kNone);
  const Reply ref = data(5, 1, 10, 5, true);
  ASSERT_EQ(ref.target, Reply::Target::kParent);
  EXPECT_TRUE(ref.hdr.has(wire::kFlagRetransmit));
  EXPECT_EQ(W(ref)[0], 22);
  EXPECT_EQ(leaf_.counters().reforwarded, 1u);
  // The same wave of timeouts at the other ranks does not send it again; rank 5's next
  // timeout (a new wave) does.
  EXPECT_EQ(data(6, 1, 10, 6, true).target, Reply::Target::kNone);
  EXPECT_EQ(data(4, 1, 10, 4, true).target, Reply::Target::kNone);
  EXPECT_EQ(data(5, 1, 10, 5, true).target, Reply::Target::kParent);
  EXPECT_EQ(leaf_.counters().reforwarded, 2u);

  // Retransmitted data with an incomplete copy: the bitmap names global ranks, other leaves'
  // ranks marked present.
  data(4, 2, 11, 1);
  const Reply miss = data(4, 2, 11, 1, true);
  ASSERT_TRUE(miss.hdr.has(wire::kFlagError));
  EXPECT_EQ(miss.hdr.rank, 4);
  EXPECT_EQ(testing::ranks_in_bitmap(W(miss) + 1, 1), (std::vector<uint32_t>{0, 1, 2, 3, 4}));

  wire::Header res = up.hdr;

  res.tag = kKey;  // sealed as the root seals it
  res.flags = wire::kFlagResult;
  res.rank = 0;
  // Not sealed with the job's key (a forged parent answer): a bad tag, no state.
  wire::Header bad = res;
  bad.tag = kKey ^ 1;
  EXPECT_EQ(send(bad, {1, 2}).target, Reply::Target::kNone);
  EXPECT_EQ(leaf_.counters().bad_tag, 1u);
  // Wrong round or an idle copy: stale.
  bad = res;
  bad.seq = 9;
  EXPECT_EQ(send(bad, {1, 2}).target, Reply::Target::kNone);
  bad = res;
  bad.slot = 3;
  EXPECT_EQ(send(bad, {1, 2}).target, Reply::Target::kNone);
  bad = res;
  bad.slot = 2;  // incomplete copy
  bad.seq = 11;
  EXPECT_EQ(send(bad, {1, 2}).target, Reply::Target::kNone);
  EXPECT_EQ(leaf_.counters().parent_stale, 3u);

  const Reply down = send(res, {100, 200});
  ASSERT_EQ(down.target, Reply::Target::kAllRanks);
  EXPECT_TRUE(down.hdr.has(wire::kFlagResult));
  EXPECT_EQ(down.hdr.rank, 0);
  EXPECT_EQ(down.hdr.seq, 10u);
  EXPECT_EQ(W(down)[0], 100);
  EXPECT_EQ(W(down)[1], 200);
  EXPECT_EQ(leaf_.counters().parent_results, 1u);
  // The parent's duplicate is stale now; a worker's retransmission gets the kept result.
  EXPECT_EQ(send(res, {100, 200}).target, Reply::Target::kNone);
  const Reply kept = data(6, 1, 10, 6, true);
  ASSERT_EQ(kept.target, Reply::Target::kSender);
  EXPECT_TRUE(kept.hdr.has(wire::kFlagRetransmit));
  EXPECT_EQ(W(kept)[0], 100);

  // A flat job takes no RESULT at all (sealed with its incarnation's key, as a worker would).
  Engine flat;
  ASSERT_TRUE(flat.add_job(flat_job(kWorld)).ok());
  for (uint16_t r = 0; r < kWorld; ++r) {
    flat.on_packet(
        encode_packet(testing::hello_header(kJob, kKey, r, 10 + r), std::vector<int32_t>{kWorld}),
        &rank_, &job_);
  }
  ASSERT_TRUE(flat.job_ready(kJob));
  std::vector<uint8_t> rb = encode_packet(res, std::vector<int32_t>{1, 2});
  wire::seal(rb, wire::incarnation_key(Key128{kKey}, flat.epoch(kJob)));
  EXPECT_EQ(flat.on_packet(rb, &rank_, &job_).target, Reply::Target::kNone);
  EXPECT_EQ(flat.counters().bad_tag, 0u);
  EXPECT_EQ(flat.counters().malformed, 1u);
}

TEST_F(TreeLeafUnit, StalledSlotsNameGlobalRanksAndTheParentWait) {
  join_all();
  int32_t rank;
  JobId job;
  wire::Header h = testing::data_header(kJob, kKey, 5, 0, false, 3, 2);
  leaf_.on_packet(encode_packet(h, std::vector<int32_t>{1, 1}), 1000, &rank, &job);
  for (uint16_t r : {4, 6, 7}) {
    h.rank = r;
    h.slot = 1;
    leaf_.on_packet(encode_packet(h, std::vector<int32_t>{1, 1}), 1000, &rank, &job);
  }
  h.rank = 5;
  leaf_.on_packet(encode_packet(h, std::vector<int32_t>{1, 1}), 1000, &rank, &job);  // slot 1 done
  const std::vector<StalledSlot> st = leaf_.stalled_slots(kJob, 5000, 10);
  ASSERT_EQ(st.size(), 2u);
  for (const StalledSlot& s : st) {
    if (s.slot == 0) {
      EXPECT_FALSE(s.waiting_parent);
      EXPECT_EQ(s.missing, (std::vector<uint32_t>{4, 6, 7}));
    } else {
      EXPECT_TRUE(s.waiting_parent);
      EXPECT_TRUE(s.missing.empty());
    }
  }
  // The root reports leaf 0 missing for slot 1's round: the stalled slot names ranks 0-3.
  wire::Header e = h;
  e.flags = wire::kFlagError;
  e.slot = 1;
  e.rank = 1;
  ASSERT_EQ(send(e, {static_cast<int32_t>(wire::ErrorReason::kMissingRanks), 0b10}).target,
            Reply::Target::kAllRanks);
  for (const StalledSlot& s : leaf_.stalled_slots(kJob, 5000, 10)) {
    if (s.slot != 1) continue;
    EXPECT_TRUE(s.waiting_parent);
    EXPECT_EQ(s.missing, (std::vector<uint32_t>{0, 1, 2, 3}));
  }
}

// Feeds a leaf's reply (to its parent) into a root engine; returns the root's reply.
Reply to_root(Engine& root, const Reply& up) {
  int32_t rank;
  JobId job;
  return root.on_packet(encode_reply(up), &rank, &job);
}

// A root of `leaves` ranks that every leaf has joined (this fixture's leaf with its real HELLO).
void join_root(Engine& root, uint32_t leaves, const Reply& leaf_hello, uint16_t leaf_child) {
  JobConfig rc = flat_job(leaves);
  rc.tree.role = TreeRole::kRoot;
  ASSERT_TRUE(root.add_job(rc).ok());
  for (uint16_t c = 0; c < leaves; ++c) {
    if (c == leaf_child) {
      to_root(root, leaf_hello);
      continue;
    }
    wire::Header h = testing::hello_header(kJob, kKey, c, 4000 + c);
    int32_t rank;
    JobId job;
    root.on_packet(encode_packet(h, std::vector<int32_t>{static_cast<int32_t>(leaves)}), &rank,
                   &job);
  }
  ASSERT_TRUE(root.job_ready(kJob));
}

TEST_F(TreeLeafUnit, TurnsTheRootsMissingLeavesIntoGlobalRanksForItsWorkers) {
  for (uint16_t r = 4; r < 7; ++r) hello(r, 900 + r);
  const Reply up_hello = hello(7, 907);
  ASSERT_EQ(up_hello.target, Reply::Target::kParent);
  Engine root;
  join_root(root, 2, up_hello, 1);
  // The root's notice, then its WELCOME to the leaf's HELLO, with the root's epoch.
  parent_epoch_ = root.epoch(kJob);
  const Reply w = to_root(root, up_hello);
  ASSERT_EQ(w.hdr.seq, up_hello.hdr.seq);
  ASSERT_EQ(to_root(leaf_, w).target, Reply::Target::kAllRanks);

  for (uint16_t r = 4; r < 7; ++r) data(r, 1, 10, r);
  const Reply up = data(7, 1, 10, 7);
  ASSERT_EQ(up.target, Reply::Target::kParent);
  EXPECT_EQ(to_root(root, up).target, Reply::Target::kNone);  // leaf 0 has not sent: waits
  // Before the root said anything, a retransmission that does not re-forward gets nothing.
  const Reply ref = data(5, 1, 10, 5, true);
  ASSERT_EQ(ref.target, Reply::Target::kParent);
  EXPECT_EQ(data(6, 1, 10, 6, true).target, Reply::Target::kNone);
  // The root answers the re-forward with its bitmap of leaves (leaf 1 present, leaf 0 missing).
  const Reply root_err = to_root(root, ref);
  ASSERT_TRUE(root_err.hdr.has(wire::kFlagError));
  ASSERT_EQ(root_err.hdr.count, 2);
  EXPECT_EQ(testing::ranks_in_bitmap(W(root_err) + 1, 1), (std::vector<uint32_t>{1}));

  // The leaf turns it into global ranks (0-3 missing: leaf 0 by the balanced rule) for all its
  // ranks at once, with the tree note naming leaf 0 and the rule.
  const Reply down = to_root(leaf_, root_err);  // the leaf takes it like any packet
  ASSERT_EQ(down.target, Reply::Target::kAllRanks);
  ASSERT_TRUE(down.hdr.has(wire::kFlagError));
  EXPECT_EQ(down.hdr.seq, 10u);
  EXPECT_EQ(down.hdr.slot, 1);
  ASSERT_EQ(down.hdr.count, 1 + 1 + 3 + 1);
  EXPECT_EQ(W(down)[0], static_cast<int32_t>(wire::ErrorReason::kMissingRanks));
  EXPECT_EQ(testing::ranks_in_bitmap(W(down) + 1, 1), (std::vector<uint32_t>{4, 5, 6, 7}));
  EXPECT_EQ(static_cast<uint32_t>(W(down)[2]), wire::kTreeNoteTag);
  EXPECT_EQ(static_cast<uint32_t>(W(down)[3]), wire::kTreeNoteByRule);
  EXPECT_EQ(W(down)[4], 1);  // one leaf missing
  EXPECT_EQ(W(down)[5], 0);  // leaf 0
  EXPECT_EQ(leaf_.counters().parent_missing, 1u);

  // Later retransmissions of this wave get the same report unicast, naming the global rank.
  const Reply again = data(6, 1, 10, 6, true);
  ASSERT_EQ(again.target, Reply::Target::kSender);
  ASSERT_TRUE(again.hdr.has(wire::kFlagError));
  EXPECT_EQ(again.hdr.rank, 6);
  EXPECT_EQ(again.hdr.seq, 10u);
  EXPECT_EQ(testing::ranks_in_bitmap(W(again) + 1, 1), (std::vector<uint32_t>{4, 5, 6, 7}));
  // The re-forwarding rank still re-forwards (the partial or the result may be lost).
  EXPECT_EQ(data(5, 1, 10, 5, true).target, Reply::Target::kParent);

  // A report about another round of the copy is stale and changes nothing.
  wire::Header old = root_err.hdr;
  old.tag = kKey;  // sealed as the root seals it
  old.seq = 9;
  const size_t stale0 = leaf_.counters().parent_stale;
  EXPECT_EQ(send(old, {1, 2}).target, Reply::Target::kNone);
  EXPECT_EQ(leaf_.counters().parent_stale, stale0 + 1);

  // Leaf 0's partial arrives: the root completes, the leaf multicasts the result, and a
  // retransmission now gets the result, not the old report.
  wire::Header d0 = up.hdr;
  d0.rank = 0;
  std::vector<uint8_t> b0 = encode_packet(d0, std::vector<int32_t>{1, 1});
  wire::seal(b0, wire::incarnation_key(Key128{kKey}, root.epoch(kJob)));  // as leaf 0 seals it
  const Reply res = root.on_packet(b0, &rank_, &job_);
  ASSERT_EQ(res.target, Reply::Target::kAllRanks);
  const Reply res_down = to_root(leaf_, res);
  ASSERT_EQ(res_down.target, Reply::Target::kAllRanks);
  EXPECT_EQ(W(res_down)[0], 4 + 5 + 6 + 7 + 1);
  const Reply kept = data(6, 1, 10, 6, true);
  ASSERT_EQ(kept.target, Reply::Target::kSender);
  EXPECT_TRUE(kept.hdr.has(wire::kFlagResult));
  EXPECT_FALSE(kept.hdr.has(wire::kFlagError));
}

// A worker's ERROR kAborted (it gave up at its deadline) for `seq` in `slot`.
wire::Header abort_header(uint16_t global_rank, uint16_t slot, BlockSeq seq) {
  wire::Header h = testing::data_header(kJob, kKey, global_rank, slot, false, seq, 3);
  h.flags = wire::kFlagError;
  return h;
}
std::vector<int32_t> abort_words(uint16_t global_rank) {
  return {static_cast<int32_t>(wire::ErrorReason::kAborted), global_rank,
          static_cast<int32_t>(wire::kAbortDeadline)};
}
// A packet of leaf 0 (simulated) to the root, sealed as leaf 0 seals it: with the key of the
// root's incarnation.
Reply from_leaf0(Engine& root, const wire::Header& h, const std::vector<int32_t>& words) {
  std::vector<uint8_t> b = encode_packet(h, words);
  wire::seal(b, wire::incarnation_key(Key128{kKey}, root.epoch(kJob)));
  int32_t rank;
  JobId job;
  return root.on_packet(b, &rank, &job);
}

// Leaf 0 gave up on a round (its ranks' deadline passed) while this leaf, leaf 1, was late: the
// root's round is aborted, so this leaf's partial gets the abort, which every rank of this leaf
// gets too; nobody gets a result. Without the relay's abort handling, leaf 1's ranks would wait
// out their own deadline (or, had leaf 0 not told the root, succeed where leaf 0's ranks failed).
TEST_F(TreeLeafUnit, ALateLeafFailsTheRoundAnotherLeafGaveUpOn) {
  Engine root;
  ASSERT_NO_FATAL_FAILURE(join_under(root));

  // Leaf 0's partial is in at the root, then leaf 0 passes its ranks' abort on.
  EXPECT_EQ(from_leaf0(root, testing::data_header(kJob, kKey, 0, 1, false, 10, 2), {1, 1}).target,
            Reply::Target::kNone);
  // The root answers the abort with itself (it came before the round completed), with the tree
  // note tag: leaf 0 relays it to its ranks.
  const Reply ack = from_leaf0(root, abort_header(0, 1, 10), abort_words(0));
  ASSERT_EQ(ack.target, Reply::Target::kSender);
  ASSERT_EQ(ack.hdr.count, 4);
  EXPECT_EQ(W(ack)[0], static_cast<int32_t>(wire::ErrorReason::kAborted));
  EXPECT_EQ(static_cast<uint32_t>(W(ack)[3]), wire::kTreeNoteTag);
  EXPECT_EQ(root.counters().aborted_rounds, 1u);

  // Leaf 1's ranks come late: its partial goes up and the root answers with the abort.
  for (uint16_t r = 4; r < 7; ++r) data(r, 1, 10, r);
  const Reply up = data(7, 1, 10, 7);
  ASSERT_EQ(up.target, Reply::Target::kParent);
  const Reply root_abort = to_root(root, up);
  ASSERT_EQ(root_abort.target, Reply::Target::kSender);
  ASSERT_TRUE(root_abort.hdr.has(wire::kFlagError));
  ASSERT_EQ(root_abort.hdr.count, 4);  // the tree note tag: not a rank's own abort
  EXPECT_EQ(W(root_abort)[0], static_cast<int32_t>(wire::ErrorReason::kAborted));
  EXPECT_EQ(static_cast<uint32_t>(W(root_abort)[3]), wire::kTreeNoteTag);

  const Reply down = to_root(leaf_, root_abort);
  ASSERT_EQ(down.target, Reply::Target::kAllRanks);
  EXPECT_EQ(down.hdr.flags, wire::kFlagError);
  EXPECT_EQ(down.hdr.seq, 10u);
  EXPECT_EQ(down.hdr.slot, 1);
  ASSERT_EQ(down.hdr.count, 3);
  EXPECT_EQ(W(down)[0], static_cast<int32_t>(wire::ErrorReason::kAborted));
  EXPECT_EQ(W(down)[1], 0);  // leaf 0's first global rank
  EXPECT_EQ(W(down)[2], static_cast<int32_t>(wire::kAbortDeadline));
  // A rank that lost it asks again and gets it again; the root never produced a result.
  const Reply again = data(6, 1, 10, 6, true);
  ASSERT_EQ(again.target, Reply::Target::kSender);
  EXPECT_EQ(again.hdr.flags, wire::kFlagError);
  EXPECT_EQ(again.hdr.rank, 6);
  EXPECT_EQ(W(again)[0], static_cast<int32_t>(wire::ErrorReason::kAborted));
  EXPECT_EQ(root.counters().completed, 0u);
}

// This leaf's ranks gave up while leaf 0 was late: the leaf passes the abort on to the root, so
// leaf 0's late partial cannot complete the root's round (its ranks fail too, instead of
// succeeding where this leaf's failed).
TEST_F(TreeLeafUnit, PassesItsRanksAbortToTheRoot) {
  Engine root;
  ASSERT_NO_FATAL_FAILURE(join_under(root));

  for (uint16_t r = 4; r < 7; ++r) data(r, 1, 10, r);
  const Reply up = data(7, 1, 10, 7);
  EXPECT_EQ(to_root(root, up).target, Reply::Target::kNone);  // leaf 0 is late

  // Rank 5 gives up: the leaf's copy is complete here (forwarded), so the abort goes up as leaf
  // 1's, naming the leaf and the rank's cause.
  const Reply ab = send(abort_header(5, 1, 10), abort_words(5));
  ASSERT_EQ(ab.target, Reply::Target::kParent);
  EXPECT_EQ(ab.hdr.flags, wire::kFlagError);
  EXPECT_EQ(ab.hdr.rank, 1);
  EXPECT_EQ(ab.hdr.seq, 10u);
  ASSERT_EQ(ab.hdr.count, 3);
  EXPECT_EQ(W(ab)[1], 1);
  EXPECT_EQ(leaf_.counters().aborts_forwarded, 1u);
  // The root marks its round aborted and answers so; the leaf relays that to every local rank
  // (rank 5, which waits for the answer, and the others, which fail with it).
  const Reply ack = to_root(root, ab);
  EXPECT_EQ(root.counters().aborted_rounds, 1u);
  ASSERT_EQ(ack.target, Reply::Target::kSender);
  ASSERT_EQ(ack.hdr.count, 4);
  const Reply down = to_root(leaf_, ack);
  ASSERT_EQ(down.target, Reply::Target::kAllRanks);
  ASSERT_EQ(down.hdr.count, 3);
  EXPECT_EQ(W(down)[0], static_cast<int32_t>(wire::ErrorReason::kAborted));
  EXPECT_EQ(W(down)[1], 4);  // leaf 1's first global rank

  // Leaf 0's partial arrives: the abort, not a result.
  const Reply late = from_leaf0(root, testing::data_header(kJob, kKey, 0, 1, false, 10, 2), {1, 1});
  ASSERT_EQ(late.target, Reply::Target::kSender);
  EXPECT_EQ(late.hdr.flags, wire::kFlagError);
  EXPECT_EQ(W(late)[0], static_cast<int32_t>(wire::ErrorReason::kAborted));
  EXPECT_EQ(W(late)[1], 1);  // leaf 1 gave up
  EXPECT_EQ(root.counters().completed, 0u);

  // An abort for a round that is not this copy's is not passed on.
  EXPECT_EQ(send(abort_header(5, 1, 9), abort_words(5)).target, Reply::Target::kNone);
}

// The race the other way: the root's round completed (leaf 1's partial came last), but its result
// has not reached rank 5, which gives up at its deadline. The abort goes up, the root answers it
// with the result, and the leaf hands that to every local rank, so rank 5 returns the result as
// leaf 0's ranks do. Once the leaf holds the result, it answers such an abort itself.
TEST_F(TreeLeafUnit, AnAbortAfterTheRootCompletedGetsTheResult) {
  Engine root;
  ASSERT_NO_FATAL_FAILURE(join_under(root));
  EXPECT_EQ(from_leaf0(root, testing::data_header(kJob, kKey, 0, 1, false, 10, 2), {1, 1}).target,
            Reply::Target::kNone);
  for (uint16_t r = 4; r < 7; ++r) data(r, 1, 10, r);
  const Reply up = data(7, 1, 10, 7);
  ASSERT_EQ(up.target, Reply::Target::kParent);
  ASSERT_EQ(to_root(root, up).target, Reply::Target::kAllRanks);  // lost on its way to leaf 1

  const Reply ab = send(abort_header(5, 1, 10), abort_words(5));
  ASSERT_EQ(ab.target, Reply::Target::kParent);
  const Reply answer = to_root(root, ab);
  EXPECT_EQ(root.counters().aborted_rounds, 0u);
  ASSERT_EQ(answer.target, Reply::Target::kSender);
  EXPECT_TRUE(answer.hdr.has(wire::kFlagResult));
  const Reply down = to_root(leaf_, answer);
  ASSERT_EQ(down.target, Reply::Target::kAllRanks);
  EXPECT_TRUE(down.hdr.has(wire::kFlagResult));
  EXPECT_EQ(down.hdr.seq, 10u);
  ASSERT_EQ(down.hdr.count, 2);
  EXPECT_EQ(W(down)[0], 1 + 4 + 5 + 6 + 7);
  EXPECT_EQ(W(down)[1], 1 + 2 * (4 + 5 + 6 + 7));

  const Reply again = send(abort_header(5, 1, 10), abort_words(5));
  ASSERT_EQ(again.target, Reply::Target::kSender);
  EXPECT_EQ(again.hdr.flags, wire::kFlagResult | wire::kFlagRetransmit);
  EXPECT_EQ(W(again)[0], 1 + 4 + 5 + 6 + 7);
}

// The leaves disagree on a round's shape (each leaf's ranks agree among themselves): the root's
// mismatch, which names leaves, reaches every rank of this leaf in global ranks, at once and on
// their retransmissions. Before, the leaf dropped it and its ranks ran into their deadline.
TEST_F(TreeLeafUnit, RelaysTheRootsMismatchInGlobalRanks) {
  Engine root;
  ASSERT_NO_FATAL_FAILURE(join_under(root));

  // Leaf 0's ranks called with 3 elements; this leaf's with 2.
  EXPECT_EQ(
      from_leaf0(root, testing::data_header(kJob, kKey, 0, 1, false, 10, 3), {1, 1, 1}).target,
      Reply::Target::kNone);
  for (uint16_t r = 4; r < 7; ++r) data(r, 1, 10, r);
  const Reply up = data(7, 1, 10, 7);
  ASSERT_EQ(up.target, Reply::Target::kParent);
  const Reply root_mm = to_root(root, up);
  ASSERT_EQ(root_mm.target, Reply::Target::kAllRanks);  // every leaf at once
  ASSERT_EQ(root_mm.hdr.count, 6 + 1);                  // the full form, a bitmap of the 2 leaves
  EXPECT_EQ(W(root_mm)[0], static_cast<int32_t>(wire::ErrorReason::kRoundMismatch));

  const Reply down = to_root(leaf_, root_mm);
  ASSERT_EQ(down.target, Reply::Target::kAllRanks);
  EXPECT_EQ(down.hdr.flags, wire::kFlagError);
  EXPECT_EQ(down.hdr.seq, 10u);
  EXPECT_EQ(down.hdr.slot, 1);
  ASSERT_EQ(down.hdr.count, 6 + 1);  // a bitmap of the 8 global ranks
  for (int i = 0; i < 6; ++i) EXPECT_EQ(W(down)[i], W(root_mm)[i]) << i;
  // The other shape (this leaf's, the second one in) is ranks 4-7.
  EXPECT_EQ(testing::ranks_in_bitmap(W(down) + 6, 1), (std::vector<uint32_t>{4, 5, 6, 7}));
  const Reply again = data(5, 1, 10, 5, true);
  ASSERT_EQ(again.target, Reply::Target::kSender);
  EXPECT_EQ(again.hdr.rank, 5);
  ASSERT_EQ(again.hdr.count, 6 + 1);
  EXPECT_EQ(W(again)[0], static_cast<int32_t>(wire::ErrorReason::kRoundMismatch));
  EXPECT_EQ(testing::ranks_in_bitmap(W(again) + 6, 1), (std::vector<uint32_t>{4, 5, 6, 7}));
  EXPECT_EQ(root.counters().completed, 0u);
}

// This leaf's own ranks disagree (rank 7 calls with 3 elements, ranks 4-6 and leaf 0's ranks
// with 2): the poisoned leaf copy never completes, so the leaf tells the root, which waits for
// leaf 0's partial, words the answer from its shape (leaf 0's ranks called as ranks 4-6 did) and
// sends it to both leaves at once; the leaf hands it to every local rank as it is. Every rank of
// the tree gets the same words: ranks 0-6 one shape, rank 7 the other.
TEST_F(TreeLeafUnit, ALeafsOwnMismatchReachesEveryLeafInGlobalRanks) {
  Engine root;
  ASSERT_NO_FATAL_FAILURE(join_under(root));
  for (uint16_t r = 4; r < 7; ++r) EXPECT_EQ(data(r, 1, 10, r).target, Reply::Target::kNone);
  wire::Header odd = testing::data_header(kJob, kKey, 7, 1, false, 10, 3);
  const Reply up = send(odd, {7, 7, 7});
  ASSERT_EQ(up.target, Reply::Target::kParent);
  EXPECT_EQ(up.hdr.flags, wire::kFlagError);
  EXPECT_EQ(up.hdr.rank, 1);       // child_index
  ASSERT_EQ(up.hdr.count, 7 + 2);  // both groups of this leaf's ranks, the tree tag
  EXPECT_EQ(W(up)[8], static_cast<int32_t>(wire::kTreeNoteTag));
  // Leaf 0's partial is not in yet: the root waits for its shape.
  EXPECT_EQ(to_root(root, up).target, Reply::Target::kNone);
  const Reply told = from_leaf0(root, testing::data_header(kJob, kKey, 0, 1, false, 10, 2), {1, 1});
  ASSERT_EQ(told.target, Reply::Target::kAllRanks);
  ASSERT_EQ(told.hdr.count, 7 + 1);
  EXPECT_EQ(W(told)[0], static_cast<int32_t>(wire::ErrorReason::kRoundMismatch));
  EXPECT_EQ(W(told)[1], 2);  // the first shape is leaf 0's: 2 elements
  EXPECT_EQ(testing::ranks_in_bitmap(W(told) + 6, 1), (std::vector<uint32_t>{7}));

  const Reply down = to_root(leaf_, told);
  ASSERT_EQ(down.target, Reply::Target::kAllRanks);
  ASSERT_EQ(down.hdr.count, 6 + 1);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(W(down)[i], W(told)[i]) << i;
  // A local rank's resend, and a later partial of leaf 0 at the root, get the same words.
  const Reply again = data(5, 1, 10, 5, true);
  ASSERT_EQ(again.target, Reply::Target::kSender);
  ASSERT_EQ(again.hdr.count, 6 + 1);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(W(again)[i], W(told)[i]) << i;
  wire::Header resent = testing::data_header(kJob, kKey, 0, 1, false, 10, 2);
  resent.flags = wire::kFlagRetransmit;
  const Reply root_again = from_leaf0(root, resent, {1, 1});
  ASSERT_EQ(root_again.target, Reply::Target::kSender);
  EXPECT_EQ(root_again.hdr.count, 7 + 1);
}

TEST(TreeLeaf, MissingLeavesUseTheControllersLeafBases) {
  // Three unbalanced leaves over 8 ranks: [0, 2), [2, 4), [4, 8); this is leaf 2.
  Engine leaf;
  JobConfig c = leaf_job(2, 4, 4, 3);
  c.tree.leaf_bases = {0, 2, 4};
  ASSERT_TRUE(leaf.add_job(c).ok());
  const uint64_t parent_epoch = kParentEpoch;
  const testing::ScopedEpochOf epochs{leaf_and_parent_epochs(leaf, parent_epoch)};
  int32_t rank;
  JobId job;
  auto send = [&](const wire::Header& h, const std::vector<int32_t>& p) {
    return leaf.on_packet(encode_packet(h, p), &rank, &job);
  };
  wire::Header h;
  h.tag = kKey;  // the key encode_packet() seals with
  h.flags = wire::kFlagHello;
  h.job = kJob;
  Reply hello_up;
  for (uint16_t r = 4; r < 8; ++r) {
    h.rank = r;
    h.seq = 50 + r;
    hello_up = send(h, {static_cast<int32_t>(kWorld)});
  }
  ASSERT_EQ(hello_up.target, Reply::Target::kParent);
  ASSERT_EQ(
      send(parent_welcome(hello_up.hdr.seq), welcome_words(kSlots, kElems, parent_epoch)).target,
      Reply::Target::kAllRanks);
  Reply up;
  for (uint16_t r = 4; r < 8; ++r) {
    up = send(testing::data_header(kJob, kKey, r, 0, true, 5, 1), {1});
  }
  ASSERT_EQ(up.target, Reply::Target::kParent);
  // The root (3 leaves) has leaves 0 and 2: leaf 1, ranks 2-3, is missing.
  wire::Header e = up.hdr;
  e.tag = kKey;  // sealed as the root seals it (with its epoch: epochs above)
  e.flags = wire::kFlagError;
  e.rank = 2;
  const Reply down = send(e, {static_cast<int32_t>(wire::ErrorReason::kMissingRanks), 0b101});
  ASSERT_EQ(down.target, Reply::Target::kAllRanks);
  EXPECT_TRUE(down.hdr.shadow);
  EXPECT_EQ(testing::ranks_in_bitmap(W(down) + 1, 1), (std::vector<uint32_t>{0, 1, 4, 5, 6, 7}));
  EXPECT_EQ(W(down)[3], 0);  // not by the rule: the controller's list
  EXPECT_EQ(W(down)[4], 1);
  EXPECT_EQ(W(down)[5], 1);
  // A report naming no missing leaf still answers (the root waits for nothing: its result is
  // on the way), with an empty list.
  const Reply none = send(e, {static_cast<int32_t>(wire::ErrorReason::kMissingRanks), 0b111});
  ASSERT_EQ(none.target, Reply::Target::kAllRanks);
  EXPECT_EQ(W(none)[4], 0);
  EXPECT_EQ(testing::ranks_in_bitmap(W(none) + 1, 1),
            (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(TreeConfig, AddJobChecksTheLeafFields) {
  Engine e;
  JobConfig c = leaf_job(0, 6, 4, 2);  // ranks 6..9 of a world of 8
  Status s = e.add_job(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank_base"), std::string::npos) << s.message();
  c = leaf_job(0, 0, 0, 2);
  EXPECT_NE(e.add_job(c).message().find("local_ranks"), std::string::npos);
  c = leaf_job(2, 0, 4, 2);
  EXPECT_NE(e.add_job(c).message().find("child_index"), std::string::npos);
  c = flat_job(8);
  c.tree.rank_base = 4;
  EXPECT_NE(e.add_job(c).message().find("role leaf only"), std::string::npos);
  c = flat_job(8);
  c.tree.leaf_bases = {0, 4};
  EXPECT_NE(e.add_job(c).message().find("role leaf only"), std::string::npos);
  // leaf_bases: one entry per leaf, from 0, ascending, consistent with this leaf's ranks.
  c = leaf_job(1, 4, 4, 2);
  c.tree.leaf_bases = {0, 4, 6};
  s = e.add_job(c);
  EXPECT_NE(s.message().find("leaf_bases has 3 entries, parent_world is 2"), std::string::npos)
      << s.message();
  c.tree.leaf_bases = {1, 4};
  s = e.add_job(c);
  EXPECT_NE(s.message().find("leaf_bases[0] = 1 is out of order"), std::string::npos)
      << s.message();
  c.tree.leaf_bases = {0, 8};
  EXPECT_NE(e.add_job(c).message().find("leaf_bases[1] = 8"), std::string::npos);
  c.tree.leaf_bases = {0, 3};
  s = e.add_job(c);
  EXPECT_NE(s.message().find("leaf_bases gives leaf 1 ranks [3, 8)"), std::string::npos)
      << s.message();
  c = leaf_job(1, 4, 4, 0);
  c.tree.leaf_bases = {0, 4};  // gives the parent world too
  ASSERT_TRUE(e.add_job(c).ok());
  ASSERT_TRUE(e.remove_job(kJob).ok());
  c.tree.leaf_bases.clear();
  ASSERT_TRUE(e.add_job(c).ok());
  EXPECT_EQ(e.world_size(kJob), kWorld);
  EXPECT_EQ(e.rank_counters(kJob).size(), kPerLeaf);
  EXPECT_EQ(e.slot_table(kJob)->config().world_size, kPerLeaf);
}

}  // namespace
}  // namespace ina::agg
