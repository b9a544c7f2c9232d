// The aggregator's control agent as pure functions: the controller's heartbeat answer parsed into
// jobs (the aggregation tree's fields: role, a leaf's rank_base, local_ranks, child_index, parent,
// parent_world, leaf_bases), with errors naming the entry and the field, and a leaf's telemetry
// JSON reporting its tree role and global ranks.
#include "aggregator/control_agent.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace ina::agg {
namespace {

std::string answer(const std::string& jobs) { return "{\"jobs\": [" + jobs + "]}"; }
constexpr const char* kBase = R"("job": 4, "key": "00000000000000010000000000000063", )"
                              R"("world": 8, "slots": 16, "block_elems": 256, "slot_base": 32)";

TEST(HeartbeatJobs, FlatLeafAndRoot) {
  const std::string body =
      answer(std::string("{") + kBase + "}, {" + kBase +
             R"(, "role": "leaf", "rank_base": 4, "local_ranks": 4,
                                      "child_index": 1, "parent": "10.0.0.9:47474"}, )" +
             R"({"job": 5, "key": "00000000000000000000000000000001", "world": 2, "slots": 16,
                                      "block_elems": 256, "slot_base": 0, "role": "root"})");
  auto jobs = parse_heartbeat_jobs(body);
  ASSERT_TRUE(jobs.ok()) << jobs.status().to_string();
  ASSERT_EQ(jobs->size(), 3u);
  const JobConfig& flat = (*jobs)[0];
  EXPECT_EQ(flat.tree.role, TreeRole::kFlat);
  EXPECT_EQ(flat.job, 4u);
  EXPECT_EQ(flat.key, (Key128{99, 1}));  // 128 bits: lo 99, hi 1
  EXPECT_EQ(flat.slots.world_size, 8u);
  EXPECT_EQ(flat.slots.num_slots, 16u);
  EXPECT_EQ(flat.slots.max_payload_bytes, 1024u);  // block_elems 256 x 4 bytes
  EXPECT_EQ(flat.slot_base, 32u);
  const JobConfig& leaf = (*jobs)[1];
  EXPECT_EQ(leaf.tree.role, TreeRole::kLeaf);
  EXPECT_EQ(leaf.tree.rank_base, 4u);
  EXPECT_EQ(leaf.tree.local_ranks, 4u);
  EXPECT_EQ(leaf.tree.child_index, 1u);
  EXPECT_EQ(leaf.tree.parent, "10.0.0.9:47474");
  EXPECT_EQ(leaf.tree.parent_world, 0u);
  EXPECT_EQ(leaf.served_ranks(), 4u);
  EXPECT_TRUE(leaf.tree.leaf_bases.empty());
  EXPECT_EQ((*jobs)[2].tree.role, TreeRole::kRoot);
  EXPECT_EQ((*jobs)[2].slots.world_size, 2u);
}

TEST(HeartbeatJobs, LeafBasesAreTakenAndChecked) {
  auto jobs = parse_heartbeat_jobs(answer(std::string("{") + kBase + R"(, "role": "leaf",
      "rank_base": 4, "local_ranks": 4, "child_index": 1, "parent": "a:1", "parent_world": 2,
      "leaf_bases": [0, 4]})"));
  ASSERT_TRUE(jobs.ok()) << jobs.status().to_string();
  EXPECT_EQ((*jobs)[0].tree.leaf_bases, (std::vector<uint32_t>{0, 4}));
  for (const char* bad :
       {R"("leaf_bases": 4)", R"("leaf_bases": [0, 8])", R"("leaf_bases": [0, -4])"}) {
    auto r = parse_heartbeat_jobs(answer(std::string("{") + kBase + R"(, "role": "leaf",
        "rank_base": 4, "local_ranks": 4, "child_index": 1, "parent": "a:1", )" +
                                         bad + "}"));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("jobs[0]: field \"leaf_bases\" must be an array of ranks "
                                        "below the world of 8"),
              std::string::npos)
        << r.status().message();
  }
}

TEST(HeartbeatJobs, ErrorsNameTheEntryAndField) {
  auto err = [](const std::string& body) {
    auto r = parse_heartbeat_jobs(body);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string{} : r.status().message();
  };
  EXPECT_NE(err("[]").find("\"jobs\" array"), std::string::npos);
  EXPECT_NE(err(answer(R"({"job": 1})")).find("jobs[0]: field \"key\" is missing"),
            std::string::npos);
  std::string m = err(answer(std::string("{") + kBase + R"(, "role": "middle"})"));
  EXPECT_NE(m.find("\"role\" must be \"flat\", \"leaf\" or \"root\""), std::string::npos) << m;
  m = err(answer(std::string("{") + kBase + R"(, "role": "leaf", "local_ranks": 4,
                 "child_index": 0, "parent": "a:1"})"));
  EXPECT_NE(m.find("\"rank_base\" is missing"), std::string::npos) << m;
  m = err(answer(std::string("{") + kBase + R"(, "role": "leaf", "rank_base": 0,
                 "local_ranks": 4, "child_index": 0, "parent": "nowhere"})"));
  EXPECT_NE(m.find("\"parent\" as \"host:port\""), std::string::npos) << m;
  m = err(answer(std::string("{") + kBase + R"(, "role": "leaf", "rank_base": 6,
                 "local_ranks": 4, "child_index": 0, "parent": "a:1"})"));
  EXPECT_NE(m.find("inside the world of 8"), std::string::npos) << m;
  m = err(answer(R"({"job": 1, "key": 99})"));
  EXPECT_NE(m.find("jobs[0]: field \"key\" must be a string of 32 hexadecimal digits, got 99"),
            std::string::npos)
      << m;
  m = err(answer(std::string("{") + kBase + R"(}, {"job": -1, "key": 1})"));
  EXPECT_NE(m.find("jobs[1]: field \"job\" must be an integer"), std::string::npos) << m;
}

TEST(HeartbeatJobs, LeafTelemetryNamesGlobalRanks) {
  JobSnapshot j;
  j.cfg.job = 4;
  j.cfg.slots.world_size = 8;
  j.cfg.tree.role = TreeRole::kLeaf;
  j.cfg.tree.rank_base = 4;
  j.cfg.tree.local_ranks = 2;
  j.cfg.tree.child_index = 1;
  j.cfg.tree.parent = "h:1";
  j.counters.forwarded = 7;
  j.counters.parent_joined = true;
  j.telemetry.resize(2);
  j.straggler_ranking = {1, 0};
  StalledSlot s;
  s.missing = {5};
  j.stalled.push_back(s);
  const nlohmann::json o = nlohmann::json::parse(job_telemetry_json(j));
  EXPECT_EQ(o["role"], "leaf");
  EXPECT_EQ(o["rank_base"], 4);
  EXPECT_EQ(o["child_index"], 1);
  EXPECT_EQ(o["forwarded"], 7);
  EXPECT_EQ(o["parent_joined"], true);
  EXPECT_EQ(o["stragglers"][0]["rank"], 5);
  EXPECT_EQ(o["stragglers"][1]["rank"], 4);
  EXPECT_EQ(o["stalled_slots"][0]["missing_ranks"][0], 5);
}

// The telemetry lists the ranks by lost time with their cause, and /metrics has the
// per-rank, per-cause lost-time counters labelled ina_job.
TEST(Telemetry, StragglersByLostTimeWithCausesAndCounters) {
  JobSnapshot j;
  j.cfg.job = 6;
  j.cfg.slots.world_size = 3;
  j.telemetry.resize(3);
  j.straggler_ranking = {0, 1, 2};
  j.loss.ranks.resize(3);
  j.loss.total_ns.resize(3);
  j.loss.ranks[2].lost_ns[static_cast<size_t>(LagCause::kLink)] = 30'000'000;
  j.loss.ranks[2].episodes = 9;
  j.loss.ranks[0].lost_ns[static_cast<size_t>(LagCause::kStart)] = 1'000'000;
  j.loss.ranks[0].episodes = 1;
  j.loss.total_ns[2][static_cast<size_t>(LagCause::kLink)] = 1'500'000'000;
  j.loss.collectives = 10;
  j.loss.span_ns = 2'000'000'000;
  j.loss.sum_sq_s2 = 9 * (30e-3 / 9) * (30e-3 / 9) + 1e-6;
  j.lost_ranking = rank_by_lost_time(j.loss);
  const nlohmann::json o = nlohmann::json::parse(job_telemetry_json(j));
  ASSERT_EQ(o["stragglers"].size(), 3u);
  EXPECT_EQ(o["stragglers"][0]["rank"], 2);
  EXPECT_EQ(o["stragglers"][0]["cause"], "link");
  EXPECT_EQ(o["stragglers"][0]["straggler"], true) << o.dump();
  EXPECT_DOUBLE_EQ(o["stragglers"][0]["lost_ms"].get<double>(), 30.0);
  EXPECT_DOUBLE_EQ(o["stragglers"][0]["lost_ms_by_cause"]["link"].get<double>(), 30.0);
  EXPECT_EQ(o["stragglers"][0]["episodes"], 9);
  EXPECT_EQ(o["stragglers"][1]["rank"], 0);
  EXPECT_EQ(o["stragglers"][1]["straggler"], false);
  EXPECT_EQ(o["lag_ranking"][0], 0);
  EXPECT_EQ(o["lost_window"]["collectives"], 10);
  AggregatorSnapshot s;
  s.jobs.push_back(j);
  const std::string m = prometheus_text(s);
  EXPECT_NE(m.find("# TYPE ina_aggregator_rank_lost_seconds_total counter"), std::string::npos);
  EXPECT_NE(
      m.find(
          "ina_aggregator_rank_lost_seconds_total{ina_job=\"6\",rank=\"2\",cause=\"link\"} 1.5\n"),
      std::string::npos)
      << m;
  EXPECT_NE(
      m.find(
          "ina_aggregator_rank_lost_seconds_total{ina_job=\"6\",rank=\"0\",cause=\"return\"} 0\n"),
      std::string::npos);
  EXPECT_NE(m.find("ina_aggregator_rank_straggler{ina_job=\"6\",rank=\"2\"} 1\n"),
            std::string::npos);
  EXPECT_NE(m.find("ina_aggregator_rank_straggler{ina_job=\"6\",rank=\"1\"} 0\n"),
            std::string::npos);
  // Histogram bounds are exact powers of two in microseconds (2^20 us = 1.048576 s, not
  // 1.04858), and every family is the aggregator's.
  ASSERT_FALSE(j.telemetry.empty());
  EXPECT_NE(m.find(",le=\"1.048576\"}"), std::string::npos) << m;
  EXPECT_NE(m.find(",le=\"0.000001\"}"), std::string::npos) << m;
  EXPECT_NE(m.find(",le=\"0.000512\"}"), std::string::npos) << m;
  EXPECT_EQ(m.find("e-0"), std::string::npos) << m;
  EXPECT_EQ(m.find("1.04858\""), std::string::npos) << m;
  for (size_t at = m.find("# TYPE "); at != std::string::npos; at = m.find("# TYPE ", at + 1)) {
    EXPECT_EQ(m.compare(at + 7, 15, "ina_aggregator_"), 0) << m.substr(at, 80);
  }
}

// The per-job label of /metrics is ina_job: Prometheus renames a target's own "job" label to
// "exported_job" (it sets job to the scrape job's name), so a query on job="9" found nothing.
TEST(AgentMetrics, PerJobLabelIsInaJob) {
  AggregatorSnapshot s;
  JobSnapshot j;
  j.cfg.job = 9;
  j.cfg.slots.world_size = 2;
  j.telemetry.resize(2);
  j.straggler_ranking = {1, 0};
  StalledSlot st;
  st.missing = {1};
  j.stalled.push_back(st);
  s.jobs.push_back(j);
  const std::string m = prometheus_text(s);
  EXPECT_NE(m.find("ina_aggregator_job_packets_total{ina_job=\"9\"} 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("ina_aggregator_stalled_missing{ina_job=\"9\",rank=\"1\"} 1\n"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("{job="), std::string::npos) << m;
  EXPECT_EQ(m.find(",job="), std::string::npos) << m;
}

// The HTTP endpoint (--http-port) is exclusive: a second agent on the busy port fails with an
// error naming it (httplib's default socket options set SO_REUSEPORT, which let both listen and
// share the connections).
TEST(AgentHttp, BusyPortIsRefusedWithItsNumber) {
  AgentTarget target{[] { return AggregatorSnapshot{}; }, [](std::vector<JobConfig>) {}};
  AgentOptions o;
  o.http_bind = "127.0.0.1";
  o.http_port = 0;
  auto first = ControlAgent::start(o, target);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  ASSERT_GT((*first)->http_port(), 0);
  o.http_port = (*first)->http_port();
  auto second = ControlAgent::start(o, target);
  ASSERT_FALSE(second.ok()) << "a second agent listens on busy TCP port " << o.http_port;
  const std::string m = second.status().message();
  EXPECT_NE(m.find("--http-port"), std::string::npos) << m;
  EXPECT_NE(m.find("TCP port " + std::to_string(o.http_port) + " is already in use"),
            std::string::npos)
      << m;
}

}  // namespace
}  // namespace ina::agg
