// Kernel-bypass worker transport over an AF_XDP socket (feature `xdp`, libxdp + libbpf), no DPDK:
// INA_TRANSPORT=xdp, INA_XDP_IFACE, INA_XDP_QUEUE, our IPv4 INA_LOCAL_IP (not configured on the
// kernel interface: we answer ARP for it), the aggregator's MAC by ARP or INA_AGGREGATOR_MAC.
//
// Filtering: libxdp's default XSK program redirects every frame of the bound queue to the socket
// (by queue, not by port), so the interface/queue belongs to this worker. In user space frames
// are classified with protocol/frame.h: INA datagrams to our UDP port are delivered, ARP requests
// for our address and ICMP echo are answered, ARP replies give the aggregator's MAC, the rest is
// counted and dropped (it never reaches the kernel stack).
//
// UMEM: kFrames frames of 2 KiB; the first half feeds the fill ring (receive), the second half is
// the transmit pool, recycled from the completion ring. Received frames handed out as views return
// to the fill ring at the next recv_batch(). Zero-copy bind first, copy mode when the driver has
// no zero-copy (veth), and generic (SKB) XDP when native XDP cannot attach.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ina/base/features.h"
#include "ina/base/status.h"
#include "ina/ina.hpp"
#include "ina/protocol/frame.h"
#include "worker/transport/transport.h"

namespace ina::worker {

struct XdpTransportOptions {
  std::string iface;
  uint32_t queue = 0;
  uint32_t local_ip = 0;       // host order
  bool local_mac_set = false;  // else the interface's
  frame::Mac local_mac{};
  uint16_t local_port = 0;
  uint32_t aggregator_ip = 0;
  uint16_t aggregator_port = 47474;
  bool aggregator_mac_set = false;
  frame::Mac aggregator_mac{};
  uint32_t batch = 64;
  bool force_copy = false;  // skip the zero-copy attempt
  std::chrono::milliseconds arp_timeout{5000};
};

// The options of cfg's fields (Config::from_env parsed INA_XDP_IFACE, INA_XDP_QUEUE,
// INA_XDP_COPY, INA_LOCAL_IP, INA_LOCAL_MAC, INA_LOCAL_PORT, INA_AGGREGATOR_MAC into them) and its
// aggregator (an IPv4 literal). A missing required field is an error naming its variable.
Result<XdpTransportOptions> xdp_options_from_config(const Config& cfg);

// libxdp's and libbpf's versions (in libina-xdp.so; libina's features::probe_xdp asks it).
features::Probe probe_libxdp();

struct XdpTransportCounters {
  uint64_t sent = 0;
  uint64_t received = 0;
  uint64_t no_tx_frame = 0;  // transmit pool empty: counted as loss
  uint64_t arp_answered = 0;
  uint64_t icmp_answered = 0;
};

class XdpTransport final : public Transport {
 public:
  static Result<std::unique_ptr<XdpTransport>> create(const XdpTransportOptions& opts);
  ~XdpTransport() override;
  XdpTransport(const XdpTransport&) = delete;
  XdpTransport& operator=(const XdpTransport&) = delete;

  Status send_batch(std::span<const std::span<const uint8_t>> pkts) override;
  Result<size_t> recv_batch(std::span<Datagram> out, std::chrono::microseconds timeout) override;
  size_t max_datagram() const override { return max_datagram_; }
  std::string peer_name() const override { return peer_name_; }
  void set_spin(std::chrono::microseconds budget) override { spin_ = budget; }

  bool zero_copy() const { return zero_copy_; }
  const XdpTransportCounters& counters() const { return counters_; }
  const frame::Counters& frame_counters() const { return frames_; }

  struct State;  // libxdp objects and rings (xdp_transport.cc)

 private:
  XdpTransport();
  Status init(const XdpTransportOptions& opts);
  // Takes up to `max` received frames; INA datagrams go to out (and stay held), the rest is
  // answered or dropped at once. Returns how many datagrams.
  size_t drain(std::span<Datagram> out);
  void recycle_held();
  void reclaim_tx();
  // Queues one frame of `len` bytes already written at tx frame `addr`.
  void kick_tx();

  std::unique_ptr<State> s_;
  frame::LocalConfig local_;
  frame::Endpoint src_{}, dst_{};
  bool have_mac_ = false;
  bool zero_copy_ = false;
  size_t max_datagram_ = 0;
  uint32_t batch_ = 64;
  uint16_t ip_id_ = 0;
  std::string peer_name_;
  XdpTransportCounters counters_;
  std::chrono::microseconds spin_{0};  // poll this long before blocking (set_spin)
  frame::Counters frames_;
  std::vector<uint64_t> held_;  // rx frame addresses handed out by the last recv_batch
  std::vector<uint64_t> tx_free_;
};

}  // namespace ina::worker
