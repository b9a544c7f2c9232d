// An in-memory network for worker tests: N worker transports and one thread running the real
// aggregator packet logic (ina::agg::Engine), with seeded loss, duplication and reordering in
// both directions. Datagrams are copied through mutex-protected queues (allocation per packet is
// fine here: this is test scaffolding, not the library's hot path).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/engine.h"
#include "ina/protocol/wire.h"
#include "worker/transport/transport.h"

namespace ina::worker::testing {

struct NetFaults {
  double drop_percent = 0;  // each direction
  double dup_percent = 0;
  double reorder_percent = 0;  // inserted up to 8 places early in the receiver's queue
  uint64_t seed = 1;
  // Every reply datagram is preceded by a forged copy: the last byte flipped (a payload word, or
  // the tag of an empty one), its tag left as it was. A worker must drop it as a bad tag.
  bool forge_replies = false;
};

class MemNetwork {
 public:
  // `endpoints` transports (worker sockets) talk to an aggregator serving `job`. With `alive`
  // false nobody answers; with `refuse` also set, every datagram counts as refused (ICMP port
  // unreachable), as on a host where no aggregator process listens.
  MemNetwork(size_t endpoints, const agg::JobConfig& job, NetFaults faults = {}, bool alive = true,
             bool refuse = false);
  ~MemNetwork();
  MemNetwork(const MemNetwork&) = delete;
  MemNetwork& operator=(const MemNetwork&) = delete;

  // The transport of endpoint `i` (call once per endpoint).
  std::unique_ptr<Transport> transport(size_t i);

  // The aggregator dies (answers nothing, every datagram refused) just before its reply datagram
  // number `n` (counted from 1 over every datagram it sends to a worker, each copy of a
  // multicast apart) would go out; 0 disarms. Set it before the workers start.
  void kill_before_reply(uint64_t n) { kill_at_ = n; }
  // Reply datagrams sent to workers so far.
  uint64_t replies() const { return replies_.load(); }

  // Stops the aggregator thread; then engine() may be inspected.
  void stop();
  const agg::Engine& engine() const { return engine_; }
  uint64_t dropped() const { return dropped_.load(); }
  uint64_t duplicated() const { return duplicated_.load(); }
  uint64_t reordered() const { return reordered_.load(); }

 private:
  class Endpoint;
  struct Packet {
    size_t src = 0;
    std::vector<uint8_t> bytes;
  };
  struct Queue {
    std::mutex m;
    std::condition_variable cv;
    std::deque<Packet> q;
    std::mt19937_64 rng;
  };

  void push(Queue& box, size_t src, std::span<const uint8_t> bytes);
  void aggregator_loop();

  NetFaults faults_;
  std::atomic<bool> alive_;
  std::atomic<bool> refuse_;
  std::atomic<uint64_t> kill_at_{0};
  std::atomic<uint64_t> replies_{0};
  // Delivers one reply to endpoint `e` unless the kill point is reached (then dies).
  void reply(size_t e, std::span<const uint8_t> bytes);
  agg::Engine engine_;
  Queue to_agg_;
  std::vector<std::unique_ptr<Queue>> inbox_;
  std::vector<std::atomic<uint64_t>> refusals_;
  // rank -> the endpoint that last sent a valid packet as that rank (the real backend's address
  // table): a multicast reply goes to those endpoints only.
  std::vector<int64_t> rank_endpoint_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> dropped_{0}, duplicated_{0}, reordered_{0};
  std::thread thread_;

  friend class Endpoint;
};

}  // namespace ina::worker::testing
