#include "worker/transport/fault_transport.h"

namespace ina::worker {

FaultInjectingTransport::FaultInjectingTransport(std::unique_ptr<Transport> inner,
                                                 const FaultInjection& fault, uint64_t seed)
    : inner_(std::move(inner)), fault_(fault), state_(seed) {}

bool FaultInjectingTransport::wanted(const FaultInjection& fault) {
  return fault.drop_send_percent > 0 || fault.drop_recv_percent > 0 || fault.dup_send_percent > 0;
}

double next_fault_percent(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (100.0 / 9007199254740992.0);  // 53 bits -> [0, 100)
}

uint64_t collective_delay_us(const FaultInjection& fault, uint64_t* state) {
  uint64_t us = fault.delay_us;
  if (fault.straggle_percent > 0 && fault.straggle_delay_us > 0 &&
      next_fault_percent(state) < fault.straggle_percent) {
    us += fault.straggle_delay_us;
  }
  return us;
}

Status FaultInjectingTransport::send_batch(std::span<const std::span<const uint8_t>> pkts) {
  out_.clear();  // keeps its capacity: no allocation once it has grown to the largest batch
  for (const auto& p : pkts) {
    if (fault_.drop_send_percent > 0 && next_percent() < fault_.drop_send_percent) {
      ++counters_.dropped_on_send;
      continue;
    }
    out_.push_back(p);
    if (fault_.dup_send_percent > 0 && next_percent() < fault_.dup_send_percent) {
      ++counters_.duplicated_on_send;
      out_.push_back(p);
    }
  }
  if (out_.empty()) return ok_status();
  return inner_->send_batch(out_);
}

Result<size_t> FaultInjectingTransport::recv_batch(std::span<Datagram> out,
                                                   std::chrono::microseconds timeout) {
  INA_ASSIGN_OR_RETURN(size_t n, inner_->recv_batch(out, timeout));
  if (fault_.drop_recv_percent <= 0) return n;
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (next_percent() < fault_.drop_recv_percent) {
      ++counters_.dropped_on_receive;
      continue;
    }
    out[kept++] = out[i];
  }
  return kept;
}

uint64_t effective_fault_seed(const Config& cfg) {
  if (cfg.fault.seed != 0) return cfg.fault.seed;
  // Distinct per rank so that ranks do not lose the same packets in lockstep.
  return 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(cfg.rank) + 1);
}

void wrap_fault_injection(const Config& cfg, std::vector<std::unique_ptr<Transport>>* transports) {
  if (!FaultInjectingTransport::wanted(cfg.fault)) return;
  for (size_t k = 0; k < transports->size(); ++k) {
    // Shard 0 keeps the unsharded seed; the others draw their own losses.
    (*transports)[k] = std::make_unique<FaultInjectingTransport>(
        std::move((*transports)[k]), cfg.fault,
        effective_fault_seed(cfg) ^ (0xD1B54A32D192ED03ull * k));
  }
}

}  // namespace ina::worker
