// Suite dpdk: the DPDK aggregator loop on an in-process net_ring port (rte_eth_from_rings). The
// test plays several ranks: it enqueues Ethernet frames on the port's rx ring and reads the replies
// from its tx rings. Randomized order, duplicates and loss must give exact sums at every rank, on
// one and on two worker lcores (the slot handoff); malformed frames are counted by reason and never
// answered; ARP and ICMP echo are answered. Exits 77 (skip) with the reason when the EAL cannot
// start (it runs with --no-huge, so it needs root-like access to /proc/self/pagemap only).
#include "aggregator/dpdk_backend.h"

#include <gtest/gtest.h>
#include <rte_eal.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_ring.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "dpdk_test_main.h"
#include "ina/protocol/frame.h"
#include "ina/protocol/wire.h"
#include "test_packets.h"

namespace ina::agg {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kAggIp = 0x0A0B0001;  // 10.11.0.1
constexpr uint16_t kAggPort = 47474;
constexpr JobId kJob = 7;
constexpr uint64_t kKey = 0xC0FFEE;
const frame::Mac kAggMac{0x02, 0xAA, 0, 0, 0, 1};
rte_mempool* g_pool = nullptr;  // the test's own frames
unsigned g_workers = 0;         // worker lcores the EAL gave us

frame::Endpoint rank_ep(uint32_t r) {
  return frame::Endpoint{{0x02, 0xBB, 0, 0, 0, static_cast<uint8_t>(r)},
                         0x0A0B0100 + r,
                         static_cast<uint16_t>(40000 + r)};
}
frame::Endpoint agg_ep() { return frame::Endpoint{kAggMac, kAggIp, kAggPort}; }

// Incarnations (WIRE.md): frames are sealed as the workers seal them, with the epoch their
// WELCOMEs named (test_packets.h; decode_reply learns it).
const bool g_epochs_hooked = [] {
  testing::hook_worker_epochs();
  return true;
}();

std::vector<uint8_t> ina_frame(uint32_t rank, const wire::Header& h,
                               const std::vector<int32_t>& payload) {
  return testing::udp_frame(rank_ep(rank), agg_ep(), h, payload);
}

struct Rx {
  std::vector<uint8_t> bytes;
  unsigned txq = 0;
};

class RingPort {
 public:
  explicit RingPort(unsigned txqs) {
    static int serial = 0;
    const std::string base = "t" + std::to_string(serial++);
    rx_ = rte_ring_create((base + "rx").c_str(), 4096, rte_socket_id(),
                          RING_F_SP_ENQ | RING_F_SC_DEQ);
    for (unsigned q = 0; q < txqs; ++q) {
      tx_.push_back(rte_ring_create((base + "tx" + std::to_string(q)).c_str(), 8192,
                                    rte_socket_id(), RING_F_SP_ENQ | RING_F_SC_DEQ));
    }
    const int port =
        rte_eth_from_rings((base + "port").c_str(), &rx_, 1, tx_.data(), txqs, rte_socket_id());
    EXPECT_GE(port, 0) << rte_strerror(rte_errno);
    port_ = static_cast<uint16_t>(port);
    name_ = std::to_string(port_);  // the ring PMD names it net_ring_<name>; the number is plain
  }
  ~RingPort() {
    rte_mbuf* m;
    while (rte_ring_dequeue(rx_, reinterpret_cast<void**>(&m)) == 0) rte_pktmbuf_free(m);
    for (rte_ring* r : tx_) {
      while (rte_ring_dequeue(r, reinterpret_cast<void**>(&m)) == 0) rte_pktmbuf_free(m);
    }
    // The aggregator closed the port; the rings are ours.
    rte_ring_free(rx_);
    for (rte_ring* r : tx_) rte_ring_free(r);
  }
  const std::string& name() const { return name_; }
  uint64_t segments_seen() const { return segs_; }

  void inject(const std::vector<uint8_t>& f) {
    rte_mbuf* m = rte_pktmbuf_alloc(g_pool);
    ASSERT_NE(m, nullptr);
    std::memcpy(rte_pktmbuf_append(m, static_cast<uint16_t>(f.size())), f.data(), f.size());
    while (rte_ring_enqueue(rx_, m) != 0) std::this_thread::yield();
  }
  // The frame as an indirect mbuf (rte_pktmbuf_clone) of a buffer the aggregator must not write:
  // its replies come from fresh mbufs.
  void inject_clone(const std::vector<uint8_t>& f) {
    rte_mbuf* m = rte_pktmbuf_alloc(g_pool);
    ASSERT_NE(m, nullptr);
    std::memcpy(rte_pktmbuf_append(m, static_cast<uint16_t>(f.size())), f.data(), f.size());
    rte_mbuf* c = rte_pktmbuf_clone(m, g_pool);
    ASSERT_NE(c, nullptr);
    rte_pktmbuf_free(m);  // the clone holds the buffer
    while (rte_ring_enqueue(rx_, c) != 0) std::this_thread::yield();
  }
  // Replies so far.
  std::vector<Rx> drain() {
    std::vector<Rx> out;
    for (unsigned q = 0; q < tx_.size(); ++q) {
      rte_mbuf* m;
      while (rte_ring_dequeue(tx_[q], reinterpret_cast<void**>(&m)) == 0) {
        // Chains (indirect multicast) are read across their segments.
        std::vector<uint8_t> bytes(m->pkt_len);
        const void* d = rte_pktmbuf_read(m, 0, m->pkt_len, bytes.data());
        if (d != bytes.data()) std::memcpy(bytes.data(), d, m->pkt_len);
        segs_ += m->nb_segs;
        out.push_back(Rx{std::move(bytes), q});
        rte_pktmbuf_free(m);
      }
    }
    return out;
  }
  // Collects replies until `done(all)` or the deadline.
  template <typename Pred>
  std::vector<Rx> wait_for(Pred done, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
    std::vector<Rx> all;
    const auto end = Clock::now() + limit;
    while (!done(all) && Clock::now() < end) {
      auto more = drain();
      if (more.empty()) std::this_thread::sleep_for(std::chrono::microseconds(200));
      for (auto& r : more) all.push_back(std::move(r));
    }
    return all;
  }

 private:
  rte_ring* rx_ = nullptr;
  std::vector<rte_ring*> tx_;
  uint16_t port_ = 0;
  std::string name_;
  uint64_t segs_ = 0;
};

// A reply as rank `r` sees it: addressed to r and a valid INA datagram (checksums included).
struct Decoded {
  uint32_t rank;
  wire::PacketView pkt;
  std::vector<int32_t> words;
};
bool decode_reply(const Rx& rx, uint32_t world, Decoded* out) {
  for (uint32_t r = 0; r < world; ++r) {
    const frame::Endpoint ep = rank_ep(r);
    frame::Parsed p;
    const frame::Verdict v =
        frame::classify(rx.bytes, frame::LocalConfig{ep.mac, ep.ip, ep.port}, {}, &p);
    if (v == frame::Verdict::kIpNotForUs) continue;
    if (v != frame::Verdict::kIna) {
      ADD_FAILURE() << "reply not a valid frame for rank " << r << ": " << frame::verdict_name(v);
      return false;
    }
    if (std::memcmp(rx.bytes.data(), ep.mac.data(), 6) != 0 || p.src_ip != kAggIp ||
        p.src_port != kAggPort || p.src_mac != kAggMac) {
      ADD_FAILURE() << "reply to rank " << r << " has wrong addresses";
      return false;
    }
    if (wire::decode(p.ina, &out->pkt) != wire::DecodeError::kOk) {
      ADD_FAILURE() << "reply to rank " << r << " is not an INA packet";
      return false;
    }
    testing::learn_welcome(out->pkt);
    if (!testing::reply_tag_ok(p.ina, kJob, kKey)) {
      ADD_FAILURE() << "reply to rank " << r << " is not sealed with the job's key (or epoch's)";
      return false;
    }
    out->rank = r;
    out->words.resize(out->pkt.hdr.count);
    if (!out->words.empty()) {
      wire::load_words(out->words.data(), out->pkt.payload, out->words.size());
    }
    return true;
  }
  ADD_FAILURE() << "reply to an unknown address";
  return false;
}

struct Running {
  std::unique_ptr<RingPort> port;
  std::unique_ptr<DpdkAggregator> agg;
  ~Running() {
    if (agg) agg->stop();
    if (port) port->drain();  // frames of the aggregator's pool go back before the pool does
    agg.reset();              // stops and closes the port, frees the pool
    port.reset();
  }
};

std::unique_ptr<Running> start(unsigned lcores, uint32_t world, uint32_t slots, uint16_t elems,
                               bool indirect = false, TreeRole role = TreeRole::kFlat) {
  auto r = std::make_unique<Running>();
  r->port = std::make_unique<RingPort>(lcores);
  DpdkOptions o;
  o.port = r->port->name();
  o.ip = kAggIp;
  o.udp_port = kAggPort;
  o.mac_set = true;
  o.mac = kAggMac;
  o.mbufs = 4095;
  o.lcores = lcores;
  o.fanout = indirect ? DpdkOptions::Fanout::kChains : DpdkOptions::Fanout::kCopies;
  JobConfig j;
  j.job = kJob;
  j.key = kKey;
  j.slots.world_size = world;
  j.slots.num_slots = slots;
  j.slots.max_payload_bytes = static_cast<uint32_t>(elems) * 4;
  j.tree.role = role;
  auto a = DpdkAggregator::create(o, {j});
  if (!a.ok()) {
    ADD_FAILURE() << a.status().to_string();
    return nullptr;
  }
  r->agg = std::move(*a);
  EXPECT_EQ(r->agg->lcores(), lcores);
  const Status st = r->agg->start();
  if (!st.ok()) {
    ADD_FAILURE() << st.to_string();
    return nullptr;
  }
  return r;
}

// Every rank joins; each must get the WELCOME notice [slots, elems, epoch] (seq 0), then, for
// its HELLO again, its own WELCOME (seq = its nonce) with the same epoch (WIRE.md).
void join(Running& run, uint32_t world, uint32_t slots, uint16_t elems) {
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t r = 0; r < world; ++r) {
      const wire::Header h = testing::hello_header(kJob, kKey, static_cast<uint16_t>(r), 1000 + r);
      run.port->inject(ina_frame(r, h, {static_cast<int32_t>(world)}));
    }
    auto got = run.port->wait_for([&](const std::vector<Rx>& v) { return v.size() >= world; });
    ASSERT_EQ(got.size(), world);
    std::vector<bool> seen(world, false);
    for (const Rx& rx : got) {
      Decoded d;
      ASSERT_TRUE(decode_reply(rx, world, &d));
      EXPECT_EQ(d.pkt.hdr.flags, wire::kFlagHello | wire::kFlagResult);
      EXPECT_EQ(d.pkt.hdr.seq, pass == 0 ? 0u : 1000 + d.rank);
      ASSERT_EQ(d.words.size(), wire::kWelcomeWords);
      EXPECT_EQ(std::vector<int32_t>(d.words.begin(), d.words.begin() + 2),
                (std::vector<int32_t>{static_cast<int32_t>(slots), elems * 4}));  // bytes
      seen[d.rank] = true;
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), true), static_cast<long>(world));
  }
}

int32_t value(uint32_t rank, uint32_t block, uint32_t i) {
  return static_cast<int32_t>((rank + 1) * 100003u + block * 7919u + i * 31u) *
         ((i + rank) % 3 == 0 ? -1 : 1);
}

// Parameters: worker lcores, indirect multicast.
class DpdkLoop : public ::testing::TestWithParam<std::tuple<unsigned, bool>> {
 protected:
  void SetUp() override {
    if (std::get<0>(GetParam()) > g_workers) {
      GTEST_SKIP() << "needs " << std::get<0>(GetParam()) << " worker lcores, the EAL has "
                   << g_workers;
    }
  }
};

// Randomized order, 15% duplicates and 10% loss (resent later with RETRANSMIT) over two epochs
// of every slot copy: each rank gets every block's exact sum.
// A tree leaf job needs a route to its parent, which the DPDK loop does not have: refused with
// a message naming the job and the backend to use.
TEST(DpdkCreate, RefusesATreeLeafJob) {
  DpdkOptions o;
  o.port = "net_ring_unused";
  o.ip = kAggIp;
  o.udp_port = kAggPort;
  JobConfig j;
  j.job = kJob;
  j.key = kKey;
  j.slots.world_size = 8;
  j.tree.role = TreeRole::kLeaf;
  j.tree.rank_base = 4;
  j.tree.local_ranks = 4;
  j.tree.child_index = 1;
  j.tree.parent = "10.0.0.2:47474";
  auto a = DpdkAggregator::create(o, {j});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("tree leaf"), std::string::npos) << a.status().to_string();
  EXPECT_NE(a.status().message().find("--backend udp"), std::string::npos);
}

// DpdkOptions::fanout: kChains and kCopies as asked; kAuto chains where the port's PMD transmits
// multi-segment frames (net_memif does: dpdk_memif_test checks its aggregator's log), else copies.
TEST(DpdkCreate, FanoutFollowsTheOptionAndThePort) {
  for (const auto f :
       {DpdkOptions::Fanout::kAuto, DpdkOptions::Fanout::kChains, DpdkOptions::Fanout::kCopies}) {
    RingPort port(1);
    rte_eth_dev_info info{};
    ASSERT_EQ(rte_eth_dev_info_get(static_cast<uint16_t>(std::stoi(port.name())), &info), 0);
    const bool multi_segs = (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0;
    DpdkOptions o;
    o.port = port.name();
    o.ip = kAggIp;
    o.udp_port = kAggPort;
    o.mbufs = 1023;
    o.lcores = 1;
    o.fanout = f;
    JobConfig j;
    j.job = kJob;
    j.slots.world_size = 2;
    j.slots.num_slots = 4;
    auto a = DpdkAggregator::create(o, {j});
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    const bool want =
        f == DpdkOptions::Fanout::kChains || (f == DpdkOptions::Fanout::kAuto && multi_segs);
    EXPECT_EQ((*a)->chains(), want)
        << "fanout " << int(f) << ", net_ring multi-segment tx " << multi_segs;
  }
}

// A tree root on the DPDK loop: the leaves' float SUM PARTIAL words are twice the
// block (an int64 per float32 element, 2112-byte frames for a 1024-byte block), so the root's
// mbufs and MTU are sized for them. Two leaves ask for the exponent (the MAX comes back to both),
// then send their words; both get the float32 sum, converted once.
TEST(DpdkRoot, CarriesFloatSumPartialWords) {
  constexpr uint32_t kLeaves = 2, kSlots = 4;
  constexpr uint16_t kElems = 256;
  auto run = start(1, kLeaves, kSlots, kElems, false, TreeRole::kRoot);
  ASSERT_NE(run, nullptr);
  join(*run, kLeaves, kSlots, kElems);
  // The ring PMD hands the test's own mbufs to the loop, so the size the root's pool and MTU are
  // given is asserted here: a leaf's words frame must fit.
  EXPECT_GE(run->agg->max_packet(), wire::kHeaderSize + size_t{kElems} * 8);
  auto partial = [&](uint32_t leaf, uint16_t count, int16_t exp, int32_t word) {
    wire::Header h =
        testing::data_header(kJob, kKey, static_cast<uint16_t>(leaf), 0, false, 1, count);
    h.flags = wire::kFlagPartial;
    h.dtype = DType::kFloat32;
    h.exp = exp;
    run->port->inject(ina_frame(leaf, h, std::vector<int32_t>(count, word)));
  };
  auto replies = [&] {
    auto got = run->port->wait_for([&](const std::vector<Rx>& v) { return v.size() >= kLeaves; });
    EXPECT_EQ(got.size(), kLeaves);
    std::vector<Decoded> out(got.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(decode_reply(got[i], kLeaves, &out[i]));
    return out;
  };
  partial(0, 0, 3, 0);  // exponent requests: E = MAX(3, 5)
  partial(1, 0, 5, 0);
  for (const Decoded& d : replies()) {
    EXPECT_EQ(d.pkt.hdr.flags, wire::kFlagPartial | wire::kFlagResult);
    EXPECT_EQ(d.pkt.hdr.exp, 5);
  }
  // The words at scale 2^-20 (what the leaves quantized with E): 3 + 5 = 8 units.
  partial(0, kElems, -20, 3);
  partial(1, kElems, -20, 5);
  for (const Decoded& d : replies()) {
    EXPECT_EQ(d.pkt.hdr.flags, wire::kFlagResult);
    ASSERT_EQ(d.pkt.hdr.count, kElems);
    for (const int32_t w : d.words) ASSERT_EQ(std::bit_cast<float>(w), 8 * 0x1p-20f);
  }
  EXPECT_EQ(run->agg->loop_totals().multi_segment, 0u);
}

TEST_P(DpdkLoop, ShuffledDuplicatedLossyTrafficGivesExactSums) {
  const unsigned lcores = std::get<0>(GetParam());
  const bool indirect = std::get<1>(GetParam());
  constexpr uint32_t kWorld = 4, kSlots = 8, kEpochs = 2;
  constexpr uint16_t kElems = 64;
  const unsigned in_use = rte_mempool_in_use_count(g_pool);
  auto run = start(lcores, kWorld, kSlots, kElems, indirect);
  ASSERT_NE(run, nullptr);
  join(*run, kWorld, kSlots, kElems);
  std::mt19937 rng(1234 + lcores);
  uint64_t results_total = 0;

  for (uint32_t epoch = 0; epoch < kEpochs; ++epoch) {
    const uint32_t b0 = epoch * 2 * kSlots;
    const uint32_t nb = 2 * kSlots;  // every slot copy once per epoch
    struct Pkt {
      uint32_t rank, block;
      bool retransmit;
    };
    std::vector<Pkt> order;
    for (uint32_t b = b0; b < b0 + nb; ++b) {
      for (uint32_t r = 0; r < kWorld; ++r) order.push_back({r, b, false});
    }
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Pkt> first, lost;
    std::uniform_int_distribution<int> pct(0, 99);
    for (const Pkt& p : order) {
      if (pct(rng) < 10) {
        lost.push_back(p);
        continue;
      }
      first.push_back(p);
      if (pct(rng) < 15) {
        const size_t at = std::uniform_int_distribution<size_t>(0, first.size())(rng);
        first.insert(first.begin() + static_cast<long>(at), p);  // a duplicate, anywhere
      }
    }
    if (lost.empty()) lost.push_back(first.back()), first.pop_back();
    auto send = [&](const Pkt& p, bool retransmit) {
      const uint16_t count = static_cast<uint16_t>(kElems - (p.block % 3) * 8);  // varied sizes
      wire::Header h;
      h.tag = kKey;  // the key udp_frame() seals with
      h.job = kJob;
      h.rank = static_cast<uint16_t>(p.rank);
      h.slot = static_cast<uint16_t>(p.block % kSlots);
      h.shadow = ((p.block / kSlots) % 2) != 0;
      h.seq = p.block + 1;
      h.count = count;
      h.flags = retransmit ? wire::kFlagRetransmit : 0;
      std::vector<int32_t> pl(count);
      for (uint32_t i = 0; i < count; ++i) pl[i] = value(p.rank, p.block, i);
      run->port->inject(ina_frame(p.rank, h, pl));
    };
    for (const Pkt& p : first) send(p, false);
    // Let the first pass settle, then the lost ones are resent.
    auto got = run->port->wait_for([](const std::vector<Rx>&) { return false; },
                                   std::chrono::milliseconds(300));
    for (const Pkt& p : lost) send(p, true);

    // Results per (rank, block): every copy must be exact; every rank gets every block.
    std::map<std::pair<uint32_t, uint32_t>, int> results;
    auto absorb = [&](const std::vector<Rx>& v, size_t from) {
      for (size_t k = from; k < v.size(); ++k) {
        Decoded d;
        ASSERT_TRUE(decode_reply(v[k], kWorld, &d));
        const wire::Header& h = d.pkt.hdr;
        if (h.has(wire::kFlagError)) continue;  // missing-ranks reports to retransmissions
        ASSERT_TRUE(h.has(wire::kFlagResult)) << int{h.flags};
        const uint32_t block = h.seq - 1;
        ASSERT_GE(block, b0);
        ASSERT_LT(block, b0 + nb);
        ASSERT_EQ(h.slot, block % kSlots);
        const uint16_t count = static_cast<uint16_t>(kElems - (block % 3) * 8);
        ASSERT_EQ(d.words.size(), count);
        for (uint32_t i = 0; i < count; ++i) {
          int64_t want = 0;
          for (uint32_t r = 0; r < kWorld; ++r) want += value(r, block, i);
          ASSERT_EQ(d.words[i], static_cast<int32_t>(want)) << "block " << block << " elem " << i;
        }
        ++results[{d.rank, block}];
      }
    };
    absorb(got, 0);
    size_t absorbed = 0;
    auto rest = run->port->wait_for([&](const std::vector<Rx>& v) {
      absorb(v, absorbed);
      absorbed = v.size();
      return results.size() == size_t{kWorld} * nb;
    });
    ASSERT_EQ(results.size(), size_t{kWorld} * nb) << "epoch " << epoch;
    for (auto& [k, n] : results) results_total += static_cast<uint64_t>(n);
  }

  run->agg->stop();
  const EngineCounters e = run->agg->engine_totals();
  EXPECT_EQ(e.completed, uint64_t{kEpochs} * 2 * kSlots);
  EXPECT_EQ(e.malformed, 0u);
  EXPECT_EQ(e.stale, 0u);
  EXPECT_GT(e.duplicates, 0u);
  const DpdkLoopCounters lc = run->agg->loop_totals();
  EXPECT_EQ(lc.tx_dropped + lc.handoff_dropped + lc.no_mbuf + lc.unroutable, 0u);
  EXPECT_GE(results_total, uint64_t{kEpochs} * 2 * kSlots * kWorld);
  // Copies are single segments; indirect results are header + datagram chains.
  const uint64_t frames = lc.tx;
  if (indirect) {
    EXPECT_GT(run->port->segments_seen(), frames);
  } else {
    EXPECT_EQ(run->port->segments_seen(), frames);
  }
  if (lcores > 1) {
    EXPECT_GT(lc.handed_off, 0u);
    for (unsigned i = 0; i < lcores; ++i) EXPECT_GT(run->agg->engine(i).counters().completed, 0u);
  }
  // Every received frame (a chain's shared datagram is one: its reference count is the number of
  // ranks) is back in the pool once every reply is freed: none leaked, none freed twice.
  run->port->drain();
  run->agg.reset();
  EXPECT_EQ(rte_mempool_in_use_count(g_pool), in_use);
}

// A result whose received mbuf is shared (an indirect mbuf here) is encoded in a fresh mbuf; as
// chains or copies, every rank gets the exact sum, and every mbuf goes back to the pool.
TEST_P(DpdkLoop, ResultsFromAFreshMbufWhenTheReceivedOneIsShared) {
  const unsigned lcores = std::get<0>(GetParam());
  constexpr uint32_t kWorld = 3, kSlots = 4;
  constexpr uint16_t kElems = 40;
  const unsigned in_use = rte_mempool_in_use_count(g_pool);
  auto run = start(lcores, kWorld, kSlots, kElems, std::get<1>(GetParam()));
  ASSERT_NE(run, nullptr);
  join(*run, kWorld, kSlots, kElems);
  for (uint32_t b = 0; b < kSlots; ++b) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      const wire::Header h = testing::data_header(kJob, kKey, static_cast<uint16_t>(r),
                                                  static_cast<uint16_t>(b), false, b + 1, kElems);
      std::vector<int32_t> pl(kElems);
      for (uint32_t i = 0; i < kElems; ++i) pl[i] = value(r, b, i);
      run->port->inject_clone(ina_frame(r, h, pl));
    }
  }
  auto got = run->port->wait_for(
      [&](const std::vector<Rx>& v) { return v.size() >= size_t{kWorld} * kSlots; });
  ASSERT_EQ(got.size(), size_t{kWorld} * kSlots);
  std::set<std::pair<uint32_t, uint32_t>> seen;
  for (const Rx& rx : got) {
    Decoded d;
    ASSERT_TRUE(decode_reply(rx, kWorld, &d));
    ASSERT_TRUE(d.pkt.hdr.has(wire::kFlagResult));
    const uint32_t b = d.pkt.hdr.seq - 1;
    ASSERT_EQ(d.words.size(), kElems);
    for (uint32_t i = 0; i < kElems; ++i) {
      int64_t want = 0;
      for (uint32_t r = 0; r < kWorld; ++r) want += value(r, b, i);
      ASSERT_EQ(d.words[i], static_cast<int32_t>(want)) << "block " << b << " elem " << i;
    }
    seen.insert({d.rank, b});
  }
  EXPECT_EQ(seen.size(), size_t{kWorld} * kSlots);
  run->agg->stop();
  EXPECT_EQ(run->agg->loop_totals().no_mbuf, 0u);
  run->port->drain();
  run->agg.reset();
  EXPECT_EQ(rte_mempool_in_use_count(g_pool), in_use);
}

// The loop verifies the tags of a burst's DATA at once (packet_mac_many): frames sealed with
// another key, and genuine frames tampered with after sealing, of the same length as the genuine
// ones and in the same bursts (the lanes of one lockstep group), change nothing: every rank gets
// every block's exact sum, each forged frame is a bad tag, and only the genuine ones pass the
// burst's check.
TEST_P(DpdkLoop, ForgedDataInTheSameBurstsChangesNothing) {
  const unsigned lcores = std::get<0>(GetParam());
  constexpr uint32_t kWorld = 4, kSlots = 8, kBlocks = 16;
  constexpr uint16_t kElems = 256;
  const unsigned in_use = rte_mempool_in_use_count(g_pool);
  auto run = start(lcores, kWorld, kSlots, kElems, std::get<1>(GetParam()));
  ASSERT_NE(run, nullptr);
  join(*run, kWorld, kSlots, kElems);
  std::vector<std::vector<uint8_t>> frames;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      const wire::Header h = testing::data_header(kJob, kKey, static_cast<uint16_t>(r),
                                                  static_cast<uint16_t>(b % kSlots),
                                                  ((b / kSlots) % 2) != 0, b + 1, kElems);
      std::vector<int32_t> pl(kElems), junk(kElems, 1000000);
      for (uint32_t i = 0; i < kElems; ++i) pl[i] = value(r, b, i);
      wire::Header forged = h;
      forged.tag = kKey ^ 1;  // another key
      frames.push_back(ina_frame(r, forged, junk));
      std::vector<uint8_t> tampered = ina_frame(r, h, pl);
      tampered[tampered.size() - 5] ^= 0x40;  // a payload bit after sealing
      tampered[40] = tampered[41] = 0;        // UDP checksum "none": the tag is the only check
      frames.push_back(std::move(tampered));
      frames.push_back(ina_frame(r, h, pl));
    }
  }
  for (const auto& f : frames) run->port->inject(f);
  std::map<std::pair<uint32_t, uint32_t>, int> results;
  size_t absorbed = 0;
  run->port->wait_for([&](const std::vector<Rx>& v) {
    for (; absorbed < v.size(); ++absorbed) {
      Decoded d;
      EXPECT_TRUE(decode_reply(v[absorbed], kWorld, &d));
      EXPECT_TRUE(d.pkt.hdr.has(wire::kFlagResult)) << int{d.pkt.hdr.flags};
      const uint32_t block = d.pkt.hdr.seq - 1;
      EXPECT_EQ(d.words.size(), kElems);
      for (uint32_t i = 0; i < d.words.size(); ++i) {
        int64_t want = 0;
        for (uint32_t r = 0; r < kWorld; ++r) want += value(r, block, i);
        EXPECT_EQ(d.words[i], static_cast<int32_t>(want)) << "block " << block << " elem " << i;
      }
      ++results[{d.rank, block}];
    }
    return results.size() == size_t{kWorld} * kBlocks;
  });
  ASSERT_EQ(results.size(), size_t{kWorld} * kBlocks);
  for (auto& [k, n] : results) EXPECT_EQ(n, 1) << "rank " << k.first << " block " << k.second;
  run->agg->stop();
  const EngineCounters e = run->agg->engine_totals();
  EXPECT_EQ(e.bad_tag, uint64_t{2} * kWorld * kBlocks);
  EXPECT_EQ(e.completed, kBlocks);
  EXPECT_EQ(e.malformed, 0u);
  EXPECT_EQ(run->agg->loop_totals().tags_in_burst, uint64_t{kWorld} * kBlocks);
  run->port->drain();
  run->agg.reset();
  EXPECT_EQ(rte_mempool_in_use_count(g_pool), in_use);
}

// Malformed frames are counted by reason and never answered; ARP and ICMP echo are answered.
TEST_P(DpdkLoop, MalformedFramesCountedArpAndPingAnswered) {
  const unsigned lcores = std::get<0>(GetParam());
  constexpr uint32_t kWorld = 2;
  auto run = start(lcores, kWorld, 4, 16, std::get<1>(GetParam()));
  ASSERT_NE(run, nullptr);
  join(*run, kWorld, 4, 16);

  wire::Header h;

  h.tag = kKey;  // the key udp_frame() seals with
  h.job = kJob;
  h.count = 4;
  const std::vector<int32_t> pl{1, 2, 3, 4};
  const auto good = ina_frame(0, h, pl);
  auto fix_ip = [](std::vector<uint8_t>& f) {
    f[24] = f[25] = 0;
    const uint16_t c = frame::checksum(f.data() + 14, 20);
    f[24] = uint8_t(c >> 8);
    f[25] = uint8_t(c);
  };
  std::vector<uint8_t> f;
  run->port->inject(std::vector<uint8_t>(good.begin(), good.begin() + 9));  // short
  f = good;
  f[12] = 0x86;
  f[13] = 0xDD;
  run->port->inject(f);  // EtherType IPv6
  f = good;
  f[16] = 0xFF;  // IP total length beyond the frame
  fix_ip(f);
  run->port->inject(f);
  f = good;
  f[38] = 0;
  f[39] = 5;  // UDP length below its header
  run->port->inject(f);
  {
    f = good;  // wrong UDP port, checksum fixed so the port is the only fault
    const frame::Endpoint a{kAggMac, kAggIp, 9999};
    frame::write_udp_headers(f.data(), rank_ep(0), a, good.size() - frame::kUdpHeadroom,
                             frame::sum16(good.data() + 42, good.size() - 42), 1);
    run->port->inject(f);
  }
  {
    std::vector<uint8_t> bad_ina(good.begin() + 42, good.end());
    bad_ina[0] = 'X';  // bad magic
    std::vector<uint8_t> g(42 + bad_ina.size());
    std::memcpy(g.data() + 42, bad_ina.data(), bad_ina.size());
    frame::write_udp_headers(g.data(), rank_ep(0), agg_ep(), bad_ina.size(),
                             frame::sum16(bad_ina.data(), bad_ina.size()), 1);
    run->port->inject(g);
  }
  {
    wire::Header forged = h;  // sealed with another key: a bad tag
    forged.tag = kKey ^ 1;
    run->port->inject(ina_frame(0, forged, pl));
  }
  // ARP request for our address (broadcast), then an ICMP echo request.
  std::vector<uint8_t> arp(60, 0);
  std::memset(arp.data(), 0xFF, 6);
  const frame::Endpoint r0 = rank_ep(0);
  std::memcpy(arp.data() + 6, r0.mac.data(), 6);
  arp[12] = 0x08;
  arp[13] = 0x06;
  const uint8_t arp_hdr[8] = {0, 1, 8, 0, 6, 4, 0, 1};
  std::memcpy(arp.data() + 14, arp_hdr, 8);
  std::memcpy(arp.data() + 22, r0.mac.data(), 6);
  wire::put_u32(arp.data() + 28, r0.ip);
  wire::put_u32(arp.data() + 38, kAggIp);
  run->port->inject(arp);

  std::vector<uint8_t> ping(14 + 20 + 8 + 24);
  {
    // Build as UDP, then turn into ICMP echo: headers from the same writer.
    frame::write_udp_headers(ping.data(), r0, agg_ep(), 24, 0, 5);
    ping[23] = frame::kIpProtoIcmp;
    fix_ip(ping);
    uint8_t* icmp = ping.data() + 34;
    std::memset(icmp, 0, 8);
    icmp[0] = 8;
    icmp[5] = 0x42;  // identifier
    icmp[7] = 3;     // sequence
    for (int i = 0; i < 24; ++i) icmp[8 + i] = static_cast<uint8_t>(i);
    const uint16_t c = frame::checksum(icmp, 32);
    icmp[2] = uint8_t(c >> 8);
    icmp[3] = uint8_t(c);
  }
  run->port->inject(ping);

  auto got = run->port->wait_for([](const std::vector<Rx>& v) { return v.size() >= 2; });
  // Nothing else may come (the malformed frames were ahead of the ARP request on the one queue).
  auto extra = run->port->wait_for([](const std::vector<Rx>&) { return false; },
                                   std::chrono::milliseconds(200));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(extra.empty()) << extra.size() << " unexpected replies";
  const std::vector<uint8_t>* arp_reply = nullptr;
  const std::vector<uint8_t>* echo_reply = nullptr;
  for (const Rx& rx : got) {
    if (rx.bytes.size() >= 14 && rx.bytes[12] == 0x08 && rx.bytes[13] == 0x06)
      arp_reply = &rx.bytes;
    if (rx.bytes.size() >= 14 && rx.bytes[12] == 0x08 && rx.bytes[13] == 0x00)
      echo_reply = &rx.bytes;
  }
  ASSERT_NE(arp_reply, nullptr);
  ASSERT_NE(echo_reply, nullptr);
  const auto& ar = *arp_reply;
  EXPECT_EQ(0, std::memcmp(ar.data(), r0.mac.data(), 6));
  EXPECT_EQ(wire::get_u16(ar.data() + 20), 2);  // reply
  EXPECT_EQ(0, std::memcmp(ar.data() + 22, kAggMac.data(), 6));
  EXPECT_EQ(wire::get_u32(ar.data() + 28), kAggIp);
  EXPECT_EQ(wire::get_u32(ar.data() + 38), r0.ip);
  const auto& er = *echo_reply;
  ASSERT_EQ(er.size(), ping.size());
  EXPECT_EQ(0, std::memcmp(er.data(), r0.mac.data(), 6));
  EXPECT_EQ(wire::get_u32(er.data() + 30), r0.ip);
  EXPECT_EQ(er[34], 0);  // echo reply
  EXPECT_EQ(frame::checksum(er.data() + 14, 20), 0);
  EXPECT_EQ(frame::checksum(er.data() + 34, 32), 0);
  EXPECT_EQ(0, std::memcmp(er.data() + 38, ping.data() + 38, 28));  // id, seq, data echoed

  run->agg->stop();
  const frame::Counters fc = run->agg->frame_totals();
  using V = frame::Verdict;
  EXPECT_EQ(fc.get(V::kTooShort), 1u);
  EXPECT_EQ(fc.get(V::kBadEtherType), 1u);
  EXPECT_EQ(fc.get(V::kBadIpTotalLength), 1u);
  EXPECT_EQ(fc.get(V::kBadUdpLength), 1u);
  EXPECT_EQ(fc.get(V::kWrongUdpPort), 1u);
  EXPECT_EQ(fc.get(V::kArpRequest), 1u);
  EXPECT_EQ(fc.get(V::kIcmpEcho), 1u);
  EXPECT_EQ(fc.dropped(), 5u);
  const EngineCounters e = run->agg->engine_totals();
  EXPECT_EQ(e.decode.by_error[static_cast<size_t>(wire::DecodeError::kBadMagic)], 1u);
  EXPECT_EQ(e.malformed, 1u);
  EXPECT_EQ(e.bad_tag, 1u);
  EXPECT_EQ(e.completed, 0u);
}

INSTANTIATE_TEST_SUITE_P(Lcores, DpdkLoop,
                         ::testing::Combine(::testing::Values(1u, 2u), ::testing::Bool()),
                         [](const auto& p) {
                           return std::to_string(std::get<0>(p.param)) + "_lcores" +
                                  (std::get<1>(p.param) ? "_indirect" : "_copies");
                         });

}  // namespace
}  // namespace ina::agg

int main(int argc, char** argv) {
  return ina::agg::testing::run_dpdk_tests(argc, argv, "dpdk_backend_test", "ina_dpdk_test_",
                                           "test_frames", &ina::agg::g_pool, &ina::agg::g_workers);
}
