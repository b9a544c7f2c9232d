// ina-ctl's text for people (controller/ctl_format.h): aligned tables from the controller's
// JSON, the admission answer as JSON and as a sentence, and readable errors.
#include "controller/ctl_format.h"

#include <gtest/gtest.h>

namespace ina::ctl {
namespace {

using json = nlohmann::json;

TEST(CtlFormat, TablesAlignColumns) {
  EXPECT_EQ(format_table({"A", "LONGER", "C"}, {{"xyz", "1", "last"}, {"q", "22", ""}}),
            "A    LONGER  C\n"
            "xyz  1       last\n"
            "q    22\n");
  const json jobs = json::parse(R"([
    {"id": 1, "name": "resnet", "world": 4, "state": "active", "shape": "flat", "slots": 128,
     "placements": [{"aggregator": "a:1", "role": "flat", "slot_base": 0}], "idle_ms": 1500,
     "reason": ""},
    {"id": 12, "name": "t5", "world": 8, "state": "refused", "shape": "none", "slots": 64,
     "placements": [], "idle_ms": 20, "reason": "every aggregator is draining"}])");
  EXPECT_EQ(
      jobs_table(jobs),
      "ID  NAME    WORLD  STATE    SHAPE  PLACEMENT    IDLE   REASON\n"
      "1   resnet  4      active   flat   a:1 [0,128)  1.5 s  -\n"
      "12  t5      8      refused  none   -            20 ms  every aggregator is draining\n");
  EXPECT_EQ(jobs_table(json::array()), "no job\n");
  EXPECT_EQ(aggregators_table(json::array()), "no aggregator is registered\n");
  const json aggs = json::parse(R"([{"id": "a:1", "address": "10.0.0.1:1", "draining": true,
    "free_slots": 10, "slot_capacity": 64, "max_fan_in": 8, "block_elems": 2048,
    "heartbeat_age_ms": 5, "jobs": [1, 2], "http": ""}])");
  EXPECT_EQ(aggregators_table(aggs),
            "ID   ADDRESS     STATE     FREE/SLOTS  FAN-IN  BLOCK  HEARTBEAT  JOBS  HTTP\n"
            "a:1  10.0.0.1:1  draining  10/64       8       2048   5 ms       2     -\n");
}

TEST(CtlFormat, TreePlacementsNameLeavesAndRoot) {
  const json job = json::parse(R"({"id": 3, "name": "big", "world": 8, "state": "active",
    "shape": "tree", "slots": 64, "block_elems": 2048, "replacements": 0, "idle_ms": 0,
    "reason": "", "placements": [
      {"aggregator": "b", "role": "leaf", "slot_base": 0, "rank_base": 0, "local_ranks": 4,
       "child_index": 0, "address": "10.0.0.2:1"},
      {"aggregator": "c", "role": "leaf", "slot_base": 64, "rank_base": 4, "local_ranks": 4,
       "child_index": 1, "address": "10.0.0.3:1"},
      {"aggregator": "a", "role": "root", "slot_base": 0, "leaves": 2,
       "address": "10.0.0.1:1"}]})");
  const std::string d = job_details(job);
  EXPECT_NE(d.find("job           3 'big'\nstate         active\n"), std::string::npos) << d;
  EXPECT_NE(d.find("ROLE  AGGREGATOR  ADDRESS     SLOTS     RANKS\n"
                   "leaf  b           10.0.0.2:1  [0,64)    0-3\n"
                   "leaf  c           10.0.0.3:1  [64,128)  4-7\n"
                   "root  a           10.0.0.1:1  [0,64)    -\n"),
            std::string::npos)
      << d;
  EXPECT_NE(jobs_table(json::array({job}))
                .find("leaf 0 (ranks 0-3) b [0,64), leaf 1 (ranks 4-7) c "
                      "[64,128), root a [0,64)"),
            std::string::npos)
      << jobs_table(json::array({job}));
}

TEST(CtlFormat, AdmissionAnswerAsJsonAndSentence) {
  const json a = admission_json(
      "admitted\njob 3\nkey 00ff\nshards 2\naggregator 10.0.0.1:1\naggregator 10.0.0.2:1\n"
      "slots 128\nblock 2048\nreason admitted with 2 of 3 shards\n");
  EXPECT_EQ(a["result"], "admitted");
  EXPECT_EQ(a["job"], 3);
  EXPECT_EQ(a["aggregators"].size(), 2u);
  EXPECT_EQ(admission_summary(a),
            "admitted: job 3 on 10.0.0.1:1, 10.0.0.2:1, slots 128, block 2048 (admitted with 2 "
            "of 3 shards)\n");
  const json r = admission_json("refused\njob 4\nreason every aggregator is draining\n");
  EXPECT_EQ(admission_summary(r),
            "refused: job 4: every aggregator is draining (its ranks run on the host path)\n");
  EXPECT_TRUE(admission_json("error admit: world must be in 1..65535\n").is_null());
}

TEST(CtlFormat, ErrorsAreTextNotJson) {
  EXPECT_EQ(error_text(404, "{\"error\":\"no job 99\"}\n"), "no job 99");
  EXPECT_EQ(error_text(400, "error admit: world must be in 1..65535\n"),
            "admit: world must be in 1..65535");
  EXPECT_EQ(error_text(502, ""), "HTTP 502");
  EXPECT_EQ(error_text(500, "boom\n"), "boom");
}

}  // namespace
}  // namespace ina::ctl
