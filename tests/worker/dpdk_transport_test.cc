// Suite dpdk: libina's DPDK transport in process, two ranks sharing one net_ring port (a vdev
// without arguments transmits into the ring it receives from, so the test's frames reach the
// port like an aggregator's results). A receive by one rank must dispatch everything waiting on
// the port, not one burst: the engine checks its retransmission timers when a receive returns
// less than a full batch, so a rank's results must not sit in the port's ring while another rank
// receives (with more ranks than cores they did, timers fired, each resend drew a duplicate
// result, and the aggregator's ring to the port overflowed). Then the other rank gets every frame
// once, in order. Exits 77 with the reason when the EAL cannot start.
#include "worker/transport/dpdk_transport.h"

#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_ring.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ina/protocol/frame.h"
#include "ina/protocol/wire.h"
#include "tests/aggregator/test_packets.h"
#include "tests/check.h"

namespace {

using ina::testing::g_failures;

constexpr uint32_t kLocalIp = 0x0A420002;  // 10.66.0.2
constexpr uint32_t kAggIp = 0x0A420001;    // 10.66.0.1
constexpr uint16_t kAggPort = 47474;
constexpr uint16_t kRankPort0 = 47500;
constexpr int kFrames = 100;  // more than three bursts of 32

}  // namespace

int main() {
  using namespace ina;
  using worker::DpdkTransport;
  worker::DpdkTransportOptions o;
  o.eal_args = {"--no-huge",
                "-m",
                "256",
                "--no-shconf",
                "--no-pci",
                "--no-telemetry",
                "--log-level=3",
                "--file-prefix",
                "ina_dt_" + std::to_string(getpid()),
                "--vdev=net_ring0"};
  o.port = "net_ring0";
  o.local_ip = kLocalIp;
  o.aggregator_ip = kAggIp;
  o.aggregator_port = kAggPort;
  o.aggregator_mac_set = true;
  o.aggregator_mac = frame::Mac{0x02, 0, 0, 0, 0, 0x01};
  o.link_timeout = std::chrono::milliseconds(2000);
  std::array<std::unique_ptr<DpdkTransport>, 2> rank;
  for (int r = 0; r < 2; ++r) {
    o.local_port = static_cast<uint16_t>(kRankPort0 + r);
    auto t = DpdkTransport::create(o);
    if (!t.ok()) {
      const std::string msg = t.status().to_string();
      if (r == 0 && msg.find("EAL cannot start") != std::string::npos) {
        std::printf("SKIP: %s\n", msg.c_str());
        return 77;
      }
      std::printf("FAIL: rank %d: %s\n", r, msg.c_str());
      return 1;
    }
    rank[static_cast<size_t>(r)] = std::move(t).value();
  }

  uint16_t port = 0;
  CHECK(rte_eth_dev_get_port_by_name("net_ring0", &port) == 0, "no port net_ring0");
  rte_ether_addr mac{};
  CHECK(rte_eth_macaddr_get(port, &mac) == 0, "no MAC of net_ring0");
  rte_ring* rx = rte_ring_lookup("ETH_RXTX0_net_ring0");
  CHECK(rx != nullptr, "net_ring0's ring ETH_RXTX0_net_ring0 not found");
  rte_mempool* pool = rte_pktmbuf_pool_create("dt_test_pool", 511, 0, 0, 2048 + 128,
                                              static_cast<int>(rte_socket_id()));
  CHECK(pool != nullptr, "test pool");
  if (g_failures > 0) return 1;

  // kFrames results of slot k for rank 1, from the aggregator.
  frame::Endpoint agg{o.aggregator_mac, kAggIp, kAggPort};
  frame::Endpoint to1{{}, kLocalIp, static_cast<uint16_t>(kRankPort0 + 1)};
  std::memcpy(to1.mac.data(), mac.addr_bytes, 6);
  std::vector<rte_mbuf*> frames(kFrames);
  for (int k = 0; k < kFrames; ++k) {
    wire::Header h = agg::testing::data_header(7, 0xC0FFEE, 1, static_cast<uint16_t>(k), false,
                                               static_cast<BlockSeq>(k), 4);
    h.flags |= wire::kFlagResult;
    const std::vector<uint8_t> f = agg::testing::udp_frame(agg, to1, h, {k, 1, 2, 3});
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    CHECK(m != nullptr, "mbuf %d", k);
    if (m == nullptr) return 1;
    std::memcpy(rte_pktmbuf_append(m, static_cast<uint16_t>(f.size())), f.data(), f.size());
    frames[static_cast<size_t>(k)] = m;
  }
  const uint16_t queued = rte_eth_tx_burst(port, 0, frames.data(), kFrames);
  CHECK(queued == kFrames, "net_ring0 took %u of %d frames", queued, kFrames);
  CHECK(rte_ring_count(rx) == static_cast<unsigned>(kFrames), "ring holds %u, want %d",
        rte_ring_count(rx), kFrames);

  // Rank 0 receives: nothing for it, but the port is drained into rank 1's queue.
  std::array<worker::Datagram, 32> out{};
  auto got0 = rank[0]->recv_batch(out, std::chrono::microseconds(0));
  CHECK(got0.ok() && got0.value() == 0, "rank 0 received %zu datagrams, want 0",
        got0.ok() ? got0.value() : size_t{999});
  CHECK(rte_ring_count(rx) == 0,
        "%u of %d frames still wait on the port after another rank's receive", rte_ring_count(rx),
        kFrames);

  // Rank 1 gets all of them, once, in order, in full batches while more wait.
  int next = 0;
  for (int call = 0; call < 10 && next < kFrames; ++call) {
    auto got = rank[1]->recv_batch(out, std::chrono::microseconds(0));
    CHECK(got.ok(), "rank 1: %s", got.status().to_string().c_str());
    if (!got.ok()) break;
    const size_t n = got.value();
    const size_t want = std::min<size_t>(out.size(), static_cast<size_t>(kFrames - next));
    CHECK(n == want, "rank 1 call %d: %zu datagrams, want %zu", call, n, want);
    for (size_t i = 0; i < n; ++i, ++next) {
      wire::PacketView pv;
      const bool ok = wire::decode(out[i], &pv) == wire::DecodeError::kOk;
      CHECK(ok && pv.hdr.slot == next && pv.hdr.has(wire::kFlagResult),
            "rank 1 datagram %d: decoded %d, slot %u", next, ok, ok ? pv.hdr.slot : 0u);
    }
  }
  CHECK(next == kFrames, "rank 1 received %d of %d", next, kFrames);
  auto extra = rank[1]->recv_batch(out, std::chrono::microseconds(0));
  CHECK(extra.ok() && extra.value() == 0, "rank 1 received more than was sent");
  CHECK(rank[1]->counters().received == static_cast<uint64_t>(kFrames),
        "rank 1 counted %llu received",
        static_cast<unsigned long long>(rank[1]->counters().received));

  rank[0].reset();
  rank[1].reset();
  std::printf("%s: %d frames for rank 1, all dispatched by rank 0's receive\n",
              g_failures == 0 ? "PASS" : "FAIL", kFrames);
  return g_failures == 0 ? 0 : 1;
}
