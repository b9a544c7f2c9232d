// ControllerServer in process on loopback: its listening port is exclusive (a second controller
// on it is refused, naming the port), the state file is checked at start (refused, naming the
// flag, the path and the reason, when it cannot be read or created) and written atomically, a
// failed write is logged at error level (rate-limited) and counted, and /metrics follows the
// Prometheus conventions (each family one meaning: no unlabelled total next to labelled series,
// so sum() is the true count; HELP and TYPE for each).
#include "controller/server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "controller/state_file.h"
#include "ina/protocol/siphash.h"

namespace ina::ctl {
namespace {

std::string make_temp_dir() {
  char tmpl[] = "/tmp/ina-server-test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d == nullptr ? "" : d;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A served controller (run() on a thread) and a client to it.
class Served {
 public:
  explicit Served(ServerOptions o) {
    o.bind = "127.0.0.1";
    o.port = 0;
    auto s = ControllerServer::create(o);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return;
    server_ = std::move(s).value();
    thread_ = std::thread([this] { (void)server_->run(); });
    cli_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    // stop() is a no-op until run()'s accept loop runs: wait for a first answer.
    for (int i = 0; i < 500 && !cli_->Get("/metrics"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  ~Served() {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  bool ok() const { return server_ != nullptr; }
  uint16_t port() const { return server_->port(); }
  httplib::Client& cli() { return *cli_; }
  std::string get(const std::string& path) {
    auto r = cli_->Get(path);
    EXPECT_TRUE(r) << path;
    return r ? r->body : "";
  }
  // Registers aggregator `id` with room for `slots`.
  void register_aggregator(const std::string& id, uint32_t slots) {
    const std::string body = "{\"id\":\"" + id + "\",\"host\":\"127.0.0.1\",\"port\":40001," +
                             "\"slot_capacity\":" + std::to_string(slots) +
                             ",\"max_fan_in\":64,\"block_elems\":256}";
    auto r = cli_->Post("/v1/aggregators/heartbeat", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
  }

 private:
  std::unique_ptr<ControllerServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> cli_;
};

TEST(ControllerServer, BusyPortIsRefusedWithItsNumber) {
  ServerOptions o;
  o.bind = "127.0.0.1";
  o.port = 0;
  auto first = ControllerServer::create(o);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  o.port = (*first)->port();
  auto second = ControllerServer::create(o);
  ASSERT_FALSE(second.ok()) << "a second controller listens on busy TCP port " << o.port;
  const std::string m = second.status().message();
  EXPECT_NE(m.find("--port"), std::string::npos) << m;
  EXPECT_NE(m.find("TCP port " + std::to_string(o.port) + " is already in use"), std::string::npos)
      << m;
}

TEST(ControllerServer, StateFileThatCannotBeCreatedIsRefused) {
  const std::string dir = make_temp_dir();
  ASSERT_FALSE(dir.empty());
  ServerOptions o;
  o.bind = "127.0.0.1";
  o.port = 0;
  o.state_file = dir + "/no-such-dir/state.json";
  auto s = ControllerServer::create(o);
  ASSERT_FALSE(s.ok()) << "started with an uncreatable --state-file";
  std::string m = s.status().message();
  EXPECT_NE(m.find("--state-file " + o.state_file), std::string::npos) << m;
  EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;

  // A path that exists but cannot be read as a file (root reads anything: a directory) is refused
  // too, instead of starting empty and overwriting it at the first change.
  o.state_file = dir;
  s = ControllerServer::create(o);
  ASSERT_FALSE(s.ok()) << "started with a directory as --state-file";
  m = s.status().message();
  EXPECT_NE(m.find("--state-file"), std::string::npos) << m;
  EXPECT_NE(m.find(dir), std::string::npos) << m;
  EXPECT_NE(m.find("Is a directory"), std::string::npos) << m;

  // A creatable one is created at start (an empty state), before any change.
  o.state_file = dir + "/state.json";
  s = ControllerServer::create(o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(access(o.state_file.c_str(), R_OK), 0);
  EXPECT_NE(access((o.state_file + ".tmp").c_str(), F_OK), 0) << "temporary file left behind";
  std::system(("rm -rf " + dir).c_str());
}

TEST(StateFile, AtomicWriteReplacesTheFileAndNamesErrors) {
  const std::string dir = make_temp_dir();
  ASSERT_FALSE(dir.empty());
  const std::string path = dir + "/s.json";
  ASSERT_TRUE(write_file_atomic(path, "one").ok());
  ASSERT_TRUE(write_file_atomic(path, "two\n").ok());
  EXPECT_EQ(read_all(path), "two\n");
  EXPECT_NE(access((path + ".tmp").c_str(), F_OK), 0);
  auto text = read_state_file(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "two\n");
  EXPECT_EQ(read_state_file(dir + "/absent").status().code(), StatusCode::kNotFound);
  // A failed write leaves the old file whole and names the temporary file and the reason.
  ASSERT_EQ(mkdir((path + ".tmp").c_str(), 0755), 0);
  const Status st = write_file_atomic(path, "three");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(path + ".tmp"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("Is a directory"), std::string::npos) << st.message();
  EXPECT_EQ(read_all(path), "two\n");
  std::system(("rm -rf " + dir).c_str());
}

TEST(ControllerServer, FailedStateWritesAreLoggedAndCounted) {
  const std::string dir = make_temp_dir();
  ASSERT_FALSE(dir.empty());
  ServerOptions o;
  o.state_file = dir + "/state.json";
  Served s(o);
  ASSERT_TRUE(s.ok());
  s.register_aggregator("a", 1024);
  // From now on PATH.tmp cannot be created (a directory there; root ignores permissions).
  ASSERT_EQ(mkdir((o.state_file + ".tmp").c_str(), 0755), 0);
  ::testing::internal::CaptureStderr();
  for (const char* name : {"j1", "j2", "j3"}) {
    auto r = s.cli().Get(std::string("/v1/admit?name=") + name + "&world=2&rank=0&slots=16");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body.substr(0, 8), "admitted") << r->body;
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  std::string m = s.get("/metrics");
  EXPECT_NE(m.find("\nina_controller_persist_ok 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("\nina_controller_persist_failures_total 3\n"), std::string::npos) << m;
  // Logged at error level, naming the flag, the file and the reason; rate-limited to one line.
  const std::string line = "[ina error controller] --state-file " + o.state_file +
                           ": cannot create " + o.state_file + ".tmp: Is a directory";
  const size_t at = err.find(line);
  EXPECT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find(line, at + 1), std::string::npos) << "not rate-limited:\n" << err;
  // Once writable again the next change writes every job.
  ASSERT_EQ(rmdir((o.state_file + ".tmp").c_str()), 0);
  auto r = s.cli().Get("/v1/admit?name=j4&world=2&rank=0&slots=16");
  ASSERT_TRUE(r);
  m = s.get("/metrics");
  EXPECT_NE(m.find("\nina_controller_persist_ok 1\n"), std::string::npos) << m;
  const std::string state = read_all(o.state_file);
  for (const char* name : {"j1", "j2", "j3", "j4"}) {
    EXPECT_NE(state.find(std::string("\"") + name + "\""), std::string::npos) << state;
  }
  std::system(("rm -rf " + dir).c_str());
}

// Parses Prometheus text: the TYPE of each family and, per sample name, whether it appeared with
// and without labels.
struct Exposition {
  std::map<std::string, std::string> type;  // family -> counter, gauge, summary, histogram
  std::set<std::string> help;
  std::map<std::string, std::set<bool>> labelled;  // sample name -> {has labels?}
  std::map<std::string, double> sum_by_name;       // sample name -> sum of its values
  std::vector<std::string> errors;
};

Exposition parse(const std::string& text) {
  Exposition e;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.rfind("# HELP ", 0) == 0) {
      e.help.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      const size_t sp = line.find(' ', 7);
      const std::string name = line.substr(7, sp - 7);
      if (e.type.count(name) != 0) e.errors.push_back("two TYPE lines for " + name);
      e.type[name] = line.substr(sp + 1);
      continue;
    }
    const size_t brace = line.find('{');
    const size_t sp = line.rfind(' ');
    const std::string name = line.substr(0, std::min(brace, line.find(' ')));
    e.labelled[name].insert(brace != std::string::npos && brace < sp);
    e.sum_by_name[name] += std::stod(line.substr(sp + 1));
    std::string family = name;
    for (const char* suffix : {"_sum", "_count", "_bucket"}) {
      const std::string s = suffix;
      if (e.type.count(family) == 0 && name.size() > s.size() &&
          name.compare(name.size() - s.size(), s.size(), s) == 0) {
        family = name.substr(0, name.size() - s.size());
      }
    }
    if (e.type.count(family) == 0) e.errors.push_back("sample " + name + " has no TYPE line");
    if (e.help.count(family) == 0) e.errors.push_back("sample " + name + " has no HELP line");
    const std::string& t = e.type[family];
    if (t == "counter" && name.size() > 6 && name.compare(name.size() - 6, 6, "_total") != 0) {
      e.errors.push_back("counter " + name + " does not end in _total");
    }
  }
  return e;
}

// Admitted jobs get 128-bit keys from the kernel's CSPRNG, as 32 hex digits; never twice the
// same, never zero.
TEST(ControllerServer, AdmittedJobsGetDistinct128BitKeys) {
  Served s(ServerOptions{});
  ASSERT_TRUE(s.ok());
  s.register_aggregator("a", 1024);
  std::set<std::string> keys;
  for (const char* name : {"k1", "k2", "k3", "k4"}) {
    auto r = s.cli().Get(std::string("/v1/admit?name=") + name + "&world=2&rank=0&slots=16");
    ASSERT_TRUE(r);
    const size_t at = r->body.find("\nkey ");
    ASSERT_NE(at, std::string::npos) << r->body;
    const std::string hex = r->body.substr(at + 5, r->body.find('\n', at + 1) - at - 5);
    ina::Key128 k;
    ASSERT_TRUE(ina::parse_key_hex(hex, &k)) << "'" << hex << "'";
    EXPECT_FALSE(k.is_zero());
    EXPECT_EQ(hex, ina::key_to_hex(k));  // lowercase
    keys.insert(hex);
  }
  EXPECT_EQ(keys.size(), 4u);
}

TEST(ControllerServer, MetricsFamiliesHaveOneMeaningSoSumsAreTrue) {
  Served s(ServerOptions{});
  ASSERT_TRUE(s.ok());
  s.register_aggregator("a", 1 << 16);
  constexpr int kJobs = 5, kRanks = 4;  // every rank asks: 20 admission requests
  for (int j = 0; j < kJobs; ++j) {
    for (int r = 0; r < kRanks; ++r) {
      auto res = s.cli().Get("/v1/admit?name=job" + std::to_string(j) + "&world=" +
                             std::to_string(kRanks) + "&rank=" + std::to_string(r) + "&slots=16");
      ASSERT_TRUE(res);
      ASSERT_EQ(res->body.substr(0, 8), "admitted") << res->body;
    }
  }
  const std::string m = s.get("/metrics");
  const Exposition e = parse(m);
  EXPECT_TRUE(e.errors.empty()) << ::testing::PrintToString(e.errors) << "\n" << m;
  for (const auto& [name, kinds] : e.labelled) {
    EXPECT_EQ(kinds.size(), 1u) << name << " mixes an unlabelled sample with labelled ones:\n" << m;
  }
  // sum(ina_controller_admission_seconds_count) is the number of requests, not twice it.
  EXPECT_EQ(e.sum_by_name.at("ina_controller_admission_seconds_count"), kJobs * kRanks) << m;
  EXPECT_NE(m.find("ina_controller_admission_seconds_count{kind=\"flat\"} 20\n"), std::string::npos)
      << m;
  EXPECT_EQ(e.type.at("ina_controller_admission_seconds"), "summary");
  EXPECT_EQ(e.type.at("ina_controller_admission_max_seconds"), "gauge");
  EXPECT_EQ(e.type.count("ina_controller_admission_seconds_max"), 0u) << "unit not last";
}

}  // namespace
}  // namespace ina::ctl
