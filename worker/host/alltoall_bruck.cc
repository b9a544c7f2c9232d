// Bruck's AllToAll (Bruck et al., "Efficient algorithms for all-to-all communications in
// multiport message-passing systems", 1997; MPICH's and Open MPI's choice for small blocks): the
// latency-optimal schedule, ceil(log2 P) messages per rank instead of P-1.
//
// Think of rank r's blocks as rotated, slot i holding the block for rank r+i. In step k
// (k = 1, 2, 4, ... < P) every rank sends, as one message, the slots whose index has bit k set to
// rank r+k, and puts what rank r-k sends into the same slots. A block in slot i thus travels
// exactly i hops (the sum of i's bits), from its source s to s+i, its destination; at the end
// slot i of rank r holds the block that rank r-i sent to r. Each step moves about half the
// buffer (floor(P/2) blocks at most), so a byte crosses the network up to log2 P times: the
// choice for small blocks, where message latency, not bytes, is the cost.
//
// Copies: a slot is read from `send` until a step has written it (its index has no bit set below
// the current step) and written straight into `recv` at its last step (no bit set above the
// current one), so neither rotation of the textbook version is a separate pass; the slots in
// between live in scratch memory (Context::scratch slot 0), the step's message in slots 1 and 2.
#include <cstring>

#include "worker/host/alltoall.h"
#include "worker/host/common.h"

namespace ina::host {

Status alltoall_bruck(Context& ctx, const uint8_t* send, uint8_t* recv, size_t block_bytes) {
  const int p = ctx.size();
  const int r = ctx.rank();
  const size_t b = block_bytes;
  const auto slot_send = [&](int i) { return send + static_cast<size_t>(mod(r + i, p)) * b; };
  const auto slot_recv = [&](int i) { return recv + static_cast<size_t>(mod(r - i, p)) * b; };
  std::memcpy(recv + static_cast<size_t>(r) * b, send + static_cast<size_t>(r) * b, b);  // slot 0
  if (p == 1) return ok_status();
  const size_t half = static_cast<size_t>(p / 2) * b;  // the most one step sends
  uint8_t* middle = ctx.scratch(0, static_cast<size_t>(p) * b);
  uint8_t* out = ctx.scratch(1, half);
  uint8_t* in = ctx.scratch(2, half);
  for (int k = 1; k < p; k <<= 1) {
    size_t n = 0;
    for (int i = k; i < p; ++i) {
      if ((i & k) == 0) continue;
      const bool untouched = (i & (k - 1)) == 0;  // no earlier step wrote slot i
      std::memcpy(out + n, untouched ? slot_send(i) : middle + static_cast<size_t>(i) * b, b);
      n += b;
    }
    INA_RETURN_IF_ERROR(ctx.sendrecv(mod(r + k, p), out, n, mod(r - k, p), in, n));
    size_t at = 0;
    for (int i = k; i < p; ++i) {
      if ((i & k) == 0) continue;
      const bool last = (i >> 1) < k;  // k is i's highest bit: the block has arrived
      std::memcpy(last ? slot_recv(i) : middle + static_cast<size_t>(i) * b, in + at, b);
      at += b;
    }
  }
  return ok_status();
}

}  // namespace ina::host
