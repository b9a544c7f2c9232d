// The INA wire format, version 4: the one definition of the packet header that every worker,
// aggregator and backend uses. The byte layout is drawn in protocol/WIRE.md; checked-in test
// vectors (protocol/testdata/vectors.hex) are decoded by the tests.
//
// A packet is the 40-byte header followed by `count` payload words. Header fields are big-endian
// (network order); payload words are little-endian (the hosts and GPUs INA runs on are, so user
// data is copied to and from packets without a byte swap). Only the helpers here convert.
//
// Payload word width, by kind (payload_width()):
//   DATA     worker -> aggregator   flags 0 (| RETRANSMIT | NONFINITE): the block's raw values,
//                                   in the user's width (dtype_size: 4, 2 or 1 bytes)
//   RESULT   aggregator -> worker   RESULT (| NONFINITE | RETRANSMIT): the reduced block, same
//   PARTIAL  tree leaf <-> root     PARTIAL (| RESULT from the root): count 0 = an exponent
//                                   request/answer (exp), else acc_bytes(dtype) fixed-point words
//   HELLO    worker -> aggregator   HELLO (| RETRANSMIT): join barrier; seq = incarnation nonce
//                                   (it grows: next_nonce),
//                                   payload [world_size, max_payload_bytes]      (u32 words)
//                                   (the rank's largest block; one word: none named)
//   WELCOME  aggregator -> worker   HELLO | RESULT; seq = the HELLO's nonce (0: to every rank, a
//                                   notice that the barrier completed, adopted by none);
//                                   payload [num_slots, max_payload_bytes, epoch lo, epoch hi]
//   ERROR    aggregator -> worker   ERROR: payload [reason, ...] (see ErrorReason)       (u32)
//
// Tags: HELLO, WELCOME and the ERRORs answering a HELLO are sealed with the job's key; every other
// packet with the key of the job's current incarnation, incarnation_key(job key, epoch), so that a
// packet captured in an earlier incarnation fails the tag (WIRE.md, "Incarnations").
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "ina/protocol/mac.h"
#include "ina/protocol/siphash.h"
#include "ina/protocol/types.h"

namespace ina::wire {

static_assert(std::endian::native == std::endian::little,
              "INA's payload words are little-endian and copied without a swap");

inline constexpr uint16_t kMagic = 0x494E;  // "IN"
inline constexpr uint8_t kVersion = 4;
inline constexpr size_t kHeaderSize = 40;
inline constexpr size_t kControlWordSize = 4;   // HELLO, WELCOME and ERROR payload words (u32)
inline constexpr uint16_t kMaxSlot = 0x7FFF;    // 15-bit slot index
inline constexpr uint16_t kShadowBit = 0x8000;  // which of the slot's two copies
// A multi-threaded aggregator gives each thread runs of kSlotRun consecutive slots (thread
// (slot / kSlotRun) % threads), steered by the slot in the header. A sender that batches
// datagrams (UDP GSO: the receiver's kernel places a train by its first datagram) keeps a batch
// within one run, so that it reaches its thread whole (WIRE.md, "Slots and threads").
inline constexpr uint16_t kSlotRun = 16;
inline constexpr uint16_t kDefaultPort = 47474;
inline constexpr uint16_t kNoRoot = 0xFFFF;  // `root` of a collective without one
// A job's block in bytes when nothing else is configured: 256 float32, 512 16-bit elements.
inline constexpr uint32_t kDefaultPayloadBytes = 1024;

// flags
inline constexpr uint8_t kFlagResult = 0x01;      // aggregator -> worker: reduced data
inline constexpr uint8_t kFlagRetransmit = 0x02;  // resent after a timeout
inline constexpr uint8_t kFlagError = 0x04;       // error report; payload[0] is an ErrorReason
inline constexpr uint8_t kFlagNonFinite = 0x08;   // a block held NaN/Inf: the result is NaN
inline constexpr uint8_t kFlagHello = 0x10;       // join barrier (with RESULT: welcome)
inline constexpr uint8_t kFlagPartial = 0x20;     // tree: a leaf's exponent or fixed-point partial
inline constexpr uint8_t kKnownFlags = 0x3F;

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
  // A DATA packet disagreed with the round it joined (count, dtype, op, elems, root, exponent).
  // payload[1] is the round's block count; from a flat aggregator, once every rank's packet of
  // the round is in (until then it answers nothing), also payload[2..5] = the first shape's
  // elems and dtype | op << 8 | root << 16, another shape's the same, and payload[6..] a bitmap
  // of the ranks that sent a shape other than the first (ceil(world/32) words): every rank of the
  // round gets the same words, all at once when the last rank is in, and again on every later
  // DATA of that collective (the header's coll), also once a newer round took the copy. Trees
  // (WIRE.md, "kRoundMismatch"): a leaf whose own ranks disagree sends its root the words with
  // both groups of its ranks (two bitmaps of global ranks, then kTreeNoteTag); the root answers
  // every leaf with one bitmap of global ranks followed by kTreeNoteTag.
  kRoundMismatch = 4,
  // The one ERROR a worker sends. Worker to aggregator: rank payload[1] gave up on the round
  // (slot, shadow, seq) for cause payload[2] (kAbortDeadline) and will not wait for its result;
  // the aggregator marks the round aborted if it is incomplete, so that no rank can complete it
  // later (a late rank would return success where the others failed). Aggregator to worker, in
  // answer to DATA for an aborted round: the same three words.
  kAborted = 5,
  // DATA for a round older than the one its slot copy holds (a stale round): the other ranks have
  // moved past it, so it can never complete. payload[1] is the sequence the copy holds. A worker
  // still waiting for that round fails its collective (the others gave up on it at their
  // deadline and went on); any other worker ignores it (a delayed duplicate of a round whose
  // result it has), and so does a worker whose copy now holds a round at or past its
  // collective's resynchronization point (the others were told of a mismatch: its own answer,
  // kRoundMismatch, comes on its next resend).
  kSuperseded = 6,
};

// ErrorReason::kAborted's cause (payload[2]).
inline constexpr uint32_t kAbortDeadline = 1;  // the rank's collective deadline passed

// The tree note of a kMissingRanks ERROR (see ErrorReason::kMissingRanks).
inline constexpr uint32_t kTreeNoteTag = 0x54524545;  // "TREE"
// The leaves' rank ranges come from the balanced rule (leaf i of n serves
// [floor(i*W/n), floor((i+1)*W/n))), not from a list the controller sent.
inline constexpr uint32_t kTreeNoteByRule = 1;
inline constexpr uint32_t kTreeNoteMaxLeaves = 8;
inline constexpr size_t kTreeNoteWords = 3 + kTreeNoteMaxLeaves;

// Bytes of one fixed-point word of a float SUM (PARTIAL payload words): int64 for float32,
// int32 for the narrower float types (QUANTIZATION.md). int32 (never PARTIAL): 4.
inline constexpr size_t acc_bytes(DType t) { return t == DType::kFloat32 ? 8 : 4; }

// Decoded header, in host byte order.
struct Header {
  uint8_t version = kVersion;
  uint8_t flags = 0;
  JobId job = 0;
  BlockSeq seq = 0;  // block sequence (HELLO: incarnation nonce)
  uint16_t rank = 0;
  uint16_t slot = 0;    // 0..kMaxSlot
  bool shadow = false;  // copy 1 of the slot when set
  uint16_t count = 0;   // payload words
  DType dtype = DType::kInt32;
  ReduceOp op = ReduceOp::kSum;
  uint32_t coll = 0;          // collective id (per communicator, the same on every rank)
  uint32_t elems = 0;         // the collective's element count mod 2^32
  int16_t exp = kNoExponent;  // PARTIAL only: see WIRE.md; else kNoExponent
  uint16_t root = kNoRoot;    // rooted collectives: the root rank
  uint64_t tag = 0;  // authentication tag (seal(), tag_ok()); encode_header writes it as is

  bool has(uint8_t f) const { return (flags & f) != 0; }
};

enum class DecodeError : uint8_t {
  kOk = 0,
  kTruncated,  // shorter than the header
  kBadMagic,
  kBadVersion,
  kUnknownFlags,
  kUnknownDtype,
  kUnknownOp,
  kCountBeyondPayload,  // count * width > bytes after the header
  kTrailingBytes,       // bytes after the payload
  kBadPartial,          // PARTIAL with HELLO or ERROR, or not a float SUM
  kBadExponent,         // exp set on a packet that is not PARTIAL
  kCount_,              // number of values, for counter arrays
};
std::string_view decode_error_name(DecodeError e);

// Bytes per payload word of a packet with these flags and dtype.
inline constexpr size_t payload_width(uint8_t flags, DType t) {
  if ((flags & (kFlagHello | kFlagError)) != 0) return kControlWordSize;
  if ((flags & kFlagPartial) != 0) return acc_bytes(t);
  return dtype_size(t);
}

// ---- byte-order helpers (the only place that converts) ----
inline void put_u16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}
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
// Payload words: little-endian, i.e. host order here (static_assert above).
inline void put_le32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline uint32_t get_le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// A validated packet: header plus a view of the payload inside the caller's buffer.
struct PacketView {
  Header hdr;
  const uint8_t* payload = nullptr;  // hdr.count words of payload_width(flags, dtype) bytes
  size_t payload_bytes = 0;

  // Control word i (HELLO, WELCOME, ERROR: u32 little-endian), as int32.
  int32_t word(size_t i) const { return static_cast<int32_t>(get_le32(payload + i * 4)); }
};

// Header byte offsets (drawn in WIRE.md).
inline constexpr size_t kOffMagic = 0, kOffVersion = 2, kOffFlags = 3, kOffJob = 4, kOffSeq = 8,
                        kOffRank = 12, kOffSlot = 14, kOffCount = 16, kOffDtype = 18, kOffOp = 19,
                        kOffColl = 20, kOffElems = 24, kOffExp = 28, kOffRoot = 30, kOffTag = 32;
inline constexpr size_t kTagSize = 8;
static_assert(kOffTag % 8 == 0 && kOffTag + kTagSize <= kHeaderSize,
              "the tag is one whole 8-byte word of the header");

// The slot named by an INA datagram's header (0 for anything shorter than a header), and the
// run of kSlotRun slots it belongs to.
inline uint16_t slot_of(std::span<const uint8_t> d) {
  return d.size() < kHeaderSize ? uint16_t{0} : uint16_t(get_u16(d.data() + kOffSlot) & kMaxSlot);
}
inline uint16_t slot_run_of(std::span<const uint8_t> d) { return slot_of(d) / kSlotRun; }

// ---- the tag (WIRE.md): the packet MAC (mac.h: POLYVAL, then SipHash-2-4) under a 128-bit key
// over the whole datagram, its tag field read as zero. The all-zero key ("no key configured")
// seals and verifies the same way.

// The tag `datagram` must carry. datagram.size() >= kHeaderSize.
inline uint64_t compute_tag(std::span<const uint8_t> datagram, const Key128& key) {
  return packet_mac(key, datagram, kOffTag / 8);
}
// Writes the tag of `datagram` (header and payload already in place) into its tag field.
// datagram.size() >= kHeaderSize.
inline void seal(std::span<uint8_t> datagram, const Key128& key) {
  put_u64(datagram.data() + kOffTag, compute_tag(datagram, key));
}
// The same for a datagram in two parts, the header (in `head`, whose tag field is written) and
// the payload (`body`, anywhere: the user's buffer under a gathering send).
inline void seal_parts(std::span<uint8_t> head, std::span<const uint8_t> body, const Key128& key) {
  static_assert(kHeaderSize <= kMaxMacHead);
  put_u64(head.data() + kOffTag, packet_mac_parts(key, head, body, kOffTag / 8));
}
// seal_parts with the payload copied to `dst` (body.size() bytes) in the same pass: `head` and
// dst then hold the sealed datagram's two parts (dst = head.data() + kHeaderSize builds it in one
// buffer).
inline void seal_copy(std::span<uint8_t> head, std::span<const uint8_t> body, uint8_t* dst,
                      const Key128& key) {
  static_assert(kHeaderSize <= kMaxMacHead);
  put_u64(head.data() + kOffTag, packet_mac_parts_copy(key, head, body, kOffTag / 8, dst));
}
// Whether `datagram` carries the tag `key` gives it. False for anything shorter than a header.
// The comparison is of the whole word (no early exit on a byte).
inline bool tag_ok(std::span<const uint8_t> datagram, const Key128& key) {
  if (datagram.size() < kHeaderSize) return false;
  return (compute_tag(datagram, key) ^ get_u64(datagram.data() + kOffTag)) == 0;
}

// tag_ok(datagram, key) with the payload copied to dst in the same pass (mac.h, packet_mac_copy;
// `where` as there), and with `codes` its float32 magnitude codes scanned too. dst gets
// datagram.size() - kHeaderSize bytes and `codes` is updated whatever the tag: they must be storage
// that a datagram failing the tag may overwrite (nothing else reads it until a datagram passes),
// and the caller keeps them only when this returns true.
inline bool tag_ok_copy(std::span<const uint8_t> datagram, const Key128& key, uint8_t* dst,
                        CopyDst where = CopyDst::kResident) {
  if (datagram.size() < kHeaderSize) return false;
  return (packet_mac_copy(key, datagram, kOffTag / 8, kHeaderSize, dst, where) ^
          get_u64(datagram.data() + kOffTag)) == 0;
}
inline bool tag_ok_copy(std::span<const uint8_t> datagram, const Key128& key, uint8_t* dst,
                        MagnitudeCodes* codes) {
  if (datagram.size() < kHeaderSize) return false;
  return (packet_mac_copy(key, datagram, kOffTag / 8, kHeaderSize, dst, codes) ^
          get_u64(datagram.data() + kOffTag)) == 0;
}
// tag_ok(datagram, key) with the payload's float32 magnitude codes scanned in the same pass (no
// copy; `codes` updated whatever the tag, kept by the caller only when this returns true).
inline bool tag_ok_scan(std::span<const uint8_t> datagram, const Key128& key,
                        MagnitudeCodes* codes) {
  if (datagram.size() < kHeaderSize) return false;
  return (packet_mac_scan(key, datagram, kOffTag / 8, kHeaderSize, codes) ^
          get_u64(datagram.data() + kOffTag)) == 0;
}

// ---- incarnations (WIRE.md, "Incarnations"). A job's block sequence starts again at 1 with every
// completed join barrier, and its key may be kept across restarts of the job, so the job's key
// alone would make a DATA packet or an abort captured in an earlier incarnation verify again once
// its seq names a live round. The aggregator therefore names each incarnation with a 64-bit epoch
// when its barrier completes, sends it in the WELCOME (sealed with the job's key; seq = the
// HELLO's nonce, so that a worker takes only the answer to its own HELLO, never a replayed WELCOME
// of an earlier incarnation), and from then on both sides seal and verify every packet but HELLO,
// WELCOME and the ERRORs answering a HELLO with incarnation_key(job key, epoch). The key is
// derived once per incarnation: the per-packet tag costs what it did (same SipHash, same bytes).

// Words of a WELCOME payload: [num_slots, max_payload_bytes, epoch lo, epoch hi].
inline constexpr uint16_t kWelcomeWords = 4;
// The epoch a WELCOME names. p.hdr.count >= kWelcomeWords.
inline uint64_t welcome_epoch(const PacketView& p) {
  return uint64_t{static_cast<uint32_t>(p.word(2))} | uint64_t{static_cast<uint32_t>(p.word(3))}
                                                          << 32;
}

// The epoch of the incarnation whose barrier the ranks' HELLO `nonces` (by served rank) complete,
// never 0: a chain of SipHash-2-4 under the job's key over blocks of up to 28 nonces, block i
// "INAepoch", h_i (8 bytes), its nonces (4 bytes each, little-endian); h_0 = `salt`, and the
// epoch is the last block's hash. Allocates nothing.
// A function of the barrier, so that every engine (thread, lcore) of one aggregator, each of which
// runs the barrier on its copy of the HELLOs, names it alike; `salt`, drawn once per aggregator
// process (0 in tests), keeps it apart from another process's (a restarted aggregator, another
// shard of the job), where the same nonces could recur. A new barrier has at least one newer
// nonce (nonces only grow, and an old one is a replay the aggregator drops), so a new epoch.
uint64_t incarnation_epoch(const Key128& job_key, uint64_t salt, std::span<const BlockSeq> nonces);

// The key of incarnation `epoch`'s packets: (k0, k1) = SipHash-2-4 under the job's key of
// "INAkey-0" and "INAkey-1", each followed by the epoch (8 bytes, little-endian). These 16-byte
// inputs and the epoch's ("INAepoch" ...) differ from any packet's tag input (40 bytes or more,
// bytes 0-2 "IN" and the version), so no derived value is a packet tag of the job's key.
Key128 incarnation_key(const Key128& job_key, uint64_t epoch);

// Writes the 40-byte header. `out` must hold kHeaderSize bytes.
inline void encode_header(const Header& h, uint8_t* out) {
  put_u16(out + kOffMagic, kMagic);
  out[kOffVersion] = h.version;
  out[kOffFlags] = h.flags;
  put_u32(out + kOffJob, h.job);
  put_u32(out + kOffSeq, h.seq);
  put_u16(out + kOffRank, h.rank);
  put_u16(out + kOffSlot, uint16_t((h.slot & kMaxSlot) | (h.shadow ? kShadowBit : 0)));
  put_u16(out + kOffCount, h.count);
  out[kOffDtype] = static_cast<uint8_t>(h.dtype);
  out[kOffOp] = static_cast<uint8_t>(h.op);
  put_u32(out + kOffColl, h.coll);
  put_u32(out + kOffElems, h.elems);
  put_u16(out + kOffExp, static_cast<uint16_t>(h.exp));
  put_u16(out + kOffRoot, h.root);
  put_u64(out + kOffTag, h.tag);
}

// Validates and decodes `buf`. Reads nothing past buf.size(). On success fills `out`.
inline DecodeError decode(std::span<const uint8_t> buf, PacketView* out) {
  const uint8_t* p = buf.data();
  if (buf.size() < kHeaderSize) return DecodeError::kTruncated;
  if (get_u16(p + kOffMagic) != kMagic) return DecodeError::kBadMagic;
  if (p[kOffVersion] != kVersion) return DecodeError::kBadVersion;
  const uint8_t flags = p[kOffFlags];
  if ((flags & ~kKnownFlags) != 0) return DecodeError::kUnknownFlags;
  if (!is_valid_dtype(p[kOffDtype])) return DecodeError::kUnknownDtype;
  if (!is_valid_op(p[kOffOp])) return DecodeError::kUnknownOp;
  const auto dtype = static_cast<DType>(p[kOffDtype]);
  const auto op = static_cast<ReduceOp>(p[kOffOp]);
  const uint16_t count = get_u16(p + kOffCount);
  const size_t payload_bytes = buf.size() - kHeaderSize;
  const size_t want = size_t{count} * payload_width(flags, dtype);
  if (want > payload_bytes) return DecodeError::kCountBeyondPayload;
  if (want < payload_bytes) return DecodeError::kTrailingBytes;
  const auto exp = static_cast<int16_t>(get_u16(p + kOffExp));
  if ((flags & kFlagPartial) != 0) {
    if ((flags & (kFlagHello | kFlagError)) != 0 || dtype == DType::kInt32 ||
        op != ReduceOp::kSum) {
      return DecodeError::kBadPartial;
    }
  } else if (exp != kNoExponent) {
    return DecodeError::kBadExponent;
  }
  Header& h = out->hdr;
  h.version = p[kOffVersion];
  h.flags = flags;
  h.job = get_u32(p + kOffJob);
  h.seq = get_u32(p + kOffSeq);
  h.rank = get_u16(p + kOffRank);
  const uint16_t slot = get_u16(p + kOffSlot);
  h.slot = slot & kMaxSlot;
  h.shadow = (slot & kShadowBit) != 0;
  h.count = count;
  h.dtype = dtype;
  h.op = op;
  h.coll = get_u32(p + kOffColl);
  h.elems = get_u32(p + kOffElems);
  h.exp = exp;
  h.root = get_u16(p + kOffRoot);
  h.tag = get_u64(p + kOffTag);
  out->payload = p + kHeaderSize;
  out->payload_bytes = payload_bytes;
  return DecodeError::kOk;
}

// Bytes of a packet with this header's flags, dtype and count.
inline size_t packet_size(const Header& h) {
  return kHeaderSize + size_t{h.count} * payload_width(h.flags, h.dtype);
}
inline size_t packet_size(uint16_t count, size_t width) { return kHeaderSize + count * width; }
// A HELLO, WELCOME or ERROR packet of `count` u32 words.
inline constexpr size_t control_packet_size(size_t count) {
  return kHeaderSize + count * kControlWordSize;
}

// HELLO nonces name incarnations and only grow (WIRE.md "Join barrier"): the Unix time in units
// of kNonceTickMs, mod 2^32, and past the previous nonce of the process. `a` is newer than `b`
// when it is less than 2^31 ticks ahead (serial-number arithmetic: 397 days), so an aggregator
// can drop a replayed HELLO of an earlier incarnation.
inline constexpr uint32_t kNonceTickMs = 16;
inline constexpr bool nonce_newer(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(a - b) > 0;
}
// The nonce of an incarnation that starts at `unix_ms`, after one that had `previous` (0: none).
inline constexpr uint32_t next_nonce(uint64_t unix_ms, uint32_t previous) {
  uint32_t n = static_cast<uint32_t>(unix_ms / kNonceTickMs);
  if (previous != 0 && !nonce_newer(n, previous)) n = previous + 1;
  return n == 0 ? 1 : n;
}
// PARTIAL words are at most this many times wider than the elements they stand for (int32 words
// of float8 elements; int64 of float32 and int32 of 16-bit elements are 2x).
inline constexpr size_t kMaxPartialGrowth = 4;
// The largest DATA/RESULT packet of a job whose block is `payload_bytes`, or its largest control
// packet (an ERROR with the bitmap of `world` ranks and a tree note), if larger.
inline constexpr size_t max_data_packet_size(size_t payload_bytes, size_t world = 65535) {
  const size_t data = kHeaderSize + payload_bytes;
  const size_t control = control_packet_size(1 + (world + 31) / 32 + kTreeNoteWords);
  return data > control ? data : control;
}
// The same with a tree's PARTIAL words (up to kMaxPartialGrowth times the block).
inline constexpr size_t max_packet_size(size_t payload_bytes, size_t world = 65535) {
  const size_t partial = kHeaderSize + payload_bytes * kMaxPartialGrowth;
  const size_t data = max_data_packet_size(payload_bytes, world);
  return partial > data ? partial : data;
}

// Control payloads (HELLO, WELCOME, ERROR): u32 words, little-endian.
inline void store_words(uint8_t* dst, const int32_t* src, size_t n) {
  std::memcpy(dst, src, n * kControlWordSize);
}
inline void load_words(int32_t* dst, const uint8_t* src, size_t n) {
  std::memcpy(dst, src, n * kControlWordSize);
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
