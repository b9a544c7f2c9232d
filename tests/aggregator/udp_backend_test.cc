// UdpAggregator on loopback: a real socket served by run() in a thread, driven by test sockets
// that play the workers (HELLO/WELCOME, DATA rounds, retransmission, malformed input, UDP GSO/GRO
// batches, the drop/dup hooks, stop).
//
// Length: one suite over one subject; its cases share the helpers above them and each one is
// independent (run one with --gtest_filter).
#include "aggregator/udp_backend.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/udp_net.h"
#include "alloc_counter.h"
#include "test_packets.h"

namespace ina::agg {
namespace {

using namespace std::chrono_literals;
using testing::data_header;
using testing::encode_packet;

constexpr JobId kJob = 3;
constexpr uint64_t kKey = 0x1122334455667788ull;

// Incarnations (WIRE.md): encode_packet() seals as the workers (the epochs Client::recv learns
// from their WELCOMEs) or as a leaf's parent would (test_packets.h).
using testing::parent_epoch;
using testing::worker_epochs;
const bool g_epochs_hooked = [] {
  testing::hook_worker_epochs();
  return true;
}();

// One simulated worker: a UDP socket on 127.0.0.1.
class Client {
 public:
  explicit Client(uint16_t agg_port) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd_, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    agg_.sin_family = AF_INET;
    agg_.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    agg_.sin_port = htons(agg_port);
  }
  ~Client() {
    if (fd_ >= 0) ::close(fd_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  uint16_t port() const {
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len), 0);
    return ntohs(sa.sin_port);
  }

  void send(const std::vector<uint8_t>& b) {
    ASSERT_EQ(
        ::sendto(fd_, b.data(), b.size(), 0, reinterpret_cast<const sockaddr*>(&agg_), sizeof agg_),
        static_cast<ssize_t>(b.size()));
  }

  // Sends equal-size packets as one UDP GSO datagram train. False when the kernel lacks GSO.
  bool send_gso(const std::vector<std::vector<uint8_t>>& pkts) {
    std::vector<uint8_t> all;
    for (const auto& p : pkts) all.insert(all.end(), p.begin(), p.end());
    iovec iov{all.data(), all.size()};
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(uint16_t))] = {};
    msghdr m{};
    m.msg_name = &agg_;
    m.msg_namelen = sizeof agg_;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctrl;
    m.msg_controllen = sizeof ctrl;
    cmsghdr* cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_UDP;
    cm->cmsg_type = UDP_SEGMENT;
    cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    const auto seg = static_cast<uint16_t>(pkts[0].size());
    std::memcpy(CMSG_DATA(cm), &seg, sizeof seg);
    return ::sendmsg(fd_, &m, 0) == static_cast<ssize_t>(all.size());
  }

  struct Packet {
    wire::Header hdr;
    std::vector<int32_t> payload;
  };
  // The next packet, or nullopt after `timeout`.
  std::optional<Packet> recv(std::chrono::milliseconds timeout = 3000ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return std::nullopt;
    uint8_t buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0) return std::nullopt;
    wire::PacketView v;
    const std::span<const uint8_t> d(buf, static_cast<size_t>(n));
    EXPECT_EQ(wire::decode(d, &v), wire::DecodeError::kOk);
    testing::learn_welcome(v);
    EXPECT_TRUE(testing::reply_tag_ok(d, v.hdr.job, key))
        << "a reply not sealed with the job's key or its incarnation's";
    return Packet{v.hdr, testing::payload_words(v)};
  }

  uint64_t key = kKey;  // the job key replies must be sealed with

 private:
  int fd_ = -1;
  sockaddr_in agg_{};
};

// Value of a counter row ("  name   123") in format_counters() text; -1 when absent.
int64_t counter_value(const std::string& text, const std::string& name) {
  const std::string key = "  " + name + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + key.size()));
}

class UdpAggregatorTest : public ::testing::Test {
 protected:
  void start(uint32_t world, UdpOptions opts = {}, uint32_t slots = 8, uint16_t elems = 16) {
    opts.bind_host = "127.0.0.1";
    opts.port = 0;
    JobConfig job;
    job.job = kJob;
    job.key = kKey;
    job.slots.world_size = world;
    job.slots.num_slots = slots;
    job.slots.max_payload_bytes = static_cast<uint32_t>(elems) * 4;
    welcome_ = {static_cast<int32_t>(slots), static_cast<int32_t>(elems) * 4};
    auto a = UdpAggregator::create(opts, {job});
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    agg_ = std::move(a).value();
    ASSERT_NE(agg_->port(), 0);
    allocs_at_start_ = testing::g_counted_allocs.load();
    thread_ = std::thread([this] {
      testing::CountAllocs counting;  // the serving loop must not allocate
      run_status_ = agg_->run(stop_);
    });
    for (uint32_t r = 0; r < world; ++r) clients_.push_back(std::make_unique<Client>(agg_->port()));
  }

  // Stops run() and returns how long it took to return.
  std::chrono::milliseconds stop() {
    if (!thread_.joinable()) return 0ms;
    const auto t0 = std::chrono::steady_clock::now();
    stop_.store(true);
    thread_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_.to_string();
    // Several serving threads: starting each of lanes 1.. allocates std::thread's state once
    // (those threads' own allocations are not counted; lane 0's packet path is).
    EXPECT_EQ(testing::g_counted_allocs.load() - allocs_at_start_, agg_->threads() - 1u)
        << "run() allocated on its packet path";
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 t0);
  }

  void TearDown() override { stop(); }

  std::vector<uint8_t> hello_packet(uint16_t rank, uint32_t world, bool retransmit = false) {
    wire::Header h;
    h.tag = kKey;  // the key encode_packet() seals with
    h.job = kJob;
    h.rank = rank;
    h.seq = nonce(rank);
    h.flags = static_cast<uint8_t>(wire::kFlagHello | (retransmit ? wire::kFlagRetransmit : 0));
    return encode_packet(h, std::vector<int32_t>{static_cast<int32_t>(world)});
  }

  std::vector<uint8_t> data_packet(uint16_t rank, uint16_t slot, bool shadow, BlockSeq seq,
                                   const std::vector<int32_t>& v, uint8_t flags = 0) {
    wire::Header h = data_header(kJob, kKey, rank, slot, shadow, seq, 0);
    h.flags = flags;
    return encode_packet(h, v);
  }

  // Every rank sends HELLO; every rank must get exactly one WELCOME notice (seq 0), only after
  // the last HELLO; then, as a worker does, its HELLO again, answered with its own WELCOME
  // (seq = its nonce) naming the incarnation's epoch (WIRE.md, "Incarnations").
  void join(uint32_t world) {
    for (uint16_t r = 0; r + 1u < world; ++r) clients_[r]->send(hello_packet(r, world));
    // The barrier is open: nobody is welcomed yet.
    EXPECT_FALSE(clients_[0]->recv(150ms).has_value());
    clients_[world - 1]->send(hello_packet(static_cast<uint16_t>(world - 1), world));
    std::optional<uint64_t> epoch;
    for (uint32_t r = 0; r < world; ++r) {
      auto p = clients_[r]->recv();
      ASSERT_TRUE(p.has_value()) << "rank " << r << " got no WELCOME";
      EXPECT_EQ(p->hdr.flags, wire::kFlagHello | wire::kFlagResult);
      EXPECT_EQ(p->hdr.job, kJob);
      EXPECT_EQ(p->hdr.seq, 0u);
      ASSERT_EQ(p->payload.size(), wire::kWelcomeWords);
      EXPECT_EQ(std::vector<int32_t>(p->payload.begin(), p->payload.begin() + 2),
                welcome_);  // num_slots, max_payload_bytes
      clients_[r]->send(hello_packet(static_cast<uint16_t>(r), world));
      do {  // a duplicated HELLO (the dup hook) earns more notices
        p = clients_[r]->recv();
        ASSERT_TRUE(p.has_value()) << "rank " << r << " got no WELCOME of its own";
        ASSERT_TRUE(p->hdr.has(wire::kFlagHello));
      } while (p->hdr.seq == 0);
      EXPECT_EQ(p->hdr.seq, nonce(static_cast<uint16_t>(r)));
      const uint64_t e = static_cast<uint32_t>(p->payload[2]) |
                         uint64_t{static_cast<uint32_t>(p->payload[3])} << 32;
      if (epoch.has_value()) {
        EXPECT_EQ(e, *epoch) << "rank " << r;
      }
      epoch = e;
    }
    ASSERT_EQ(worker_epochs()[kJob], epoch.value_or(0));
  }
  static BlockSeq nonce(uint16_t rank) { return 0xC0FFEE00u + rank; }

  std::unique_ptr<UdpAggregator> agg_;
  std::vector<int32_t> welcome_;  // the WELCOME's payload start() configured
  std::atomic<bool> stop_{false};
  size_t allocs_at_start_ = 0;
  std::thread thread_;
  Status run_status_;
  std::vector<std::unique_ptr<Client>> clients_;
};

class UdpAggregatorWorldTest : public UdpAggregatorTest,
                               public ::testing::WithParamInterface<uint32_t> {};

TEST_P(UdpAggregatorWorldTest, JoinThenRoundsReachEveryRank) {
  const uint32_t world = GetParam();
  start(world);
  ASSERT_NO_FATAL_FAILURE(join(world));

  // Rounds through a window of 4 slots, alternating copies, seq per block.
  constexpr uint16_t kWindow = 4;
  BlockSeq seq = 100;
  for (int round = 0; round < 3; ++round) {
    std::map<BlockSeq, std::vector<int32_t>> want;
    for (uint16_t s = 0; s < kWindow; ++s, ++seq) {
      std::vector<int32_t> sum(5, 0);
      for (uint16_t r = 0; r < world; ++r) {
        std::vector<int32_t> v(5);
        for (size_t k = 0; k < v.size(); ++k) {
          v[k] = static_cast<int32_t>(seq * 1000 + r * 10 + k) * (r % 2 ? -1 : 1);
          sum[k] += v[k];
        }
        clients_[r]->send(data_packet(r, s, round % 2 == 1, seq, v));
      }
      want[seq] = sum;
    }
    for (uint32_t r = 0; r < world; ++r) {
      std::map<BlockSeq, std::vector<int32_t>> got;
      for (uint16_t s = 0; s < kWindow; ++s) {
        auto p = clients_[r]->recv();
        ASSERT_TRUE(p.has_value()) << "rank " << r << " round " << round;
        EXPECT_EQ(p->hdr.flags, wire::kFlagResult);
        EXPECT_EQ(p->hdr.shadow, round % 2 == 1);
        EXPECT_EQ(p->hdr.slot, static_cast<uint16_t>((p->hdr.seq - 100) % kWindow));
        got[p->hdr.seq] = p->payload;
      }
      EXPECT_EQ(got, want) << "rank " << r;
    }
  }

  // Rank 0 "lost" the last result: its retransmission gets the result again, to it alone.
  constexpr bool kLastShadow = false;  // round 2 used copy 0
  clients_[0]->send(data_packet(0, kWindow - 1, kLastShadow, seq - 1, std::vector<int32_t>(5, 0),
                                wire::kFlagRetransmit));
  auto p = clients_[0]->recv();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->hdr.seq, seq - 1);
  EXPECT_EQ(p->hdr.flags, wire::kFlagResult | wire::kFlagRetransmit);  // a resend, marked
  EXPECT_FALSE(clients_[1]->recv(100ms).has_value());

  stop();
  const EngineCounters& c = agg_->engine().counters();
  EXPECT_EQ(c.completed, 3u * kWindow);
  EXPECT_EQ(c.resent_results, 1u);
  EXPECT_EQ(c.malformed, 0u);
  const std::string text = agg_->format_counters();
  EXPECT_EQ(counter_value(text, "completed"), 12);
  EXPECT_EQ(counter_value(text, "send_errors"), 0);
  EXPECT_EQ(counter_value(text, "unroutable"), 0);
  // 2 WELCOMEs (the notice, its own) and 12 results per rank, plus the resent result.
  EXPECT_EQ(counter_value(text, "tx_datagrams"), static_cast<int64_t>(world * 14 + 1));
  EXPECT_NE(text.find("127.0.0.1:"), std::string::npos) << text;  // learned rank addresses
}

std::string world_name(const ::testing::TestParamInfo<uint32_t>& p) {
  return "world" + std::to_string(p.param);
}
INSTANTIATE_TEST_SUITE_P(Worlds, UdpAggregatorWorldTest, ::testing::Values(2, 3, 4), world_name);

TEST_F(UdpAggregatorTest, MalformedDatagramIsCountedAndDropped) {
  start(2);
  ASSERT_NO_FATAL_FAILURE(join(2));
  clients_[0]->send({0xDE, 0xAD, 0xBE, 0xEF});  // truncated
  std::vector<uint8_t> bad = data_packet(0, 0, false, 1, {1});
  bad[0] = 0;  // bad magic
  clients_[0]->send(bad);
  // A retransmitted HELLO is answered: once its WELCOME arrives, the datagrams before it (same
  // socket, same order) have been processed.
  clients_[0]->send(hello_packet(0, 2, /*retransmit=*/true));
  auto p = clients_[0]->recv();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->hdr.flags, wire::kFlagHello | wire::kFlagResult);
  EXPECT_FALSE(clients_[0]->recv(100ms).has_value());  // nothing answered the bad ones
  stop();
  const EngineCounters& c = agg_->engine().counters();
  EXPECT_EQ(c.malformed, 2u);
  EXPECT_EQ(c.decode.by_error[static_cast<size_t>(wire::DecodeError::kTruncated)], 1u);
  EXPECT_EQ(c.decode.by_error[static_cast<size_t>(wire::DecodeError::kBadMagic)], 1u);
  const std::string text = agg_->format_counters();
  EXPECT_EQ(counter_value(text, "truncated"), 1);
  EXPECT_EQ(counter_value(text, "bad_magic"), 1);
  EXPECT_EQ(counter_value(text, "bad_tag"), 0);
}

// A datagram sealed without the job's key, from another address, naming rank 0: counted as
// bad_tag and dropped, and the rank's address does not move (the next result goes to rank 0's
// real socket, nothing to the forger).
TEST_F(UdpAggregatorTest, BadTagIsCountedAndMovesNoAddress) {
  start(2);
  ASSERT_NO_FATAL_FAILURE(join(2));
  Client forger(agg_->port());
  wire::Header h = data_header(kJob, kKey ^ 1, 0, 0, false, 1, 0);
  forger.send(encode_packet(h, std::vector<int32_t>{1000}));
  wire::Header hello = testing::hello_header(kJob, 0, 0, 0xBAD);  // new nonce, no key
  forger.send(encode_packet(hello, std::vector<int32_t>{2}));
  clients_[0]->send(data_packet(0, 0, false, 1, {1}));
  clients_[1]->send(data_packet(1, 0, false, 1, {2}));
  for (int r = 0; r < 2; ++r) {
    auto p = clients_[r]->recv();
    ASSERT_TRUE(p.has_value()) << "rank " << r;
    EXPECT_EQ(p->payload, (std::vector<int32_t>{3}));
  }
  EXPECT_FALSE(forger.recv(100ms).has_value());
  stop();
  EXPECT_EQ(agg_->engine().counters().bad_tag, 2u);
  EXPECT_EQ(counter_value(agg_->format_counters(), "bad_tag"), 2);
}

TEST_F(UdpAggregatorTest, StopEndsRunPromptly) {
  start(2);
  std::this_thread::sleep_for(50ms);  // let run() reach its poll
  EXPECT_LT(stop(), 1000ms);
}

// A GSO train from one rank arrives as one GRO buffer (when the aggregator has GRO) and must be
// split into its datagrams; the results of a batch of completions go back as GSO trains (when
// the aggregator has GSO) and must arrive as separate, intact datagrams.
TEST_F(UdpAggregatorTest, GsoTrainsInBothDirections) {
  constexpr uint32_t kWorld = 2;
  constexpr uint16_t kBlocks = 8;
  start(kWorld);
  ASSERT_NO_FATAL_FAILURE(join(kWorld));
  for (uint16_t s = 0; s < kBlocks; ++s) {
    clients_[0]->send(data_packet(0, s, false, 10 + s, {s, -s, 7}));
  }
  // Rank 0's packets are queued; wait for them to be processed before the train completes them.
  clients_[0]->send(hello_packet(0, kWorld, true));
  ASSERT_TRUE(clients_[0]->recv().has_value());
  std::vector<std::vector<uint8_t>> train;
  for (uint16_t s = 0; s < kBlocks; ++s)
    train.push_back(data_packet(1, s, false, 10 + s, {1, 1, 1}));
  const bool sent_as_train = clients_[1]->send_gso(train);
  if (!sent_as_train) {
    for (const auto& p : train) clients_[1]->send(p);  // a kernel without UDP_SEGMENT
  }
  for (uint32_t r = 0; r < kWorld; ++r) {
    std::map<BlockSeq, std::vector<int32_t>> got;
    for (uint16_t k = 0; k < kBlocks; ++k) {
      auto p = clients_[r]->recv();
      ASSERT_TRUE(p.has_value()) << "rank " << r << " result " << k;
      got[p->hdr.seq] = p->payload;
    }
    for (uint16_t s = 0; s < kBlocks; ++s) {
      EXPECT_EQ(got[10u + s], (std::vector<int32_t>{s + 1, 1 - s, 8})) << "rank " << r;
    }
  }
  stop();
  const std::string text = agg_->format_counters();
  EXPECT_EQ(agg_->engine().counters().completed, kBlocks);
  if (sent_as_train && agg_->gro_enabled()) {
    // The train arrived as one buffer, so its 8 completions were flushed together: with GSO,
    // each rank's 8 equal-size results leave as one train.
    EXPECT_EQ(counter_value(text, "gro_buffers"), 1) << text;
    if (agg_->gso_enabled()) {
      EXPECT_EQ(counter_value(text, "tx_gso_entries"), kWorld) << text;
    }
  }
  RecordProperty("gro", agg_->gro_enabled() ? "on" : "off");
  RecordProperty("gso", agg_->gso_enabled() ? "on" : "off");
}

TEST_F(UdpAggregatorTest, GsoOffSendsDatagramsOneByOne) {
  UdpOptions o;
  o.gso = false;
  o.gro = false;
  start(2, o);
  EXPECT_FALSE(agg_->gso_enabled());
  EXPECT_FALSE(agg_->gro_enabled());
  ASSERT_NO_FATAL_FAILURE(join(2));
  for (uint16_t s = 0; s < 4; ++s) clients_[0]->send(data_packet(0, s, false, 1 + s, {1}));
  for (uint16_t s = 0; s < 4; ++s) clients_[1]->send(data_packet(1, s, false, 1 + s, {2}));
  for (uint32_t r = 0; r < 2; ++r) {
    for (int k = 0; k < 4; ++k) {
      auto p = clients_[r]->recv();
      ASSERT_TRUE(p.has_value());
      EXPECT_EQ(p->payload, (std::vector<int32_t>{3}));
    }
  }
  stop();
  EXPECT_EQ(counter_value(agg_->format_counters(), "tx_gso_entries"), 0);
}

TEST_F(UdpAggregatorTest, DuplicateHookNeverAddsTwice) {
  UdpOptions o;
  o.dup_percent = 100;
  start(2, o);
  ASSERT_NO_FATAL_FAILURE(join(2));
  clients_[0]->send(data_packet(0, 0, false, 1, {5}));
  clients_[1]->send(data_packet(1, 0, false, 1, {6}));
  for (uint32_t r = 0; r < 2; ++r) {
    std::optional<Client::Packet> p;
    // The duplicated last HELLO earned its sender a second WELCOME: skip it.
    do {
      p = clients_[r]->recv();
      ASSERT_TRUE(p.has_value());
    } while (p->hdr.has(wire::kFlagHello));
    EXPECT_EQ(p->hdr.flags, wire::kFlagResult);
    EXPECT_EQ(p->payload, (std::vector<int32_t>{11}));
  }
  // Rank 1's duplicate completed nothing: it was answered with the result, once more.
  auto extra = clients_[1]->recv(300ms);
  ASSERT_TRUE(extra.has_value());
  EXPECT_EQ(extra->payload, (std::vector<int32_t>{11}));
  EXPECT_EQ(extra->hdr.flags, wire::kFlagResult | wire::kFlagRetransmit);
  stop();
  EXPECT_EQ(agg_->engine().counters().duplicates, 2u);
  EXPECT_EQ(agg_->engine().counters().resent_results, 1u);
  EXPECT_EQ(agg_->engine().counters().completed, 1u);
}

TEST_F(UdpAggregatorTest, DropHookDropsEverything) {
  UdpOptions o;
  o.drop_percent = 100;
  start(2, o);
  clients_[0]->send(hello_packet(0, 2));
  clients_[1]->send(hello_packet(1, 2));
  EXPECT_FALSE(clients_[0]->recv(300ms).has_value());
  stop();
  EXPECT_EQ(agg_->dropped_by_hook(), 2u);
  EXPECT_EQ(agg_->engine().counters().packets_in, 0u);
}

// Several serving threads: slot s belongs to thread (s / 16) % 2 (runs of wire::kSlotRun).
// Workers' datagrams sent one by one
// (the reuseport program steers each to its owner), as GSO trains (one buffer of several slots:
// the receiving thread hands the others' over) and, with the steering off, by the kernel's flow
// hash alone. Every result is exact, each rank gets one WELCOME, both threads complete blocks.
class UdpAggregatorThreadsTest : public UdpAggregatorTest,
                                 public ::testing::WithParamInterface<bool> {};

TEST_P(UdpAggregatorThreadsTest, SlotsSpreadOverThreadsWithExactResults) {
  const bool steer = GetParam();
  constexpr uint32_t kWorld = 4;
  constexpr uint16_t kSlots = 2 * wire::kSlotRun;
  UdpOptions o;
  o.threads = 2;
  o.steer = steer;
  start(kWorld, o, kSlots);
  ASSERT_EQ(agg_->threads(), 2u);
  ASSERT_NO_FATAL_FAILURE(join(kWorld));
  for (uint32_t r = 0; r < kWorld; ++r) {
    EXPECT_FALSE(clients_[r]->recv(50ms).has_value()) << "rank " << r << ": a second WELCOME";
  }
  BlockSeq seq = 1;
  bool any_train = false;
  for (int round = 0; round < 6; ++round) {
    const bool shadow = round % 2 == 1;
    const bool as_train = round >= 3;  // rounds 3..5: every rank sends its 8 blocks as one train
    std::map<BlockSeq, std::vector<int32_t>> want;
    std::vector<std::vector<std::vector<uint8_t>>> pkts(kWorld);
    for (uint16_t s = 0; s < kSlots; ++s, ++seq) {
      std::vector<int32_t> sum(16, 0);
      for (uint16_t r = 0; r < kWorld; ++r) {
        std::vector<int32_t> v(16);
        for (size_t k = 0; k < v.size(); ++k) {
          v[k] = static_cast<int32_t>(seq * 7919 + r * 31 + k) * (r % 2 ? -1 : 1);
          sum[k] += v[k];
        }
        pkts[r].push_back(data_packet(r, s, shadow, seq, v));
      }
      want[seq] = sum;
    }
    for (uint16_t r = 0; r < kWorld; ++r) {
      if (as_train && clients_[r]->send_gso(pkts[r])) {
        any_train = true;
        continue;
      }
      for (const auto& p : pkts[r]) clients_[r]->send(p);
    }
    for (uint32_t r = 0; r < kWorld; ++r) {
      std::map<BlockSeq, std::vector<int32_t>> got;
      for (uint16_t k = 0; k < kSlots; ++k) {
        auto p = clients_[r]->recv();
        ASSERT_TRUE(p.has_value()) << "rank " << r << " round " << round << " result " << k;
        EXPECT_EQ(p->hdr.flags, wire::kFlagResult);
        got[p->hdr.seq] = p->payload;
      }
      EXPECT_EQ(got, want) << "rank " << r << " round " << round;
    }
  }
  stop();
  const EngineCounters t = agg_->engine_totals();
  EXPECT_EQ(t.completed, 6u * kSlots);
  // Each rank HELLOs twice: to join, and again on the barrier's notice (WIRE.md).
  EXPECT_EQ(t.hellos, 2 * kWorld) << "a HELLO copy was counted twice";
  EXPECT_EQ(t.malformed + t.stale + t.not_ready + t.duplicates, 0u);
  // Slots 0..15 on thread 0, 16..31 on thread 1: half of the blocks each.
  EXPECT_EQ(agg_->engine(0).counters().completed, 3u * kSlots);
  EXPECT_EQ(agg_->engine(1).counters().completed, 3u * kSlots);
  const std::string text = agg_->format_counters();
  EXPECT_EQ(counter_value(text, "threads"), 2);
  EXPECT_EQ(counter_value(text, "handoff_dropped"), 0);
  EXPECT_EQ(counter_value(text, "completed"), 6 * kSlots);
  // Each HELLO is copied to the other thread. Steered, the datagrams sent one by one reach their
  // owner directly: only trains (one of all 32 slots: their other thread's half) are handed
  // over.
  const uint64_t train_handoffs = any_train ? 3u * kWorld * kSlots / 2 : 0;
  if (steer) {
    EXPECT_EQ(agg_->handed_off(), 2 * kWorld + train_handoffs) << text;
  } else {
    EXPECT_GE(agg_->handed_off(), 2 * kWorld + train_handoffs) << text;
  }
  RecordProperty("handed_off", std::to_string(agg_->handed_off()));
}

INSTANTIATE_TEST_SUITE_P(Steering, UdpAggregatorThreadsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("steered") : std::string("flow_hash");
                         });

TEST(UdpAggregatorCreateTest, ThreadsZeroIsOnePerCpu) {
  UdpOptions o;
  o.bind_host = "127.0.0.1";
  o.port = 0;
  o.threads = 0;
  o.max_payload_bytes = 64;
  auto a = UdpAggregator::create(o, {});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_EQ((*a)->threads(),
            std::min<unsigned>(static_cast<unsigned>(CPU_COUNT(&set)), kMaxUdpThreads));
  o.threads = kMaxUdpThreads + 1;
  auto bad = UdpAggregator::create(o, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("threads"), std::string::npos);
}

// An aggregator created without jobs (they come from set_jobs, as the controller agent's do),
// serving on its own thread. stop() ends run() and expects it to have returned OK; the destructor
// stops it too, so a test that fails half way does not leave the thread running.
class JoblessAggregator {
 public:
  explicit JoblessAggregator(uint32_t slot_capacity = UdpOptions{}.slot_capacity,
                             unsigned threads = 1) {
    UdpOptions opts;
    opts.threads = threads;
    opts.bind_host = "127.0.0.1";
    opts.port = 0;
    opts.slot_capacity = slot_capacity;
    opts.max_payload_bytes = static_cast<uint32_t>(16) * 4;
    opts.snapshot_interval = 10ms;
    auto created = UdpAggregator::create(opts, {});
    EXPECT_TRUE(created.ok()) << created.status().to_string();
    if (!created.ok()) return;
    agg_ = std::move(created).value();
    thread_ = std::thread([this] { run_status_ = agg_->run(stop_); });
  }
  ~JoblessAggregator() { stop(); }
  UdpAggregator* get() const { return agg_.get(); }
  void stop() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    thread_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_.to_string();
  }

 private:
  std::unique_ptr<UdpAggregator> agg_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  Status run_status_;
};

// Jobs added and removed at run time (as the controller agent does): two jobs served at once
// with exact results, a spoofed key ignored, one job removed while the other keeps running.
class UdpAggregatorJobsThreadsTest : public ::testing::TestWithParam<unsigned> {};

// With 2 threads the jobs reach both (slots 0 and 16 are on different threads) and the snapshot
// merges them.
TEST_P(UdpAggregatorJobsThreadsTest, SetJobsAtRunTime) {
  JoblessAggregator running(64, GetParam());
  ASSERT_NE(running.get(), nullptr);
  UdpAggregator& agg = *running.get();

  auto job = [](JobId id, uint64_t key, uint32_t base, uint32_t slots = 32) {
    JobConfig j;
    j.job = id;
    j.key = key;
    j.slots.world_size = 2;
    j.slots.num_slots = slots;
    j.slots.max_payload_bytes = static_cast<uint32_t>(16) * 4;
    j.slot_base = base;
    return j;
  };
  // Job 6 overlaps job 4's range: refused and reported, the others unaffected.
  agg.set_jobs({job(4, 0x44, 0), job(5, 0x55, 32), job(6, 0x66, 16)});
  auto wait_for = [&](auto pred) {
    for (int i = 0; i < 300 && !pred(agg.snapshot()); ++i) std::this_thread::sleep_for(10ms);
    return pred(agg.snapshot());
  };
  ASSERT_TRUE(wait_for([](const AggregatorSnapshot& s) { return s.jobs.size() == 2; }));
  EXPECT_NE(agg.snapshot().job_errors.at(6).find("overlaps job 4"), std::string::npos);

  Client a0(agg.port()), a1(agg.port()), b0(agg.port()), b1(agg.port());
  a0.key = a1.key = 0x44;
  b0.key = b1.key = 0x55;
  auto hello = [](JobId id, uint64_t key, uint16_t rank) {
    wire::Header h = testing::hello_header(id, key, rank, 100 + rank);
    return encode_packet(h, std::vector<int32_t>{2});
  };
  a0.send(hello(4, 0x44, 0));
  a1.send(hello(4, 0x44, 1));
  b0.send(hello(5, 0x55, 0));
  b1.send(hello(5, 0x55, 1));
  for (Client* c : {&a0, &a1, &b0, &b1}) {
    auto p = c->recv();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->hdr.flags, wire::kFlagHello | wire::kFlagResult);
  }
  // The WELCOMEs were the notices: each rank's own names the epoch (Client::recv keeps it).
  a0.send(hello(4, 0x44, 0));
  b0.send(hello(5, 0x55, 0));
  for (Client* c : {&a0, &b0}) {
    auto p = c->recv();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->hdr.seq, 100u);
  }
  // Same slot numbers in both jobs.
  a0.send(encode_packet(data_header(4, 0x44, 0, 0, false, 1, 3), {1, 2, 3}));
  b0.send(encode_packet(data_header(5, 0x55, 0, 0, false, 1, 3), {10, 20, 30}));
  b1.send(encode_packet(data_header(5, 0x55, 1, 0, false, 1, 3), {1, 1, 1}));
  a1.send(encode_packet(data_header(4, 0x44, 1, 0, false, 1, 3), {4, 5, 6}));
  for (Client* c : {&a0, &a1}) {
    auto p = c->recv();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->hdr.job, 4u);
    EXPECT_EQ(p->payload, (std::vector<int32_t>{5, 7, 9}));
  }
  for (Client* c : {&b0, &b1}) {
    auto p = c->recv();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->hdr.job, 5u);
    EXPECT_EQ(p->payload, (std::vector<int32_t>{11, 21, 31}));
  }
  // Slot 16 (thread 1 of 2).
  b0.send(encode_packet(data_header(5, 0x55, 0, 16, false, 3, 1), {7}));
  b1.send(encode_packet(data_header(5, 0x55, 1, 16, false, 3, 1), {8}));
  for (Client* c : {&b0, &b1}) {
    auto p = c->recv();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->hdr.slot, 16u);
    EXPECT_EQ(p->payload, (std::vector<int32_t>{15}));
  }
  // Remove job 4; job 5 goes on.
  agg.set_jobs({job(5, 0x55, 32)});
  ASSERT_TRUE(wait_for([](const AggregatorSnapshot& s) { return s.jobs.size() == 1; }));
  a0.send(encode_packet(data_header(4, 0x44, 0, 1, false, 2, 1), {1}));
  b0.send(encode_packet(data_header(5, 0x55, 0, 1, false, 2, 1), {2}));
  b1.send(encode_packet(data_header(5, 0x55, 1, 1, false, 2, 1), {3}));
  for (Client* c : {&b0, &b1}) {
    auto p = c->recv();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->payload, (std::vector<int32_t>{5}));
  }
  EXPECT_FALSE(a0.recv(100ms).has_value());
  ASSERT_TRUE(wait_for([](const AggregatorSnapshot& s) { return s.engine.unknown_job >= 1; }));
  running.stop();
  const AggregatorSnapshot s = agg.snapshot();
  EXPECT_EQ(s.engine.bad_tag, 0u);
  ASSERT_EQ(s.jobs.size(), 1u);
  EXPECT_EQ(s.jobs[0].cfg.job, 5u);
  EXPECT_EQ(s.jobs[0].counters.completed, 3u);
  EXPECT_TRUE(s.jobs[0].ready);
  ASSERT_EQ(s.jobs[0].telemetry.size(), 2u);
  EXPECT_EQ(s.jobs[0].telemetry[0].lag_count + s.jobs[0].telemetry[1].lag_count, 6u);
  EXPECT_EQ(s.engine.hellos, 6u) << "a HELLO copy was counted twice";  // a0, b0 twice
  if (GetParam() > 1) {
    EXPECT_EQ(agg.engine(1).counters().completed, 1u) << "slot 16 is thread 1's";
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, UdpAggregatorJobsThreadsTest, ::testing::Values(1u, 2u),
                         [](const ::testing::TestParamInfo<unsigned>& p) {
                           return "threads" + std::to_string(p.param);
                         });

// An idle lane polls for up to `spin` after sparse traffic (a small collective's blocks), sleeps at
// once after dense traffic (a stream), and never polls with a spin of 0.
TEST(UdpSpinGateTest, PollsAfterSparseTrafficOnly) {
  constexpr uint64_t kUs = 1000;
  udp::SpinGate gate(200 * kUs);
  EXPECT_FALSE(gate.poll(1000 * kUs)) << "nothing seen yet";
  gate.on_traffic(1000 * kUs, 4);  // a small collective's blocks
  EXPECT_FALSE(gate.dense());
  EXPECT_TRUE(gate.poll(1000 * kUs + 1));
  EXPECT_TRUE(gate.poll(1199 * kUs));
  EXPECT_FALSE(gate.poll(1200 * kUs)) << "past the spin: sleep";
  // A stream: a datagram every 2 us for a whole window.
  for (uint64_t t = 1300 * kUs; t <= 1700 * kUs; t += 2 * kUs) gate.on_traffic(t, 1);
  EXPECT_TRUE(gate.dense());
  EXPECT_FALSE(gate.poll(1700 * kUs + 1)) << "dense traffic: sleep at once";
  // Sparse again (one datagram per 50 us over a window): polls again.
  for (uint64_t t = 1750 * kUs; t <= 2200 * kUs; t += 50 * kUs) gate.on_traffic(t, 1);
  EXPECT_FALSE(gate.dense());
  EXPECT_TRUE(gate.poll(2200 * kUs + 1));
  // A GRO buffer counts as the datagrams it holds: 64 every 200 us is dense.
  gate.on_traffic(2500 * kUs, 64);
  gate.on_traffic(2700 * kUs, 64);
  EXPECT_TRUE(gate.dense());

  udp::SpinGate off(0);
  off.on_traffic(1000 * kUs, 1);
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.poll(1000 * kUs + 1));
}

TEST(UdpAggregatorCreateTest, RejectsBadOptions) {
  JobConfig job;
  job.slots.world_size = 2;
  UdpOptions o;
  o.bind_host = "127.0.0.1";
  o.port = 0;
  o.batch = 0;
  auto a = UdpAggregator::create(o, {job});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("batch"), std::string::npos);

  o.batch = 8;
  o.bind_host = "no-such-host.invalid";
  a = UdpAggregator::create(o, {job});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("no-such-host.invalid"), std::string::npos);

  o.bind_host = "127.0.0.1";
  // A block of 16384 bytes makes PARTIAL packets (4 x the block) beyond one UDP datagram.
  job.slots.max_payload_bytes = 16384;
  a = UdpAggregator::create(o, {job});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("max_payload_bytes 16384"), std::string::npos)
      << a.status().message();

  job.slots.max_payload_bytes = static_cast<uint32_t>(256) * 4;
  job.slots.world_size = 0;
  a = UdpAggregator::create(o, {job});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("world_size"), std::string::npos);

  // "localhost" resolves.
  job.slots.world_size = 2;
  o.bind_host = "localhost";
  a = UdpAggregator::create(o, {job});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_NE((*a)->port(), 0);
}

// A second aggregator on a busy port fails to start with an error naming the port (the socket
// has neither SO_REUSEADDR, which on UDP lets the newer socket take the unicast traffic, nor
// SO_REUSEPORT). A wildcard bind conflicts with a loopback one as well.
// Also across thread counts: a multi-threaded aggregator's SO_REUSEPORT group takes in no second
// aggregator, and a second multi-threaded one does not join a busy port.
TEST(UdpAggregatorCreateTest, BusyPortIsRefusedWithItsNumber) {
  JobConfig job;
  job.slots.world_size = 2;
  for (unsigned first_threads : {1u, 2u}) {
    for (unsigned second_threads : {1u, 2u}) {
      UdpOptions o;
      o.bind_host = "127.0.0.1";
      o.port = 0;
      o.threads = first_threads;
      auto first = UdpAggregator::create(o, {job});
      ASSERT_TRUE(first.ok()) << first.status().to_string();
      o.port = (*first)->port();
      o.threads = second_threads;
      for (const char* host : {"127.0.0.1", "0.0.0.0"}) {
        o.bind_host = host;
        auto second = UdpAggregator::create(o, {job});
        ASSERT_FALSE(second.ok()) << host << ": a second aggregator (" << second_threads
                                  << " threads) bound busy UDP port " << o.port << " ("
                                  << first_threads << " threads)";
        const std::string m = second.status().message();
        EXPECT_NE(m.find("UDP port " + std::to_string(o.port) + " is already in use"),
                  std::string::npos)
            << m;
        EXPECT_NE(m.find("--port"), std::string::npos) << m;
      }
    }
  }
}

// A tree leaf added at run time (the controller's path): its parent is resolved when the job is
// added; the leaf's HELLO and partial sums go to the parent from the serving socket, and the
// parent's WELCOME and RESULT, received on it, reach the local ranks. A leaf whose parent is not
// host:port is refused and reported.
class UdpAggregatorLeafThreadsTest : public ::testing::TestWithParam<unsigned> {};

// With 2 threads a leaf job is thread 0's alone: its slot 17 (thread 1's run) is handed over.
TEST_P(UdpAggregatorLeafThreadsTest, LeafTalksToItsParent) {
  JoblessAggregator running(UdpOptions{}.slot_capacity, GetParam());
  ASSERT_NE(running.get(), nullptr);
  UdpAggregator& agg = *running.get();

  Client parent(agg.port());  // plays the root aggregator
  auto leaf = [&](JobId id, const std::string& where) {
    JobConfig j;
    j.job = id;
    j.key = kKey;
    j.slots.world_size = 4;
    j.slots.num_slots = 32;
    j.slots.max_payload_bytes = static_cast<uint32_t>(16) * 4;
    j.tree.role = TreeRole::kLeaf;
    j.tree.rank_base = 2;
    j.tree.local_ranks = 2;
    j.tree.child_index = 1;
    j.tree.parent = where;
    return j;
  };
  agg.set_jobs({leaf(kJob, "127.0.0.1:" + std::to_string(parent.port())), leaf(9, "nowhere")});
  auto wait_for = [&](auto pred) {
    for (int i = 0; i < 300 && !pred(agg.snapshot()); ++i) std::this_thread::sleep_for(10ms);
    return pred(agg.snapshot());
  };
  ASSERT_TRUE(wait_for([](const AggregatorSnapshot& s) { return s.jobs.size() == 1; }));
  EXPECT_NE(agg.snapshot().job_errors.at(9).find("is not host:port"), std::string::npos);

  Client r2(agg.port()), r3(agg.port());
  auto hello = [](uint16_t rank) {
    wire::Header h = testing::hello_header(kJob, kKey, rank, 300 + rank);
    return encode_packet(h, std::vector<int32_t>{4});
  };
  r2.send(hello(2));
  r3.send(hello(3));
  auto up = parent.recv();
  ASSERT_TRUE(up.has_value());
  EXPECT_EQ(up->hdr.flags, wire::kFlagHello);
  EXPECT_EQ(up->hdr.rank, 1);
  // Its guess of the parent's world (4 / 2), and the largest block its ranks carry (they named
  // none: the job's 64 bytes).
  EXPECT_EQ(up->payload, (std::vector<int32_t>{2, 64}));
  EXPECT_FALSE(r2.recv(100ms).has_value());  // not welcomed before the parent says so
  wire::Header w;
  w.tag = kKey;  // the root seals with the job's key
  w.job = kJob;
  w.seq = up->hdr.seq;  // the leaf's HELLO it answers
  w.flags = wire::kFlagHello | wire::kFlagResult;
  parent_epoch() = 0x1A4E'7000'0000'0011ull;
  parent.send(encode_packet(w, std::vector<int32_t>{32, 16, 0x11, 0x1A4E7000}));
  for (Client* c : {&r2, &r3}) {
    auto p = c->recv();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->hdr.flags, wire::kFlagHello | wire::kFlagResult);
    EXPECT_EQ(p->hdr.seq, 0u);  // the leaf's notice
  }
  r2.send(hello(2));  // its own WELCOME: the leaf's epoch
  auto own = r2.recv();
  ASSERT_TRUE(own.has_value());
  EXPECT_EQ(own->hdr.seq, 302u);
  EXPECT_NE(worker_epochs()[kJob], parent_epoch());
  r2.send(encode_packet(data_header(kJob, kKey, 2, 17, false, 5, 3), {1, 2, 3}));
  r3.send(encode_packet(data_header(kJob, kKey, 3, 17, false, 5, 3), {10, 20, 30}));
  auto partial = parent.recv();
  ASSERT_TRUE(partial.has_value());
  EXPECT_EQ(partial->hdr.flags, 0);
  EXPECT_EQ(partial->hdr.rank, 1);
  EXPECT_EQ(partial->hdr.slot, 17);
  EXPECT_EQ(partial->hdr.seq, 5u);
  EXPECT_EQ(partial->payload, (std::vector<int32_t>{11, 22, 33}));
  wire::Header res = partial->hdr;
  res.tag = kKey;  // the key encode_packet() seals with
  res.flags = wire::kFlagResult;
  res.rank = 0;
  // Forged by someone without the key: dropped; the ranks get only the genuine result.
  wire::Header forged = res;
  forged.tag = kKey ^ 1;
  parent.send(encode_packet(forged, std::vector<int32_t>{6, 6, 6}));
  parent.send(encode_packet(res, std::vector<int32_t>{100, 200, 300}));
  for (Client* c : {&r2, &r3}) {
    auto p = c->recv();
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->hdr.flags, wire::kFlagResult);
    EXPECT_EQ(p->payload, (std::vector<int32_t>{100, 200, 300}));
  }
  running.stop();
  EXPECT_EQ(agg.engine().counters().forwarded, 1u);
  EXPECT_EQ(agg.engine().counters().parent_results, 1u);
  EXPECT_EQ(agg.engine().counters().bad_tag, 1u);
  parent_epoch() = 0;
  const std::string report = agg.format_counters();
  EXPECT_NE(report.find("\n       2 "), std::string::npos) << report;  // rows name global ranks
}

INSTANTIATE_TEST_SUITE_P(Threads, UdpAggregatorLeafThreadsTest, ::testing::Values(1u, 2u),
                         [](const ::testing::TestParamInfo<unsigned>& p) {
                           return "threads" + std::to_string(p.param);
                         });

}  // namespace
}  // namespace ina::agg
