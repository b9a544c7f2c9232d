// The datagram transport the in-network collective engine runs on: a connected, unreliable,
// message-preserving channel to one aggregator. Implementations: kernel UDP (udp_transport.h),
// an in-memory network in the tests, and a fault-injecting decorator (fault_transport.h).
//
// The engine owns retransmission, ordering and duplicate detection, so a transport may lose,
// reorder or duplicate datagrams; it must only never corrupt or merge them. Neither call allocates
// in the steady state: the caller passes spans, and received datagrams are views into buffers the
// transport owns.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ina/base/status.h"

namespace ina::worker {

// A received datagram: a view into the transport's receive buffers, valid until the next
// recv_batch() call on the same transport.
using Datagram = std::span<const uint8_t>;

// A datagram to send in two parts, one after the other: the header (the engine's slot buffer) and
// the payload (read in place, from the user's buffer).
struct GatherDatagram {
  std::span<const uint8_t> head;
  std::span<const uint8_t> body;
  size_t size() const { return head.size() + body.size(); }
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Sends each span of `pkts` as one datagram, in order. A datagram the network (or a full socket
  // buffer) loses is not an error: the engine retransmits. An error Status means the transport
  // itself is broken (a closed socket, a datagram larger than the transport can carry).
  virtual Status send_batch(std::span<const std::span<const uint8_t>> pkts) = 0;

  // The same for datagrams in two parts (each entry one datagram, head then body). The kernel UDP
  // transport hands the parts to the kernel as they are (sendmmsg's iovecs: the payload is copied
  // once, by the kernel, from the user's buffer); by default the parts are joined in a buffer the
  // transport keeps (its capacity reused: no allocation in the steady state) and sent by
  // send_batch().
  virtual Status send_gather(std::span<const GatherDatagram> pkts) {
    size_t total = 0;
    for (const GatherDatagram& g : pkts) total += g.size();
    if (gather_buf_.size() < total) gather_buf_.resize(total);
    gather_spans_.clear();
    uint8_t* o = gather_buf_.data();
    for (const GatherDatagram& g : pkts) {
      if (!g.head.empty()) std::memcpy(o, g.head.data(), g.head.size());
      if (!g.body.empty()) std::memcpy(o + g.head.size(), g.body.data(), g.body.size());
      gather_spans_.emplace_back(o, g.size());
      o += g.size();
    }
    return send_batch(gather_spans_);
  }

  // Waits up to `timeout` for at least one datagram, then stores up to out.size() of them in
  // `out` without waiting further. Returns how many (0: the timeout expired). A timeout of 0
  // only collects what has already arrived.
  virtual Result<size_t> recv_batch(std::span<Datagram> out, std::chrono::microseconds timeout) = 0;

  // How long the next recv_batch() calls may poll, yielding the CPU between polls, before they
  // block (never longer than their timeout). The engine chooses per wait: it polls where a
  // wake-up would add to a collective's latency (inc_engine.cc, "Waiting"). Transports that
  // always poll (DPDK) or never block (the in-memory network of the tests) ignore it.
  virtual void set_spin(std::chrono::microseconds budget) { (void)budget; }

  // The largest datagram send_batch() accepts (bytes).
  virtual size_t max_datagram() const = 0;

  // The aggregator's address for messages, e.g. "127.0.0.1:47474".
  virtual std::string peer_name() const = 0;

  // How often the peer refused a datagram (ICMP port unreachable: nothing listens there). The
  // engine treats refusals as loss and names them in its error message when a deadline passes.
  virtual uint64_t refusals() const { return 0; }

  // Sends the aggregator an empty datagram, which it ignores (WIRE.md, "Liveness probe"): a
  // dead aggregator's host answers it with ICMP port unreachable, counted by refusals(). The
  // engine probes when the aggregator has been silent for a while, so that it learns of a dead
  // aggregator without waiting for a retransmission timer. Best effort; transports that do not
  // see ICMP (kernel bypass) do nothing.
  virtual void probe() {}

 private:
  std::vector<uint8_t> gather_buf_;  // send_gather()'s joined datagrams
  std::vector<std::span<const uint8_t>> gather_spans_;
};

}  // namespace ina::worker
