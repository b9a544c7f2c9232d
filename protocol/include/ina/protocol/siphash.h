// SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF", 2012): the PRF of INA's
// packet tag (mac.h, WIRE.md "The tag") and of its key derivations. A 128-bit key, a 64-bit
// output; in-tree so that the worker library needs nothing beyond libc and libstdc++. The reference
// test vectors are in tests/protocol/siphash_test.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ina/protocol/key.h"

namespace ina {

// SipHash-2-4 of `msg` under `key`.
uint64_t siphash24(const Key128& key, std::span<const uint8_t> msg);
// The same with the 8 bytes at [8 * zero_word, 8 * zero_word + 8) read as zero (a packet's tag
// field, without copying the packet). msg.size() must be at least 8 * (zero_word + 1).
uint64_t siphash24_zeroed(const Key128& key, std::span<const uint8_t> msg, size_t zero_word);

}  // namespace ina
