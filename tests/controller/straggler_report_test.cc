// ina-ctl job's straggler summary (controller/straggler_report.h): a flat job's ranking with
// causes, a tree's path from the root's worst leaf to that leaf's worst rank, and nothing when
// there is no telemetry.
#include "controller/straggler_report.h"

#include <gtest/gtest.h>

#include <string>

namespace ina::ctl {
namespace {

using json = nlohmann::json;

json straggler(int rank, bool named, double lost, const char* cause, const char* text) {
  return {{"rank", rank},
          {"straggler", named},
          {"lost_ms", lost},
          {"lost_share", 0.5},
          {"cause", cause},
          {"cause_text", text},
          {"episodes", 12},
          {"collective_fraction", 0.1},
          {"mean_episode_ms", 1.5},
          {"lost_ms_by_cause", {{"start", lost}, {"link", 0}, {"loss", 0}, {"return", 0}}}};
}

TEST(StragglerReport, FlatJobListsRanksWithCauses) {
  json job = {{"aggregator", "a:1"},
              {"telemetry",
               {{"role", "flat"},
                {"lost_window", {{"lost_ms", 40.0}, {"span_s", 9.5}, {"collectives", 900}}},
                {"stragglers",
                 {straggler(2, true, 30.0, "start", "late start (compute or host side)"),
                  straggler(0, false, 2.0, "start", "late start (compute or host side)")}}}}};
  const std::string t = straggler_report(job);
  EXPECT_NE(t.find("flat a:1: 40.0 ms lost in the last 9.5 s, 900 collectives"), std::string::npos)
      << t;
  EXPECT_NE(t.find("rank 2  STRAGGLER  lost 30.0 ms (50%), in 10% of collectives (12 hold-ups, "
                   "1.50 ms each), cause: late start (compute or host side)"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("rank 0  lost 2.0 ms"), std::string::npos) << t;
  EXPECT_EQ(t.find("no straggler"), std::string::npos) << t;
  job["telemetry"]["stragglers"][0]["straggler"] = false;
  EXPECT_NE(straggler_report(job).find("no straggler"), std::string::npos);
  EXPECT_EQ(straggler_report(json{{"job", 1}}), "");
}

TEST(StragglerReport, TreeShowsThePathFromRootToRank) {
  json root = {{"role", "root"},
               {"stragglers",
                {straggler(1, true, 20.0, "start", "late start"),
                 straggler(0, false, 1.0, "start", "late start")}}};
  json leaf0 = {{"role", "leaf"},
                {"child_index", 0},
                {"stragglers", {straggler(0, false, 1.0, "start", "late start")}}};
  json leaf1 = {{"role", "leaf"},
                {"child_index", 1},
                {"stragglers", {straggler(5, true, 19.0, "link", "slow link (bandwidth)")}}};
  json job = {{"telemetry_by_aggregator", {{"r:1", root}, {"l0:1", leaf0}, {"l1:1", leaf1}}}};
  std::string t = straggler_report(job);
  EXPECT_NE(t.find("path: root r:1 -> leaf 1 (start) at l1:1 -> rank 5 (slow link (bandwidth))"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("leaf 1  STRAGGLER"), std::string::npos) << t;
  // The leaf names no rank: the leaf itself (or its uplink) is to blame.
  job["telemetry_by_aggregator"]["l1:1"]["stragglers"][0]["straggler"] = false;
  t = straggler_report(job);
  EXPECT_NE(t.find("-> leaf 1 (start) at l1:1: no rank of it named"), std::string::npos) << t;
}

}  // namespace
}  // namespace ina::ctl
