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
//   * older sequence: a stale duplicate delayed past its round; dropped. (SwitchML, which has no
//     sequence, would add such a packet to the next round.)
// Integer addition is associative, so the result is bitwise identical whatever the arrival order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ina/protocol/status.h"
#include "ina/protocol/types.h"
#include "ina/protocol/wire.h"

namespace ina::agg {

struct SlotTableConfig {
  uint32_t num_slots = 512;    // per job; at most wire::kMaxSlot + 1
  uint16_t max_elems = 256;    // largest block (elements per packet)
  uint32_t world_size = 1;     // 1 .. 65535
  // The payload loops: AVX2 (32-byte vectors) where the CPU has it, else 16-byte vectors (with
  // SSSE3's byte shuffle where the CPU has it). False keeps the 16-byte loops (tests compare both).
  bool wide_vectors = true;

  bool operator==(const SlotTableConfig&) const = default;
};

enum class Verdict : uint8_t {
  kAdded,          // contribution added; nothing to send
  kCompleted,      // this contribution completed the copy: send the result to every rank
  kResendResult,   // duplicate of a completed copy: send the result to the sender
  kDuplicate,      // duplicate of an incomplete copy: nothing to send
  kReportMissing,  // retransmission to an incomplete copy: send the bitmap to the sender
  kStale,          // older round than the copy holds: dropped
  kMismatch,       // disagrees with its round (count, dtype, op, exponent): dropped
  kBadSlot,        // slot index beyond the table: dropped
  kBadRank,        // rank >= world size: dropped
  kTooLarge,       // count > max_elems: dropped
  kCount_,
};
const char* verdict_name(Verdict v);

// A view of one copy's state, valid until the next mutating call.
struct CopyView {
  uint16_t slot = 0;
  bool shadow = false;
  bool used = false;          // has held a round
  bool complete = false;
  BlockSeq seq = 0;
  uint16_t count = 0;
  DType dtype = DType::kInt32;
  ReduceOp op = ReduceOp::kSum;
  int16_t exp = kNoExponent;
  int16_t next_exp = kNoExponent;   // MAX over contributors
  bool nonfinite = false;           // OR over contributors
  uint32_t contributors = 0;
  const int32_t* data = nullptr;               // `count` reduced values, host order
  std::span<const uint64_t> bitmap;            // contributor bitmap, bit r = rank r
};

class SlotTable {
 public:
  static Result<std::unique_ptr<SlotTable>> create(const SlotTableConfig& cfg);
  ~SlotTable();  // out of line: Copy is complete only in slot_table.cc

  // Processes a DATA packet already validated by wire::decode (any flags but RESULT/HELLO/ERROR).
  Verdict on_data(const wire::PacketView& pkt);

  CopyView copy(uint16_t slot, bool shadow) const;
  // Aggregation trees: replaces the reduced values of a complete copy with the final result its
  // parent aggregator sent (same round: seq, count, dtype, op and exponent), with the parent's
  // next-exponent and non-finite marks. False, and nothing changed, when the copy is not complete
  // or the packet is not for its round.
  bool store_result(const wire::PacketView& result);
  // Contributors of a copy's current round (0 for a slot beyond the table); cheap.
  uint32_t contributors(uint16_t slot, bool shadow) const;
  // Forgets every round (a new incarnation of the job).
  void reset();

  const SlotTableConfig& config() const { return cfg_; }
  uint32_t bitmap_words() const { return bitmap_words_; }

 private:
  explicit SlotTable(const SlotTableConfig& cfg);
  struct Copy;
 public:
  struct Kernels;  // the payload loops chosen for this CPU (slot_table.cc)
 private:
  SlotTableConfig cfg_;
  const Kernels* kernels_ = nullptr;
  uint32_t bitmap_words_ = 0;          // uint64 words per bitmap
  std::vector<Copy> copies_;           // 2 per slot: index slot*2 + shadow
  std::vector<int32_t> acc_;           // accumulators, max_elems per copy
  std::vector<uint64_t> bitmaps_;      // bitmap_words_ per copy
};

}  // namespace ina::agg
