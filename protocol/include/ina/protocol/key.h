// A job's 128-bit key and its text form. C++17 (the public ina.hpp includes it); SipHash itself
// is in siphash.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ina {

// A job's 128-bit key. As SipHash takes it: k0 = lo, k1 = hi (the 16 key bytes are lo then hi,
// little-endian). All zero means "no key configured": packets are still sealed and verified
// with it, which authenticates nothing but keeps one code path and one wire format.
struct Key128 {
  uint64_t lo = 0;
  uint64_t hi = 0;

  constexpr Key128() = default;
  constexpr Key128(uint64_t lo_, uint64_t hi_) : lo(lo_), hi(hi_) {}
  // A 64-bit key widened (hi = 0): what older state files and tests hold.
  constexpr Key128(uint64_t lo_) : lo(lo_) {}  // NOLINT(google-explicit-constructor)

  constexpr bool is_zero() const { return lo == 0 && hi == 0; }
  constexpr bool operator==(const Key128& o) const { return lo == o.lo && hi == o.hi; }
  constexpr bool operator!=(const Key128& o) const { return !(*this == o); }
};

// 32 lowercase hex digits, most significant first: hi's 16 digits, then lo's.
std::string key_to_hex(const Key128& k);
// Parses exactly 32 hexadecimal digits (either case) as key_to_hex() writes them. False on any
// other form (length, characters); *out is then unchanged.
bool parse_key_hex(std::string_view text, Key128* out);

}  // namespace ina
