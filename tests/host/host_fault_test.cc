// A rank killed mid-collective (Gloo's transport_test fork-and-kill pattern): fork 3 processes,
// each a rank looping over large AllReduces through a TCP mesh; SIGKILL rank 2 once all are
// running; ranks 0 and 1 must return an error that names rank 2 within the mesh deadline, and
// never hang (the parent kills everything it forked at the end, whatever happened).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/host/harness.h"
#include "worker/host/allreduce.h"
#include "worker/host/alltoall.h"
#include "worker/host/store.h"
#include "worker/host/tcp_mesh.h"

namespace ina::host {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr int kWorld = 3;
constexpr int kVictim = 2;
constexpr milliseconds kMeshTimeout{2000};

enum class Workload { kRing, kHalvingDoubling, kTree, kAlltoall };

// The body of a forked rank: never returns.
[[noreturn]] void rank_main(const std::string& dir, int rank, Workload w) {
  auto store = FileStore::create(dir);
  if (!store.ok()) _exit(10);
  TcpMeshOptions opts;
  opts.timeout = kMeshTimeout;
  auto mesh = TcpMesh::connect(**store, rank, kWorld, opts);
  if (!mesh.ok()) _exit(11);
  constexpr size_t kCount = 1 << 20;
  std::vector<float> in(kCount, 1.0f), out(kCount * kWorld);
  Status s;
  for (int iter = 0; s.ok(); ++iter) {
    if (w == Workload::kAlltoall) {
      s = alltoall(**mesh, out.data(), in.data(), kCount / kWorld, DType::kFloat32);
    } else {
      AllreduceOptions ao;
      ao.algorithm = w == Workload::kRing   ? AllreduceAlgorithm::kRing
                     : w == Workload::kTree ? AllreduceAlgorithm::kTree
                                            : AllreduceAlgorithm::kHalvingDoubling;
      s = allreduce(**mesh, in.data(), out.data(), kCount, DType::kFloat32, ReduceOp::kSum, ao);
    }
    if (iter == 1) (void)(*store)->set("running/" + std::to_string(rank), to_bytes("1"));
  }
  std::ofstream(dir + "/result." + std::to_string(rank)) << s.to_string();
  // Stay alive (sockets open) until the parent has read every result and kills us, so that
  // no survivor sees its neighbour exit instead of the victim.
  std::this_thread::sleep_for(std::chrono::seconds(30));
  _exit(0);
}

class HostFault : public ::testing::TestWithParam<Workload> {};

TEST_P(HostFault, KilledRankIsNamedByTheOthersWithinTheDeadline) {
  test::TempDir dir;
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) rank_main(dir.path(), r, GetParam());
    pids.push_back(pid);
  }
  struct KillAll {  // whatever happens, nothing we forked outlives the test
    std::vector<pid_t>& pids;
    ~KillAll() {
      for (pid_t p : pids) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
      }
    }
  } kill_all{pids};

  auto store = FileStore::create(dir.path());
  ASSERT_TRUE(store.ok());
  Status running = (*store)->wait({"running/0", "running/1", "running/2"}, milliseconds(30000));
  ASSERT_TRUE(running.ok()) << running.to_string();
  std::this_thread::sleep_for(milliseconds(20));
  ASSERT_EQ(kill(pids[kVictim], SIGKILL), 0);
  const auto killed_at = Clock::now();

  // Survivors report within the mesh deadline (plus scheduling slack on a loaded machine).
  for (int r = 0; r < kWorld; ++r) {
    if (r == kVictim) continue;
    const std::string path = dir.path() + "/result." + std::to_string(r);
    std::string msg;
    while (Clock::now() - killed_at < kMeshTimeout + milliseconds(5000)) {
      std::ifstream f(path);
      std::stringstream ss;
      ss << f.rdbuf();
      msg = ss.str();
      if (!msg.empty()) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
    ASSERT_FALSE(msg.empty()) << "rank " << r << " did not fail within the deadline (hang?)";
    EXPECT_NE(msg.find("rank 2"), std::string::npos) << "rank " << r << ": " << msg;
    EXPECT_TRUE(msg.rfind("UNAVAILABLE", 0) == 0 || msg.rfind("DEADLINE_EXCEEDED", 0) == 0)
        << "rank " << r << ": " << msg;
    std::printf("rank %d (after %lld ms): %s\n", r,
                static_cast<long long>(
                    std::chrono::duration_cast<milliseconds>(Clock::now() - killed_at).count()),
                msg.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Workloads, HostFault,
                         ::testing::Values(Workload::kRing, Workload::kHalvingDoubling,
                                           Workload::kTree, Workload::kAlltoall),
                         [](const auto& i) {
                           switch (i.param) {
                             case Workload::kRing: return std::string("ring");
                             case Workload::kHalvingDoubling: return std::string("hd");
                             case Workload::kTree: return std::string("tree");
                             case Workload::kAlltoall: return std::string("alltoall");
                           }
                           return std::string("unknown");
                         });

}  // namespace
}  // namespace ina::host
