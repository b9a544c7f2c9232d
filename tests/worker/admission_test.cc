// The worker's admission answer parser and job naming (worker/admission.cc): strict, every
// malformed answer is an error that names the bad field.
#include "worker/admission.h"

#include <gtest/gtest.h>

namespace ina::worker {
namespace {

TEST(AdmissionTest, ParsesAdmittedAndRefused) {
  Result<Admission> a = parse_admission(
      "admitted\njob 12\nkey 18446744073709551615\naggregator 10.0.0.5:4000\nslots 64\nblock "
      "128\nfuture-field x\n");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_TRUE(a->admitted);
  EXPECT_EQ(a->job, 12u);
  EXPECT_EQ(a->key, UINT64_MAX);
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
  EXPECT_FALSE(parse_admission("admitted\njob 1\nkey 2\naggregator h:1\nslots 4\n").ok());
  const char* bad[] = {"job x", "job 4294967296", "key -1", "aggregator h:0", "slots 0",
                       "slots 40000", "block 16385"};
  for (const char* line : bad) {
    std::string body = "admitted\njob 1\nkey 2\naggregator h:1\nslots 4\nblock 8\n";
    body += line;
    body += "\n";
    Result<Admission> a = parse_admission(body);
    ASSERT_FALSE(a.ok()) << line;
    const std::string field(line, std::string(line).find(' '));
    EXPECT_NE(a.status().message().find("'" + field + "'"), std::string::npos)
        << a.status().message();
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
