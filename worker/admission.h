// Admission through ina-controller (INA_CONTROLLER): a tiny HTTP/1.0 GET over the host path's
// TCP helpers and a "key value" line answer, so libina needs neither an HTTP nor a JSON library.
// Every rank asks with the same job name and gets the same answer (the controller's admission
// is sticky per name), so all ranks agree on the in-network path or the host fallback.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ina/base/status.h"
#include "ina/ina.hpp"

namespace ina::worker {

struct Admission {
  bool admitted = false;
  JobId job = 0;
  Key128 key;                   // the job's key ("key" line: 32 hex digits)
  std::string aggregator_host;  // shard 0's aggregator (the only one unless sharded)
  uint16_t aggregator_port = 0;
  // Every aggregator in shard order: one, or K after a "shards K" line.
  std::vector<AggregatorAddress> aggregators;
  uint32_t slots = 0;
  uint32_t block_elems = 0;
  std::string reason;  // refused: why
};

// Parses the controller's answer ("admitted" or "refused" first, then "key value" lines). A
// sharded job's answer has "shards K" and then exactly K "aggregator host:port" lines (shard 0
// first); an unsharded one has one "aggregator" line.
Result<Admission> parse_admission(std::string_view body);

// The job's name: Config::job_name, else derived from the rendezvous store address; empty when
// neither is set.
std::string admission_name(const Config& cfg);

// Applies an admission to cfg: its aggregator(s) (set_aggregators), job, key, and the window and
// block size lowered to the admitted ones.
void apply_admission(const Admission& a, Config* cfg);

// Asks the controller and rewrites cfg (aggregator or aggregators, job, key, window, block) on
// admission; on a
// refusal or an unreachable controller, sets host_only when a store is configured (the host
// fallback), else returns kUnavailable with the reason. `host_reason`: where the reason for the
// host fallback goes (the caller says it); null: the reason is logged at debug level only (a
// probe that asks again).
Status admit(Config* cfg, std::chrono::milliseconds timeout, std::string* host_reason = nullptr);

// Tells the controller this rank is done with the job (best effort, short timeout).
void release(const Config& cfg);

}  // namespace ina::worker
