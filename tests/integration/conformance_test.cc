// Conformance: the failure behaviour the README promises, shown by real processes over kernel
// UDP. Every rank is a forked process that uses only the C ABI (ina/ina.h, configured through
// the environment as a launcher would), against real ina-aggregator processes on 127.0.0.1: one
// (flat), a root and two leaves (a two-level tree), or two (a job sharded over both).
//
//   Mismatch/{flat,tree,sharded}{,_store}  rank 3 calls ina_allreduce with other arguments than
//       ranks 0-2, for every kind of mismatch (a count of the same, more and fewer blocks, one
//       across the block boundary, another dtype, op, int vs float); every rank must return
//       INA_INVALID_ARGUMENT with the same message naming both groups of ranks and both shapes,
//       and the next matched collectives must succeed on every rank with the exact sum. With and
//       without a store (INA_STORE: the host fallback armed). INA_CONFORMANCE_REPS repetitions of
//       the kinds (default 2; the full matrix: 20).
//   AggregatorStopped  the aggregator SIGSTOPped mid-stream with a store set: the ranks move to
//       the host path after the silence limit (not the deadline), exactly.
//   ForgedAndReplayed  while the job runs, a stranger sends the aggregator forged datagrams (the
//       job's id with a bad tag, seq moved, bits flipped, truncated, garbage, HELLOs with a new
//       nonce) and replays genuine ones captured by a relay between the ranks and the aggregator:
//       every collective stays exact and no rank fails.
// The late rank, the killed rank and the killed aggregator are the real-process tests of
// fallback_test.cc and multiprocess_test.cc, which meson runs in this suite too (with filters).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../free_port.h"
#include "ina/ina.h"
#include "ina/protocol/wire.h"
#include "tests/integration/loopback_support.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ina::testing::AggregatorProcess;

constexpr int kWorld = 4;
constexpr int kOdd = 3;           // the rank that calls with other arguments
constexpr int kTimeoutMs = 3000;  // INA_TIMEOUT_MS, as the report that found the wedge used
constexpr size_t kMsgLen = 640;

int reps() {
  const char* e = std::getenv("INA_CONFORMANCE_REPS");
  const int n = e != nullptr ? std::atoi(e) : 0;
  return n > 0 ? n : 2;
}

// One kind of mismatch: ranks 0-2 call (count, dtype, op), rank 3 (odd_count, odd_dtype, odd_op).
struct Kind {
  const char* name;
  size_t count;
  size_t odd_count;
  ina_dtype_t odd_dtype;
  ina_op_t odd_op;
  const char* odd_text;  // how the message names rank 3's call
  const char* text;      // and the others'
};
// The loopback block is 8 KiB: 2048 float32 elements.
const Kind kKinds[] = {
    {"count_same_blocks", 1000, 1001, INA_FLOAT32, INA_SUM, "1001 float32 elements (sum)",
     "1000 float32 elements (sum)"},
    {"count_more_blocks", 1000, 5000, INA_FLOAT32, INA_SUM, "5000 float32 elements (sum)",
     "1000 float32 elements (sum)"},
    {"count_fewer_blocks", 5000, 1000, INA_FLOAT32, INA_SUM, "1000 float32 elements (sum)",
     "5000 float32 elements (sum)"},
    {"count_smaller", 1000, 200, INA_FLOAT32, INA_SUM, "200 float32 elements (sum)",
     "1000 float32 elements (sum)"},
    {"count_across_block", 2048, 2049, INA_FLOAT32, INA_SUM, "2049 float32 elements (sum)",
     "2048 float32 elements (sum)"},
    {"dtype", 1000, 1000, INA_FLOAT16, INA_SUM, "1000 float16 elements (sum)",
     "1000 float32 elements (sum)"},
    {"op", 1000, 1000, INA_FLOAT32, INA_MAX, "1000 float32 elements (max)",
     "1000 float32 elements (sum)"},
    {"int_vs_float", 1000, 1000, INA_INT32, INA_SUM, "1000 int32 elements (sum)",
     "1000 float32 elements (sum)"},
};
constexpr int kKindCount = static_cast<int>(sizeof kKinds / sizeof kKinds[0]);
constexpr int kMatchedAfter = 3;  // matched collectives after each mismatched one

// What the ranks report to the test (MAP_SHARED: written by the forked ranks).
struct Outcome {
  int code;  // the mismatched call's result
  char msg[kMsgLen];
  int after_failed;  // matched collectives after it that failed or were inexact
  char after_msg[kMsgLen];
};
struct Shared {
  char setup[kWorld][kMsgLen];
  Outcome out[kWorld][20 * kKindCount + 1];
  int host_path[kWorld];
  double coll_ms[kWorld];  // AggregatorStopped: the collective the aggregator stopped in
  int done[kWorld];        // collectives that succeeded exactly
  ina::testing::KillDuringCollective stop;
};

struct SharedMap {
  SharedMap() {
    void* mem =
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem != MAP_FAILED) sh = new (mem) Shared();
  }
  ~SharedMap() {
    if (sh != nullptr) munmap(sh, sizeof(Shared));
  }
  SharedMap(const SharedMap&) = delete;
  SharedMap& operator=(const SharedMap&) = delete;
  Shared* sh = nullptr;
};

void put(char* dst, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(dst, kMsgLen, fmt, ap);
  va_end(ap);
}

// The job's topology: what each rank's INA_AGGREGATOR names.
enum class Topo { kFlat, kTree, kSharded };

struct Job {
  AggregatorProcess aggs[3];
  std::vector<std::string> addr;  // per rank
  uint16_t store_port = 0;
  std::string key;  // the job's key (hex): every aggregator's --key, every rank's INA_JOB_KEY

  AggregatorProcess::Options options() const {
    AggregatorProcess::Options o;
    if (!key.empty()) o.extra_args = {"--key", key};
    return o;
  }

  std::string start(Topo t) {
    auto at = [](uint16_t p) { return "127.0.0.1:" + std::to_string(p); };
    addr.assign(kWorld, "");
    switch (t) {
      case Topo::kFlat: {
        if (std::string e = aggs[0].start(kWorld, options()); !e.empty()) return e;
        for (auto& a : addr) a = at(aggs[0].port);
        return "";
      }
      case Topo::kSharded: {
        for (int k = 0; k < 2; ++k) {
          if (std::string e = aggs[k].start(kWorld, options()); !e.empty()) return e;
        }
        for (auto& a : addr) a = at(aggs[0].port) + "," + at(aggs[1].port);
        return "";
      }
      case Topo::kTree: {
        // A root whose ranks are two leaves; leaf c serves ranks 2c and 2c + 1.
        if (std::string e = aggs[2].start(2, options()); !e.empty()) return e;
        for (int c = 0; c < 2; ++c) {
          AggregatorProcess::Options lo = options();
          lo.extra_args.insert(
              lo.extra_args.end(),
              {"--parent", at(aggs[2].port), "--child-index", std::to_string(c), "--rank-base",
               std::to_string(2 * c), "--local-ranks", "2", "--parent-world", "2"});
          if (std::string e = aggs[c].start(kWorld, lo); !e.empty()) return e;
          addr[2 * c] = addr[2 * c + 1] = at(aggs[c].port);
        }
        return "";
      }
    }
    return "unknown topology";
  }
};

// The environment of rank `rank`, as a launcher sets it; then the C ABI's communicator.
ina_comm_t* create_rank(int rank, const Job& job, bool store, char* why) {
  setenv("INA_RANK", std::to_string(rank).c_str(), 1);
  setenv("INA_WORLD_SIZE", std::to_string(kWorld).c_str(), 1);
  setenv("INA_AGGREGATOR", job.addr[static_cast<size_t>(rank)].c_str(), 1);
  setenv("INA_TIMEOUT_MS", std::to_string(kTimeoutMs).c_str(), 1);
  if (store) {
    setenv("INA_STORE", ("127.0.0.1:" + std::to_string(job.store_port)).c_str(), 1);
  } else {
    unsetenv("INA_STORE");
  }
  if (!job.key.empty()) {
    setenv("INA_JOB_KEY", job.key.c_str(), 1);
  } else {
    unsetenv("INA_JOB_KEY");
  }
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  ina_comm_t* comm = nullptr;
  if (ina_comm_create(nullptr, &comm) != INA_SUCCESS) {
    put(why, "ina_comm_create: %s", ina_last_create_error());
    return nullptr;
  }
  return comm;
}

// A matched float32 SUM whose every partial sum is an exact small integer: rank r gives r + 1
// (+ the element's index mod 7), so the sum is 10 + 4 * (i mod 7) on every path.
bool matched_ok(ina_comm_t* comm, size_t count, int rank, char* why) {
  std::vector<float> buf(count);
  for (size_t i = 0; i < count; ++i)
    buf[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 7));
  const ina_result_t r = ina_allreduce(comm, buf.data(), buf.data(), count, INA_FLOAT32, INA_SUM);
  if (r != INA_SUCCESS) {
    put(why, "%s: %s", ina_result_string(r), ina_comm_last_error(comm));
    return false;
  }
  for (size_t i = 0; i < count; ++i) {
    if (buf[i] != static_cast<float>(10 + 4 * static_cast<int>(i % 7))) {
      put(why, "element %zu is %g", i, static_cast<double>(buf[i]));
      return false;
    }
  }
  return true;
}

int mismatch_rank(int rank, const Job& job, bool store, Shared* sh, int n_reps) {
  ina_comm_t* comm = create_rank(rank, job, store, sh->setup[rank]);
  if (comm == nullptr) return 2;
  // One matched collective first: the job is in step before the first mismatch.
  if (!matched_ok(comm, 1000, rank, sh->setup[rank])) return 3;
  std::vector<uint8_t> buf(4 * 8192, 0);
  for (int rep = 0; rep < n_reps; ++rep) {
    for (int k = 0; k < kKindCount; ++k) {
      const Kind& kind = kKinds[k];
      Outcome& o = sh->out[rank][rep * kKindCount + k];
      const bool odd = rank == kOdd;
      // Inputs of 1.0 (any dtype reads them as small values; the call fails anyway).
      std::fill(buf.begin(), buf.end(), uint8_t{0});
      const ina_result_t r =
          ina_allreduce(comm, buf.data(), buf.data(), odd ? kind.odd_count : kind.count,
                        odd ? kind.odd_dtype : INA_FLOAT32, odd ? kind.odd_op : INA_SUM);
      o.code = r;
      put(o.msg, "%s", r == INA_SUCCESS ? "" : ina_comm_last_error(comm));
      for (int a = 0; a < kMatchedAfter; ++a) {
        if (!matched_ok(comm, a == 0 ? kind.count : 3000 * a, rank, o.after_msg)) ++o.after_failed;
      }
    }
  }
  sh->host_path[rank] = ina_comm_on_host_path(comm);
  ina_comm_destroy(comm);
  return 0;
}

void run_mismatch(Topo topo, bool store) {
  Job job;
  ASSERT_EQ(job.start(topo), "");
  if (store) {
    job.store_port = ina::testing::free_loopback_port();
    ASSERT_NE(job.store_port, 0);
  }
  SharedMap shared;
  ASSERT_NE(shared.sh, nullptr);
  Shared* sh = shared.sh;
  const int n_reps = std::min(reps(), 20);
  const auto t0 = Clock::now();
  const std::vector<int> codes = ina::testing::fork_ranks(
      kWorld, [&](int rank) { return mismatch_rank(rank, job, store, sh, n_reps); },
      std::chrono::seconds(60 + 10 * n_reps));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(codes[r], 0) << "rank " << r << ": " << sh->setup[r];
  }
  int split = 0, failed_after = 0;
  for (int rep = 0; rep < n_reps; ++rep) {
    for (int k = 0; k < kKindCount; ++k) {
      const Kind& kind = kKinds[k];
      SCOPED_TRACE(std::string(kind.name) + ", repetition " + std::to_string(rep));
      const int i = rep * kKindCount + k;
      const Outcome& o0 = sh->out[0][i];
      bool same = true;
      for (int r = 0; r < kWorld; ++r) {
        const Outcome& o = sh->out[r][i];
        EXPECT_EQ(o.code, INA_INVALID_ARGUMENT) << "rank " << r << ": " << o.msg;
        EXPECT_STREQ(o.msg, o0.msg) << "rank " << r;
        same = same && o.code == INA_INVALID_ARGUMENT && std::strcmp(o.msg, o0.msg) == 0;
        EXPECT_EQ(o.after_failed, 0) << "rank " << r << ": " << o.after_msg;
        failed_after += o.after_failed;
      }
      split += same ? 0 : 1;
      const std::string m = o0.msg;
      EXPECT_NE(m.find(std::string("ranks 0-2: ") + kind.text + "; ranks 3: " + kind.odd_text),
                std::string::npos)
          << m;
    }
  }
  // Still in network: a mismatch is the user's error, not the aggregator's.
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(sh->host_path[r], 0) << "rank " << r;
  std::printf(
      "%d kinds x %d repetitions: %d split outcomes, %d failed matched collectives "
      "afterwards (%.1f s)\n",
      kKindCount, n_reps, split, failed_after, s);
}

TEST(Mismatch, flat) { run_mismatch(Topo::kFlat, false); }
TEST(Mismatch, flat_store) { run_mismatch(Topo::kFlat, true); }
TEST(Mismatch, tree) { run_mismatch(Topo::kTree, false); }
TEST(Mismatch, tree_store) { run_mismatch(Topo::kTree, true); }
TEST(Mismatch, sharded) { run_mismatch(Topo::kSharded, false); }
TEST(Mismatch, sharded_store) { run_mismatch(Topo::kSharded, true); }

// ---- the aggregator stopped (SIGSTOP) mid-stream, a store set ----

TEST(AggregatorStopped, HostPathAfterTheSilenceLimitExact) {
  Job job;
  ASSERT_EQ(job.start(Topo::kFlat), "");
  job.store_port = ina::testing::free_loopback_port();
  ASSERT_NE(job.store_port, 0);
  SharedMap shared;
  ASSERT_NE(shared.sh, nullptr);
  Shared* sh = shared.sh;
  constexpr size_t kAt = 4, kColls = 8, kCount = 1 << 16;
  auto body = [&](int rank) -> int {
    ina_comm_t* comm = create_rank(rank, job, /*store=*/true, sh->setup[rank]);
    if (comm == nullptr) return 2;
    for (size_t ci = 0; ci < kColls; ++ci) {
      sh->stop.before(ci, kAt);
      const auto t0 = Clock::now();
      if (!matched_ok(comm, kCount, rank, sh->out[rank][0].msg)) return 3;
      if (ci == kAt) {
        sh->coll_ms[rank] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      }
      ++sh->done[rank];
    }
    sh->host_path[rank] = ina_comm_on_host_path(comm);
    ina_comm_destroy(comm);
    return 0;
  };
  const pid_t agg = job.aggs[0].pid;
  const std::string err = ina::testing::run_forked(
      kWorld, body,
      [&] {
        return sh->stop.kill(
            kWorld, kAt, [&] { return kill(agg, SIGSTOP); }, "the aggregator");
      },
      60s);
  kill(agg, SIGCONT);
  EXPECT_EQ(err, "");
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + sh->setup[r] + sh->out[r][0].msg);
    EXPECT_EQ(sh->done[r], static_cast<int>(kColls));
    EXPECT_EQ(sh->host_path[r], 1);
    // The silence limit (500 ms) and the host path, well before the deadline.
    EXPECT_LT(sh->coll_ms[r], 0.8 * kTimeoutMs);
  }
}

// ---- forged and replayed datagrams while the job runs ----

// A UDP relay between the ranks and the aggregator: rank r sends to front[r], which the relay
// forwards from back[r] (so the aggregator sees rank r at back[r]'s address), and the answers
// back. Meanwhile it sends the aggregator, from back[r], genuine datagrams of rank r captured on
// the way (replays, valid tags) and forgeries made from them.
struct Relay {
  int front[kWorld];
  int back[kWorld];
  sockaddr_in rank_addr[kWorld]{};
  bool rank_known[kWorld]{};
  std::vector<std::vector<uint8_t>> captured[kWorld];
  uint64_t sent_hostile = 0, forwarded = 0;
  std::atomic<bool> stop{false};

  std::string open(uint16_t agg_port) {
    for (int r = 0; r < kWorld; ++r) {
      front[r] = socket(AF_INET, SOCK_DGRAM, 0);
      back[r] = socket(AF_INET, SOCK_DGRAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (bind(front[r], reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "bind";
      sockaddr_in g = a;
      g.sin_port = htons(agg_port);
      if (connect(back[r], reinterpret_cast<sockaddr*>(&g), sizeof g) != 0) return "connect";
    }
    return "";
  }
  uint16_t front_port(int r) const {
    sockaddr_in a{};
    socklen_t n = sizeof a;
    getsockname(front[r], reinterpret_cast<sockaddr*>(&a), &n);
    return ntohs(a.sin_port);
  }
  ~Relay() {
    for (int r = 0; r < kWorld; ++r) {
      close(front[r]);
      close(back[r]);
    }
  }

  void run() {
    std::mt19937 rng(12345);
    std::vector<uint8_t> buf(65536);
    pollfd fds[2 * kWorld];
    for (int r = 0; r < kWorld; ++r) {
      fds[r] = {front[r], POLLIN, 0};
      fds[kWorld + r] = {back[r], POLLIN, 0};
    }
    auto last_attack = Clock::now();
    while (!stop.load()) {
      if (poll(fds, 2 * kWorld, 1) > 0) {
        for (int r = 0; r < kWorld; ++r) {
          sockaddr_in from{};
          socklen_t fl = sizeof from;
          ssize_t n;
          while ((n = recvfrom(front[r], buf.data(), buf.size(), MSG_DONTWAIT,
                               reinterpret_cast<sockaddr*>(&from), &fl)) >= 0) {
            rank_addr[r] = from;
            rank_known[r] = true;
            (void)send(back[r], buf.data(), static_cast<size_t>(n), 0);
            ++forwarded;
            if (n >= static_cast<ssize_t>(ina::wire::kHeaderSize) && captured[r].size() < 64 &&
                rng() % 8 == 0) {
              captured[r].emplace_back(buf.begin(), buf.begin() + n);
            }
          }
          while ((n = recv(back[r], buf.data(), buf.size(), MSG_DONTWAIT)) >= 0) {
            if (rank_known[r]) {
              (void)sendto(front[r], buf.data(), static_cast<size_t>(n), 0,
                           reinterpret_cast<sockaddr*>(&rank_addr[r]), sizeof rank_addr[r]);
            }
          }
        }
      }
      if (Clock::now() - last_attack >= 1ms) {
        last_attack = Clock::now();
        for (int i = 0; i < 16; ++i) attack(rng);
      }
    }
  }

  void attack(std::mt19937& rng) {
    const int r = static_cast<int>(rng() % kWorld);
    if (captured[r].empty()) return;
    std::vector<uint8_t> p = captured[r][rng() % captured[r].size()];
    using namespace ina::wire;
    switch (rng() % 6) {
      case 0: break;                          // replay, unchanged
      case 1: p[kOffSeq + 1] ^= 0x10; break;  // seq moved by 2^20
      case 2: p[rng() % p.size()] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;  // a bit
      case 3: p.resize(rng() % p.size()); break;                                      // truncated
      case 4:  // garbage, with the magic or not
        for (auto& b : p) b = static_cast<uint8_t>(rng());
        if (rng() % 2 == 0) p[0] = 0x49, p[1] = 0x4e;
        break;
      case 5:  // a HELLO with a new nonce (a genuine one's tag does not cover it)
        p[kOffFlags] = kFlagHello;
        p[kOffSeq] ^= 0x5a;
        break;
    }
    (void)send(back[r], p.data(), p.size(), 0);
    ++sent_hostile;
  }
};

TEST(ForgedAndReplayed, ChangeNothing) {
  Job job;
  job.key = "5f1e2d3c4b5a69788796a5b4c3d2e1f0";
  ASSERT_EQ(job.start(Topo::kFlat), "");
  Relay relay;
  ASSERT_EQ(relay.open(job.aggs[0].port), "");
  for (int r = 0; r < kWorld; ++r) job.addr[r] = "127.0.0.1:" + std::to_string(relay.front_port(r));
  SharedMap shared;
  ASSERT_NE(shared.sh, nullptr);
  Shared* sh = shared.sh;
  std::thread t([&] { relay.run(); });
  constexpr int kColls = 150;
  const std::vector<int> codes = ina::testing::fork_ranks(
      kWorld,
      [&](int rank) {
        ina_comm_t* comm = create_rank(rank, job, false, sh->setup[rank]);
        if (comm == nullptr) return 2;
        for (int ci = 0; ci < kColls; ++ci) {
          const size_t count = 1000 + static_cast<size_t>(ci % 10) * 3000;
          if (!matched_ok(comm, count, rank, sh->out[rank][0].msg)) return 3;
          ++sh->done[rank];
        }
        sh->host_path[rank] = ina_comm_on_host_path(comm);
        ina_comm_destroy(comm);
        return 0;
      },
      90s);
  relay.stop.store(true);
  t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r << ": " << sh->setup[r] << sh->out[r][0].msg;
    EXPECT_EQ(sh->done[r], kColls) << "rank " << r;
    EXPECT_EQ(sh->host_path[r], 0) << "rank " << r;
  }
  EXPECT_GT(relay.sent_hostile, 500u);
  std::printf(
      "%d collectives per rank exact beside %llu forged and replayed datagrams (%llu "
      "forwarded)\n",
      kColls, static_cast<unsigned long long>(relay.sent_hostile),
      static_cast<unsigned long long>(relay.forwarded));
}

}  // namespace
