// ControllerState: placement on slot ranges (flat, two-level trees, shards), sticky admission,
// refusal reasons, expiry of silent aggregators and re-placement of their jobs, idle-job expiry,
// drain, release, and the persisted JSON surviving a restart (the version-1 format included).
#include "controller/state.h"

#include <gtest/gtest.h>

#include <string>

#include "controller/requests.h"

namespace ina::ctl {
namespace {

AggregatorInfo agg(const std::string& id, uint32_t slots, uint32_t fan_in = 8) {
  AggregatorInfo a;
  a.id = id;
  a.host = "10.0.0.1";
  a.port = 47474;
  a.slot_capacity = slots;
  a.max_fan_in = fan_in;
  a.block_elems = 256;
  return a;
}

AdmitRequest req(const std::string& name, uint32_t world, uint32_t slots, uint32_t rank = 0,
                 uint32_t shards = 0) {
  AdmitRequest r;
  r.name = name;
  r.world = world;
  r.slots = slots;
  r.rank = rank;
  r.shards = shards;
  return r;
}

std::set<std::string> aggregators_of(const JobInfo& j) {
  std::set<std::string> s;
  for (const Placement& p : j.placements) s.insert(p.aggregator);
  return s;
}

// Checks the tree invariants: n leaves by child_index, consecutive balanced rank blocks covering
// 0..world-1 within `fan_in`, every leaf's parent the root, the root on none of the leaves'
// aggregators with world n, and each rank's placement its leaf.
void expect_tree(const JobInfo& j, uint32_t world, uint32_t fan_in) {
  SCOPED_TRACE("world " + std::to_string(world));
  ASSERT_TRUE(j.is_tree());
  EXPECT_STREQ(j.shape(), "tree");
  const uint32_t n = (world + fan_in - 1) / fan_in;
  ASSERT_EQ(j.placements.size(), size_t{n} + 1);
  const Placement& root = j.placements.back();
  EXPECT_EQ(root.role, Role::kRoot);
  EXPECT_EQ(root.local_ranks, n);
  uint32_t next = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const Placement& p = j.placements[i];
    EXPECT_EQ(p.role, Role::kLeaf);
    EXPECT_EQ(p.child_index, i);
    EXPECT_EQ(p.rank_base, next);
    EXPECT_GE(p.local_ranks, world / n);
    EXPECT_LE(p.local_ranks, (world + n - 1) / n);
    EXPECT_LE(p.local_ranks, fan_in);
    EXPECT_EQ(p.parent, root.aggregator);
    EXPECT_NE(p.aggregator, root.aggregator);
    next += p.local_ranks;
    for (uint32_t r = p.rank_base; r < p.rank_base + p.local_ranks; ++r) {
      EXPECT_EQ(j.placement_for_rank(r), &p) << "rank " << r;
    }
  }
  EXPECT_EQ(next, world);
  EXPECT_EQ(aggregators_of(j).size(), j.placements.size());  // one job id per aggregator
}

class StateTest : public ::testing::Test {
 protected:
  ControllerState st{StateOptions{1000}, [this] { return ++key_; }};
  uint64_t key_ = 100;
};

TEST_F(StateTest, PlacesJobsOnDisjointRangesAndRefusesWithAReason) {
  Result<JobInfo> r = st.admit(req("a", 4, 64), 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().state, JobState::kRefused);
  EXPECT_EQ(r.value().reason, "no aggregator is registered");
  ASSERT_TRUE(st.heartbeat(agg("x", 128), 0).ok());
  ASSERT_TRUE(st.heartbeat(agg("y", 64), 0).ok());
  // "a" stays refused (sticky), even though capacity now exists.
  EXPECT_EQ(st.admit(req("a", 4, 64, 3), 1)->state, JobState::kRefused);
  JobInfo b = st.admit(req("b", 4, 64), 1).value();
  JobInfo c = st.admit(req("c", 4, 64), 1).value();
  JobInfo d = st.admit(req("d", 4, 64), 1).value();
  EXPECT_EQ(b.state, JobState::kActive);
  ASSERT_EQ(b.placements.size(), 1u);
  EXPECT_STREQ(b.shape(), "flat");
  EXPECT_EQ(b.placements[0].aggregator, "x");
  EXPECT_EQ(b.placements[0].role, Role::kFlat);
  EXPECT_EQ(b.placements[0].slot_base, 0u);
  EXPECT_EQ(c.placements.at(0).aggregator, "x");
  EXPECT_EQ(c.placements.at(0).slot_base, 64u);
  EXPECT_EQ(d.placements.at(0).aggregator, "y");
  EXPECT_EQ(d.placements.at(0).slot_base, 0u);
  EXPECT_NE(b.key, c.key);
  EXPECT_NE(b.key, 0u);
  JobInfo e = st.admit(req("e", 4, 1), 1).value();
  EXPECT_EQ(e.state, JobState::kRefused);
  EXPECT_NE(e.reason.find("no aggregator has 1 contiguous free slots"), std::string::npos)
      << e.reason;
  JobInfo f = st.admit(req("f", 9, 1), 1).value();
  EXPECT_EQ(f.state, JobState::kRefused);
  EXPECT_NE(f.reason.find("tree for world 9 needs 2 leaves"), std::string::npos) << f.reason;
  EXPECT_EQ(st.free_slots("x"), 0u);
  // Every rank gets the same answer; a different world size is an error.
  const JobInfo b3 = st.admit(req("b", 4, 64, 3), 2).value();
  EXPECT_EQ(b3.id, b.id);
  EXPECT_EQ(b3.key, b.key);
  EXPECT_EQ(st.admit(req("b", 5, 64), 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.admit(req("bad name", 4, 64), 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.admit(req("g", 4, 64, 4), 2).status().code(), StatusCode::kInvalidArgument);
  // Releasing every rank frees the range; the first fit reuses the hole.
  for (uint32_t r2 = 0; r2 < 4; ++r2) ASSERT_TRUE(st.release("b", r2).ok());
  EXPECT_EQ(st.job(b.id), nullptr);
  JobInfo h = st.admit(req("h", 2, 32), 3).value();
  EXPECT_EQ(h.placements.at(0).aggregator, "x");
  EXPECT_EQ(h.placements.at(0).slot_base, 0u);
  EXPECT_EQ(st.jobs_on("x").size(), 2u);
}

TEST_F(StateTest, SilentAggregatorIsRemovedAndItsJobsAreLost) {
  ASSERT_TRUE(st.heartbeat(agg("x", 128), 0).ok());
  ASSERT_TRUE(st.heartbeat(agg("y", 128), 0).ok());
  const JobInfo a = st.admit(req("a", 2, 128), 0).value();
  const JobInfo b = st.admit(req("b", 2, 128), 0).value();
  ASSERT_EQ(a.placements.at(0).aggregator, "x");
  ASSERT_EQ(b.placements.at(0).aggregator, "y");
  EXPECT_TRUE(st.expire(900).empty());
  ASSERT_TRUE(st.heartbeat(agg("y", 128), 900).ok());
  const std::vector<std::string> gone = st.expire(1500);
  ASSERT_EQ(gone, std::vector<std::string>{"x"});
  EXPECT_EQ(st.job(a.id)->state, JobState::kLost);
  // y is full (128 of 128), so x's job cannot move there.
  EXPECT_NE(st.job(a.id)->reason.find("aggregator x stopped heartbeating and no other aggregator"),
            std::string::npos)
      << st.job(a.id)->reason;
  EXPECT_EQ(st.job(b.id)->state, JobState::kActive);
  EXPECT_EQ(st.lost_total, 1u);
}

TEST_F(StateTest, DrainedAggregatorGetsNoNewJobs) {
  ASSERT_TRUE(st.heartbeat(agg("x", 128), 0).ok());
  const JobInfo a = st.admit(req("a", 2, 32), 0).value();
  ASSERT_TRUE(st.drain("x", true).ok());
  ASSERT_TRUE(st.heartbeat(agg("x", 128), 1).ok());  // a heartbeat does not undo the drain
  EXPECT_TRUE(st.aggregators().at("x").draining);
  const JobInfo b = st.admit(req("b", 2, 32), 1).value();
  EXPECT_EQ(b.state, JobState::kRefused);
  EXPECT_EQ(b.reason, "every aggregator is draining");
  EXPECT_EQ(st.jobs_on("x").size(), 1u);  // the running job keeps its place
  EXPECT_EQ(st.jobs_on("x")[0].job, a.id);
  EXPECT_EQ(st.drain("nope", true).code(), StatusCode::kNotFound);
}

// A refusal is decided again when a rank that was told it asks again (a new run), not for a
// rank of the refused run asking for the first time: after the drain is turned off, a second
// request of rank 0 admits the job; ranks 1-3 of the refused run were refused with it, and ranks
// asking after the admission get the admission (sticky).
TEST_F(StateTest, RefusalIsReEvaluatedWhenAToldRankAsksAgain) {
  ASSERT_TRUE(st.heartbeat(agg("x", 128), 0).ok());
  ASSERT_TRUE(st.drain("x", true).ok());
  const JobInfo r0 = st.admit(req("t5", 4, 32, 0), 1).value();
  ASSERT_EQ(r0.state, JobState::kRefused);
  EXPECT_EQ(r0.reason, "every aggregator is draining");
  ASSERT_TRUE(st.drain("x", false).ok());
  // Rank 1 of the same run, asking for the first time: the run's answer.
  const JobInfo r1 = st.admit(req("t5", 4, 32, 1), 2).value();
  EXPECT_EQ(r1.state, JobState::kRefused);
  EXPECT_EQ(r1.id, r0.id);
  EXPECT_EQ(st.refused_total, 1u);
  // Rank 0 again: a new run, decided again, now admitted under a new job id.
  const JobInfo a0 = st.admit(req("t5", 4, 32, 0), 3).value();
  EXPECT_EQ(a0.state, JobState::kActive);
  EXPECT_NE(a0.id, r0.id);
  EXPECT_EQ(st.job(r0.id), nullptr);
  // The admission is sticky for every rank of the new run, rank 1 included.
  for (uint32_t r = 0; r < 4; ++r) {
    const JobInfo x = st.admit(req("t5", 4, 32, r), 4).value();
    EXPECT_EQ(x.state, JobState::kActive) << "rank " << r;
    EXPECT_EQ(x.id, a0.id) << "rank " << r;
    EXPECT_EQ(x.key, a0.key) << "rank " << r;
  }
  EXPECT_EQ(st.admitted_total, 1u);
  // Still refused while the condition holds: a told rank asking again gets a new refusal.
  ASSERT_TRUE(st.drain("x", true).ok());
  const JobInfo b0 = st.admit(req("u", 2, 32, 0), 5).value();
  const JobInfo b0again = st.admit(req("u", 2, 32, 0), 6).value();
  EXPECT_EQ(b0again.state, JobState::kRefused);
  EXPECT_NE(b0again.id, b0.id);
  EXPECT_EQ(st.refused_total, 3u);
  // A world that differs from the refused run's is an error for a rank of that run, and a new
  // decision for a rank that was told.
  EXPECT_EQ(st.admit(req("u", 3, 32, 1), 7).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.admit(req("u", 3, 32, 0), 7).value().world, 3u);
}

// Every decision is one audit line naming the job, its ranks, placement and reason.
TEST_F(StateTest, EveryDecisionIsOneAuditLine) {
  StateOptions o{1000};
  o.job_idle_ttl = 500;
  ControllerState s{o, [this] { return ++key_; }};
  ASSERT_TRUE(s.heartbeat(agg("x", 128), 0).ok());
  ASSERT_TRUE(s.heartbeat(agg("x", 128), 10).ok());  // a heartbeat is no decision
  std::vector<std::string> a = s.take_audit();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0],
            "aggregator x registered: data plane 10.0.0.1:47474, 128 slots, fan-in 8, block 256");
  const JobInfo j = s.admit(req("resnet", 4, 32, 2), 20).value();
  (void)s.admit(req("resnet", 4, 32, 3), 20);  // the same answer: no new decision
  a = s.take_audit();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0], "job " + std::to_string(j.id) +
                      " 'resnet' (world 4) admitted, first asked by rank 2: flat on x slots "
                      "[0,32), block 256");
  ASSERT_TRUE(s.drain("x", true).ok());
  const JobInfo r = s.admit(req("late", 2, 32), 30).value();
  ASSERT_TRUE(s.drain("x", false).ok());
  a = s.take_audit();
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0], "aggregator x drain on: no new jobs placed there; 1 active jobs on it: " +
                      std::to_string(j.id) + " keep running");
  EXPECT_EQ(a[1], "job " + std::to_string(r.id) +
                      " 'late' (world 2) refused, first asked by rank 0: every aggregator is "
                      "draining; its ranks run on the host path");
  EXPECT_EQ(a[2], "aggregator x drain off: placing jobs there again; 1 active jobs on it: " +
                      std::to_string(j.id));
  ASSERT_TRUE(s.release("late", 0).ok());
  ASSERT_TRUE(s.release("late", 1).ok());
  a = s.take_audit();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0], "job " + std::to_string(r.id) +
                      " 'late' (world 2) refused, released by every rank: forgotten");
  s.note_job_packets(j.id, "x", 5, 100);
  EXPECT_EQ(s.expire_jobs(700), std::vector<JobId>{j.id});
  a = s.take_audit();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_NE(a[0].find("job " + std::to_string(j.id) + " 'resnet' (world 4) expired: no packets"),
            std::string::npos)
      << a[0];
  EXPECT_NE(a[0].find("(was flat on x slots [0,32))"), std::string::npos) << a[0];
  // An aggregator's expiry, the re-placement of its job, and a loss.
  ASSERT_TRUE(s.heartbeat(agg("y", 64), 700).ok());
  ASSERT_TRUE(s.heartbeat(agg("z", 32), 700).ok());
  const JobInfo m = s.admit(req("moving", 2, 64), 700).value();
  ASSERT_EQ(m.placements.at(0).aggregator, "x");
  const JobInfo l = s.admit(req("lost", 2, 64), 700).value();
  ASSERT_EQ(l.placements.at(0).aggregator, "x");
  (void)s.take_audit();
  ASSERT_TRUE(s.heartbeat(agg("y", 64), 1500).ok());
  ASSERT_TRUE(s.heartbeat(agg("z", 32), 1500).ok());
  EXPECT_EQ(s.expire(1800), std::vector<std::string>{"x"});
  a = s.take_audit();
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0],
            "aggregator x expired: no heartbeat for 1790 ms (timeout 1000 ms): removed; its jobs "
            "follow (re-placed or lost)");
  EXPECT_EQ(a[1], "job " + std::to_string(m.id) +
                      " 'moving' (world 2) re-placed off silent aggregator(s): now flat on y "
                      "slots [0,64)");
  EXPECT_NE(a[2].find("job " + std::to_string(l.id) + " 'lost' (world 2) lost: aggregator x "),
            std::string::npos)
      << a[2];
  ASSERT_TRUE(s.remove_job(m.id).ok());
  a = s.take_audit();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0], "job " + std::to_string(m.id) +
                      " 'moving' (world 2) active, removed on request: freed flat on y slots "
                      "[0,64)");
}

TEST_F(StateTest, StateSurvivesARestartThroughJson) {
  ASSERT_TRUE(st.heartbeat(agg("x", 128), 0).ok());
  const JobInfo a = st.admit(req("a", 2, 32), 0).value();
  const JobInfo r = st.admit(req("r", 9, 32), 0).value();
  ASSERT_TRUE(st.release("a", 1).ok());
  const std::string saved = st.to_json();

  ControllerState again(StateOptions{1000}, [] { return uint64_t{7}; });
  ASSERT_TRUE(again.from_json(saved, 5000).ok());
  const JobInfo* a2 = again.job_by_name("a");
  ASSERT_NE(a2, nullptr);
  EXPECT_EQ(a2->id, a.id);
  EXPECT_EQ(a2->key, a.key);
  EXPECT_EQ(a2->placements, a.placements);
  EXPECT_EQ(a2->released, std::set<uint32_t>{1});
  EXPECT_EQ(again.job_by_name("r")->state, JobState::kRefused);
  EXPECT_EQ(again.jobs_on("x").size(), 1u);
  // The restored aggregator has a full timeout from the restart, and new ids do not collide.
  EXPECT_TRUE(again.expire(5900).empty());
  const JobInfo b = again.admit(req("b", 2, 32), 5000).value();
  EXPECT_GT(b.id, r.id);
  EXPECT_EQ(b.placements.at(0).slot_base, 32u);
  EXPECT_EQ(again.from_json("{\"version\": 1}", 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(again.from_json("not json", 0).code(), StatusCode::kInvalidArgument);
}

TEST_F(StateTest, HeartbeatValidatesFields) {
  AggregatorInfo a = agg("x", 0);
  Status s = st.heartbeat(a, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("slot_capacity"), std::string::npos);
  a = agg("x", 8, 0);
  EXPECT_NE(st.heartbeat(a, 0).message().find("max_fan_in"), std::string::npos);
  a = agg("x", 8);
  a.port = 0;
  EXPECT_NE(st.heartbeat(a, 0).message().find("port"), std::string::npos);
  EXPECT_TRUE(st.aggregators().empty());
}

TEST_F(StateTest, TreeShapesForWorlds5To16WithFanIn4) {
  for (uint32_t world = 5; world <= 16; ++world) {
    ControllerState s{StateOptions{1000}, [this] { return ++key_; }};
    for (const char* id : {"a", "b", "c", "d", "e", "f"})
      ASSERT_TRUE(s.heartbeat(agg(id, 128, 4), 0).ok());
    const JobInfo j = s.admit(req("t", world, 64), 0).value();
    ASSERT_EQ(j.state, JobState::kActive) << world << ": " << j.reason;
    expect_tree(j, world, 4);
    EXPECT_EQ(s.admitted_tree_total, 1u);
    // Every rank gets the same job; the heartbeat answers: leaves serve the global world, the root
    // one rank per leaf; a leaf knows its parent's data-plane address.
    EXPECT_EQ(s.admit(req("t", world, 64, world - 1), 0)->placements, j.placements);
    const Placement& root = j.placements.back();
    for (const Placement& p : j.placements) {
      const std::vector<Assignment> on = s.jobs_on(p.aggregator);
      ASSERT_EQ(on.size(), 1u);
      EXPECT_EQ(on[0].job, j.id);
      EXPECT_EQ(on[0].key, j.key);
      EXPECT_EQ(on[0].placement, p);
      EXPECT_EQ(on[0].world, p.role == Role::kRoot ? root.local_ranks : world);
      EXPECT_EQ(on[0].parent_address, p.role == Role::kLeaf ? "10.0.0.1:47474" : "");
      // A leaf HELLOs its root with the root's world: the number of leaves.
      EXPECT_EQ(on[0].parent_world, p.role == Role::kLeaf ? root.local_ranks : 0u);
      // A leaf gets every leaf's first rank by child index (the balanced rule's floor(i*W/n)),
      // to name the ranks behind another leaf in its workers' errors.
      if (p.role == Role::kLeaf) {
        ASSERT_EQ(on[0].leaf_bases.size(), root.local_ranks);
        for (uint32_t i = 0; i < root.local_ranks; ++i) {
          EXPECT_EQ(on[0].leaf_bases[i], i * world / root.local_ranks) << world << " leaf " << i;
        }
        EXPECT_EQ(on[0].leaf_bases[p.child_index], p.rank_base);
      } else {
        EXPECT_TRUE(on[0].leaf_bases.empty());
      }
      EXPECT_EQ(s.free_slots(p.aggregator), 64u);
    }
  }
}

TEST_F(StateTest, TreeBalancesRanksAndKeepsTheRootOffTheLeaves) {
  // World 10 over fan-in 4: 3 leaves of 3, 3, 4 ranks (floor(i*10/3) bases 0, 3, 6). Every
  // aggregator could be a leaf: the root is the first (a), the leaves the next ones.
  for (const char* id : {"a", "b", "c", "d"}) ASSERT_TRUE(st.heartbeat(agg(id, 128, 4), 0).ok());
  JobInfo j = st.admit(req("t", 10, 32), 0).value();
  expect_tree(j, 10, 4);
  EXPECT_EQ(j.placements[0].local_ranks, 3u);
  EXPECT_EQ(j.placements[1].local_ranks, 3u);
  EXPECT_EQ(j.placements[2].local_ranks, 4u);
  EXPECT_EQ(j.placements[0].aggregator, "b");
  EXPECT_EQ(j.placements[2].aggregator, "d");
  EXPECT_EQ(j.placements[3].aggregator, "a");
  // A root-only aggregator (fan-in 2: too small for a leaf of 4) is preferred for the root, so
  // the leaf-capable ones stay leaves: world 8 fits on leaves x, y with the root on "r".
  ControllerState s{StateOptions{1000}, [this] { return ++key_; }};
  ASSERT_TRUE(s.heartbeat(agg("r", 128, 2), 0).ok());
  ASSERT_TRUE(s.heartbeat(agg("x", 128, 4), 0).ok());
  ASSERT_TRUE(s.heartbeat(agg("y", 128, 4), 0).ok());
  j = s.admit(req("t", 8, 32), 0).value();
  expect_tree(j, 8, 4);
  EXPECT_EQ(j.placements[0].aggregator, "x");
  EXPECT_EQ(j.placements[1].aggregator, "y");
  EXPECT_EQ(j.placements[2].aggregator, "r");
  // Block size: the smallest of the tree's aggregators.
  EXPECT_EQ(j.block_elems, 256u);
}

TEST_F(StateTest, TreeRefusalsNameWhatIsMissing) {
  ASSERT_TRUE(st.heartbeat(agg("a", 128, 4), 0).ok());
  ASSERT_TRUE(st.heartbeat(agg("b", 128, 4), 0).ok());
  // Two aggregators: 2 leaves but no third for the root.
  JobInfo j = st.admit(req("t8", 8, 64), 0).value();
  EXPECT_EQ(j.state, JobState::kRefused);
  EXPECT_EQ(j.reason,
            "tree for world 8 needs 2 leaves with fan-in >= 4 and a root with fan-in >= 2 on "
            "another aggregator: only 2 aggregators have 64 contiguous free slots (2 with fan-in "
            ">= 4, 2 with fan-in >= 2)");
  ASSERT_TRUE(st.heartbeat(agg("c", 128, 4), 0).ok());
  EXPECT_EQ(st.admit(req("t8b", 8, 64), 0)->state, JobState::kActive);
  // Now a, b, c have 64 free each; a job of 100 slots fits nowhere.
  j = st.admit(req("big", 8, 100), 0).value();
  EXPECT_EQ(j.state, JobState::kRefused);
  EXPECT_NE(j.reason.find("only 0 aggregators have 100 contiguous free slots"), std::string::npos)
      << j.reason;
  // World 17 over fan-in 4 needs 5 leaves: more than a root of fan-in 4 takes.
  for (const char* id : {"d", "e", "f", "g"}) ASSERT_TRUE(st.heartbeat(agg(id, 128, 4), 0).ok());
  j = st.admit(req("t17", 17, 8), 0).value();
  EXPECT_EQ(j.state, JobState::kRefused);
  EXPECT_NE(j.reason.find("a two-level tree of 5 leaves needs a root fan-in of 5, largest 4"),
            std::string::npos)
      << j.reason;
  // Draining aggregators are no candidates.
  for (const char* id : {"a", "b", "c", "d", "e", "f", "g"}) ASSERT_TRUE(st.drain(id, true).ok());
  EXPECT_EQ(st.admit(req("t9", 9, 8), 0)->reason, "every aggregator is draining");
}

TEST_F(StateTest, ShardsOnDistinctAggregators) {
  ASSERT_TRUE(st.heartbeat(agg("x", 128), 0).ok());
  ASSERT_TRUE(st.heartbeat(agg("y", 128), 0).ok());
  ASSERT_TRUE(st.heartbeat(agg("z", 64), 0).ok());
  JobInfo j = st.admit(req("s2", 4, 64, 0, 2), 0).value();
  ASSERT_EQ(j.state, JobState::kActive);
  EXPECT_STREQ(j.shape(), "sharded");
  ASSERT_EQ(j.placements.size(), 2u);
  EXPECT_EQ(j.placements[0].aggregator, "x");
  EXPECT_EQ(j.placements[1].aggregator, "y");
  EXPECT_TRUE(j.reason.empty()) << j.reason;
  for (const Placement& p : j.placements) {
    EXPECT_EQ(p.role, Role::kFlat);
    const std::vector<Assignment> on = st.jobs_on(p.aggregator);
    ASSERT_EQ(on.size(), 1u);
    EXPECT_EQ(on[0].key, j.key);  // same job id and key on every shard
    EXPECT_EQ(on[0].world, 4u);
  }
  // Asked for 4: x, y have 64 left, z 64: three shards, and the answer says so.
  j = st.admit(req("s4", 4, 64, 0, 4), 0).value();
  ASSERT_EQ(j.state, JobState::kActive);
  EXPECT_EQ(aggregators_of(j), (std::set<std::string>{"x", "y", "z"}));
  EXPECT_EQ(j.shards_asked, 4u);
  EXPECT_EQ(j.reason,
            "admitted with 3 of 4 shards: only 3 aggregators with fan-in >= 4 have 64 contiguous "
            "free slots");
  EXPECT_EQ(st.short_shards_total, 1u);
  EXPECT_EQ(st.admitted_sharded_total, 2u);
  // None has room: refused with the flat reason.
  j = st.admit(req("s-none", 4, 64, 0, 2), 0).value();
  EXPECT_EQ(j.state, JobState::kRefused);
  EXPECT_NE(j.reason.find("no aggregator has 64 contiguous free slots"), std::string::npos);
  // A sharded tree is refused clearly.
  j = st.admit(req("s-tree", 9, 1, 0, 2), 0).value();
  EXPECT_EQ(j.state, JobState::kRefused);
  EXPECT_NE(j.reason.find("shards=2: sharding a job that needs an aggregation tree (world 9"),
            std::string::npos)
      << j.reason;
  EXPECT_EQ(st.admit(req("bad", 4, 1, 0, 257), 0).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(StateTest, ControllerDefaultShards) {
  ControllerState s{StateOptions{1000, 2}, [this] { return ++key_; }};
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(s.heartbeat(agg(id, 128, 4), 0).ok());
  EXPECT_EQ(s.admit(req("d", 4, 8), 0)->placements.size(), 2u);          // the default
  EXPECT_EQ(s.admit(req("one", 4, 8, 0, 1), 0)->placements.size(), 1u);  // asked for none
  // The default does not apply to a job that needs a tree: it gets the tree.
  const JobInfo t = s.admit(req("t", 6, 8), 0).value();
  ASSERT_EQ(t.state, JobState::kActive) << t.reason;
  expect_tree(t, 6, 4);
}

TEST_F(StateTest, SilentAggregatorsJobsAreReplaced) {
  ASSERT_TRUE(st.heartbeat(agg("x", 128), 0).ok());
  ASSERT_TRUE(st.heartbeat(agg("y", 128), 0).ok());
  const JobInfo a = st.admit(req("a", 2, 64), 0).value();
  const JobInfo b = st.admit(req("b", 2, 64), 0).value();
  ASSERT_EQ(a.placements.at(0).aggregator, "x");
  ASSERT_EQ(b.placements.at(0).aggregator, "x");
  st.set_job_telemetry(a.id, "x", "{\"packets\":1}");
  st.set_job_telemetry(a.id, "y", "{\"packets\":2}");  // not a's aggregator: ignored
  EXPECT_EQ(st.job(a.id)->telemetry,
            (std::map<std::string, std::string>{{"x", "{\"packets\":1}"}}));
  ASSERT_TRUE(st.heartbeat(agg("y", 128), 900).ok());
  ASSERT_EQ(st.expire(1500), std::vector<std::string>{"x"});
  EXPECT_TRUE(st.job(a.id)->telemetry.empty());  // x's report went with x
  // Both move to y, on new disjoint ranges, keeping id and key.
  for (const JobInfo* old : {&a, &b}) {
    const JobInfo* j = st.job(old->id);
    ASSERT_NE(j, nullptr);
    EXPECT_EQ(j->state, JobState::kActive) << j->reason;
    EXPECT_EQ(j->key, old->key);
    EXPECT_EQ(j->placements.at(0).aggregator, "y");
    EXPECT_EQ(j->replacements, 1u);
  }
  EXPECT_NE(st.job(a.id)->placements[0].slot_base, st.job(b.id)->placements[0].slot_base);
  EXPECT_EQ(st.jobs_on("y").size(), 2u);
  EXPECT_EQ(st.replaced_total, 2u);
  EXPECT_EQ(st.lost_total, 0u);
  // The sticky answer now names y.
  EXPECT_EQ(st.admit(req("a", 2, 64, 1), 1600)->placements.at(0).aggregator, "y");
  // y goes too: nothing left, both lost.
  ASSERT_EQ(st.expire(3000), std::vector<std::string>{"y"});
  EXPECT_EQ(st.job(a.id)->state, JobState::kLost);
  EXPECT_EQ(st.lost_total, 2u);
}

TEST_F(StateTest, TreeLeafAndRootAreReplaced) {
  for (const char* id : {"a", "b", "c", "d", "e"})
    ASSERT_TRUE(st.heartbeat(agg(id, 128, 4), 0).ok());
  const JobInfo t = st.admit(req("t", 8, 32), 0).value();
  ASSERT_TRUE(t.is_tree());
  ASSERT_EQ(t.placements[0].aggregator, "b");
  ASSERT_EQ(t.placements[1].aggregator, "c");
  ASSERT_EQ(t.placements[2].aggregator, "a");
  // Leaf c and root a stop; d and e take their places, the leaves point at the new root.
  for (const char* id : {"b", "d", "e"}) ASSERT_TRUE(st.heartbeat(agg(id, 128, 4), 900).ok());
  const std::vector<std::string> gone = st.expire(1500);
  ASSERT_EQ(gone, (std::vector<std::string>{"a", "c"}));
  const JobInfo* j = st.job(t.id);
  ASSERT_EQ(j->state, JobState::kActive) << j->reason;
  expect_tree(*j, 8, 4);
  Placement leaf0 = t.placements[0];  // unchanged but for its parent
  leaf0.parent = "e";
  EXPECT_EQ(j->placements[0], leaf0);
  EXPECT_EQ(j->placements[1].aggregator, "d");
  EXPECT_EQ(j->placements[1].rank_base, 4u);
  EXPECT_EQ(j->placements[1].child_index, 1u);
  EXPECT_EQ(j->placements[2].aggregator, "e");
  EXPECT_EQ(j->replacements, 2u);
  EXPECT_EQ(j->key, t.key);
  EXPECT_EQ(st.jobs_on("b").at(0).parent_address, "10.0.0.1:47474");
  // Both leaves stop with one spare (f): leaf 0 could move, leaf 1 cannot, so the whole job is
  // lost (and the move that was possible is not counted).
  ASSERT_TRUE(st.heartbeat(agg("e", 128, 4), 1600).ok());
  ASSERT_TRUE(st.heartbeat(agg("f", 128, 4), 1600).ok());
  ASSERT_EQ(st.expire(2500), (std::vector<std::string>{"b", "d"}));
  EXPECT_EQ(st.job(t.id)->state, JobState::kLost);
  EXPECT_EQ(st.replaced_total, 2u);  // nothing counted for a re-placement that failed
  EXPECT_EQ(st.lost_total, 1u);
  EXPECT_NE(st.job(t.id)->reason.find("no other aggregator with fan-in >= "), std::string::npos)
      << st.job(t.id)->reason;
}

TEST_F(StateTest, LostShardIsMovedOrDropped) {
  for (const char* id : {"x", "y", "z"}) ASSERT_TRUE(st.heartbeat(agg(id, 64), 0).ok());
  const JobInfo s = st.admit(req("s", 4, 64, 0, 2), 0).value();
  ASSERT_EQ(aggregators_of(s), (std::set<std::string>{"x", "y"}));
  // y stops: z takes shard 1 (the shard order stays).
  ASSERT_TRUE(st.heartbeat(agg("x", 64), 900).ok());
  ASSERT_TRUE(st.heartbeat(agg("z", 64), 900).ok());
  st.expire(1500);
  const JobInfo* j = st.job(s.id);
  ASSERT_EQ(j->placements.size(), 2u);
  EXPECT_EQ(j->placements[0].aggregator, "x");
  EXPECT_EQ(j->placements[1].aggregator, "z");
  // z stops with no spare: the shard is dropped, the job runs on x alone and says why.
  ASSERT_TRUE(st.heartbeat(agg("x", 64), 2000).ok());
  st.expire(2600);
  j = st.job(s.id);
  ASSERT_EQ(j->state, JobState::kActive);
  ASSERT_EQ(j->placements.size(), 1u);
  EXPECT_EQ(j->placements[0].aggregator, "x");
  EXPECT_NE(j->reason.find("running on 1 of 2 shards: lost shard aggregator(s) z"),
            std::string::npos)
      << j->reason;
  st.expire(4000);  // x too
  EXPECT_EQ(st.job(s.id)->state, JobState::kLost);
}

TEST_F(StateTest, IdleJobExpiresAndFreesItsSlots) {
  ControllerState s{StateOptions{100000, 1, 5000}, [this] { return ++key_; }};
  ASSERT_TRUE(s.heartbeat(agg("x", 128), 0).ok());
  ASSERT_TRUE(s.heartbeat(agg("y", 128), 0).ok());
  const JobInfo a = s.admit(req("a", 2, 128), 0).value();
  const JobInfo b = s.admit(req("b", 2, 64), 0).value();
  ASSERT_EQ(a.placements.at(0).aggregator, "x");
  s.note_job_packets(a.id, "x", 10, 3000);  // activity at 3000
  s.note_job_packets(b.id, "y", 0, 3000);   // a report without packets is none
  s.note_job_packets(a.id, "y", 99, 4000);  // not a's aggregator: ignored
  EXPECT_EQ(s.expire_jobs(5000), std::vector<JobId>{});
  const JobInfo c = s.admit(req("c", 2, 8), 0).value();  // no aggregator ever reports it
  ASSERT_EQ(c.placements.at(0).aggregator, "y");
  EXPECT_EQ(s.expire_jobs(5001), std::vector<JobId>{b.id});  // idle since admission
  s.note_job_packets(a.id, "x", 10, 7500);                   // unchanged counter: no activity
  EXPECT_EQ(s.expire_jobs(8000), std::vector<JobId>{});
  EXPECT_EQ(s.expire_jobs(8001), std::vector<JobId>{a.id});
  EXPECT_EQ(s.job(a.id)->state, JobState::kExpired);
  EXPECT_NE(s.job(a.id)->reason.find("no packets on any of its aggregators for 5001 ms"),
            std::string::npos)
      << s.job(a.id)->reason;
  EXPECT_EQ(s.free_slots("x"), 128u);
  EXPECT_TRUE(s.jobs_on("x").empty());
  EXPECT_EQ(s.expired_total, 2u);
  // The same name again is a new run of the job.
  const JobInfo a2 = s.admit(req("a", 2, 128), 9000).value();
  EXPECT_EQ(a2.state, JobState::kActive);
  EXPECT_NE(a2.id, a.id);
  EXPECT_EQ(s.job(a.id), nullptr);
  // A counter that went down (aggregator restart) is activity too.
  s.note_job_packets(a2.id, "x", 50, 9000);
  s.note_job_packets(a2.id, "x", 3, 13000);
  EXPECT_TRUE(s.expire_jobs(17000).empty());
  EXPECT_EQ(s.job(c.id)->state, JobState::kActive);  // unreported: never expired
  // TTL 0: never.
  ControllerState never{StateOptions{1000, 1, 0}, [this] { return ++key_; }};
  ASSERT_TRUE(never.heartbeat(agg("x", 128), 0).ok());
  const JobInfo n = never.admit(req("a", 2, 8), 0).value();
  ASSERT_EQ(n.state, JobState::kActive);
  never.note_job_packets(n.id, "x", 0, 0);
  EXPECT_TRUE(never.expire_jobs(1000000000).empty());
}

TEST_F(StateTest, PlacementsSurviveARestartThroughJson) {
  for (const char* id : {"a", "b", "c", "d", "e"})
    ASSERT_TRUE(st.heartbeat(agg(id, 128, 4), 0).ok());
  const JobInfo t = st.admit(req("t", 7, 32), 0).value();
  const JobInfo s = st.admit(req("s", 4, 32, 0, 4), 0).value();
  ASSERT_TRUE(t.is_tree());
  ASSERT_TRUE(s.is_sharded());
  ASSERT_EQ(aggregators_of(s), (std::set<std::string>{"a", "b", "c", "d"}));
  for (const char* id : {"a", "b", "c", "e"}) ASSERT_TRUE(st.heartbeat(agg(id, 128, 4), 900).ok());
  st.expire(1500);  // d goes: its shard moves to e
  ASSERT_EQ(st.job(s.id)->replacements + st.job(t.id)->replacements, 1u);
  const std::string saved = st.to_json();
  ControllerState again(StateOptions{1000}, [] { return uint64_t{7}; });
  ASSERT_TRUE(again.from_json(saved, 5000).ok());
  for (const JobId id : {t.id, s.id}) {
    const JobInfo* x = st.job(id);
    const JobInfo* y = again.job(id);
    ASSERT_NE(y, nullptr);
    EXPECT_EQ(y->placements, x->placements);
    EXPECT_EQ(y->shards_asked, x->shards_asked);
    EXPECT_EQ(y->replacements, x->replacements);
    EXPECT_EQ(y->key, x->key);
    EXPECT_EQ(y->last_activity, 5000);
  }
  for (const char* id : {"a", "b", "c", "e"}) {
    EXPECT_EQ(again.jobs_on(id).size(), st.jobs_on(id).size()) << id;
    EXPECT_EQ(again.free_slots(id), st.free_slots(id)) << id;
  }
  // A bad role names the field.
  std::string bad = saved;
  bad.replace(bad.find("\"leaf\""), 6, "\"twig\"");
  const Status bs = again.from_json(bad, 0);
  EXPECT_EQ(bs.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bs.message().find("role 'twig' is not flat, leaf or root"), std::string::npos)
      << bs.message();
}

TEST_F(StateTest, Version1StateFileStillLoads) {
  // As written before placements existed: one aggregator and slot_base per job.
  const std::string v1 = R"({
    "version": 1, "next_id": 3,
    "aggregators": [{"id": "x", "host": "10.0.0.1", "port": 47474, "slot_capacity": 128,
                     "max_fan_in": 8, "block_elems": 256, "http": "", "draining": false}],
    "jobs": [
      {"id": 1, "name": "a", "world": 2, "key": 77, "slots": 32, "block_elems": 256,
       "dtypes": [], "state": "active", "reason": "", "aggregator": "x", "slot_base": 32,
       "released": [1]},
      {"id": 2, "name": "r", "world": 9, "key": 0, "slots": 32, "block_elems": 256,
       "dtypes": [], "state": "refused", "reason": "too big", "aggregator": "", "slot_base": 0,
       "released": []}]})";
  ASSERT_TRUE(st.from_json(v1, 100).ok());
  const JobInfo* a = st.job_by_name("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->placements.size(), 1u);
  EXPECT_EQ(a->placements[0].aggregator, "x");
  EXPECT_EQ(a->placements[0].slot_base, 32u);
  EXPECT_EQ(a->placements[0].role, Role::kFlat);
  EXPECT_EQ(a->key, (Key128{77, 0}));  // a 64-bit key of version 1 or 2, widened
  EXPECT_TRUE(st.job_by_name("r")->placements.empty());
  EXPECT_EQ(st.free_slots("x"), 96u);
  // Saved again, it is version 3 (keys as 32 hex digits) and loads the same.
  ControllerState again(StateOptions{1000}, [] { return uint64_t{7}; });
  const std::string v3 = st.to_json();
  ASSERT_TRUE(again.from_json(v3, 0).ok());
  EXPECT_EQ(again.job(1)->placements, a->placements);
  EXPECT_EQ(again.job(1)->key, (Key128{77, 0}));
  EXPECT_NE(v3.find("\"version\": 3"), std::string::npos);
  EXPECT_NE(v3.find("\"key\": \"0000000000000000000000000000004d\""), std::string::npos) << v3;
  std::string bad = v3;
  bad.replace(bad.find("0000000000000000000000000000004d"), 32, "4d");
  EXPECT_NE(again.from_json(bad, 0).message().find("job 1: \"key\" is not 32 hexadecimal digits"),
            std::string::npos);
  EXPECT_EQ(again.from_json(R"({"version": 4})", 0).message(), "state: version 4 is not 1, 2 or 3");
}

// Numbers out of their field's range are refused, not converted: a float beyond uint16_t was
// undefined behaviour and 70000 became port 4464 (fuzz_controller; corpus regress-*).
TEST_F(StateTest, OutOfRangeNumbersAreRefused) {
  const std::string hb = R"({"id": "a", "host": "h", "slot_capacity": 8, "max_fan_in": 2,
                             "block_elems": 256, "port": )";
  EXPECT_TRUE(parse_heartbeat_request(hb + "47474}").ok());
  for (const char* port : {"4.6e69", "70000", "-1", "1.5", "\"1\""}) {
    Result<HeartbeatRequest> r = parse_heartbeat_request(hb + port + "}");
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << port;
  }
  ASSERT_TRUE(st.heartbeat(agg("x", 128), 0).ok());
  ASSERT_TRUE(st.admit(req("a", 2, 32), 0).ok());
  const std::string saved = st.to_json();
  ControllerState again(StateOptions{1000}, [] { return uint64_t{7}; });
  ASSERT_TRUE(again.from_json(saved, 0).ok());
  for (const auto& [from, to] :
       {std::pair{"\"port\": 47474", "\"port\": 1e70"}, std::pair{"\"world\": 2", "\"world\": -2"},
        std::pair{"\"next_id\": 2", "\"next_id\": 4294967296"}}) {
    std::string bad = saved;
    const size_t at = bad.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    bad.replace(at, std::string(from).size(), to);
    EXPECT_EQ(again.from_json(bad, 0).code(), StatusCode::kInvalidArgument) << to;
  }
}

}  // namespace
}  // namespace ina::ctl
