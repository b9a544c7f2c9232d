#include "ina/protocol/wire.h"

namespace ina::wire {

std::string_view decode_error_name(DecodeError e) {
  switch (e) {
    case DecodeError::kOk: return "ok";
    case DecodeError::kTruncated: return "truncated";
    case DecodeError::kBadMagic: return "bad_magic";
    case DecodeError::kBadVersion: return "bad_version";
    case DecodeError::kUnknownFlags: return "unknown_flags";
    case DecodeError::kUnknownDtype: return "unknown_dtype";
    case DecodeError::kUnknownOp: return "unknown_op";
    case DecodeError::kCountBeyondPayload: return "count_beyond_payload";
    case DecodeError::kTrailingBytes: return "trailing_bytes";
    case DecodeError::kBadPartial: return "bad_partial";
    case DecodeError::kBadExponent: return "bad_exponent";
    case DecodeError::kCount_: break;
  }
  return "?";
}

}  // namespace ina::wire
