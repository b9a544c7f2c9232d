// Suite dpdk: the DPDK aggregator with several rx/tx queues and jobs changed at run time, on an
// in-process net_ring port with two rx rings and two tx rings (rte_eth_from_rings) that the
// aggregator configures itself (one rx and one tx queue per worker lcore). The test plays the
// ranks and the port's flow hash: each rank's frames go to one rx ring (ranks 0 and 1 to queue 0,
// 2 and 3 to queue 1), so both lcores receive from their own queue and hand the other lcore's
// slots over. Checked: exact sums at every rank, frames received on both queues, both lcores
// completing rounds; jobs added and removed through set_jobs() while the loops run (the per-lcore
// mailboxes), the merged snapshot (counters, readiness, telemetry), a job whose block exceeds the
// mbufs refused with its reason. Exits 77 (skip) with the reason when the EAL cannot start.
#include <gtest/gtest.h>
#include <rte_eal.h>
#include <rte_errno.h>
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
#include <thread>

#include "aggregator/dpdk_backend.h"
#include "dpdk_test_main.h"
#include "ina/protocol/frame.h"
#include "ina/protocol/wire.h"
#include "test_packets.h"

namespace ina::agg {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
constexpr uint32_t kAggIp = 0x0A0C0001;  // 10.12.0.1
constexpr uint16_t kAggPort = 47474;
const frame::Mac kAggMac{0x02, 0xAA, 0, 0, 0, 2};
rte_mempool* g_pool = nullptr;  // the test's own frames
// Incarnations (WIRE.md): frames are sealed as the workers seal them, with the epoch their
// WELCOMEs named (test_packets.h; decode_reply learns it).
const bool g_epochs_hooked = [] {
  testing::hook_worker_epochs();
  return true;
}();
unsigned g_workers = 0;  // worker lcores the EAL gave us

frame::Endpoint rank_ep(uint32_t r) {
  return frame::Endpoint{{0x02, 0xBB, 0, 0, 1, static_cast<uint8_t>(r)},
                         0x0A0C0100 + r,
                         static_cast<uint16_t>(41000 + r)};
}

std::vector<uint8_t> ina_frame(uint32_t rank, const wire::Header& h,
                               const std::vector<int32_t>& payload) {
  return testing::udp_frame(rank_ep(rank), frame::Endpoint{kAggMac, kAggIp, kAggPort}, h, payload);
}

// A port of `queues` rx rings and `queues` tx rings.
class MultiRingPort {
 public:
  explicit MultiRingPort(unsigned queues) {
    static int serial = 0;
    const std::string base = "mq" + std::to_string(serial++);
    for (unsigned q = 0; q < queues; ++q) {
      rx_.push_back(rte_ring_create((base + "rx" + std::to_string(q)).c_str(), 4096,
                                    rte_socket_id(), RING_F_SP_ENQ | RING_F_SC_DEQ));
      tx_.push_back(rte_ring_create((base + "tx" + std::to_string(q)).c_str(), 8192,
                                    rte_socket_id(), RING_F_SP_ENQ | RING_F_SC_DEQ));
    }
    const int port = rte_eth_from_rings((base + "port").c_str(), rx_.data(), queues, tx_.data(),
                                        queues, rte_socket_id());
    EXPECT_GE(port, 0) << rte_strerror(rte_errno);
    name_ = std::to_string(port);
  }
  ~MultiRingPort() {
    drain();
    for (rte_ring* r : rx_) {
      rte_mbuf* m;
      while (rte_ring_dequeue(r, reinterpret_cast<void**>(&m)) == 0) rte_pktmbuf_free(m);
      rte_ring_free(r);
    }
    for (rte_ring* r : tx_) rte_ring_free(r);
  }
  const std::string& name() const { return name_; }
  void inject(unsigned q, const std::vector<uint8_t>& f) {
    rte_mbuf* m = rte_pktmbuf_alloc(g_pool);
    ASSERT_NE(m, nullptr);
    std::memcpy(rte_pktmbuf_append(m, static_cast<uint16_t>(f.size())), f.data(), f.size());
    while (rte_ring_enqueue(rx_[q], m) != 0) std::this_thread::yield();
  }
  std::vector<std::vector<uint8_t>> drain() {
    std::vector<std::vector<uint8_t>> out;
    for (rte_ring* r : tx_) {
      rte_mbuf* m;
      while (rte_ring_dequeue(r, reinterpret_cast<void**>(&m)) == 0) {
        std::vector<uint8_t> bytes(m->pkt_len);
        const void* d = rte_pktmbuf_read(m, 0, m->pkt_len, bytes.data());
        if (d != bytes.data()) std::memcpy(bytes.data(), d, m->pkt_len);
        out.push_back(std::move(bytes));
        rte_pktmbuf_free(m);
      }
    }
    return out;
  }

 private:
  std::vector<rte_ring*> rx_, tx_;
  std::string name_;
};

// A reply decoded for the rank it is addressed to; false when it is for none of them.
struct Reply1 {
  uint32_t rank = 0;
  wire::Header hdr;
  std::vector<int32_t> words;
};
bool decode_reply(const std::vector<uint8_t>& bytes, uint32_t world, uint64_t key, Reply1* out) {
  for (uint32_t r = 0; r < world; ++r) {
    const frame::Endpoint ep = rank_ep(r);
    frame::Parsed p;
    if (frame::classify(bytes, frame::LocalConfig{ep.mac, ep.ip, ep.port}, {}, &p) !=
        frame::Verdict::kIna) {
      continue;
    }
    wire::PacketView pkt;
    if (wire::decode(p.ina, &pkt) != wire::DecodeError::kOk) return false;
    testing::learn_welcome(pkt);
    EXPECT_TRUE(testing::reply_tag_ok(p.ina, pkt.hdr.job, key))
        << "a reply not sealed with the job's key (or its incarnation's)";
    out->rank = r;
    out->hdr = pkt.hdr;
    out->words.resize(pkt.hdr.count);
    if (!out->words.empty()) wire::load_words(out->words.data(), pkt.payload, pkt.hdr.count);
    return true;
  }
  return false;
}

int32_t value(uint32_t rank, uint32_t block, uint32_t i) {
  return static_cast<int32_t>((rank + 3) * 7919u + block * 104729u + i * 17u) *
         ((i + rank) % 2 == 0 ? -1 : 1);
}

// The rx queue a rank's frames land on (the "flow hash" of this port).
unsigned queue_of(uint32_t rank) { return rank < 2 ? 0 : 1; }

struct Harness {
  std::unique_ptr<MultiRingPort> port;
  std::unique_ptr<DpdkAggregator> agg;
  ~Harness() {
    if (agg) agg->stop();
    if (port) port->drain();
    agg.reset();  // stops and closes the port, frees the pool
    port.reset();
  }
  // Calls service() until `pred(snapshot)` or 10 s.
  template <class P>
  bool serve_until(P pred) {
    const auto end = Clock::now() + 10s;
    while (Clock::now() < end) {
      agg->service(1ms);
      if (pred(agg->snapshot())) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }

  // Every rank joins job `job`; each gets the WELCOME notice, then, for its HELLO again, its own
  // WELCOME naming the incarnation's epoch (WIRE.md; decode_reply learns it).
  void join(JobId job, uint64_t key, uint32_t world) {
    for (int pass = 0; pass < 2; ++pass) {
      for (uint32_t r = 0; r < world; ++r) {
        wire::Header h = testing::hello_header(job, key, static_cast<uint16_t>(r), 500 + r);
        port->inject(queue_of(r), ina_frame(r, h, {static_cast<int32_t>(world)}));
      }
      size_t welcomes = 0;
      const auto end = Clock::now() + 10s;
      while (welcomes < world && Clock::now() < end) {
        for (const auto& b : port->drain()) {
          Reply1 d;
          ASSERT_TRUE(decode_reply(b, world, key, &d));
          EXPECT_EQ(d.hdr.flags, wire::kFlagHello | wire::kFlagResult);
          EXPECT_EQ(d.hdr.seq, pass == 0 ? 0u : 500 + d.rank);
          ++welcomes;
        }
        std::this_thread::sleep_for(200us);
      }
      ASSERT_EQ(welcomes, world);
    }
  }

  // `blocks` blocks of `elems` ints of job `job` in windows of 2 * slots blocks (each slot copy
  // once, as a worker's window reuses a copy only after its result): every rank's frames on its
  // queue in a shuffled order; every rank must get every block's exact sum.
  void exact_round(JobId job, uint64_t key, uint32_t world, uint32_t slots, uint16_t elems,
                   uint32_t block0, uint32_t blocks, uint32_t seed) {
    std::mt19937 rng(seed);
    for (uint32_t w0 = block0; w0 < block0 + blocks; w0 += 2 * slots) {
      const uint32_t w1 = std::min(block0 + blocks, w0 + 2 * slots);
      std::vector<std::pair<uint32_t, uint32_t>> order;  // (rank, block)
      for (uint32_t b = w0; b < w1; ++b) {
        for (uint32_t r = 0; r < world; ++r) order.emplace_back(r, b);
      }
      std::shuffle(order.begin(), order.end(), rng);
      for (const auto& [r, b] : order) {
        wire::Header h;
        h.tag = key;  // the key udp_frame() seals with (test_packets.h)
        h.job = job;
        h.rank = static_cast<uint16_t>(r);
        h.slot = static_cast<uint16_t>(b % slots);
        h.shadow = ((b / slots) % 2) != 0;
        h.seq = b + 1;
        h.count = elems;
        std::vector<int32_t> pl(elems);
        for (uint32_t i = 0; i < elems; ++i) pl[i] = value(r, b, i);
        port->inject(queue_of(r), ina_frame(r, h, pl));
      }
      std::map<std::pair<uint32_t, uint32_t>, bool> got;  // (rank, block) -> exact
      const size_t want = size_t{world} * (w1 - w0);
      const auto end = Clock::now() + 20s;
      while (got.size() < want && Clock::now() < end) {
        for (const auto& bytes : port->drain()) {
          Reply1 d;
          ASSERT_TRUE(decode_reply(bytes, world, key, &d)) << "a reply to no rank";
          ASSERT_NE(d.hdr.flags & wire::kFlagResult, 0) << "not a result";
          const uint32_t b = d.hdr.seq - 1;
          ASSERT_EQ(d.words.size(), elems);
          bool exact = true;
          for (uint32_t i = 0; i < elems; ++i) {
            int64_t s = 0;
            for (uint32_t r = 0; r < world; ++r) s += value(r, b, i);
            exact = exact && d.words[i] == static_cast<int32_t>(s);
          }
          EXPECT_TRUE(exact) << "block " << b << " at rank " << d.rank;
          got[{d.rank, b}] = exact;
        }
        std::this_thread::sleep_for(200us);
      }
      ASSERT_EQ(got.size(), want) << "results missing in blocks [" << w0 << ", " << w1 << ")";
    }
  }
};

DpdkOptions options(const std::string& port) {
  DpdkOptions o;
  o.port = port;
  o.ip = kAggIp;
  o.udp_port = kAggPort;
  o.mac_set = true;
  o.mac = kAggMac;
  o.mbufs = 4095;
  o.lcores = 2;
  return o;
}

class DpdkMultiQueue : public ::testing::Test {
 protected:
  void SetUp() override {
    if (g_workers < 2) GTEST_SKIP() << "needs 2 worker lcores, the EAL has " << g_workers;
  }
};

// 2 lcores x 2 queues: both queues receive, both lcores aggregate their slots, exact sums.
TEST_F(DpdkMultiQueue, TwoQueuesTwoLcoresExactSums) {
  constexpr JobId kJob = 11;
  constexpr uint64_t kKey = 0xABCDEF;
  constexpr uint32_t kWorld = 4, kSlots = 8;
  constexpr uint16_t kElems = 64;
  Harness h;
  h.port = std::make_unique<MultiRingPort>(2);
  JobConfig j;
  j.job = kJob;
  j.key = kKey;
  j.slots = SlotTableConfig{kSlots, uint32_t{kElems} * 4, kWorld};
  auto a = DpdkAggregator::create(options(h.port->name()), {j});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  h.agg = std::move(*a);
  ASSERT_EQ(h.agg->lcores(), 2u);
  ASSERT_EQ(h.agg->rx_queues(), 2u) << "one rx queue per lcore";
  ASSERT_TRUE(h.agg->start().ok());
  h.join(kJob, kKey, kWorld);
  h.exact_round(kJob, kKey, kWorld, kSlots, kElems, 0, 4 * kSlots, 7);
  EXPECT_GT(h.agg->rx_frames(0), 0u) << "queue 0 received nothing";
  EXPECT_GT(h.agg->rx_frames(1), 0u) << "queue 1 received nothing";
  h.agg->stop();
  for (unsigned i = 0; i < 2; ++i) {
    const DpdkLoopCounters& c = h.agg->loop_counters(i);
    SCOPED_TRACE("lcore " + std::to_string(i));
    // Queue i carries ranks 2i and 2i+1: their HELLOs (two each: to join, and again on the
    // barrier's notice, WIRE.md) and blocks (half of them go to the other lcore), every frame
    // received once.
    EXPECT_EQ(c.rx, 4u + 2u * 4 * kSlots);
    EXPECT_EQ(c.handed_off, 4u /* HELLO copies */ + 2u * 2 * kSlots);
    EXPECT_EQ(c.handoff_received, c.handed_off);
    EXPECT_EQ(c.handoff_dropped, 0u);
    EXPECT_EQ(h.agg->engine(i).counters().completed, 2u * kSlots) << "slots of lcore " << i;
  }
  // Each HELLO counted once, by the lcore that received it (its copy to the other is not), so the
  // totals count what the ranks sent.
  const EngineCounters e = h.agg->engine_totals();
  EXPECT_EQ(e.hellos, 2 * uint64_t{kWorld});
  EXPECT_EQ(e.packets_in, 2 * uint64_t{kWorld} + uint64_t{kWorld} * 4 * kSlots);
}

// Jobs from set_jobs() while the loops run: applied on both lcores through their mailboxes,
// served exactly, reported in the merged snapshot, replaced, and refused with a reason when the
// block does not fit.
TEST_F(DpdkMultiQueue, JobsChangedWhileRunning) {
  constexpr uint32_t kWorld = 4, kSlots = 4;
  constexpr uint16_t kElems = 32;
  Harness h;
  h.port = std::make_unique<MultiRingPort>(2);
  DpdkOptions o = options(h.port->name());
  o.max_payload_bytes = static_cast<uint32_t>(64) * 4;
  o.slot_capacity = 16;
  o.telemetry = true;
  auto a = DpdkAggregator::create(o, {});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  h.agg = std::move(*a);
  ASSERT_TRUE(h.agg->start().ok());
  EXPECT_TRUE(h.agg->snapshot().jobs.empty());

  JobConfig ja;
  ja.job = 21;
  ja.key = 0x2121;  // (the test helpers seal with 64-bit keys)
  ja.slots = SlotTableConfig{kSlots, uint32_t{kElems} * 4, kWorld};
  ja.slot_base = 0;
  JobConfig too_big = ja;
  too_big.job = 22;
  too_big.slot_base = 8;
  too_big.slots.max_payload_bytes =
      static_cast<uint32_t>(4096) * 4;  // beyond max_block_elems: the mbufs cannot hold it
  h.agg->set_jobs({ja, too_big});
  ASSERT_TRUE(h.serve_until([](const AggregatorSnapshot& s) { return s.jobs.size() == 1; }));
  {
    const AggregatorSnapshot s = h.agg->snapshot();
    EXPECT_EQ(s.jobs[0].cfg.job, 21u);
    ASSERT_EQ(s.job_errors.count(22), 1u);
    EXPECT_NE(s.job_errors.at(22).find("exceeds"), std::string::npos) << s.job_errors.at(22);
  }
  for (unsigned i = 0; i < 2; ++i) {
    EXPECT_EQ(h.agg->engine(i).world_size(21), kWorld) << "lcore " << i << " lacks job 21";
  }
  h.join(ja.job, ja.key.lo, kWorld);
  h.exact_round(ja.job, ja.key.lo, kWorld, kSlots, kElems, 0, 4 * kSlots, 3);
  // The merged snapshot: every round of both lcores, ready everywhere, every rank timed.
  ASSERT_TRUE(h.serve_until([&](const AggregatorSnapshot& s) {
    return s.jobs.size() == 1 && s.jobs[0].counters.completed == 4 * kSlots;
  })) << "completed "
      << h.agg->snapshot().jobs.at(0).counters.completed;
  {
    const JobSnapshot j = h.agg->snapshot().jobs.at(0);
    EXPECT_TRUE(j.ready);
    ASSERT_EQ(j.telemetry.size(), kWorld);
    uint64_t timed = 0, last = 0;
    for (const RankTelemetry& t : j.telemetry) {
      timed += t.lag_count;
      last += t.last;
    }
    EXPECT_EQ(timed, uint64_t{kWorld} * 4 * kSlots) << "every contribution timed once";
    EXPECT_EQ(last, 4u * kSlots) << "one rank completes each round";
    EXPECT_EQ(j.straggler_ranking.size(), kWorld);
    EXPECT_EQ(h.agg->snapshot().engine.completed, 4u * kSlots);
  }

  // Job 21 replaced by job 23 on the same slots: 21's packets are now unknown, 23 is exact.
  JobConfig jb = ja;
  jb.job = 23;
  h.agg->set_jobs({jb});
  ASSERT_TRUE(h.serve_until([](const AggregatorSnapshot& s) {
    return s.jobs.size() == 1 && s.jobs[0].cfg.job == 23 && s.job_errors.empty();
  }));
  for (unsigned i = 0; i < 2; ++i) EXPECT_EQ(h.agg->engine(i).world_size(21), 0u);
  const uint64_t unknown0 = h.agg->snapshot().engine.unknown_job;
  wire::Header old;
  old.job = 21;
  old.rank = 0;
  old.seq = 99;
  old.count = kElems;
  h.port->inject(queue_of(0), ina_frame(0, old, std::vector<int32_t>(kElems, 1)));
  ASSERT_TRUE(h.serve_until([&](const AggregatorSnapshot& s) {
    return s.engine.unknown_job == unknown0 + 1;
  })) << "the removed job's packet was not counted as unknown";
  h.join(jb.job, jb.key.lo, kWorld);
  h.exact_round(jb.job, jb.key.lo, kWorld, kSlots, kElems, 0, 2 * kSlots, 5);
  EXPECT_TRUE(h.port->drain().empty());
}

}  // namespace
}  // namespace ina::agg

int main(int argc, char** argv) {
  return ina::agg::testing::run_dpdk_tests(argc, argv, "dpdk_multiqueue_test", "ina_dpdk_mq_",
                                           "mq_frames", &ina::agg::g_pool, &ina::agg::g_workers);
}
