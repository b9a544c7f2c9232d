// The slot table: see slot_table.h for the round semantics.
//
// Layout: copy k (k = slot * 2 + shadow) owns acc_[k * max_elems, +max_elems) and
// bitmaps_[k * bitmap_words_, +bitmap_words_). Everything is allocated once in create(); on_data()
// touches only the one copy its packet names, so it never allocates, locks or logs.
#include "aggregator/slot_table.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <new>
#include <string>

namespace ina::agg {

struct SlotTable::Copy {
  BlockSeq seq = 0;
  uint32_t contributors = 0;
  uint16_t count = 0;
  DType dtype = DType::kInt32;
  ReduceOp op = ReduceOp::kSum;
  int16_t exp = kNoExponent;
  int16_t next_exp = kNoExponent;
  bool used = false;
  bool complete = false;
  bool nonfinite = false;
};

namespace {

// Limits of the configuration (SlotTableConfig's comments; the wire's 15-bit slot index).
constexpr uint32_t kMaxSlots = uint32_t{wire::kMaxSlot} + 1;
constexpr uint32_t kMaxElems = 16384;
constexpr uint32_t kMaxWorld = 65535;

// Payload reduction over big-endian words.
//
// GCC 12 at -O2 does not vectorize a loop over __builtin_bswap32 (baseline x86-64 has no byte
// shuffle, and the cheap cost model refuses loops that need an epilogue), so the bulk is written
// with GCC/Clang vector extensions: 4 words at a time, byte swap as one constant byte permutation
// where the target has a byte shuffle (pshufb with SSSE3, as in builds with DPDK's -march=corei7;
// NEON), else by shifts and masks (plain SSE2), then a scalar tail. memcpy keeps the unaligned
// loads and stores well defined.
using U32x4 = uint32_t __attribute__((vector_size(16)));
using I32x4 = int32_t __attribute__((vector_size(16)));
constexpr size_t kLanes = 4;

inline U32x4 bswap_lanes(U32x4 w) {
#if defined(__SSSE3__) || defined(__ARM_NEON)
  using U8x16 = uint8_t __attribute__((vector_size(16)));
  const U8x16 b = std::bit_cast<U8x16>(w);
  return std::bit_cast<U32x4>(
      __builtin_shufflevector(b, b, 3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12));
#else
  // Without a byte shuffle GCC lowers the permutation to scalar code: shifts and masks instead.
  return (w >> 24) | ((w >> 8) & 0xFF00u) | ((w << 8) & 0xFF0000u) | (w << 24);
#endif
}
inline U32x4 load_be(const uint8_t* p) {
  U32x4 w;
  std::memcpy(&w, p, sizeof w);
  return bswap_lanes(w);
}
inline uint32_t load_be1(const uint8_t* p) { return wire::get_u32(p); }

// acc = payload (the round's first contribution).
void copy_words(int32_t* __restrict acc, const uint8_t* __restrict src, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const U32x4 v = load_be(src + i * wire::kElemSize);
    std::memcpy(acc + i, &v, sizeof v);
  }
  for (; i < n; ++i) acc[i] = static_cast<int32_t>(load_be1(src + i * wire::kElemSize));
}

// acc += payload, wrapping modulo 2^32 (done in uint32: signed overflow would be UB).
void add_words(int32_t* __restrict acc, const uint8_t* __restrict src, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    U32x4 a;
    std::memcpy(&a, acc + i, sizeof a);
    a += load_be(src + i * wire::kElemSize);
    std::memcpy(acc + i, &a, sizeof a);
  }
  for (; i < n; ++i) {
    acc[i] = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) +
                                  load_be1(src + i * wire::kElemSize));
  }
}

// acc = min(acc, payload) or max(acc, payload), as signed int32 (the quantizer maps floats to
// int32 by an order-preserving bijection, so this is also MIN/MAX of floats).
template <bool kMax>
void minmax_words(int32_t* __restrict acc, const uint8_t* __restrict src, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    I32x4 a;
    std::memcpy(&a, acc + i, sizeof a);
    const I32x4 v = reinterpret_cast<I32x4>(load_be(src + i * wire::kElemSize));
    I32x4 take_v;  // lanes: -1 where v wins, else 0
    if constexpr (kMax) {
      take_v = v > a;
    } else {
      take_v = v < a;
    }
    a = (v & take_v) | (a & ~take_v);
    std::memcpy(acc + i, &a, sizeof a);
  }
  for (; i < n; ++i) {
    const int32_t v = static_cast<int32_t>(load_be1(src + i * wire::kElemSize));
    acc[i] = kMax ? std::max(acc[i], v) : std::min(acc[i], v);
  }
}

std::string range_error(const char* field, uint32_t lo, uint32_t hi, uint64_t got) {
  return std::string("slot table: ") + field + " must be in " + std::to_string(lo) + ".." +
         std::to_string(hi) + ", got " + std::to_string(got);
}

}  // namespace

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kAdded: return "added";
    case Verdict::kCompleted: return "completed";
    case Verdict::kResendResult: return "resend_result";
    case Verdict::kDuplicate: return "duplicate";
    case Verdict::kReportMissing: return "report_missing";
    case Verdict::kStale: return "stale";
    case Verdict::kMismatch: return "mismatch";
    case Verdict::kBadSlot: return "bad_slot";
    case Verdict::kBadRank: return "bad_rank";
    case Verdict::kTooLarge: return "too_large";
    case Verdict::kCount_: break;
  }
  return "?";
}

Result<std::unique_ptr<SlotTable>> SlotTable::create(const SlotTableConfig& cfg) {
  if (cfg.num_slots < 1 || cfg.num_slots > kMaxSlots) {
    return invalid_argument(range_error("num_slots", 1, kMaxSlots, cfg.num_slots));
  }
  if (cfg.max_elems < 1 || cfg.max_elems > kMaxElems) {
    return invalid_argument(range_error("max_elems", 1, kMaxElems, cfg.max_elems));
  }
  if (cfg.world_size < 1 || cfg.world_size > kMaxWorld) {
    return invalid_argument(range_error("world_size", 1, kMaxWorld, cfg.world_size));
  }
  // The largest table (32768 slots x 16384 elements) is 4 GiB of accumulators: an allocation
  // failure is a configuration the machine cannot hold, reported as such, not a crash.
  try {
    return std::unique_ptr<SlotTable>(new SlotTable(cfg));
  } catch (const std::bad_alloc&) {
    const uint64_t bytes = uint64_t{cfg.num_slots} * 2 * cfg.max_elems * sizeof(int32_t);
    return resource_exhausted("slot table: cannot allocate " + std::to_string(bytes) +
                              " bytes of accumulators (num_slots " +
                              std::to_string(cfg.num_slots) + ", max_elems " +
                              std::to_string(cfg.max_elems) + ")");
  }
}

SlotTable::SlotTable(const SlotTableConfig& cfg)
    : cfg_(cfg),
      bitmap_words_((cfg.world_size + 63) / 64),
      copies_(size_t{cfg.num_slots} * 2),
      acc_(size_t{cfg.num_slots} * 2 * cfg.max_elems),
      bitmaps_(size_t{cfg.num_slots} * 2 * bitmap_words_) {}

SlotTable::~SlotTable() = default;

void SlotTable::reset() {
  std::fill(copies_.begin(), copies_.end(), Copy{});
  std::fill(bitmaps_.begin(), bitmaps_.end(), uint64_t{0});
}

Verdict SlotTable::on_data(const wire::PacketView& pkt) {
  const wire::Header& h = pkt.hdr;
  if (h.slot >= cfg_.num_slots) [[unlikely]] return Verdict::kBadSlot;
  if (h.rank >= cfg_.world_size) [[unlikely]] return Verdict::kBadRank;
  if (h.count > cfg_.max_elems) [[unlikely]] return Verdict::kTooLarge;

  const size_t k = size_t{h.slot} * 2 + (h.shadow ? 1 : 0);
  Copy& c = copies_[k];
  uint64_t* bitmap = bitmaps_.data() + k * bitmap_words_;
  int32_t* acc = acc_.data() + k * cfg_.max_elems;

  if (c.used) {
    // Serial-number arithmetic: the sequence wraps after 2^32 blocks, and a copy is reused every
    // other use of its slot, so the two rounds compared are always close together.
    const int32_t ahead = static_cast<int32_t>(h.seq - c.seq);
    if (ahead < 0) return Verdict::kStale;
    if (ahead > 0) c.used = false;  // a newer round: abandon this one (complete or not)
  }
  if (!c.used) {
    c = Copy{};
    c.used = true;
    c.seq = h.seq;
    std::fill_n(bitmap, bitmap_words_, uint64_t{0});
  }

  const uint64_t bit = uint64_t{1} << (h.rank % 64);
  uint64_t& word = bitmap[h.rank / 64];
  if ((word & bit) != 0) {
    if (c.complete) return Verdict::kResendResult;
    return h.has(wire::kFlagRetransmit) ? Verdict::kReportMissing : Verdict::kDuplicate;
  }

  if (c.contributors == 0) {
    // The round's first contributor defines its shape and starts the accumulator.
    c.count = h.count;
    c.dtype = h.dtype;
    c.op = h.op;
    c.exp = h.exp;
    copy_words(acc, pkt.payload, h.count);
  } else {
    if (h.count != c.count || h.dtype != c.dtype || h.op != c.op || h.exp != c.exp) {
      return Verdict::kMismatch;
    }
    switch (c.op) {
      case ReduceOp::kSum: add_words(acc, pkt.payload, h.count); break;
      case ReduceOp::kMin: minmax_words<false>(acc, pkt.payload, h.count); break;
      case ReduceOp::kMax: minmax_words<true>(acc, pkt.payload, h.count); break;
    }
  }
  word |= bit;
  c.next_exp = std::max(c.next_exp, h.next_exp);  // kNoExponent (INT16_MIN) is the identity
  c.nonfinite = c.nonfinite || h.has(wire::kFlagNonFinite);
  if (++c.contributors == cfg_.world_size) {
    c.complete = true;
    return Verdict::kCompleted;
  }
  return Verdict::kAdded;
}

bool SlotTable::store_result(const wire::PacketView& pkt) {
  const wire::Header& h = pkt.hdr;
  if (h.slot >= cfg_.num_slots) return false;
  const size_t k = size_t{h.slot} * 2 + (h.shadow ? 1 : 0);
  Copy& c = copies_[k];
  if (!c.used || !c.complete || c.seq != h.seq || c.count != h.count || c.dtype != h.dtype ||
      c.op != h.op || c.exp != h.exp) {
    return false;
  }
  copy_words(acc_.data() + k * cfg_.max_elems, pkt.payload, h.count);
  c.next_exp = h.next_exp;
  c.nonfinite = h.has(wire::kFlagNonFinite);
  return true;
}

uint32_t SlotTable::contributors(uint16_t slot, bool shadow) const {
  if (slot >= cfg_.num_slots) return 0;
  return copies_[size_t{slot} * 2 + (shadow ? 1 : 0)].contributors;
}

CopyView SlotTable::copy(uint16_t slot, bool shadow) const {
  CopyView v;
  v.slot = slot;
  v.shadow = shadow;
  if (slot >= cfg_.num_slots) return v;
  const size_t k = size_t{slot} * 2 + (shadow ? 1 : 0);
  const Copy& c = copies_[k];
  v.used = c.used;
  v.complete = c.complete;
  v.seq = c.seq;
  v.count = c.count;
  v.dtype = c.dtype;
  v.op = c.op;
  v.exp = c.exp;
  v.next_exp = c.next_exp;
  v.nonfinite = c.nonfinite;
  v.contributors = c.contributors;
  v.data = acc_.data() + k * cfg_.max_elems;
  v.bitmap = std::span<const uint64_t>(bitmaps_.data() + k * bitmap_words_, bitmap_words_);
  return v;
}

}  // namespace ina::agg
