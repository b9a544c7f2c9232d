// EtcdReplica against a real one-member etcd the test starts on loopback (exit 77 without etcd):
// one of two replicas leads, the other follows the state it writes, and a deposed leader that
// still believes it leads cannot write (its txn compares the leader key's create revision); the
// new leader writes, and the deposed one reloads the new leader's state.
#include "controller/replica_etcd.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "controller/etcd_client.h"

extern char** environ;

namespace ina::ctl {
namespace {

using namespace std::chrono_literals;

uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

std::string g_etcd_bin;

// A one-member etcd on free loopback ports, its data in a temp dir; killed at the end.
class EtcdProcess {
 public:
  ~EtcdProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  // "" when it serves, else why not.
  std::string start() {
    char tmpl[] = "/tmp/ina-etcd-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return "mkdtemp failed";
    dir_ = tmpl;
    client_ = free_port();
    const uint16_t peer = free_port();
    if (client_ == 0 || peer == 0) return "no free port";
    const std::string c = "http://127.0.0.1:" + std::to_string(client_);
    const std::string p = "http://127.0.0.1:" + std::to_string(peer);
    std::vector<std::string> args = {g_etcd_bin,
                                     "--name",
                                     "t",
                                     "--data-dir",
                                     dir_ + "/data",
                                     "--listen-client-urls",
                                     c,
                                     "--advertise-client-urls",
                                     c,
                                     "--listen-peer-urls",
                                     p,
                                     "--initial-advertise-peer-urls",
                                     p,
                                     "--initial-cluster",
                                     "t=" + p,
                                     "--log-level",
                                     "error"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, (dir_ + "/log").c_str(), O_WRONLY | O_CREAT, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return "cannot spawn " + g_etcd_bin;
    httplib::Client cli("127.0.0.1", client_);
    for (int i = 0; i < 200; ++i) {
      auto r = cli.Get("/health");
      if (r && r->body.find("\"health\":\"true\"") != std::string::npos) return "";
      std::this_thread::sleep_for(50ms);
    }
    return "etcd not healthy within 10 s (log in " + dir_ + "/log)";
  }
  std::string endpoint() const { return "etcd://127.0.0.1:" + std::to_string(client_); }

 private:
  pid_t pid_ = -1;
  std::string dir_;
  uint16_t client_ = 0;
};

// What a replica's apply callback was given last.
struct Applied {
  std::mutex mu;
  std::string text;
  bool leading = false;
  int calls = 0;
  EtcdReplica::Apply fn() {
    return [this](const std::string& t, bool l) {
      std::lock_guard<std::mutex> g(mu);
      text = t;
      leading = l;
      ++calls;
      return ok_status();
    };
  }
  std::string last() {
    std::lock_guard<std::mutex> g(mu);
    return text;
  }
};

template <class F>
bool eventually(F f, std::chrono::milliseconds within) {
  const auto end = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return f();
}

TEST(EtcdReplica, OneLeadsTheOtherFollowsADeposedLeaderCannotWrite) {
  EtcdProcess etcd;
  const std::string why = etcd.start();
  ASSERT_EQ(why, "");
  // A renews rarely (its thread wakes every 2.5 s), so right after being deposed it still
  // believes it leads: its write must fail on etcd's compare, not on its own belief.
  ReplicaOptions slow;
  slow.lease_ttl_s = 10;
  slow.poll_ms = 5000;
  ReplicaOptions quick;
  quick.poll_ms = 50;
  auto a = EtcdReplica::create(etcd.endpoint(), slow);
  auto b = EtcdReplica::create(etcd.endpoint(), quick);
  ASSERT_TRUE(a.ok() && b.ok());
  Applied applied_a, applied_b;
  (*a)->start("127.0.0.1:1", applied_a.fn());
  ASSERT_TRUE(eventually([&] { return (*a)->leading(); }, 5s)) << "A never led";
  EXPECT_EQ(applied_a.last(), "");  // nothing stored yet
  (*b)->start("127.0.0.1:2", applied_b.fn());
  ASSERT_TRUE(eventually([&] { return (*b)->leader() == "127.0.0.1:1"; }, 5s));
  EXPECT_FALSE((*b)->leading());
  ASSERT_TRUE((*a)->save("{\"state\":1}").ok());
  EXPECT_TRUE(eventually([&] { return applied_b.last() == "{\"state\":1}"; }, 3s))
      << "the follower did not load the leader's state";
  // A follower cannot write.
  EXPECT_EQ((*b)->save("{\"state\":\"b\"}").code(), StatusCode::kAborted);

  // Depose A behind its back: its lease is revoked, so its leader key goes and B takes over.
  EtcdClient raw(parse_etcd_endpoints(etcd.endpoint()).value());
  Result<EtcdKv> key = raw.get("/ina/controller/leader");
  ASSERT_TRUE(key.ok() && key->found);
  ASSERT_TRUE(raw.revoke(key->lease).ok());
  ASSERT_TRUE(eventually([&] { return (*b)->leading(); }, 3s)) << "B did not take over";
  const Status stale = (*a)->save("{\"state\":\"stale\"}");
  EXPECT_EQ(stale.code(), StatusCode::kAborted) << stale.to_string();
  Result<EtcdKv> stored = raw.get("/ina/controller/state");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->value, "{\"state\":1}") << "a deposed leader's write reached etcd";
  // The new leader writes; the deposed one reloads that and stops leading.
  ASSERT_TRUE((*b)->save("{\"state\":2}").ok());
  Result<std::string> reloaded = (*a)->reload();
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(*reloaded, "{\"state\":2}");
  EXPECT_FALSE((*a)->leading());
  // A clean stop of the leader hands over at once (its lease is revoked): A leads again.
  (*b)->stop();
  EXPECT_TRUE(eventually([&] { return (*a)->leading(); }, 8s)) << "A did not take over";
}

}  // namespace
}  // namespace ina::ctl

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* path = std::getenv("PATH");
  std::string p = path == nullptr ? "/usr/bin:/bin" : path;
  for (size_t at = 0; at <= p.size();) {
    const size_t colon = p.find(':', at);
    const std::string dir = p.substr(at, colon == std::string::npos ? colon : colon - at);
    if (!dir.empty() && ::access((dir + "/etcd").c_str(), X_OK) == 0) {
      ina::ctl::g_etcd_bin = dir + "/etcd";
      break;
    }
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  if (ina::ctl::g_etcd_bin.empty()) {
    std::printf("SKIP: etcd is not installed (apt-get install etcd-server)\n");
    return 77;
  }
  return RUN_ALL_TESTS();
}
