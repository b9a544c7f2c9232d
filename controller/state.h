// The aggregation manager's state as pure logic (no I/O, no clock: callers pass `now`): the
// aggregator registry with heartbeats, job admission and placement on slot ranges, expiry of
// silent aggregators, draining, release. ina-controller wraps it in an HTTP server (server.cc);
// the tests drive it directly.
//
// Admission is by job name and sticky: every rank of a job asks with the same name and gets the
// same answer, a refusal included, so all ranks agree on the path (in-network or host fallback)
// even when capacity frees up between the first and the last rank's request.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ina/protocol/status.h"
#include "ina/protocol/types.h"

namespace ina::ctl {

using Millis = int64_t;  // a monotonic-ish time in ms (the server passes a steady clock)

struct AggregatorInfo {
  std::string id;            // stable name, "host:port" of its data plane
  std::string host;          // where workers send packets
  uint16_t port = 0;
  uint32_t slot_capacity = 0;
  uint32_t max_fan_in = 0;   // largest world size it serves alone
  uint32_t block_elems = 0;  // largest block it accepts
  std::string http;          // its metrics/telemetry endpoint "host:port" ("" if none)
  bool draining = false;
  Millis last_heartbeat = 0;
};

enum class JobState : uint8_t {
  kActive,    // placed on an aggregator
  kRefused,   // no capacity at admission: the job runs on the host fallback
  kLost,      // its aggregator stopped heartbeating: the job falls back to the host path
};
const char* job_state_name(JobState s);

struct JobInfo {
  JobId id = 0;
  std::string name;
  uint32_t world = 0;
  uint64_t key = 0;
  uint32_t slots = 0;         // slot range size (the workers' window)
  uint32_t block_elems = 0;
  std::vector<std::string> dtypes;
  JobState state = JobState::kActive;
  std::string reason;         // why refused or lost
  std::string aggregator;     // placement (kActive, kLost)
  uint32_t slot_base = 0;
  Millis admitted_at = 0;
  std::set<uint32_t> released;  // ranks that finished
  std::string telemetry_json;   // the aggregator's last report on this job (opaque here)
};

struct AdmitRequest {
  std::string name;
  uint32_t world = 0;
  uint32_t rank = 0;
  uint32_t slots = 128;
  uint32_t block_elems = 256;
  std::vector<std::string> dtypes;
};

struct StateOptions {
  Millis heartbeat_timeout = 3000;  // an aggregator silent this long is removed
};

class ControllerState {
 public:
  using KeyGen = std::function<uint64_t()>;
  ControllerState(StateOptions opts, KeyGen keygen);

  // Registration and heartbeat in one (idempotent, so a restarted controller rebuilds its
  // registry from the next heartbeats; jobs survive a restart through the persisted state). The
  // caller answers with jobs_on(): the jobs the aggregator must serve.
  Status heartbeat(const AggregatorInfo& info, Millis now);
  // Jobs the aggregator must serve.
  std::vector<JobInfo> jobs_on(const std::string& aggregator) const;
  // Admission (see the file comment). kInvalidArgument for a bad request or a name admitted
  // with another world size; a refusal is not an error: the JobInfo says kRefused and why.
  Result<JobInfo> admit(const AdmitRequest& req, Millis now);
  // A rank is done with the job; when every rank is, the job is forgotten (its slots freed).
  Status release(const std::string& name, uint32_t rank);
  Status remove_job(JobId id);
  // Stops placing jobs on the aggregator; the jobs it has keep running.
  Status drain(const std::string& aggregator, bool on);
  // Removes aggregators silent past the timeout; their jobs become kLost. Returns their ids.
  std::vector<std::string> expire(Millis now);

  const std::map<std::string, AggregatorInfo>& aggregators() const { return aggs_; }
  const std::map<JobId, JobInfo>& jobs() const { return jobs_; }
  const JobInfo* job(JobId id) const;
  const JobInfo* job_by_name(const std::string& name) const;
  // Free slots of an aggregator (capacity minus active jobs' ranges).
  uint32_t free_slots(const std::string& aggregator) const;
  void set_job_telemetry(JobId id, std::string json);

  // Counters for /metrics.
  uint64_t admitted_total = 0;
  uint64_t refused_total = 0;
  uint64_t lost_total = 0;

  // Persistence: the whole state as JSON text, and back (jobs and aggregators; an aggregator
  // restored from the file gets `now` as its last heartbeat, so it has a full timeout to
  // re-register).
  std::string to_json() const;
  Status from_json(const std::string& text, Millis now);

 private:
  // First fit of `slots` contiguous slots on `agg` at or above 0; nullopt when none.
  std::optional<uint32_t> find_range(const AggregatorInfo& agg, uint32_t slots) const;
  std::string placement_refusal(const AdmitRequest& req) const;

  StateOptions opts_;
  KeyGen keygen_;
  std::map<std::string, AggregatorInfo> aggs_;
  std::map<JobId, JobInfo> jobs_;
  std::map<std::string, JobId> by_name_;
  JobId next_id_ = 1;
};

}  // namespace ina::ctl
