// Broadcast over a binomial tree, pipelined in chunks.
//
// With v = (rank - root) mod P, rank v receives from v - 2^k, where 2^k is v's lowest set bit,
// and sends to v + 2^j for every 2^j < 2^k (while v + 2^j < P; the root, v = 0, to every power
// of two below P): the root reaches every rank in ceil(log2 P) rounds. The buffer is cut into
// chunks; a rank posts a receive for every chunk at once and forwards each chunk to its children as
// soon as it has arrived, so a large buffer streams down the tree instead of waiting at every
// level.
#include "worker/host/broadcast.h"

#include <algorithm>
#include <vector>

#include "worker/host/common.h"

namespace ina::host {

Status broadcast(Context& ctx, void* buf, size_t count, DType t, const BroadcastOptions& opts) {
  if (!is_valid_dtype(static_cast<uint8_t>(t))) return invalid_argument("broadcast: bad dtype");
  const int p = ctx.size();
  if (opts.root < 0 || opts.root >= p)
    return invalid_argument("broadcast: root " + std::to_string(opts.root) + " outside world of " +
                            std::to_string(p));
  if (count > 0 && buf == nullptr) return invalid_argument("broadcast: null buffer");
  if (count == 0 || p == 1) return ok_status();
  const size_t es = dtype_size(t);
  auto* data = static_cast<uint8_t*>(buf);
  const int v = mod(ctx.rank() - opts.root, p);
  auto real = [&](int vr) { return mod(vr + opts.root, p); };

  int parent = -1;
  int mask = 1;
  while (mask < p) {
    if (v & mask) {
      parent = real(v - mask);
      break;
    }
    mask <<= 1;
  }
  std::vector<int> children;
  for (int m = mask >> 1; m > 0; m >>= 1)
    if (v + m < p) children.push_back(real(v + m));

  const size_t chunk_elems = std::max<size_t>(1, opts.chunk_bytes / es);
  const size_t k_chunks = (count + chunk_elems - 1) / chunk_elems;
  std::vector<Context::Handle> recvs;
  if (parent >= 0)
    for (size_t c = 0; c < k_chunks; ++c) {
      const size_t lo = split_point(count, k_chunks, c), hi = split_point(count, k_chunks, c + 1);
      recvs.push_back(ctx.irecv(parent, data + lo * es, (hi - lo) * es));
    }
  std::vector<Context::Handle> sends;
  for (size_t c = 0; c < k_chunks; ++c) {
    const size_t lo = split_point(count, k_chunks, c), hi = split_point(count, k_chunks, c + 1);
    if (parent >= 0) INA_RETURN_IF_ERROR(ctx.wait(recvs[c]));
    for (int child : children) sends.push_back(ctx.isend(child, data + lo * es, (hi - lo) * es));
  }
  return ctx.wait_all(sends);
}

}  // namespace ina::host
