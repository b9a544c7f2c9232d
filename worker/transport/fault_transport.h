// A Transport decorator for fault-injection tests (Config::fault, INA_TEST_*): drops datagrams on
// send and on receive and duplicates them on send, at random from a seeded generator, so a run
// with the same seed loses the same packets. It wraps any transport (kernel UDP in production
// runs, the in-memory network in unit tests).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ina/ina.hpp"
#include "worker/transport/transport.h"

namespace ina::worker {

struct FaultCounters {
  uint64_t dropped_on_send = 0;
  uint64_t dropped_on_receive = 0;
  uint64_t duplicated_on_send = 0;
};

// Uniform in [0, 100) from *state (splitmix64): enough for test decisions, fully reproducible.
double next_fault_percent(uint64_t* state);

// The wait before one collective (INA_TEST_DELAY_US and INA_TEST_STRAGGLE): fault.delay_us,
// plus fault.straggle_delay_us in fault.straggle_percent of the calls, drawn from *state.
uint64_t collective_delay_us(const FaultInjection& fault, uint64_t* state);

// The seed FaultInjection uses: cfg.fault.seed, or one derived from the rank when it is 0.
uint64_t effective_fault_seed(const Config& cfg);
// Wraps each shard's transport in a FaultInjectingTransport when cfg.fault asks for one (shard 0
// with the unsharded seed, the others with their own).
void wrap_fault_injection(const Config& cfg, std::vector<std::unique_ptr<Transport>>* transports);

class FaultInjectingTransport final : public Transport {
 public:
  // `seed` must be the effective seed (FaultInjection::seed, or one derived from the rank).
  FaultInjectingTransport(std::unique_ptr<Transport> inner, const FaultInjection& fault,
                          uint64_t seed);

  Status send_batch(std::span<const std::span<const uint8_t>> pkts) override;
  Result<size_t> recv_batch(std::span<Datagram> out, std::chrono::microseconds timeout) override;
  size_t max_datagram() const override { return inner_->max_datagram(); }
  std::string peer_name() const override { return inner_->peer_name(); }
  uint64_t refusals() const override { return inner_->refusals(); }
  void probe() override { inner_->probe(); }
  void set_spin(std::chrono::microseconds budget) override { inner_->set_spin(budget); }

  const FaultCounters& counters() const { return counters_; }
  Transport& inner() { return *inner_; }

  // True when `fault` asks for any drop or duplication (else the decorator is not needed).
  static bool wanted(const FaultInjection& fault);

 private:
  double next_percent() { return next_fault_percent(&state_); }

  std::unique_ptr<Transport> inner_;
  FaultInjection fault_;
  uint64_t state_;
  FaultCounters counters_;
  std::vector<std::span<const uint8_t>> out_;  // reused between calls
};

}  // namespace ina::worker
