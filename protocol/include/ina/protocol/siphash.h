// SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF", 2012): the MAC of INA's
// packets (WIRE.md, the tag). A 128-bit key, a 64-bit output; in-tree so that the worker library
// needs nothing beyond libc and libstdc++. The reference test vectors are in
// tests/protocol/siphash_test.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
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
  bool operator==(const Key128&) const = default;
};

// 32 lowercase hex digits, most significant first: hi's 16 digits, then lo's.
std::string key_to_hex(const Key128& k);
// Parses exactly 32 hexadecimal digits (either case) as key_to_hex() writes them. False on any
// other form (length, characters); *out is then unchanged.
bool parse_key_hex(std::string_view text, Key128* out);

// SipHash-2-4 of `msg` under `key`.
uint64_t siphash24(const Key128& key, std::span<const uint8_t> msg);
// The same with the 8 bytes at [8 * zero_word, 8 * zero_word + 8) read as zero (a packet's tag
// field, without copying the packet). msg.size() must be at least 8 * (zero_word + 1).
uint64_t siphash24_zeroed(const Key128& key, std::span<const uint8_t> msg, size_t zero_word);

}  // namespace ina
