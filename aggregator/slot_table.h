// The slot table: the reduction switch's memory, as pure logic (no I/O, no clock, no allocation
// after construction).
//
// A job owns `num_slots` slots; each slot has two copies (the packet's shadow bit picks one). A
// worker streams blocks through a window of slots: block after block reuses a slot, alternating
// its copy, and a worker reuses copy c of a slot only after it has received the result of the
// other copy's round, which completed only after every rank had received copy c's result. So
// while one copy collects a new round, the other (the shadow copy) still holds the last result
// for ranks whose result packet was lost and who retransmit (SwitchML's scheme).
//
// Each copy records the block sequence of its round. A packet for a copy:
//   * same sequence, rank not yet in the contributor bitmap: added exactly once (the first
//     contribution overwrites, the others add, or take MIN/MAX); the last one completes the copy
//     and its result goes to every rank;
//   * same sequence, rank already present: a duplicate; if the copy is complete the sender gets
//     the result again; if not and the packet is a retransmission, the sender gets the bitmap so
//     it can name the missing ranks;
//   * newer sequence (serial-number arithmetic): starts a new round in this copy, discarding an
//     incomplete older round (its collective was abandoned after a deadline);
//   * older sequence: a stale duplicate delayed past its round, or a late rank's packet for a
//     round the others gave up; dropped (the engine tells the sender which round the copy holds:
//     kSuperseded). (SwitchML, which has no sequence, would add such a packet to the next round.)
//   * an aborted round (abort(): a rank gave up on it at its deadline): never completes; every
//     DATA for it is answered with kAborted, so that a rank arriving late fails as the others
//     did instead of completing what they abandoned.
// How a round reduces (wire v2, protocol/QUANTIZATION.md): int32 SUM and MIN/MAX as the
// contributions arrive, in int32 in the result's own words (SUM wraps modulo 2^32 by definition,
// MIN/MAX are exact: no wider accumulator, no final pass), MIN/MAX of floats in int32 too (the
// codec's order-preserving keys); a float SUM keeps every rank's raw words and block exponent and,
// when the round completes, quantizes them all with E = MAX, adds them in integers and converts
// the sum to the user's type once (codec.h). The result is kept in the user's width for RESULT.
// Aggregation trees: a leaf table (defer_float_sum) stops a float SUM round at its exponent and
// quantizes with the root's E on request (quantize_partial); a root table collects the leaves'
// PARTIAL exponent requests in a round and then, in the same copy, their PARTIAL words.
// Integer addition is associative and E is a MAX, so results are bitwise identical whatever the
// arrival order, loss or duplication.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "ina/base/status.h"
#include "ina/protocol/codec.h"
#include "ina/protocol/types.h"
#include "ina/protocol/wire.h"

namespace ina::agg {

// The copy index of (slot, shadow copy): copy 2 * slot + shadow. Every per-copy array of the
// table and of the engine is indexed by it.
inline constexpr size_t copy_index(uint16_t slot, bool shadow) {
  return size_t{slot} * 2 + (shadow ? 1 : 0);
}

struct SlotTableConfig {
  uint32_t num_slots = 512;  // per job; at most wire::kMaxSlot + 1
  // The block in bytes (DATA/RESULT payload): max_payload_bytes / width elements per block.
  uint32_t max_payload_bytes = wire::kDefaultPayloadBytes;  // 4 .. 16384, a multiple of 4
  uint32_t world_size = 1;                                  // contributors per round, 1 .. 65535
  // Tree leaf: a completed float SUM round waits for the root's exponent (quantize_partial)
  // instead of being converted.
  bool defer_float_sum = false;
  // The N of B = magnitude_bits(dtype, N) for float SUM (a leaf: the job's global world, whose
  // every rank the root's sum includes). 0: world_size.
  uint32_t quant_world = 0;

  bool operator==(const SlotTableConfig&) const = default;
};

enum class Verdict : uint8_t {
  kAdded,            // contribution added; nothing to send
  kCompleted,        // this contribution completed the copy: send the result to every rank
  kExpCompleted,     // root: the leaves' exponent requests are all in: answer every leaf
  kResendExp,        // root: a leaf's request for an answered exponent: answer the sender
  kResendResult,     // duplicate of a completed copy: send the result to the sender
  kDuplicate,        // duplicate of an incomplete copy: nothing to send
  kReportMissing,    // retransmission to an incomplete copy: send the bitmap to the sender
  kStale,            // older round than the copy holds: dropped
  kMismatch,         // ranks disagree on the round's shape and every rank is in (a poisoned copy:
                     // CopyView::poisoned), or a leaf's words without their exponent round: the
                     // sender is told
  kMismatchPending,  // a poisoned copy still waiting for ranks: nothing to send yet
  kAborted,          // the round was aborted by a rank that gave up on it (abort()): the sender
                     // is told (CopyView::aborted_by)
  kBadSlot,          // slot index beyond the table: dropped
  kBadRank,          // rank >= world size: dropped
  kTooLarge,         // payload beyond the job's block: dropped
  kCount_,
};
const char* verdict_name(Verdict v);

// What a copy's round collects (from its first contribution).
enum class CopyMode : uint8_t {
  kReduce,   // int32 SUM, MIN/MAX: reduced as the contributions arrive
  kRaw,      // float SUM: every rank's words kept until the round completes
  kExp,      // root: the leaves' PARTIAL exponent requests
  kPartial,  // root: the leaves' PARTIAL fixed-point words (after kExp, same copy)
};

// A float SUM DATA packet whose tag the engine's receive pass verified: its words stored in the
// table's storage (raw_words_for), or left in the datagram where that packet completes its round
// (in_datagram: the completion reads them there, so they are never copied); their scan when the
// pass made it too (float32), else the table scans them.
struct StoredWords {
  bool scanned = false;
  codec::Scan scan;
  bool in_datagram = false;
};

// A view of one copy's state, valid until the next mutating call.
struct CopyView {
  uint16_t slot = 0;
  bool shadow = false;
  bool used = false;  // has held a round
  bool complete = false;
  BlockSeq seq = 0;
  uint16_t count = 0;
  DType dtype = DType::kInt32;
  ReduceOp op = ReduceOp::kSum;
  uint32_t elems = 0;
  uint32_t coll = 0;  // the first contributor's (not compared)
  uint16_t root = wire::kNoRoot;
  CopyMode mode = CopyMode::kReduce;
  // kRaw: MAX of the ranks' block exponents; kExp: MAX of the leaves' requests; kPartial: the
  // words' scale exponent (E - B, from the packets).
  int16_t exp = kNoExponent;
  int16_t answer_exp = kNoExponent;  // root: the E it answered (kExp complete, kPartial)
  bool nonfinite = false;            // OR over contributors (and, kPartial, the exponent round)
  bool partial_ready = false;        // leaf: quantize_partial() ran for this round
  uint32_t contributors = 0;
  // Complete copy: `count` elements of the user's type (little-endian, what RESULT carries).
  const uint8_t* result = nullptr;
  // Leaf, after quantize_partial: `count` words of wire::acc_bytes(dtype) bytes.
  const uint8_t* partial = nullptr;
  std::span<const uint64_t> bitmap;  // contributor bitmap, bit r = rank r
  // Ranks disagreed on the round's shape (count, dtype, op, elems, root): the first contributor's
  // shape is the fields above, the first other shape is other_*, and other_ranks has a bit for
  // every rank that sent a shape other than the first. Such a copy never completes.
  bool poisoned = false;
  uint16_t other_count = 0;
  DType other_dtype = DType::kInt32;
  ReduceOp other_op = ReduceOp::kSum;
  uint32_t other_elems = 0;
  uint16_t other_root = wire::kNoRoot;
  std::span<const uint64_t> other_ranks;
  // A rank gave up on the round (abort()): it never completes. kNoAbort: not aborted.
  static constexpr uint32_t kNoAbort = 0xFFFFFFFFu;
  uint32_t aborted_by = kNoAbort;
  uint32_t abort_cause = 0;
};

class SlotTable {
 public:
  static Result<std::unique_ptr<SlotTable>> create(const SlotTableConfig& cfg);
  ~SlotTable();  // out of line: Copy is complete only in slot_table.cc

  // Processes a DATA or PARTIAL packet already validated by wire::decode (RESULT, HELLO and
  // ERROR are the engine's business). `stored`: a float SUM DATA packet whose words the engine's
  // receive pass already copied to raw_words_for(pkt.hdr) (see there).
  Verdict on_data(const wire::PacketView& pkt, const StoredWords* stored = nullptr);
  // Where a float SUM DATA packet's words go (rank h.rank's raw words in the copy it names), when
  // nothing live is there: the rank has no words in the copy's round, or its complete round
  // consumed them (finish()). The engine verifies the packet's tag while it copies (and scans)
  // its words there in one pass (wire::tag_ok_copy), since a forged packet that writes them
  // changes nothing the table reads; then on_data(pkt, &stored). Null for any other packet, or
  // when the words are live (a duplicate of a contribution the round holds, a leaf's complete
  // round waiting for its root's exponent): the engine verifies the tag first, as for every
  // other packet.
  //
  // *completes (when not null) says whether the packet is the last contribution its round waits
  // for (a contributor of the round's shape, the others all in; not at a tree leaf, which keeps
  // every rank's words for its root's exponent): its words are then needed only by the completion
  // that on_data runs at once, so the engine verifies and scans them in the datagram and passes
  // StoredWords::in_datagram instead of copying them (the words stay where a forged packet cannot
  // write). on_data gives the same result either way.
  uint8_t* raw_words_for(const wire::Header& h, bool* completes = nullptr);

  CopyView copy(uint16_t slot, bool shadow) const;
  // Tree leaf: quantizes a complete, deferred float SUM round (kRaw) with the root's exponent
  // `exp` (and its non-finite mark) into PARTIAL words (CopyView::partial). False, and nothing
  // changed, when the copy is not such a round of sequence `seq`.
  bool quantize_partial(uint16_t slot, bool shadow, BlockSeq seq, int16_t exp, bool nonfinite);
  // Aggregation trees: replaces the result of a complete copy with the final result its parent
  // aggregator sent (same round: seq, count, dtype and op), with the parent's non-finite mark.
  // False, and nothing changed, when the copy is not complete or the packet is not for its round.
  bool store_result(const wire::PacketView& result);
  // Rank `rank` gives up on the round (h.slot, h.shadow, h.seq), for `cause` (wire::kAbort*):
  // an incomplete round of that sequence, or a copy that holds an older round or none, is marked
  // aborted, so that every later DATA for that round gets Verdict::kAborted instead of completing
  // it. False, and nothing changed, for a complete round, an older sequence than the copy holds
  // (a replay) or a slot beyond the table.
  bool abort(const wire::Header& h, uint32_t rank, uint32_t cause);
  // Contributors of a copy's current round (0 for a slot beyond the table); cheap.
  uint32_t contributors(uint16_t slot, bool shadow) const;
  // Forgets every round (a new incarnation of the job).
  void reset();

  const SlotTableConfig& config() const { return cfg_; }
  uint32_t bitmap_words() const { return bitmap_words_; }

 private:
  explicit SlotTable(const SlotTableConfig& cfg);
  struct Copy;
  // `last`: the words of the rank `last_rank` that completed the round, where they are not in
  // the table's storage (null: they are).
  void finish(size_t k, const uint8_t* last = nullptr, uint32_t last_rank = 0);
  // A DATA packet for the poisoned copy k: records its rank (and whether its shape is the first).
  Verdict poisoned_data(size_t k, const wire::Header& h);
  static bool same_shape(const Copy& c, const wire::Header& h);

  SlotTableConfig cfg_;
  uint32_t quant_world_ = 1;
  uint32_t acc_words_ = 0;     // int64 words of accumulators per copy (4 bytes per block byte)
  uint32_t bitmap_words_ = 0;  // uint64 words per bitmap
  std::vector<Copy> copies_;   // 2 per slot: copy_index(slot, shadow)
  // The large arrays are calloc'ed: zero pages the kernel maps on first touch, so a table sized
  // for the largest block and every slot costs memory for the slots and bytes the ranks use
  // (their window, their negotiated block), not for all of it (std::vector would write it all).
  template <typename T>
  class ZeroedArray {
   public:
    explicit ZeroedArray(size_t n) : p_(static_cast<T*>(std::calloc(n == 0 ? 1 : n, sizeof(T)))) {
      if (p_ == nullptr) throw std::bad_alloc();
    }
    T* data() { return p_.get(); }
    const T* data() const { return p_.get(); }

   private:
    struct Free {
      void operator()(T* p) const { std::free(p); }
    };
    std::unique_ptr<T, Free> p_;
  };
  ZeroedArray<int64_t> acc_;                // accumulators, acc_words_ per copy (int32 views too)
  ZeroedArray<uint8_t> result_;             // max_payload_bytes per copy
  ZeroedArray<uint8_t> raw_;                // float SUM: world_size * max_payload_bytes per copy
  std::vector<uint64_t> bitmaps_;           // bitmap_words_ per copy
  std::vector<uint64_t> other_bitmaps_;     // poisoned copies: the ranks of another shape
  std::vector<const uint8_t*> rank_words_;  // finish(): each rank's words of the completed round
};

}  // namespace ina::agg
