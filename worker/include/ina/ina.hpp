// libina: the INA worker library, C++ API. (The C ABI is ina/ina.h.)
//
//   auto cfg = ina::Config::from_env();                // INA_RANK, INA_WORLD_SIZE, INA_AGGREGATOR..
//   auto comm = ina::Communicator::create(*cfg);       // joins the job: a barrier with all ranks
//   ina::Status s = (*comm)->allreduce(grad, grad, n, ina::DType::kFloat32, ina::ReduceOp::kSum);
//
// Errors come back as Status (no exceptions): kInvalidArgument for bad arguments,
// kDeadlineExceeded with the missing ranks named when a collective cannot finish in time,
// kUnavailable when the aggregator never answers.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ina/protocol/status.h"
#include "ina/protocol/types.h"

namespace ina {

// Test hooks for the worker's I/O: drop or duplicate datagrams at random (seeded), and delay
// this rank before each collective (a straggler). Read from INA_TEST_DROP_PERCENT,
// INA_TEST_DUP_PERCENT, INA_TEST_DELAY_US by Config::from_env.
struct FaultInjection {
  double drop_send_percent = 0;
  double drop_recv_percent = 0;
  double dup_send_percent = 0;
  uint32_t delay_us = 0;
  uint64_t seed = 0;  // 0: derived from the rank
};

struct Config {
  int rank = -1;
  int world_size = 0;
  std::string aggregator_host = "127.0.0.1";
  uint16_t aggregator_port = 47474;
  JobId job = 1;
  uint64_t job_key = 0;
  uint32_t block_elems = 256;    // elements per packet, 1 .. 16384 (the aggregator may lower it)
  uint32_t window = 128;         // slots in flight, 1 .. 32768 (the aggregator may lower it)
  std::chrono::milliseconds timeout{30000};       // deadline of one collective (and of joining)
  std::chrono::microseconds retransmit{2000};     // first retransmission timeout
  FaultInjection fault;

  // Defaults overlaid with the environment (see ina/ina.h). A malformed variable is an
  // kInvalidArgument naming it and the expected form.
  static Result<Config> from_env();
  // Checks ranges; names the first bad field.
  Status validate() const;
};

struct CommStats {
  uint64_t collectives = 0;
  uint64_t packets_sent = 0;
  uint64_t packets_received = 0;
  uint64_t retransmits = 0;
  uint64_t duplicate_results = 0;   // results for blocks already done
  uint64_t malformed = 0;           // datagrams that failed validation
  uint64_t nonfinite_blocks = 0;
  uint64_t error_reports = 0;
  uint64_t spurious_retransmits = 0; // resends whose original result arrived after all
  uint64_t rto_us = 0;              // current adaptive retransmission timeout
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  static Result<std::unique_ptr<Communicator>> create(const Config& cfg);

  // recv may equal send. Any count (0 allowed). float32/float16/bfloat16/int32; sum/min/max.
  virtual Status allreduce(const void* send, void* recv, size_t count, DType dtype,
                           ReduceOp op) = 0;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const CommStats& stats() const = 0;
};

}  // namespace ina
