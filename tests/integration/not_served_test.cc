// INA configured but not used: an aggregator that never answers (a UDP socket that reads and
// drops) or a controller that is not there. Ranks are forked processes over kernel UDP and the
// TCP mesh (a TcpStore served by rank 0); each rank's stderr goes to a file the test reads.
//
//   SilentAggregatorWarnsOnceAndRunsOnTheHostPath   every rank logs one warning naming the
//       reason ("INA is configured but not used: no aggregator for job ..."), not one per
//       collective, and its AllReduces are exact on the host path.
//   SilentAggregatorWithRequireIncFailsOnEveryRank  Config::require_inc (INA_REQUIRE_INC=1):
//       every rank's Communicator::create fails, kFailedPrecondition naming the variable and why.
//   DeadController{Warns,WithRequireIncFails}        the same for a controller nobody serves.
//   RequireIncWithNothingConfiguredIsAnError        host only by configuration, world 1.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "ina/ina.hpp"
#include "tests/free_port.h"
#include "tests/integration/loopback_support.h"

namespace {

using namespace std::chrono_literals;

constexpr int kWorld = 4;
constexpr const char* kWarning = "INA is configured but not used";

// A UDP socket on 127.0.0.1 that nobody reads: an aggregator that never answers.
struct SilentAggregator {
  int fd = -1;
  uint16_t port = 0;
  SilentAggregator() {
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
  }
  ~SilentAggregator() {
    if (fd >= 0) close(fd);
  }
};

struct Logs {
  std::string dir;
  Logs() {
    char t[] = "/tmp/ina-not-served-XXXXXX";
    const char* d = mkdtemp(t);
    dir = d != nullptr ? d : "/tmp";
  }
  ~Logs() {
    for (int r = 0; r < kWorld; ++r) unlink(path(r).c_str());
    rmdir(dir.c_str());
  }
  std::string path(int r) const { return dir + "/rank" + std::to_string(r) + ".err"; }
  // In the child: stderr to this rank's file.
  void redirect(int r) const {
    const int fd = open(path(r).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) dup2(fd, 2);
  }
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

ina::Config base_config(int rank, uint16_t store_port) {
  ina::Config cfg;
  cfg.rank = rank;
  cfg.world_size = kWorld;
  cfg.timeout = 1500ms;
  cfg.store = "127.0.0.1:" + std::to_string(store_port);
  return cfg;
}

// Every rank: create, then 5 int32 SUM AllReduces that must be exact on the host path.
int runs_on_host_path(ina::Config cfg, const Logs& logs) {
  logs.redirect(cfg.rank);
  auto comm = ina::Communicator::create(cfg);
  if (!comm.ok()) {
    std::fprintf(stderr, "create: %s\n", comm.status().to_string().c_str());
    return 2;
  }
  if (!(*comm)->on_host_path()) return 3;
  for (int i = 0; i < 5; ++i) {
    int32_t x[3] = {cfg.rank, 1, -i}, y[3] = {};
    const ina::Status s = (*comm)->allreduce(x, y, 3, ina::DType::kInt32, ina::ReduceOp::kSum);
    if (!s.ok()) {
      std::fprintf(stderr, "allreduce %d: %s\n", i, s.to_string().c_str());
      return 4;
    }
    if (y[0] != 6 || y[1] != kWorld || y[2] != -i * kWorld) return 5;
  }
  return 0;
}

// Every rank: create must fail with kFailedPrecondition naming INA_REQUIRE_INC and `why`.
int create_fails(ina::Config cfg, const Logs& logs, const std::string& why) {
  logs.redirect(cfg.rank);
  cfg.require_inc = true;
  auto comm = ina::Communicator::create(cfg);
  if (comm.ok()) return 2;
  std::fprintf(stderr, "create: %s\n", comm.status().to_string().c_str());
  if (comm.status().code() != ina::StatusCode::kFailedPrecondition) return 3;
  if (comm.status().message().find("INA_REQUIRE_INC=1") == std::string::npos) return 4;
  if (comm.status().message().find(why) == std::string::npos) return 5;
  return 0;
}

void expect_one_warning_per_rank(const Logs& logs, const std::string& why) {
  for (int r = 0; r < kWorld; ++r) {
    const std::string err = ina::testing::slurp(logs.path(r));
    EXPECT_EQ(count(err, kWarning), 1u) << "rank " << r << ":\n" << err;
    EXPECT_NE(err.find(why), std::string::npos) << "rank " << r << ":\n" << err;
  }
}

void expect_no_warning(const Logs& logs) {
  for (int r = 0; r < kWorld; ++r) {
    const std::string err = ina::testing::slurp(logs.path(r));
    EXPECT_EQ(count(err, kWarning), 0u) << "rank " << r << ":\n" << err;
  }
}

// Runs `rank` (int -> "" or what went wrong) in kWorld forked processes; "" when every one passed.
template <class RankFn>
std::string run_ranks(RankFn rank) {
  return ina::testing::run_forked(
      kWorld, rank, [] { return std::string(); }, 60s);
}

TEST(NotServed, SilentAggregatorWarnsOnceAndRunsOnTheHostPath) {
  SilentAggregator agg;
  ASSERT_NE(agg.port, 0);
  const uint16_t store = ina::testing::free_loopback_port();
  ASSERT_NE(store, 0);
  Logs logs;
  const std::string err = run_ranks([&](int r) {
    ina::Config cfg = base_config(r, store);
    cfg.aggregator_port = agg.port;
    return runs_on_host_path(cfg, logs);
  });
  EXPECT_EQ(err, "");
  expect_one_warning_per_rank(logs, "no aggregator for job");
}

TEST(NotServed, SilentAggregatorWithRequireIncFailsOnEveryRank) {
  SilentAggregator agg;
  ASSERT_NE(agg.port, 0);
  const uint16_t store = ina::testing::free_loopback_port();
  ASSERT_NE(store, 0);
  Logs logs;
  const std::string err = run_ranks([&](int r) {
    ina::Config cfg = base_config(r, store);
    cfg.aggregator_port = agg.port;
    return create_fails(cfg, logs, "no aggregator for job");
  });
  EXPECT_EQ(err, "");
  expect_no_warning(logs);  // the error replaces the warning
}

ina::Config dead_controller_config(int rank, uint16_t store, uint16_t controller) {
  ina::Config cfg = base_config(rank, store);
  cfg.controller_host = "127.0.0.1";
  cfg.controller_port = controller;  // nothing listens there
  cfg.job_name = "not-served-test";
  return cfg;
}

TEST(NotServed, DeadControllerWarnsOnceAndRunsOnTheHostPath) {
  const uint16_t store = ina::testing::free_loopback_port();
  const uint16_t controller = ina::testing::free_loopback_port();
  ASSERT_NE(store, 0);
  ASSERT_NE(controller, 0);
  Logs logs;
  const std::string err = run_ranks(
      [&](int r) { return runs_on_host_path(dead_controller_config(r, store, controller), logs); });
  EXPECT_EQ(err, "");
  expect_one_warning_per_rank(logs, "controller 127.0.0.1:" + std::to_string(controller));
}

TEST(NotServed, DeadControllerWithRequireIncFailsOnEveryRank) {
  const uint16_t store = ina::testing::free_loopback_port();
  const uint16_t controller = ina::testing::free_loopback_port();
  ASSERT_NE(store, 0);
  ASSERT_NE(controller, 0);
  Logs logs;
  const std::string err = run_ranks([&](int r) {
    return create_fails(dead_controller_config(r, store, controller), logs,
                        "controller 127.0.0.1:" + std::to_string(controller));
  });
  EXPECT_EQ(err, "");
}

TEST(NotServed, RequireIncWithNothingConfiguredIsAnError) {
  const uint16_t store = ina::testing::free_loopback_port();
  ASSERT_NE(store, 0);
  ina::Config cfg;
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.store = "127.0.0.1:" + std::to_string(store);
  cfg.host_only = true;
  cfg.require_inc = true;
  auto comm = ina::Communicator::create(cfg);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), ina::StatusCode::kFailedPrecondition);
  EXPECT_NE(comm.status().message().find("INA_REQUIRE_INC=1"), std::string::npos)
      << comm.status().message();
}

}  // namespace
