// ina::Communicator: validates arguments at the API boundary, then runs the in-network engine.
#include <cinttypes>
#include <cstdint>
#include <string>

#include "ina/ina.hpp"
#include "ina/protocol/log.h"
#include "worker/communicator_impl.h"
#include "worker/fault_transport.h"
#include "worker/inc_engine.h"
#include "worker/udp_transport.h"

namespace ina {
namespace worker {
namespace {

bool overlap_partially(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  if (x == y) return false;
  return x < y ? y - x < bytes : x - y < bytes;
}

class CommunicatorImpl final : public Communicator {
 public:
  CommunicatorImpl(const Config& cfg, std::unique_ptr<Transport> transport)
      : rank_(cfg.rank), size_(cfg.world_size), engine_(cfg, std::move(transport)) {}

  ~CommunicatorImpl() override {
    const CommStats& s = engine_.stats();
    INA_DEBUG("worker",
              "rank %d closes: %" PRIu64 " collectives, %" PRIu64 " packets sent, %" PRIu64
              " received, %" PRIu64 " retransmits, %" PRIu64 " duplicate results, %" PRIu64
              " malformed, %" PRIu64 " error reports",
              rank_, s.collectives, s.packets_sent, s.packets_received, s.retransmits,
              s.duplicate_results, s.malformed, s.error_reports);
  }

  Status join() { return engine_.join(); }

  Status allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    const auto d = static_cast<uint8_t>(dtype);
    const auto o = static_cast<uint8_t>(op);
    if (!is_valid_dtype(d)) {
      return invalid_argument("allreduce: unknown dtype " + std::to_string(d) +
                              " (int32=1, float32=2, float16=3, bfloat16=4)");
    }
    if (!is_valid_op(o)) {
      return invalid_argument("allreduce: unknown op " + std::to_string(o) +
                              " (sum=1, min=2, max=3)");
    }
    if (count > 0 && (send == nullptr || recv == nullptr)) {
      return invalid_argument(std::string("allreduce: ") + (send == nullptr ? "send" : "recv") +
                              " is null with count " + std::to_string(count));
    }
    const size_t esize = dtype_size(dtype);
    if (count > SIZE_MAX / esize) {
      return invalid_argument("allreduce: count " + std::to_string(count) + " overflows");
    }
    if (overlap_partially(send, recv, count * esize)) {
      return invalid_argument(
          "allreduce: send and recv overlap without being equal (in place needs send == recv)");
    }
    return engine_.allreduce(send, recv, count, dtype, op);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const CommStats& stats() const override { return engine_.stats(); }

 private:
  int rank_;
  int size_;
  IncEngine engine_;
};

}  // namespace

uint64_t effective_fault_seed(const Config& cfg) {
  if (cfg.fault.seed != 0) return cfg.fault.seed;
  // Distinct per rank so that ranks do not lose the same packets in lockstep.
  return 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(cfg.rank) + 1);
}

Result<std::unique_ptr<Communicator>> create_communicator(const Config& cfg,
                                                          std::unique_ptr<Transport> transport) {
  INA_RETURN_IF_ERROR(cfg.validate());
  if (FaultInjectingTransport::wanted(cfg.fault)) {
    transport = std::make_unique<FaultInjectingTransport>(std::move(transport), cfg.fault,
                                                          effective_fault_seed(cfg));
  }
  auto comm = std::make_unique<CommunicatorImpl>(cfg, std::move(transport));
  INA_RETURN_IF_ERROR(comm->join());
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace worker

Result<std::unique_ptr<Communicator>> Communicator::create(const Config& cfg) {
  INA_RETURN_IF_ERROR(cfg.validate());
  worker::UdpTransportOptions opts;
  opts.host = cfg.aggregator_host;
  opts.port = cfg.aggregator_port;
  INA_ASSIGN_OR_RETURN(std::unique_ptr<worker::UdpTransport> udp,
                       worker::UdpTransport::create(opts));
  return worker::create_communicator(cfg, std::move(udp));
}

}  // namespace ina
