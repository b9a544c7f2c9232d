// ina-controller's requests turned into ControllerState's inputs, and its answer to a worker:
// pure, no HTTP. server.cc hands over the request body or query parameters (httplib::Params is
// this QueryParams); tests/fuzz/controller_fuzz.cc calls them directly.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "controller/state.h"
#include "ina/base/status.h"

namespace ina::ctl {

// An unsigned decimal number of at most 10 digits that fits 32 bits (no sign, no spaces).
bool parse_u32(const std::string& s, uint32_t* out);

// POST /v1/aggregators/heartbeat: {"id", "host", "port", "slot_capacity", "max_fan_in",
// "block_elems", optional "http", optional "jobs": {"<job id>": {telemetry, "packets": n}}}.
struct HeartbeatRequest {
  AggregatorInfo info;
  struct JobReport {
    JobId job = 0;
    std::string telemetry;     // the job's JSON object, as sent (dumped again)
    bool has_packets = false;  // "packets" was an unsigned number
    uint64_t packets = 0;
  };
  std::vector<JobReport> jobs;  // entries whose key is not a job id are skipped
};
// kInvalidArgument naming the problem ("body is not a JSON object", "heartbeat: <field error>").
Result<HeartbeatRequest> parse_heartbeat_request(const std::string& body);

// GET /v1/admit?name=&world=&rank=&slots=&block=&shards=&dtypes=a,b: the first value of each
// parameter counts (as httplib's get_param_value). kInvalidArgument when world is missing, a
// number is not unsigned decimal, or shards is 0.
using QueryParams = std::multimap<std::string, std::string>;
Result<AdmitRequest> parse_admit_request(const QueryParams& params);

// The worker's answer to an admission: "key value" lines, first line "admitted" or "refused"
// (worker/admission.h parses it).
std::string admission_text(const JobInfo& j, uint32_t rank, const ControllerState& st);

}  // namespace ina::ctl
