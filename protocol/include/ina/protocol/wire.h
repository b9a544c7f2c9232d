// The INA wire format, version 1: the one definition of the packet header that every worker,
// aggregator and backend uses. The byte layout is drawn in protocol/WIRE.md; a checked-in test
// vector (protocol/testdata/) is decoded by the tests.
//
// A packet is the 32-byte header followed by `count` int32 payload words. Every multi-byte field,
// payload included, is big-endian (network order); only the helpers in this header convert.
//
// Packet kinds (by flags):
//   DATA     worker -> aggregator   flags 0 (| RETRANSMIT | NONFINITE): one block's quantized values
//   RESULT   aggregator -> worker   RESULT (| NONFINITE): the reduced block
//   HELLO    worker -> aggregator   HELLO (| RETRANSMIT): join barrier; seq = incarnation nonce,
//                                   payload [world_size]
//   WELCOME  aggregator -> worker   HELLO | RESULT: payload [num_slots, max_block_elems]
//   ERROR    aggregator -> worker   ERROR: payload [reason, ...] (see ErrorReason)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "ina/protocol/types.h"

namespace ina::wire {

inline constexpr uint16_t kMagic = 0x494E;  // "IN"
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 32;
inline constexpr size_t kElemSize = 4;               // payload words are int32
inline constexpr uint16_t kMaxSlot = 0x7FFF;         // 15-bit slot index
inline constexpr uint16_t kShadowBit = 0x8000;       // which of the slot's two copies
inline constexpr uint16_t kDefaultPort = 47474;

// flags
inline constexpr uint8_t kFlagResult = 0x01;      // aggregator -> worker: reduced data
inline constexpr uint8_t kFlagRetransmit = 0x02;  // worker resent this after a timeout
inline constexpr uint8_t kFlagError = 0x04;       // error report; payload[0] is an ErrorReason
inline constexpr uint8_t kFlagNonFinite = 0x08;   // a block held NaN/Inf: the result is NaN
inline constexpr uint8_t kFlagHello = 0x10;       // join barrier (with RESULT: welcome)
inline constexpr uint8_t kKnownFlags = 0x1F;

// payload[0] of an ERROR packet.
enum class ErrorReason : uint32_t {
  // The slot copy is incomplete; payload[1..] is the contributor bitmap (bit r of word r/32),
  // sent in answer to a retransmission so that a worker can name the ranks that are missing.
  // A tree leaf whose copy waits on the root may append a tree note after the ceil(world/32)
  // bitmap words: [kTreeNoteTag, flags (kTreeNoteByRule), m, up to kTreeNoteMaxLeaves indices of
  // the missing leaves]; m counts them all. Readers that do not know it ignore the extra words.
  kMissingRanks = 1,
  // HELLO's world size differs from the aggregator's; payload[1] is the aggregator's.
  kWorldSizeMismatch = 2,
  // A DATA packet arrived before every rank joined; payload[1..] is the HELLO bitmap.
  kJobNotReady = 3,
  // A DATA packet disagreed with the round it joined (count, dtype, op or exponent).
  kRoundMismatch = 4,
};

// The tree note of a kMissingRanks ERROR (see ErrorReason::kMissingRanks).
inline constexpr uint32_t kTreeNoteTag = 0x54524545;  // "TREE"
// The leaves' rank ranges come from the balanced rule (leaf i of n serves
// [floor(i*W/n), floor((i+1)*W/n))), not from a list the controller sent.
inline constexpr uint32_t kTreeNoteByRule = 1;
inline constexpr uint32_t kTreeNoteMaxLeaves = 8;
inline constexpr size_t kTreeNoteWords = 3 + kTreeNoteMaxLeaves;

// Decoded header, in host byte order.
struct Header {
  uint8_t version = kVersion;
  uint8_t flags = 0;
  JobId job = 0;
  uint64_t key = 0;       // per-job key, checked on every packet
  BlockSeq seq = 0;       // block sequence (HELLO: incarnation nonce)
  uint16_t rank = 0;
  uint16_t slot = 0;      // 0..kMaxSlot
  bool shadow = false;    // copy 1 of the slot when set
  uint16_t count = 0;     // payload elements
  DType dtype = DType::kInt32;
  ReduceOp op = ReduceOp::kSum;
  int16_t exp = kNoExponent;       // exponent this block was quantized with
  int16_t next_exp = kNoExponent;  // exponent of the next block on this slot (aggregator: MAX)

  bool has(uint8_t f) const { return (flags & f) != 0; }
};

enum class DecodeError : uint8_t {
  kOk = 0,
  kTruncated,            // shorter than the header
  kBadMagic,
  kBadVersion,
  kUnknownFlags,
  kUnknownDtype,
  kUnknownOp,
  kCountBeyondPayload,   // count * 4 > bytes after the header
  kTrailingBytes,        // bytes after the payload
  kCount_,               // number of values, for counter arrays
};
std::string_view decode_error_name(DecodeError e);

// A validated packet: header plus a view of the big-endian payload inside the caller's buffer.
struct PacketView {
  Header hdr;
  const uint8_t* payload = nullptr;  // hdr.count big-endian int32 words

  int32_t word(size_t i) const {
    uint32_t v;
    std::memcpy(&v, payload + i * kElemSize, sizeof v);
    return static_cast<int32_t>(__builtin_bswap32(v));
  }
};

// ---- byte-order helpers (the only place that converts) ----
inline void put_u16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v >> 8); p[1] = uint8_t(v); }
inline void put_u32(uint8_t* p, uint32_t v) {
  v = __builtin_bswap32(v);
  std::memcpy(p, &v, 4);
}
inline void put_u64(uint8_t* p, uint64_t v) {
  v = __builtin_bswap64(v);
  std::memcpy(p, &v, 8);
}
inline uint16_t get_u16(const uint8_t* p) { return uint16_t((p[0] << 8) | p[1]); }
inline uint32_t get_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return __builtin_bswap32(v);
}
inline uint64_t get_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return __builtin_bswap64(v);
}

// Header byte offsets (drawn in WIRE.md).
inline constexpr size_t kOffMagic = 0, kOffVersion = 2, kOffFlags = 3, kOffJob = 4, kOffKey = 8,
                        kOffSeq = 16, kOffRank = 20, kOffSlot = 22, kOffCount = 24,
                        kOffDtype = 26, kOffOp = 27, kOffExp = 28, kOffNextExp = 30;

// Writes the 32-byte header. `out` must hold kHeaderSize bytes.
inline void encode_header(const Header& h, uint8_t* out) {
  put_u16(out + kOffMagic, kMagic);
  out[kOffVersion] = h.version;
  out[kOffFlags] = h.flags;
  put_u32(out + kOffJob, h.job);
  put_u64(out + kOffKey, h.key);
  put_u32(out + kOffSeq, h.seq);
  put_u16(out + kOffRank, h.rank);
  put_u16(out + kOffSlot, uint16_t((h.slot & kMaxSlot) | (h.shadow ? kShadowBit : 0)));
  put_u16(out + kOffCount, h.count);
  out[kOffDtype] = static_cast<uint8_t>(h.dtype);
  out[kOffOp] = static_cast<uint8_t>(h.op);
  put_u16(out + kOffExp, static_cast<uint16_t>(h.exp));
  put_u16(out + kOffNextExp, static_cast<uint16_t>(h.next_exp));
}

// Validates and decodes `buf`. Reads nothing past buf.size(). On success fills `out`.
inline DecodeError decode(std::span<const uint8_t> buf, PacketView* out) {
  const uint8_t* p = buf.data();
  if (buf.size() < kHeaderSize) return DecodeError::kTruncated;
  if (get_u16(p + kOffMagic) != kMagic) return DecodeError::kBadMagic;
  if (p[kOffVersion] != kVersion) return DecodeError::kBadVersion;
  if ((p[kOffFlags] & ~kKnownFlags) != 0) return DecodeError::kUnknownFlags;
  if (!is_valid_dtype(p[kOffDtype])) return DecodeError::kUnknownDtype;
  if (!is_valid_op(p[kOffOp])) return DecodeError::kUnknownOp;
  const uint16_t count = get_u16(p + kOffCount);
  const size_t payload_bytes = buf.size() - kHeaderSize;
  if (size_t{count} * kElemSize > payload_bytes) return DecodeError::kCountBeyondPayload;
  if (size_t{count} * kElemSize < payload_bytes) return DecodeError::kTrailingBytes;
  Header& h = out->hdr;
  h.version = p[kOffVersion];
  h.flags = p[kOffFlags];
  h.job = get_u32(p + kOffJob);
  h.key = get_u64(p + kOffKey);
  h.seq = get_u32(p + kOffSeq);
  h.rank = get_u16(p + kOffRank);
  const uint16_t slot = get_u16(p + kOffSlot);
  h.slot = slot & kMaxSlot;
  h.shadow = (slot & kShadowBit) != 0;
  h.count = count;
  h.dtype = static_cast<DType>(p[kOffDtype]);
  h.op = static_cast<ReduceOp>(p[kOffOp]);
  h.exp = static_cast<int16_t>(get_u16(p + kOffExp));
  h.next_exp = static_cast<int16_t>(get_u16(p + kOffNextExp));
  out->payload = p + kHeaderSize;
  return DecodeError::kOk;
}

inline size_t packet_size(uint16_t count) { return kHeaderSize + size_t{count} * kElemSize; }

// Payload conversion between host int32 and big-endian words (vectorizes).
inline void store_payload(uint8_t* dst, const int32_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) put_u32(dst + i * kElemSize, static_cast<uint32_t>(src[i]));
}
inline void load_payload(int32_t* dst, const uint8_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<int32_t>(get_u32(src + i * kElemSize));
}

// Per-reason counters of rejected packets; one writer.
struct DecodeCounters {
  std::array<uint64_t, static_cast<size_t>(DecodeError::kCount_)> by_error{};
  void add(DecodeError e) { ++by_error[static_cast<size_t>(e)]; }
  uint64_t total_rejected() const {
    uint64_t t = 0;
    for (size_t i = 1; i < by_error.size(); ++i) t += by_error[i];
    return t;
  }
};

}  // namespace ina::wire
