// Dissemination barrier (Hensgen, Finkel and Manber, 1988): in round k = 0, 1, ... while
// 2^k < P, rank r sends an empty message to r + 2^k and waits for one from r - 2^k. After
// ceil(log2 P) rounds every rank has heard, directly or through others, from every rank, so none
// can leave before all have entered. Works for any P.
#include "worker/host/barrier.h"

#include "worker/host/common.h"

namespace ina::host {

Status barrier(Context& ctx) {
  const int p = ctx.size();
  for (int dist = 1; dist < p; dist *= 2) {
    INA_RETURN_IF_ERROR(
        ctx.sendrecv(mod(ctx.rank() + dist, p), nullptr, 0, mod(ctx.rank() - dist, p), nullptr, 0));
  }
  return ok_status();
}

}  // namespace ina::host
