// The packet MAC of wire version 4 (WIRE.md, "The tag"): POLYVAL (RFC 8452) over the datagram
// under a hash key derived from the 128-bit key, then SipHash-2-4 under the key over the 16-byte
// POLYVAL value and the datagram's length. This is the universal-hash-then-PRF construction of
// AES-GCM-SIV's tag (RFC 8452, section 4: POLYVAL, then a block cipher), with SipHash as the PRF:
// no nonce is needed, and a datagram's tag reveals nothing of the hash key as long as no two
// datagrams' POLYVALs collide, which for two different datagrams of at most L 16-byte blocks
// happens with probability at most L / 2^128 (POLYVAL is almost-XOR-universal).
//
// Why not SipHash over the whole datagram, as versions 1 to 3 did: SipHash is sequential (two
// rounds per 8-byte word) and cost about 520 ns per 1472-byte datagram on the development VM, a
// quarter of the CPU of every rank and of the aggregator at 1 Gbit/s. POLYVAL with the carry-less
// multiply multiplies up to 32 blocks independently and reduces once per 32: four blocks per
// instruction with VPCLMULQDQ on 512-bit vectors (AVX-512: Intel since Ice Lake, AMD since Zen 4),
// one with PCLMULQDQ (every x86-64 since 2010) or with PMULL (arm64's Crypto Extension);
// ina-engine-bench prints what a datagram costs by each. Without any of them a portable bit-serial
// multiply computes the same values, slowly (about 12 us per KiB).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ina/protocol/key.h"

namespace ina {

// A GF(2^128) element in POLYVAL's order: the 16 bytes little-endian, lo = bytes 0..7.
struct Gf128 {
  uint64_t lo = 0;
  uint64_t hi = 0;
  constexpr bool operator==(const Gf128& o) const { return lo == o.lo && hi == o.hi; }
};

// The ways polyval() can multiply: portable (bit-serial, any CPU), a 64 x 64 carry-less multiply
// on 128-bit vectors (PCLMULQDQ on x86-64, PMULL on arm64), VPCLMULQDQ on 512-bit vectors.
// best_mac_path() is the fastest this CPU has; all give the same values.
enum class MacPath { kPortable, kClmul, kClmul512 };
bool mac_path_available(MacPath p);
MacPath best_mac_path();
const char* mac_path_name(MacPath p);

// POLYVAL(h, X_1 .. X_s) of RFC 8452, where the X_j are `msg` cut into 16-byte blocks, the last one
// padded with zero bytes, by the fastest path (or the one named: it must be available). Exposed
// for the tests (RFC 8452's vector, every path against the portable one).
Gf128 polyval(const Gf128& h, std::span<const uint8_t> msg);
Gf128 polyval(const Gf128& h, std::span<const uint8_t> msg, MacPath path);

// Blocks folded per reduction: a run of up to kMacFold blocks is multiplied by the powers of the
// hash key and reduced once.
inline constexpr size_t kMacFold = 32;

// A key expanded for the MAC: the SipHash key itself and the powers of POLYVAL's hash key h
// (h itself is hrev[kMacFold - 1]).
struct MacKey {
  Key128 prf;
  // hrev[i] = h^(kMacFold - i) in POLYVAL's dot-product sense (h^1 = h, h^k = dot(h^(k-1), h)):
  // highest power first, so that block j of a run of r blocks takes hrev[kMacFold - r + j].
  Gf128 hrev[kMacFold];
  Gf128 h_mont;  // h * x^-128 (the portable multiply's form of h)
};
MacKey expand_mac_key(const Key128& key);

// The 64-bit MAC of `msg` with the 8 bytes at [8 * zero_word, 8 * zero_word + 8) read as zero (a
// packet's tag field). msg.size() must be at least 8 * (zero_word + 1); zero_word < 8.
uint64_t packet_mac(const MacKey& key, std::span<const uint8_t> msg, size_t zero_word);
// The same by the named path (it must be available): for benchmarks of each path.
uint64_t packet_mac(const MacKey& key, std::span<const uint8_t> msg, size_t zero_word,
                    MacPath path);
// The same under a raw key: expanded once and kept in a small per-thread cache (the last few keys
// used; a packet's key changes only when a job or its incarnation does).
uint64_t packet_mac(const Key128& key, std::span<const uint8_t> msg, size_t zero_word);

// The MACs of `n` datagrams at once: out[i] = packet_mac(*keys[i], msgs[i], zero_word), the same
// values. One datagram's MAC is a chain of dependent steps (a reduction per fold of up to kMacFold
// blocks, then SipHash's rounds): about 270 TSC cycles for a 1 KiB datagram on a 2-core Xeon VM,
// where its multiplies alone take about 70. Here consecutive datagrams of one length (a burst of
// one job's blocks) go through the folds four at a time in lockstep and through SipHash as the four
// lanes of one vector, so that their chains overlap (the aggregator's receive burst). Any length,
// keys and mix of lengths; where the CPU lacks VPCLMULQDQ on 512-bit vectors and AVX-512VL, one
// at a time (packet_mac).
void packet_mac_many(const MacKey* const* keys, const std::span<const uint8_t>* msgs, size_t n,
                     size_t zero_word, uint64_t* out);

// The MAC of the concatenation head || body, computed in place (a datagram whose payload stays in
// the user's buffer, sent by a gathering send): the same value as packet_mac over the two
// concatenated. head.size() <= kMaxMacHead; the zeroed word lies in the first kMaxMacHead bytes.
inline constexpr size_t kMaxMacHead = 48;
uint64_t packet_mac_parts(const MacKey& key, std::span<const uint8_t> head,
                          std::span<const uint8_t> body, size_t zero_word, MacPath path);
uint64_t packet_mac_parts(const Key128& key, std::span<const uint8_t> head,
                          std::span<const uint8_t> body, size_t zero_word);
// The same while body is copied to dst (body.size() bytes; no overlap), in one read of the body:
// a sender that builds the datagram from a payload kept elsewhere (the aggregator's result, kept
// in its slot for resends) seals it as it copies it.
uint64_t packet_mac_parts_copy(const MacKey& key, std::span<const uint8_t> head,
                               std::span<const uint8_t> body, size_t zero_word, uint8_t* dst,
                               MacPath path);
uint64_t packet_mac_parts_copy(const Key128& key, std::span<const uint8_t> head,
                               std::span<const uint8_t> body, size_t zero_word, uint8_t* dst);

// The receive pass: packet_mac(key, msg, zero_word) computed while msg[from, msg.size()) is copied
// to dst (msg.size() - from bytes; dst must not overlap msg), in one read of the datagram: each
// vector the MAC loads is also stored. A receiver that verifies a datagram and keeps its payload
// (the worker's RESULT into the user's buffer, the aggregator's float SUM words into slot
// storage) pays one pass instead of two; it must copy only where a datagram that fails the tag
// may write (the copy happens whatever the tag). 8 * (zero_word + 1) <= from <=
// 16 * (zero_word / 2 + 1) and from <= msg.size() (a wire header: from 40, zero_word 4).
//
// `where` says what dst is. kResident: storage the caller reuses and finds in cache (the
// aggregator's slots). kStream: a large buffer that consecutive datagrams fill once (the user's
// output), not in cache; the pass then prefetches the lines it will store next, which made such a
// copy 1.6x faster (mac.cc) and costs resident storage time.
enum class CopyDst { kResident, kStream };
uint64_t packet_mac_copy(const MacKey& key, std::span<const uint8_t> msg, size_t zero_word,
                         size_t from, uint8_t* dst, MacPath path,
                         CopyDst where = CopyDst::kResident);
uint64_t packet_mac_copy(const Key128& key, std::span<const uint8_t> msg, size_t zero_word,
                         size_t from, uint8_t* dst, CopyDst where = CopyDst::kResident);

// The copied bytes read as float32 magnitude codes (4-byte little-endian lanes from `from`, the
// sign bit cleared), what the block codec's scan_codes computes for float32 (codec.h, scan): the
// largest finite code (below Inf's; 0 for none) and whether any is >= bad. Updated in place: top
// and nonfinite carry over from the caller's values.
struct MagnitudeCodes {
  uint32_t bad = 0x7F800000u;  // Inf: a SUM's non-finite bound
  uint32_t top = 0;
  bool nonfinite = false;
};
// packet_mac_copy that also scans the copied bytes (from and their number multiples of 4): verify,
// copy and scan in one pass.
uint64_t packet_mac_copy(const MacKey& key, std::span<const uint8_t> msg, size_t zero_word,
                         size_t from, uint8_t* dst, MagnitudeCodes* codes, MacPath path);
uint64_t packet_mac_copy(const Key128& key, std::span<const uint8_t> msg, size_t zero_word,
                         size_t from, uint8_t* dst, MagnitudeCodes* codes);
// The same without the copy: verify and scan in one pass, the bytes left where they are (the
// aggregator's datagram that completes a round, whose words the completion reads from it).
uint64_t packet_mac_scan(const MacKey& key, std::span<const uint8_t> msg, size_t zero_word,
                         size_t from, MagnitudeCodes* codes, MacPath path);
uint64_t packet_mac_scan(const Key128& key, std::span<const uint8_t> msg, size_t zero_word,
                         size_t from, MagnitudeCodes* codes);

}  // namespace ina
