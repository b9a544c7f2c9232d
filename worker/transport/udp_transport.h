// Kernel UDP transport: one socket connected to the aggregator, recvmmsg/sendmmsg batches.
//
// Receive: UDP_GRO when the kernel has it (an aggregator that sends with UDP_SEGMENT, or a NIC
// that coalesces, hands us several datagrams in one buffer; the gso_size control message splits
// them again). Send: runs of equal-size datagrams in one batch go out as one UDP_SEGMENT
// super-datagram when the kernel accepts it (one trip through the stack instead of one per
// packet); if the kernel refuses GSO on this path (no checksum offload: EIO; gso_size beyond the
// path MTU: EINVAL) the transport falls back to plain sendmmsg for good.
//
// An ICMP port unreachable (nothing listens at the aggregator's port) surfaces as ECONNREFUSED
// on the next send or receive. It is counted (refusals()) and otherwise treated as loss: the
// aggregator may be starting, and the engine's deadline decides when to give up. A datagram a
// local firewall drops (EPERM from sendmmsg) is counted (filtered) and treated as loss too.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ina/base/status.h"
#include "worker/transport/transport.h"

namespace ina::worker {

struct UdpTransportOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 47474;
  uint32_t batch = 32;                // datagrams per recvmmsg, and per sendmmsg call
  bool gro = true;                    // UDP_GRO on receive when the kernel has it
  bool gso = true;                    // UDP_SEGMENT on send when the kernel has it
  int socket_buffer_bytes = 8 << 20;  // SO_SNDBUF / SO_RCVBUF, best effort
};

struct UdpTransportCounters {
  uint64_t datagrams_sent = 0;
  uint64_t datagrams_received = 0;
  uint64_t gso_sends = 0;       // super-datagrams sent with UDP_SEGMENT
  uint64_t gro_receives = 0;    // buffers that held more than one datagram
  uint64_t send_dropped = 0;    // datagrams given up on a full socket buffer
  uint64_t truncated = 0;       // received datagrams larger than the buffer (dropped)
  uint64_t refusals = 0;        // ECONNREFUSED (ICMP port unreachable)
  uint64_t filtered = 0;        // EPERM: dropped by a firewall in our own output path (loss)
  uint64_t spin_receives = 0;   // waits that found datagrams while polling (no wake-up)
  uint64_t blocking_waits = 0;  // waits in ppoll (it returns at once if a datagram came)
};

class UdpTransport final : public Transport {
 public:
  static Result<std::unique_ptr<UdpTransport>> create(const UdpTransportOptions& opts);
  ~UdpTransport() override;
  UdpTransport(const UdpTransport&) = delete;
  UdpTransport& operator=(const UdpTransport&) = delete;

  Status send_batch(std::span<const std::span<const uint8_t>> pkts) override;
  Status send_gather(std::span<const GatherDatagram> pkts) override;
  Result<size_t> recv_batch(std::span<Datagram> out, std::chrono::microseconds timeout) override;
  // One datagram on the path to the aggregator: its route's MTU less the IP and UDP headers.
  size_t max_datagram() const override { return max_datagram_; }
  std::string peer_name() const override { return peer_name_; }
  uint64_t refusals() const override { return counters_.refusals; }
  void set_spin(std::chrono::microseconds budget) override {
    spin_us_ = std::max<int64_t>(0, budget.count());
  }
  void probe() override;

  bool gro_enabled() const { return gro_on_; }
  bool gso_enabled() const { return gso_on_; }
  uint16_t local_port() const { return local_port_; }
  const UdpTransportCounters& counters() const { return counters_; }

  // The largest UDP payload over IPv4 (65535 - 20 - 8); used for IPv6 too.
  static constexpr size_t kMaxUdpPayload = 65507;

 private:
  UdpTransport() = default;
  Status init(const UdpTransportOptions& opts);
  // Copies datagrams of the messages received last time into `out`, splitting GRO buffers.
  size_t drain(std::span<Datagram> out);
  // Sends pkts[from, from + n) with one sendmmsg call (GSO runs grouped); returns how many
  // datagrams went out, or -1 with errno.
  // P: a contiguous datagram (std::span) or one in two parts (GatherDatagram).
  template <class P>
  long send_some(std::span<const P> pkts, size_t from);
  template <class P>
  Status send_all(std::span<const P> pkts);

  int fd_ = -1;
  std::string peer_name_;
  uint16_t local_port_ = 0;
  size_t max_datagram_ = kMaxUdpPayload;
  bool gro_on_ = false;
  bool gso_on_ = false;
  uint32_t batch_ = 32;
  // Poll before blocking in recv_batch (set_spin; udp_transport.cc).
  int64_t spin_us_ = 0;
  // One recvmmsg without waiting: datagrams read (0: none, or a refusal counted), or -errno.
  int read_now();
  UdpTransportCounters counters_;

  // Receive side: batch_ buffers of kRxBufferSize bytes, their headers and control space.
  static constexpr size_t kRxBufferSize = 65536;
  std::unique_ptr<uint8_t[]> rx_storage_;
  std::vector<mmsghdr> rx_msgs_;
  std::vector<iovec> rx_iov_;
  std::vector<uint64_t> rx_ctrl_;  // CMSG space per message (uint64 for alignment)
  size_t rx_ctrl_words_ = 0;
  size_t rx_received_ = 0;   // messages in the last recvmmsg
  size_t rx_next_msg_ = 0;   // first message not fully handed out
  size_t rx_next_off_ = 0;   // offset in it (GRO buffers are handed out in pieces)
  bool rx_drained_ = false;  // the last read found fewer messages than a batch (recv_batch)

  // Send side: per sendmmsg call at most batch_ messages; a GSO message gathers a run.
  std::vector<mmsghdr> tx_msgs_;
  std::vector<iovec> tx_iov_;  // two per datagram (send_gather's parts)
  std::vector<uint64_t> tx_ctrl_;
  std::vector<uint32_t> tx_pkts_per_msg_;
};

}  // namespace ina::worker
