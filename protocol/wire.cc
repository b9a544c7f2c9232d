#include "ina/protocol/wire.h"

#include <algorithm>

namespace ina::wire {

namespace {

// 8 ASCII bytes as the little-endian word whose bytes they are.
constexpr uint64_t label(const char (&s)[9]) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(s[i]);
  return v;
}

void put_le64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }  // little-endian host

}  // namespace

uint64_t incarnation_epoch(const Key128& job_key, uint64_t salt, std::span<const BlockSeq> nonces) {
  // A chain over blocks of up to kPerBlock nonces, each block "INAepoch", the chain value (first
  // the salt), the nonces: no allocation (it runs on the packet that completes a barrier).
  constexpr size_t kPerBlock = 28;
  uint8_t msg[16 + kPerBlock * 4];
  put_le64(msg, label("INAepoch"));
  uint64_t h = salt;
  size_t r = 0;
  do {
    const size_t n = std::min(kPerBlock, nonces.size() - r);
    put_le64(msg + 8, h);
    for (size_t i = 0; i < n; ++i) put_le32(msg + 16 + i * 4, nonces[r + i]);
    h = siphash24(job_key, std::span<const uint8_t>(msg, 16 + n * 4));
    r += n;
  } while (r < nonces.size());
  return h == 0 ? 1 : h;
}

Key128 incarnation_key(const Key128& job_key, uint64_t epoch) {
  uint8_t msg[16];
  put_le64(msg + 8, epoch);
  put_le64(msg, label("INAkey-0"));
  const uint64_t k0 = siphash24(job_key, msg);
  put_le64(msg, label("INAkey-1"));
  return Key128(k0, siphash24(job_key, msg));
}

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
