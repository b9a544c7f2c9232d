// The worker's admission answer parser and job naming (worker/admission.cc): strict, every
// malformed answer is an error that names the bad field.
#include "worker/admission.h"

#include <gtest/gtest.h>

namespace ina::worker {
namespace {

TEST(AdmissionTest, ParsesAdmittedAndRefused) {
  Result<Admission> a = parse_admission(
      "admitted\njob 12\nkey ffffffffffffffff0000000000000001\naggregator 10.0.0.5:4000\nslots "
      "64\nblock "
      "128\nfuture-field x\n");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_TRUE(a->admitted);
  EXPECT_EQ(a->job, 12u);
  EXPECT_EQ(a->key, (Key128{1, UINT64_MAX}));
  EXPECT_EQ(a->aggregator_host, "10.0.0.5");
  EXPECT_EQ(a->aggregator_port, 4000);
  EXPECT_EQ(a->slots, 64u);
  EXPECT_EQ(a->block_elems, 128u);
  a = parse_admission("refused\njob 3\nreason no aggregator has 64 contiguous free slots\n");
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->admitted);
  EXPECT_EQ(a->reason, "no aggregator has 64 contiguous free slots");
}

TEST(AdmissionTest, RejectsMalformedAnswers) {
  EXPECT_FALSE(parse_admission("").ok());
  EXPECT_FALSE(parse_admission("maybe\n").ok());
  // Admitted but incomplete.
  EXPECT_FALSE(
      parse_admission(
          "admitted\njob 1\nkey 00000000000000000000000000000002\naggregator h:1\nslots 4\n")
          .ok());
  const char* bad[] = {"job x",          "job 4294967296", "key -1",
                       "key 2",          "key 0x2",        "key 0000000000000000000000000000000g",
                       "aggregator h:0", "slots 0",        "slots 40000",
                       "block 16385"};
  for (const char* line : bad) {
    std::string body =
        "admitted\njob 1\nkey 00000000000000000000000000000002\naggregator h:1\nslots 4\nblock 8\n";
    body += line;
    body += "\n";
    Result<Admission> a = parse_admission(body);
    ASSERT_FALSE(a.ok()) << line;
    const std::string field(line, std::string(line).find(' '));
    EXPECT_NE(a.status().message().find("'" + field + "'"), std::string::npos)
        << a.status().message();
  }
}

// The contract's sharded answer: "shards K", then K aggregator lines in shard order.
TEST(AdmissionTest, ParsesAShardedAnswer) {
  Result<Admission> a = parse_admission(
      "admitted\njob 9\nkey 00000000000000000000000000000005\nshards 3\naggregator "
      "10.0.0.1:4000\naggregator "
      "10.0.0.2:4001\naggregator [fe80::3]:4002\nslots 32\nblock 256\n");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_EQ(a->aggregators.size(), 3u);
  EXPECT_EQ(a->aggregators[0].host, "10.0.0.1");
  EXPECT_EQ(a->aggregators[1].port, 4001);
  EXPECT_EQ(a->aggregators[2].host, "fe80::3");
  EXPECT_EQ(a->aggregator_host, "10.0.0.1");  // shard 0
  EXPECT_EQ(a->aggregator_port, 4000);

  Config c;
  c.rank = 1;
  c.world_size = 4;
  c.window = 64;
  apply_admission(*a, &c);
  ASSERT_EQ(c.aggregators.size(), 3u);
  EXPECT_EQ(c.aggregators[2].port, 4002);
  EXPECT_EQ(c.aggregator_host, "10.0.0.1");
  EXPECT_EQ(c.job, 9u);
  EXPECT_EQ(c.job_key, 5u);
  EXPECT_EQ(c.window, 32u);
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();

  // An unsharded admission after a sharded static config: one aggregator again.
  a = parse_admission(
      "admitted\njob 1\nkey 00000000000000000000000000000002\naggregator h:7\nslots 4\nblock 8\n");
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->aggregators.size(), 1u);
  apply_admission(*a, &c);
  EXPECT_TRUE(c.aggregators.empty());
  EXPECT_EQ(c.aggregator_host, "h");
  EXPECT_EQ(c.aggregator_port, 7);
  // "shards 1" is an ordinary job too.
  a = parse_admission(
      "admitted\njob 1\nkey 00000000000000000000000000000002\nshards 1\naggregator h:7\nslots "
      "4\nblock 8\n");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->aggregators.size(), 1u);
}

TEST(AdmissionTest, RejectsInconsistentShardLines) {
  const std::string head =
      "admitted\njob 1\nkey 00000000000000000000000000000002\nslots 4\nblock 8\n";
  struct Bad {
    const char* lines;
    const char* names;
  } cases[] = {
      {"shards 2\naggregator a:1\n", "'shards 2' but 1 'aggregator' lines"},
      {"shards 2\naggregator a:1\naggregator b:1\naggregator c:1\n", "more 'aggregator' lines"},
      {"aggregator a:1\naggregator b:1\n", "more 'aggregator' lines than one"},
      {"aggregator a:1\nshards 2\naggregator b:1\n", "'shards' must come once, before"},
      {"shards 0\naggregator a:1\n", "bad 'shards' value '0'"},
      {"shards 65\naggregator a:1\n", "bad 'shards' value '65'"},
      {"shards x\naggregator a:1\n", "bad 'shards' value 'x'"},
      {"shards 2\naggregator a:1\naggregator a:1\n", "appears twice"},
      {"shards 2\naggregator a:1\naggregator b:0\n", "bad 'aggregator' value 'b:0'"},
  };
  for (const Bad& b : cases) {
    Result<Admission> a = parse_admission(head + b.lines);
    ASSERT_FALSE(a.ok()) << b.lines << " was accepted";
    EXPECT_NE(a.status().message().find(b.names), std::string::npos)
        << b.lines << ": " << a.status().message();
  }
}

TEST(AdmissionTest, JobNameFromConfigOrStore) {
  Config c;
  EXPECT_EQ(admission_name(c), "");
  c.store = "10.1.2.3:29500";
  EXPECT_EQ(admission_name(c), "store-10.1.2.3:29500");
  c.store = "[fe80::1]:29500";
  EXPECT_EQ(admission_name(c), "store-_fe80::1_:29500");
  c.job_name = "mine";
  EXPECT_EQ(admission_name(c), "mine");
}

TEST(AdmissionTest, NoNameIsAClearError) {
  Config c;
  c.rank = 0;
  c.world_size = 2;
  c.controller_host = "127.0.0.1";
  c.controller_port = 1;
  const Status s = admit(&c, std::chrono::milliseconds(100));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("INA_JOB_NAME"), std::string::npos) << s.message();
}

TEST(AdmissionTest, UnreachableControllerWithoutStoreIsUnavailable) {
  Config c;
  c.rank = 0;
  c.world_size = 2;
  c.controller_host = "127.0.0.1";
  c.controller_port = 1;  // nothing listens on port 1
  c.job_name = "x";
  const Status s = admit(&c, std::chrono::milliseconds(200));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("no host fallback"), std::string::npos) << s.message();
  // With a store: the host fallback.
  c.store = "127.0.0.1:9";
  ASSERT_TRUE(admit(&c, std::chrono::milliseconds(200)).ok());
  EXPECT_TRUE(c.host_only);
}

}  // namespace
}  // namespace ina::worker
