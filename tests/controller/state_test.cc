// ControllerState: placement on slot ranges, sticky admission, refusal reasons, expiry of silent
// aggregators, drain, release, and the persisted JSON surviving a restart.
#include "controller/state.h"

#include <gtest/gtest.h>

#include <string>

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

AdmitRequest req(const std::string& name, uint32_t world, uint32_t slots, uint32_t rank = 0) {
  AdmitRequest r;
  r.name = name;
  r.world = world;
  r.slots = slots;
  r.rank = rank;
  return r;
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
  EXPECT_EQ(b.aggregator, "x");
  EXPECT_EQ(b.slot_base, 0u);
  EXPECT_EQ(c.aggregator, "x");
  EXPECT_EQ(c.slot_base, 64u);
  EXPECT_EQ(d.aggregator, "y");
  EXPECT_EQ(d.slot_base, 0u);
  EXPECT_NE(b.key, c.key);
  EXPECT_NE(b.key, 0u);
  JobInfo e = st.admit(req("e", 4, 1), 1).value();
  EXPECT_EQ(e.state, JobState::kRefused);
  EXPECT_NE(e.reason.find("no aggregator has 1 contiguous free slots"), std::string::npos)
      << e.reason;
  JobInfo f = st.admit(req("f", 9, 1), 1).value();
  EXPECT_NE(f.reason.find("exceeds every aggregator's fan-in (largest 8"), std::string::npos)
      << f.reason;
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
  EXPECT_EQ(h.aggregator, "x");
  EXPECT_EQ(h.slot_base, 0u);
  EXPECT_EQ(st.jobs_on("x").size(), 2u);
}

TEST_F(StateTest, SilentAggregatorIsRemovedAndItsJobsAreLost) {
  ASSERT_TRUE(st.heartbeat(agg("x", 128), 0).ok());
  ASSERT_TRUE(st.heartbeat(agg("y", 128), 0).ok());
  const JobInfo a = st.admit(req("a", 2, 128), 0).value();
  const JobInfo b = st.admit(req("b", 2, 128), 0).value();
  ASSERT_EQ(a.aggregator, "x");
  ASSERT_EQ(b.aggregator, "y");
  EXPECT_TRUE(st.expire(900).empty());
  ASSERT_TRUE(st.heartbeat(agg("y", 128), 900).ok());
  const std::vector<std::string> gone = st.expire(1500);
  ASSERT_EQ(gone, std::vector<std::string>{"x"});
  EXPECT_EQ(st.job(a.id)->state, JobState::kLost);
  EXPECT_NE(st.job(a.id)->reason.find("aggregator x stopped heartbeating"), std::string::npos);
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
  EXPECT_EQ(st.jobs_on("x")[0].id, a.id);
  EXPECT_EQ(st.drain("nope", true).code(), StatusCode::kNotFound);
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
  EXPECT_EQ(a2->slot_base, a.slot_base);
  EXPECT_EQ(a2->released, std::set<uint32_t>{1});
  EXPECT_EQ(again.job_by_name("r")->state, JobState::kRefused);
  EXPECT_EQ(again.jobs_on("x").size(), 1u);
  // The restored aggregator has a full timeout from the restart, and new ids do not collide.
  EXPECT_TRUE(again.expire(5900).empty());
  const JobInfo b = again.admit(req("b", 2, 32), 5000).value();
  EXPECT_GT(b.id, r.id);
  EXPECT_EQ(b.slot_base, 32u);
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

}  // namespace
}  // namespace ina::ctl
