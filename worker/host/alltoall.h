// AllToAll and AllToAllv: every rank sends a distinct block to every rank (MoE expert
// parallelism's dispatch and combine).
#pragma once

#include <cstddef>
#include <span>

#include "ina/base/status.h"
#include "ina/protocol/types.h"
#include "worker/host/context.h"

namespace ina::host {

// send and recv hold size() blocks of `count` elements: block j of send goes to rank j, and
// block i of recv comes from rank i. send and recv must not overlap.
Status alltoall(Context& ctx, const void* send, void* recv, size_t count, DType t);

// Per-peer counts and displacements, in elements: rank j gets send_counts[j] elements from
// send + send_displs[j]; rank i's contribution lands at recv + recv_displs[i] and must be
// recv_counts[i] elements (as rank i's send_counts[this rank]; a mismatch is an error naming
// rank i). Zero counts are allowed. All four spans have size() entries.
Status alltoallv(Context& ctx, const void* send, std::span<const size_t> send_counts,
                 std::span<const size_t> send_displs, void* recv,
                 std::span<const size_t> recv_counts, std::span<const size_t> recv_displs, DType t);

}  // namespace ina::host
