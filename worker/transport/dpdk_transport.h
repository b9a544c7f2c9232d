// Kernel-bypass worker transport over a DPDK port (feature `dpdk`): net_memif to an aggregator on
// the same host, net_af_xdp / net_af_packet / a NIC across hosts. Selected with INA_TRANSPORT=dpdk
// only, so libina loads and runs without DPDK or hugepages otherwise: the EAL starts when the first
// DpdkTransport of the process is created, with the arguments of INA_DPDK_ARGS.
//
// Framing is protocol/frame.h (no second parser): each transport is one UDP endpoint (our IPv4 and
// MAC, UDP port INA_LOCAL_PORT + rank) talking to the aggregator's IPv4:port, whose MAC comes from
// INA_AGGREGATOR_MAC or from ARP. We answer ARP for our address and ICMP echo.
//
// Several ranks of one process share the port (one DPDK port per process, one rx and one tx
// queue): whichever rank polls takes the rx lock, receives a burst and hands each INA frame to the
// rank that owns its UDP port through that rank's single-consumer rte_ring; tx is a burst under a
// tx lock. Steady state allocates nothing: mbufs come from one pool created at start, the views
// recv_batch() returns point into mbufs held until the next call. The port is stopped when its
// last transport goes (and at exit), before the EAL is left to the process end (DPDK 22.11's memif
// can crash when a peer disconnects under traffic).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ina/base/status.h"
#include "ina/ina.hpp"
#include "ina/protocol/frame.h"
#include "worker/transport/transport.h"

struct rte_mbuf;
struct rte_ring;

namespace ina::worker {

struct DpdkTransportOptions {
  std::vector<std::string> eal_args;  // without argv[0]; used by the first transport only
  std::string port;                   // port name ("net_memif0", a PCI address), number, "" = first
  uint32_t local_ip = 0;              // host order, required
  bool local_mac_set = false;         // else the port's MAC
  frame::Mac local_mac{};
  uint16_t local_port = 0;     // our UDP port
  uint32_t aggregator_ip = 0;  // host order
  uint16_t aggregator_port = 47474;
  bool aggregator_mac_set = false;  // else ARP
  frame::Mac aggregator_mac{};
  uint16_t burst = 32;
  std::chrono::milliseconds link_timeout{10000};  // wait for the link (memif: the server) and ARP
};

// The options of cfg's fields (Config::from_env parsed INA_DPDK_ARGS, INA_DPDK_PORT, INA_LOCAL_IP,
// INA_LOCAL_MAC, INA_LOCAL_PORT, INA_AGGREGATOR_MAC into them) and its aggregator (must be an IPv4
// literal). A missing required field is an error naming its variable (bypass_endpoint.h).
Result<DpdkTransportOptions> dpdk_options_from_config(const Config& cfg);

struct DpdkTransportCounters {
  uint64_t sent = 0;
  uint64_t received = 0;
  uint64_t tx_dropped = 0;  // the port did not take them
  uint64_t no_mbuf = 0;     // pool empty: counted as loss
  uint64_t rx_ring_full = 0;
};

class DpdkPort;

class DpdkTransport final : public Transport {
 public:
  static Result<std::unique_ptr<DpdkTransport>> create(const DpdkTransportOptions& opts);
  ~DpdkTransport() override;
  DpdkTransport(const DpdkTransport&) = delete;
  DpdkTransport& operator=(const DpdkTransport&) = delete;

  Status send_batch(std::span<const std::span<const uint8_t>> pkts) override;
  Result<size_t> recv_batch(std::span<Datagram> out, std::chrono::microseconds timeout) override;
  size_t max_datagram() const override { return max_datagram_; }
  std::string peer_name() const override { return peer_name_; }

  DpdkTransportCounters counters() const {
    DpdkTransportCounters c = counters_;
    c.rx_ring_full = ep_.ring_full.load(std::memory_order_relaxed);
    return c;
  }
  const frame::LocalConfig& local() const { return local_; }
  // Frames the shared port dropped, by reason (all ranks of the process together).
  frame::Counters port_frame_counters() const;

  // Used by DpdkPort's poller (under its rx lock).
  struct Endpoint {
    frame::LocalConfig local;
    uint32_t aggregator_ip = 0;
    rte_ring* ring = nullptr;
    DpdkTransport* owner = nullptr;
    std::atomic<uint64_t> ring_full{0};  // INA frames dropped: this rank's ring was full
  };
  void learn_aggregator_mac(const frame::Mac& mac);

 private:
  DpdkTransport() = default;
  Status init(const DpdkTransportOptions& opts);
  void release_held();

  std::shared_ptr<DpdkPort> port_;
  Endpoint ep_;
  frame::LocalConfig local_;
  frame::Endpoint src_{}, dst_{};
  bool registered_ = false;
  std::atomic<bool> have_mac_{false};
  frame::Mac learned_mac_{};
  size_t max_datagram_ = 0;
  uint16_t burst_ = 32;
  uint16_t ip_id_ = 0;
  std::string peer_name_;
  DpdkTransportCounters counters_;
  std::vector<rte_mbuf*> held_;  // handed out by the last recv_batch
  size_t held_n_ = 0;
  std::vector<rte_mbuf*> tx_;
};

}  // namespace ina::worker
