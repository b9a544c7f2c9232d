// Helpers shared by the host collectives (internal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ina/base/status.h"
#include "ina/protocol/types.h"

namespace ina::host {

inline int mod(int a, int p) { return ((a % p) + p) % p; }

inline Status check_dtype_op(const char* what, DType t, ReduceOp op) {
  if (!is_valid_dtype(static_cast<uint8_t>(t)))
    return invalid_argument(std::string(what) + ": bad dtype");
  if (!is_valid_op(static_cast<uint8_t>(op)))
    return invalid_argument(std::string(what) + ": bad op");
  return ok_status();
}

inline Status check_buffers(const char* what, const void* send, const void* recv, size_t count) {
  if (count > 0 && (send == nullptr || recv == nullptr))
    return invalid_argument(std::string(what) + ": null buffer");
  return ok_status();
}

// [i*n/parts, (i+1)*n/parts): n split into `parts` near-equal ranges.
inline size_t split_point(size_t n, size_t parts, size_t i) {
  return static_cast<size_t>((static_cast<unsigned __int128>(n) * i) / parts);
}

}  // namespace ina::host
