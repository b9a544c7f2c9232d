// The path policy: in-network or host, the same for every rank, the same bits on every rank.
//
// Agreement only on failure. An in-network AllReduce that completes is returned at once: no host
// message per collective. A rank whose in-network attempt fails (the aggregator is gone, or a
// deadline passed) calls an agreement on the host mesh: a MAX over the ranks of four int32, its
// failure flag and which of done mod 3 it is at (done: the in-network AllReduces it completed).
// The other ranks meet it there at their next failure: a rank that completed the collective the
// first one failed goes on to the next AllReduce, which cannot complete in-network either (the
// failed rank never contributes to it), and fails too; or, when its next call is a host
// collective, it agrees before it (before_host_collective). So ranks agree at different calls,
// and the agreement tells each where it stands:
//
//   Two ranks' done differ by at most one. A rank completes collective f only when every rank
//   contributed every block of f, so every rank had completed f - 1. Two values of done mod 3
//   present: the smaller, m, is the ranks still in collective f = m + 1 (behind); the others
//   completed f and are in f + 1 or before a host collective (ahead). One value and a failure:
//   every rank is in the failed collective f.
//
// Then every rank redoes f on the host path from what it holds, and all move to the host path:
//
//   A block's result is in the recv buffer of every rank that received it. A rank that completed
//   f may lack nothing; a behind rank lacks the blocks it sent but whose result did not come. As a
//   slot carries block i + W' only after block i's result arrived (inc_engine.cc), a rank that sent
//   every block lacks at most the last W' blocks of each shard's range. So each rank keeps, of each
//   in-network AllReduce it completes, the result bytes of that tail only (Kept: W' x block x
//   element size per shard, 128 KiB at the defaults, the whole result of a small collective)
//   instead of a copy of the input or the output. In place, a block whose result has not arrived
//   still holds its input (the engine writes a block's output when its result arrives), so no
//   copy of the input is kept either: the host redoes those blocks from it.
//
//   The recovery of f: a MAX over the ranks of three flags per block (someone has its result,
//   someone lacks it, someone lacks its input). Blocks some ranks have and others lack: one int32
//   MAX AllReduce in which the holders put the result's words and the others INT32_MIN (holders'
//   bits are identical, so the MAX is them). Blocks nobody has: the host AllReduce (exact mode: the
//   in-network computation, so bitwise the same) per run of contiguous blocks, from the inputs.
//   A block nobody has and some rank lacks the input of cannot be recovered: every rank returns
//   kAborted (it cannot happen while the invariant above holds). An ahead rank then redoes its own
//   failed collective f + 1 on the host path from its input (nothing of f + 1 arrived anywhere).
//
// What this does not cover: a rank that completed the last in-network AllReduce of a job and
// destroys its communicator leaves a rank that failed that collective without a peer to recover
// from; that rank's call fails (the mesh reports the closed peer) instead of completing.
//
// Probing. On the host path, rank 0 decides before each AllReduce whether to probe the
// aggregator (after 1 s, then 2 s, 4 s, ... up to 60 s of wall time since the last attempt) and
// broadcasts the decision (one more small host message per collective on the host path); then
// every rank re-joins (a barrier at the aggregator, with a deadline of min(timeout, 1 s), 100 ms
// when the aggregator's host refuses our datagrams) and the ranks take the MIN of their success
// over the mesh: all joined, back in-network. Admitted
// through a controller (UDP transport), each rank first asks the controller again: when it has
// re-placed the job (its aggregator stopped heartbeating), the engine is rebuilt towards the new
// aggregator before the re-join. The admission is sticky per job name, so every rank gets the same
// placement; a rank that still gets the old one fails the join and the MIN keeps all on the host.
#include "worker/path_policy.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <thread>

#include "ina/base/log.h"
#include "worker/admission.h"
#include "worker/config_internal.h"
#include "worker/host/broadcast.h"
#include "worker/transport/fault_transport.h"
#include "worker/transport/udp_factory.h"

namespace ina::worker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kFirstProbe{1000};
constexpr std::chrono::milliseconds kMaxProbe{60000};
// A probe is one collective's detour on the host path: a dead aggregator (its host refuses our
// datagrams) fails it in kProbeRefused, a silent one in kMaxProbeJoin; a live one WELCOMEs the
// ranks within a few round trips of the broadcast that starts every rank's probe at once.
constexpr std::chrono::milliseconds kMaxProbeJoin{1000};
constexpr std::chrono::milliseconds kProbeRefused{100};

// An in-network failure that the host path can absorb: the aggregator is gone or too slow.
bool fallbackable(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

int32_t flag_of(const Status& s) { return s.ok() ? 0 : fallbackable(s) ? 1 : 2; }

}  // namespace

PathPolicy::PathPolicy(const Config& cfg, std::unique_ptr<ShardedEngine> engine,
                       host::Context* mesh, HostAllreduce host_allreduce, Algorithm algorithm,
                       std::string not_served)
    : cfg_(cfg),
      not_served_(std::move(not_served)),
      engine_(std::move(engine)),
      mesh_(mesh),
      host_allreduce_(std::move(host_allreduce)),
      algorithm_(std::move(algorithm)),
      engine_cfg_(cfg),
      block_elems_(cfg.block_elems),
      straggle_state_(effective_fault_seed(cfg) ^ 0x484f5354ull),  // host-path stragglers
      probe_backoff_(kFirstProbe) {
  arm_silence();
}

Status PathPolicy::start() {
  if (!engine_) {
    host_path_ = true;
    if (mesh_ != nullptr && (!cfg_.controller_host.empty() || !not_served_.empty())) {
      // Admission failed here (refused, or the controller unreachable from this rank), or the
      // aggregator's transport could not be made: ranks that have an engine wait in the
      // agreement below, and this vote sends them to the host path too, so all ranks agree.
      INA_ASSIGN_OR_RETURN(int32_t worst, agree_max(1, 2 * cfg_.timeout));
      if (worst == 2) return aborted("joining the job: another rank failed to join (see its log)");
      if (cfg_.require_inc) {
        return required(not_served_.empty() ? "this rank was not admitted" : not_served_);
      }
    }
    return ok_status();
  }
  const Status s = engine_->join();
  if (s.ok()) block_elems_ = engine_->block_elems();
  if (mesh_ == nullptr) return s;
  const int32_t flag = flag_of(s);
  INA_ASSIGN_OR_RETURN(int32_t worst, agree_max(flag, 2 * cfg_.timeout));
  if (flag == 2) return s;
  if (worst == 2) return aborted("joining the job: another rank failed to join (see its log)");
  if (worst == 1) {
    const std::string why = "no aggregator for job " + std::to_string(cfg_.job) + " (" +
                            (s.ok() ? "another rank could not join" : s.message()) + ")";
    if (cfg_.require_inc) return required(why);
    // Once, at warning level: the aggregator was configured and cannot serve this job.
    INA_WARN("worker",
             "rank %d: INA is configured but not used: %s; running on the host path, probing "
             "the aggregator again with backoff (INA_REQUIRE_INC=1 makes this an error)",
             cfg_.rank, why.c_str());
    lost_ = why;
    enter_host_path();
  }
  return ok_status();
}

Status PathPolicy::required(const std::string& why) const {
  return failed_precondition("INA_REQUIRE_INC=1: rank " + std::to_string(cfg_.rank) +
                             " is not served in-network (" + why + "); the host path is not used");
}

CommStats PathPolicy::stats(const CommStats& host) const {
  CommStats s = engine_ ? engine_->stats() : CommStats{};
  s.collectives += retired_.collectives;
  add_packet_counters(retired_, &s);
  s.collectives += host.collectives + host_allreduces_;
  s.host_collectives = host_collectives_;
  s.fallbacks = fallbacks_;
  s.probes = probes_;
  return s;
}

Status PathPolicy::allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  if (host_path_) {
    INA_RETURN_IF_ERROR(maybe_probe());
    // Every rank is on the host path (agreed) and the probe's outcome is agreed: every rank
    // returns this error for the same collective.
    if (host_path_ && engine_ && cfg_.require_inc) {
      return Status(StatusCode::kUnavailable, required(lost_ + "; probing the aggregator again "
                                                               "with backoff")
                                                  .message());
    }
    if (host_path_) {
      ++host_collectives_;
      ++host_allreduces_;
      // The straggler test hooks (the engine applies them on the in-network path).
      if (const uint64_t us = collective_delay_us(cfg_.fault, &straggle_state_); us > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(us));
      }
      return host_allreduce_(send, recv, count, dtype, op);
    }
  }
  if (mesh_ == nullptr) return engine_->allreduce(send, recv, count, dtype, op);
  return in_network(send, recv, count, dtype, op);
}

Status PathPolicy::in_network(const void* send, void* recv, size_t count, DType dtype,
                              ReduceOp op) {
  const Status s = engine_->allreduce(send, recv, count, dtype, op);
  if (count == 0) return s;  // no network: not a collective for the agreement
  if (s.ok()) {
    ++done_;
    pending_ = true;
    keep_tail(recv, count, dtype, op);
    return s;
  }
  // This rank failed: agree, then redo what is needed on the host path.
  const Clock::time_point failed_at = Clock::now();
  View mine = failed_view(send, recv, count, dtype, op);
  INA_ASSIGN_OR_RETURN(Agreed a, agree(flag_of(s), s));
  const Clock::time_point agreed_at = Clock::now();
  lost_ = "in-network allreduce failed: " + s.message();
  if (!cfg_.require_inc) {
    // Once per loss of the aggregator (the host path then runs until a probe succeeds).
    INA_WARN("worker",
             "rank %d: in-network allreduce failed (%s): redone on the host path, which serves "
             "the job until the aggregator answers a probe (INA_REQUIRE_INC=1 makes this an "
             "error)",
             cfg_.rank, s.message().c_str());
  }
  ++fallbacks_;
  if (a == Agreed::kRecoverMine) {
    ++host_collectives_;
    INA_RETURN_IF_ERROR(recover(mine));
    ++done_;  // every rank has now completed this one
    // Redone, so that every rank holds the same results; the caller still hears of it.
    if (cfg_.require_inc) return Status(StatusCode::kUnavailable, required(lost_).message());
    INA_DEBUG("worker", "rank %d: the agreement took %.1f ms, the redo on the host path %.1f ms",
              cfg_.rank, std::chrono::duration<double, std::milli>(agreed_at - failed_at).count(),
              std::chrono::duration<double, std::milli>(Clock::now() - agreed_at).count());
    return ok_status();
  }
  if (a == Agreed::kRecoverKept) {
    // This rank completed the collective before, which another rank failed: recover that one
    // from the kept tail, then this one from its input (no block of it completed anywhere).
    View kept = kept_view();
    INA_RETURN_IF_ERROR(recover(kept));
    for (uint8_t h : mine.has_result) {
      if (h != 0 && send == recv) {
        return internal_error(
            "allreduce: a block of the collective after the failed one completed "
            "in-network in place; its input is lost");
      }
    }
    // As every other rank runs it: an AllReduce on the host path (its probe decision first).
    return allreduce(send, recv, count, dtype, op);
  }
  return internal_error("allreduce: the agreement after a failure found nothing to redo");
}

Status PathPolicy::before_host_collective() {
  if (!pending_ || mesh_ == nullptr) return ok_status();
  INA_ASSIGN_OR_RETURN(Agreed a, agree(0, ok_status()));
  if (a == Agreed::kRecoverKept) {
    View kept = kept_view();
    INA_RETURN_IF_ERROR(recover(kept));
  } else if (a == Agreed::kRecoverMine) {
    return internal_error(
        "a host collective met ranks in a failed in-network allreduce at the "
        "same point: ranks called different collectives");
  }
  return ok_status();
}

void PathPolicy::keep_tail(const void* recv, size_t count, DType dtype, ReduceOp op) {
  kept_.valid = true;
  kept_.count = count;
  kept_.dtype = dtype;
  kept_.op = op;
  kept_.tail = engine_->tail_blocks(count, dtype);
  const size_t es = dtype_size(dtype);
  size_t bytes = 0;
  for (const BlockRange& r : kept_.tail) {
    bytes += (std::min(count, elem_offset(r.end, dtype)) - elem_offset(r.first, dtype)) * es;
  }
  kept_.bytes.resize(bytes);
  const auto* out = static_cast<const uint8_t*>(recv);
  size_t at = 0;
  for (const BlockRange& r : kept_.tail) {
    const size_t n =
        (std::min(count, elem_offset(r.end, dtype)) - elem_offset(r.first, dtype)) * es;
    std::memcpy(kept_.bytes.data() + at, out + elem_offset(r.first, dtype) * es, n);
    at += n;
  }
}

PathPolicy::View PathPolicy::failed_view(const void* send, void* recv, size_t count, DType dtype,
                                         ReduceOp op) {
  View v;
  v.count = count;
  v.dtype = dtype;
  v.op = op;
  v.input = static_cast<const uint8_t*>(send);
  v.output = static_cast<uint8_t*>(recv);
  engine_->received_blocks(count, dtype, &v.has_result);
  v.has_input.resize(v.has_result.size());
  for (size_t b = 0; b < v.has_result.size(); ++b) {
    // In place, a block's input is gone once its result arrived; otherwise send is untouched.
    v.has_input[b] = send != recv || v.has_result[b] == 0 ? 1 : 0;
  }
  const size_t es = dtype_size(dtype);
  uint8_t* out = v.output;
  v.result = [this, out, es, dtype](uint64_t b) -> const uint8_t* {
    return out + elem_offset(b, dtype) * es;
  };
  return v;
}

PathPolicy::View PathPolicy::kept_view() {
  View v;
  v.count = kept_.count;
  v.dtype = kept_.dtype;
  v.op = kept_.op;
  const uint64_t n = (kept_.count + block_elems(kept_.dtype) - 1) / block_elems(kept_.dtype);
  v.has_result.assign(n, 0);
  v.has_input.assign(n, 0);  // returned to the application: neither input nor output is ours
  const size_t es = dtype_size(kept_.dtype);
  std::vector<size_t> at(n, 0);
  size_t pos = 0;
  for (const BlockRange& r : kept_.tail) {
    for (uint64_t b = r.first; b < r.end; ++b) {
      v.has_result[b] = 1;
      at[b] = pos;
      pos +=
          (std::min(kept_.count, elem_offset(b + 1, kept_.dtype)) - elem_offset(b, kept_.dtype)) *
          es;
    }
  }
  v.result = [this, at = std::move(at)](uint64_t b) -> const uint8_t* {
    return kept_.bytes.data() + at[b];
  };
  return v;
}

Result<PathPolicy::Agreed> PathPolicy::agree(int32_t flag, const Status& mine) {
  const int32_t r = static_cast<int32_t>(done_ % 3);
  int32_t v[4] = {flag, r == 0, r == 1, r == 2};
  const std::chrono::milliseconds wait = 2 * cfg_.timeout;
  mesh_->set_timeout(std::max(wait, cfg_.timeout));
  const Status s = host::allreduce(*mesh_, v, v, 4, DType::kInt32, ReduceOp::kMax, algorithm_(16));
  mesh_->set_timeout(cfg_.timeout);
  if (!s.ok()) {
    // After a failure, what this rank saw comes first: the aggregator's report names the ranks
    // that stopped contributing (a dead rank), the mesh then only the first connection it found
    // closed, which may be a live rank that gave up before.
    if (flag != 0) {
      return Status(mine.code(), mine.message() +
                                     "; not redone on the host path: agreeing with "
                                     "the other ranks failed: " +
                                     s.message());
    }
    return Status(s.code(), "agreeing on the path after in-network allreduces: " + s.message());
  }
  pending_ = false;
  if (v[0] == 2) {
    if (flag == 2) return mine;
    return aborted("allreduce: failed on another rank (see its log)");
  }
  const int present = v[1] + v[2] + v[3];
  if (present == 3) {
    return internal_error("path agreement: ranks are more than one collective apart");
  }
  if (present == 1) {
    if (v[0] == 0) return Agreed::kNothing;
    // Everyone is at the same count and someone failed: all are in the same collective.
    enter_host_path();
    return Agreed::kRecoverMine;
  }
  // Two residues: m is the one whose successor is present too.
  const int32_t m = v[1 + (r + 1) % 3] != 0 ? r : (r + 2) % 3;
  enter_host_path();
  if (r == m) return Agreed::kRecoverMine;
  if (!kept_.valid) return internal_error("path agreement: nothing kept of the collective to redo");
  kept_.valid = false;  // used once, by this recovery
  return Agreed::kRecoverKept;
}

Status PathPolicy::recover(View& v) {
  const uint64_t n = v.has_result.size();
  const size_t es = dtype_size(v.dtype);
  auto block_bytes = [&](uint64_t b) {
    return (std::min(v.count, elem_offset(b + 1, v.dtype)) - elem_offset(b, v.dtype)) * es;
  };
  // Per block: someone has its result, someone lacks it, someone lacks its input.
  std::vector<int32_t> flags(3 * n);
  for (uint64_t b = 0; b < n; ++b) {
    flags[b] = v.has_result[b];
    flags[n + b] = v.has_result[b] == 0 ? 1 : 0;
    flags[2 * n + b] = v.has_input[b] == 0 ? 1 : 0;
  }
  INA_RETURN_IF_ERROR(host::allreduce(*mesh_, flags.data(), flags.data(), flags.size(),
                                      DType::kInt32, ReduceOp::kMax, algorithm_(flags.size() * 4)));
  for (uint64_t b = 0; b < n; ++b) {
    if (flags[b] == 0 && flags[2 * n + b] != 0) {
      return aborted("allreduce: block " + std::to_string(b) +
                     " of the failed in-network collective reached no rank and some rank no "
                     "longer holds its input: it cannot be redone on the host path");
    }
  }
  // Blocks some ranks have and others lack: the holders' words by a MAX (each block padded to
  // whole int32 words with zeros; the others contribute INT32_MIN, below every word).
  std::vector<uint64_t> shared;
  size_t words = 0;
  for (uint64_t b = 0; b < n; ++b) {
    if (flags[b] != 0 && flags[n + b] != 0) {
      shared.push_back(b);
      words += (block_bytes(b) + 3) / 4;
    }
  }
  if (!shared.empty()) {
    std::vector<int32_t> pack(words, INT32_MIN);
    size_t at = 0;
    for (uint64_t b : shared) {
      const size_t len = block_bytes(b);
      if (v.has_result[b] != 0) {
        std::fill(pack.begin() + static_cast<ptrdiff_t>(at),
                  pack.begin() + static_cast<ptrdiff_t>(at + (len + 3) / 4), 0);
        std::memcpy(pack.data() + at, v.result(b), len);
      }
      at += (len + 3) / 4;
    }
    INA_RETURN_IF_ERROR(host::allreduce(*mesh_, pack.data(), pack.data(), pack.size(),
                                        DType::kInt32, ReduceOp::kMax,
                                        algorithm_(pack.size() * 4)));
    at = 0;
    for (uint64_t b : shared) {
      const size_t len = block_bytes(b);
      if (v.has_result[b] == 0 && v.output != nullptr) {
        std::memcpy(v.output + elem_offset(b, v.dtype) * es, pack.data() + at, len);
      }
      at += (len + 3) / 4;
    }
  }
  // Blocks nobody has: the host AllReduce from the inputs, per run of contiguous blocks (blocks
  // start on block boundaries, so exact mode quantizes them as the engine would have).
  for (uint64_t b = 0; b < n;) {
    if (flags[b] != 0) {
      ++b;
      continue;
    }
    uint64_t e = b;
    while (e < n && flags[e] == 0) ++e;
    const size_t first = elem_offset(b, v.dtype);
    const size_t elems = std::min(v.count, elem_offset(e, v.dtype)) - first;
    if (v.input == nullptr || v.output == nullptr) {
      return internal_error("path recovery: a block nobody has on a rank without its input");
    }
    INA_RETURN_IF_ERROR(
        host_allreduce_(v.input + first * es, v.output + first * es, elems, v.dtype, v.op));
    b = e;
  }
  return ok_status();
}

Result<int32_t> PathPolicy::agree_max(int32_t v, std::chrono::milliseconds wait) {
  mesh_->set_timeout(std::max(wait, cfg_.timeout));
  const Status s = host::allreduce(*mesh_, &v, &v, 1, DType::kInt32, ReduceOp::kMax, algorithm_(4));
  mesh_->set_timeout(cfg_.timeout);
  if (!s.ok()) return s;
  return v;
}

void PathPolicy::enter_host_path() {
  host_path_ = true;
  pending_ = false;
  probe_backoff_ = kFirstProbe;
  next_probe_ = Clock::now() + probe_backoff_;
}

Status PathPolicy::maybe_probe() {
  if (!engine_ || mesh_ == nullptr) return ok_status();
  int32_t probe = 0;
  if (cfg_.rank == 0) probe = Clock::now() >= next_probe_ ? 1 : 0;
  if (cfg_.world_size > 1) {
    host::BroadcastOptions o;
    o.root = 0;
    INA_RETURN_IF_ERROR(host::broadcast(*mesh_, &probe, 1, DType::kInt32, o));
  }
  if (probe == 0) return ok_status();
  ++probes_;
  follow_replacement();
  const Status s = engine_->join(std::min(cfg_.timeout, kMaxProbeJoin), kProbeRefused);
  INA_ASSIGN_OR_RETURN(int32_t worst, agree_max(s.ok() ? 0 : 1, 2 * cfg_.timeout));
  if (worst == 0) {
    INA_INFO("worker", "rank %d: the aggregator%s back: in-network again", cfg_.rank,
             engine_->shards() > 1 ? "s are" : " is");
    block_elems_ = engine_->block_elems();
    host_path_ = false;
    return ok_status();
  }
  INA_DEBUG("worker", "rank %d: aggregator probe failed (%s); next in %lld ms", cfg_.rank,
            s.ok() ? "another rank could not join" : s.message().c_str(),
            static_cast<long long>(std::min(probe_backoff_ * 2, kMaxProbe).count()));
  probe_backoff_ = std::min(probe_backoff_ * 2, kMaxProbe);
  next_probe_ = Clock::now() + probe_backoff_;
  return ok_status();
}

// Admitted through a controller on the UDP transport: asks it again and, when the answer names
// another aggregator, job or key (the job was re-placed, or expired and admitted anew), rebuilds
// the engine towards it. Any failure keeps the current engine (the probe's join then decides).
void PathPolicy::follow_replacement() {
  if (cfg_.controller_host.empty()) return;
  if (cfg_.transport != AggregatorTransport::kAuto && cfg_.transport != AggregatorTransport::kUdp) {
    return;
  }
  Config c = engine_cfg_;
  if (!worker::admit(&c, std::min(cfg_.timeout, kMaxProbeJoin)).ok() || c.host_only) return;
  const std::vector<AggregatorAddress> now = aggregator_list(c);
  const std::vector<AggregatorAddress> was = aggregator_list(engine_cfg_);
  const auto same_address = [](const AggregatorAddress& a, const AggregatorAddress& b) {
    return a.host == b.host && a.port == b.port;
  };
  if (std::equal(now.begin(), now.end(), was.begin(), was.end(), same_address) &&
      c.job == engine_cfg_.job && c.job_key == engine_cfg_.job_key) {
    return;
  }
  Result<std::vector<std::unique_ptr<Transport>>> made = udp_transports(cfg_.rank, now);
  if (!made.ok()) return;
  std::vector<std::unique_ptr<Transport>> transports = std::move(made).value();
  wrap_fault_injection(c, &transports);
  INA_INFO("worker", "rank %d: the controller re-placed job %u: now job %u on %s:%u%s", cfg_.rank,
           engine_cfg_.job, c.job, now[0].host.c_str(), unsigned{now[0].port},
           now.size() > 1 ? " and more (sharded)" : "");
  const CommStats gone = engine_->stats();
  retired_.collectives += gone.collectives;
  add_packet_counters(gone, &retired_);
  engine_ = std::make_unique<ShardedEngine>(c, std::move(transports));
  arm_silence();
  engine_cfg_ = c;
}

// A silent aggregator ends a collective early only where the host path takes it over
// (inc_failure.cc, "A silent aggregator").
void PathPolicy::arm_silence() {
  if (engine_ && mesh_ != nullptr) engine_->set_silence_limit(IncEngine::kSilenceLimit);
}

}  // namespace ina::worker
