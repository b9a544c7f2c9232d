// The slot table: see slot_table.h for the round semantics.
//
// Layout: copy k (k = slot * 2 + shadow) owns acc_[k * max_elems, +max_elems) and
// bitmaps_[k * bitmap_words_, +bitmap_words_). Everything is allocated once in create(); on_data()
// touches only the one copy its packet names, so it never allocates, locks or logs.
#include "aggregator/slot_table.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "ina/protocol/vec.h"

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
// with GCC/Clang vector extensions: kBytes / 4 words at a time, byte swap as one constant byte
// permutation where the target has a byte shuffle (pshufb with SSSE3, as in builds with DPDK's
// -march=corei7; vpshufb with AVX2; NEON), else by shifts and masks (plain SSE2), then a scalar
// tail. memcpy keeps the unaligned loads and stores well defined.
//
// Each loop is an always-inlined template (vector types and byte swap: ina/protocol/vec.h),
// instantiated once for the build's target (16-byte vectors) and, on x86, once more inside an AVX2
// function (32-byte vectors, twice the words per instruction) and, in builds for baseline x86, an
// SSSE3 one; the table chooses once when it is created (the CPU's AVX2 and SSSE3 bits).
using vec::kTargetShuffle;
using vec::load_be;
using vec::Vec;

inline uint32_t load_be1(const uint8_t* p) { return wire::get_u32(p); }

// acc = payload (the round's first contribution).
template <size_t kBytes, bool kShuffle>
[[gnu::always_inline]] inline void copy_impl(int32_t* __restrict acc,
                                             const uint8_t* __restrict src, size_t n) {
  constexpr size_t L = Vec<kBytes>::kLanes;
  size_t i = 0;
  for (; i + L <= n; i += L) {
    typename Vec<kBytes>::U32 v;
    load_be<kBytes, kShuffle>(src + i * wire::kElemSize, v);
    std::memcpy(acc + i, &v, sizeof v);
  }
  for (; i < n; ++i) acc[i] = static_cast<int32_t>(load_be1(src + i * wire::kElemSize));
}

// acc += payload, wrapping modulo 2^32 (done in uint32: signed overflow would be UB).
template <size_t kBytes, bool kShuffle>
[[gnu::always_inline]] inline void add_impl(int32_t* __restrict acc,
                                            const uint8_t* __restrict src, size_t n) {
  constexpr size_t L = Vec<kBytes>::kLanes;
  size_t i = 0;
  for (; i + L <= n; i += L) {
    typename Vec<kBytes>::U32 a, v;
    std::memcpy(&a, acc + i, sizeof a);
    load_be<kBytes, kShuffle>(src + i * wire::kElemSize, v);
    a += v;
    std::memcpy(acc + i, &a, sizeof a);
  }
  for (; i < n; ++i) {
    acc[i] = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) +
                                  load_be1(src + i * wire::kElemSize));
  }
}

// acc = min(acc, payload) or max(acc, payload), as signed int32 (the quantizer maps floats to
// int32 by an order-preserving bijection, so this is also MIN/MAX of floats).
template <size_t kBytes, bool kShuffle, bool kMax>
[[gnu::always_inline]] inline void minmax_impl(int32_t* __restrict acc,
                                               const uint8_t* __restrict src, size_t n) {
  using I = typename Vec<kBytes>::I32;
  constexpr size_t L = Vec<kBytes>::kLanes;
  size_t i = 0;
  for (; i + L <= n; i += L) {
    I a;
    std::memcpy(&a, acc + i, sizeof a);
    typename Vec<kBytes>::U32 w;
    load_be<kBytes, kShuffle>(src + i * wire::kElemSize, w);
    const I v = reinterpret_cast<I>(w);
    I take_v;  // lanes: -1 where v wins, else 0
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

}  // namespace

// One set of loops: the first contribution, SUM, MIN, MAX.
struct SlotTable::Kernels {
  void (*copy)(int32_t*, const uint8_t*, size_t);
  void (*add)(int32_t*, const uint8_t*, size_t);
  void (*min)(int32_t*, const uint8_t*, size_t);
  void (*max)(int32_t*, const uint8_t*, size_t);
};

namespace {
using Kernels = SlotTable::Kernels;

void copy_base(int32_t* a, const uint8_t* s, size_t n) { copy_impl<16, kTargetShuffle>(a, s, n); }
void add_base(int32_t* a, const uint8_t* s, size_t n) { add_impl<16, kTargetShuffle>(a, s, n); }
void min_base(int32_t* a, const uint8_t* s, size_t n) {
  minmax_impl<16, kTargetShuffle, false>(a, s, n);
}
void max_base(int32_t* a, const uint8_t* s, size_t n) {
  minmax_impl<16, kTargetShuffle, true>(a, s, n);
}
constexpr Kernels kBaseKernels{copy_base, add_base, min_base, max_base};

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
[[gnu::target("avx2,tune=haswell")]] void copy_avx2(int32_t* a, const uint8_t* s, size_t n) {
  copy_impl<32, true>(a, s, n);
}
[[gnu::target("avx2,tune=haswell")]] void add_avx2(int32_t* a, const uint8_t* s, size_t n) {
  add_impl<32, true>(a, s, n);
}
[[gnu::target("avx2,tune=haswell")]] void min_avx2(int32_t* a, const uint8_t* s, size_t n) {
  minmax_impl<32, true, false>(a, s, n);
}
[[gnu::target("avx2,tune=haswell")]] void max_avx2(int32_t* a, const uint8_t* s, size_t n) {
  minmax_impl<32, true, true>(a, s, n);
}
constexpr Kernels kAvx2Kernels{copy_avx2, add_avx2, min_avx2, max_avx2};
#if !defined(__SSSE3__)
// Built for baseline x86 (without DPDK's -march=corei7): the 16-byte loops with pshufb too, for
// CPUs with SSSE3 but not AVX2, instead of the shift-and-mask byte swap.
#define INA_SLOT_TABLE_SSSE3_DISPATCH 1
[[gnu::target("ssse3")]] void copy_ssse3(int32_t* a, const uint8_t* s, size_t n) {
  copy_impl<16, true>(a, s, n);
}
[[gnu::target("ssse3")]] void add_ssse3(int32_t* a, const uint8_t* s, size_t n) {
  add_impl<16, true>(a, s, n);
}
[[gnu::target("ssse3")]] void min_ssse3(int32_t* a, const uint8_t* s, size_t n) {
  minmax_impl<16, true, false>(a, s, n);
}
[[gnu::target("ssse3")]] void max_ssse3(int32_t* a, const uint8_t* s, size_t n) {
  minmax_impl<16, true, true>(a, s, n);
}
constexpr Kernels kSsse3Kernels{copy_ssse3, add_ssse3, min_ssse3, max_ssse3};
#endif
#endif

const Kernels& kernels(bool wide) {
#ifdef __GNUC__
#if defined(__x86_64__) || defined(__i386__)
  if (wide && __builtin_cpu_supports("avx2")) return kAvx2Kernels;
#ifdef INA_SLOT_TABLE_SSSE3_DISPATCH
  if (__builtin_cpu_supports("ssse3")) return kSsse3Kernels;
#endif
#endif
#endif
  (void)wide;
  return kBaseKernels;
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
      kernels_(&kernels(cfg.wide_vectors)),
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
    kernels_->copy(acc, pkt.payload, h.count);
  } else {
    if (h.count != c.count || h.dtype != c.dtype || h.op != c.op || h.exp != c.exp) {
      return Verdict::kMismatch;
    }
    switch (c.op) {
      case ReduceOp::kSum: kernels_->add(acc, pkt.payload, h.count); break;
      case ReduceOp::kMin: kernels_->min(acc, pkt.payload, h.count); break;
      case ReduceOp::kMax: kernels_->max(acc, pkt.payload, h.count); break;
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
  kernels_->copy(acc_.data() + k * cfg_.max_elems, pkt.payload, h.count);
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
