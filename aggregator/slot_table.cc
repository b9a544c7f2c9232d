// The slot table: see slot_table.h for the round semantics.
//
// Layout: copy k (k = copy_index(slot, shadow)) owns acc_[k * acc_words_, +acc_words_) (int64
// words holding float MIN/MAX's int32 keys or PARTIAL words: int64 for float32, int32 for the
// narrower types; an int32 round reduces in its result's words instead),
// result_[k * max_payload_bytes, +max_payload_bytes), raw_[k * world * max_payload_bytes, +world *
// max_payload_bytes) (rank r's words at r * max_payload_bytes) and bitmaps_[k * bitmap_words_,
// +bitmap_words_). Everything is allocated once in create(); on_data() touches only the one copy
// its packet names, so it never allocates, locks or logs. The reductions are the block codec's
// (protocol/codec.h).
#include "aggregator/slot_table.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "ina/protocol/codec.h"

namespace ina::agg {

struct SlotTable::Copy {
  BlockSeq seq = 0;
  uint32_t contributors = 0;
  uint32_t elems = 0;
  uint32_t coll = 0;
  uint16_t count = 0;
  uint16_t root = wire::kNoRoot;
  DType dtype = DType::kInt32;
  ReduceOp op = ReduceOp::kSum;
  CopyMode mode = CopyMode::kReduce;
  int16_t exp = kNoExponent;
  int16_t answer_exp = kNoExponent;
  bool used = false;
  bool complete = false;
  bool nonfinite = false;
  bool partial_ready = false;
  bool poisoned = false;  // ranks disagreed on the shape (CopyView)
  uint32_t aborted_by = CopyView::kNoAbort;
  uint32_t abort_cause = 0;
  uint16_t other_count = 0;
  uint16_t other_root = wire::kNoRoot;
  DType other_dtype = DType::kInt32;
  ReduceOp other_op = ReduceOp::kSum;
  uint32_t other_elems = 0;
};

namespace {

// Limits of the configuration (SlotTableConfig's comments; the wire's 15-bit slot index).
constexpr uint32_t kMaxSlots = uint32_t{wire::kMaxSlot} + 1;
constexpr uint32_t kMaxPayload = 16384;
constexpr uint32_t kMaxWorld = 65535;
// Accumulator bytes per byte of a block: 4 (int32 keys and PARTIAL words of the 1-byte float8
// types); float32's int64 PARTIAL words need 2.
constexpr uint32_t kAccBytesPerByte = 4;

std::string range_error(const char* field, uint32_t lo, uint32_t hi, uint64_t got) {
  return std::string("slot table: ") + field + " must be in " + std::to_string(lo) + ".." +
         std::to_string(hi) + ", got " + std::to_string(got);
}

}  // namespace

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kAdded: return "added";
    case Verdict::kCompleted: return "completed";
    case Verdict::kExpCompleted: return "exp_completed";
    case Verdict::kResendExp: return "resend_exp";
    case Verdict::kResendResult: return "resend_result";
    case Verdict::kDuplicate: return "duplicate";
    case Verdict::kReportMissing: return "report_missing";
    case Verdict::kStale: return "stale";
    case Verdict::kMismatch: return "mismatch";
    case Verdict::kMismatchPending: return "mismatch_pending";
    case Verdict::kAborted: return "aborted";
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
  if (cfg.max_payload_bytes < 4 || cfg.max_payload_bytes > kMaxPayload ||
      cfg.max_payload_bytes % 4 != 0) {
    return invalid_argument(
        range_error("max_payload_bytes", 4, kMaxPayload, cfg.max_payload_bytes) +
        " (bytes of a block, a multiple of 4)");
  }
  if (cfg.world_size < 1 || cfg.world_size > kMaxWorld) {
    return invalid_argument(range_error("world_size", 1, kMaxWorld, cfg.world_size));
  }
  if (cfg.quant_world > kMaxWorld) {
    return invalid_argument(range_error("quant_world", 0, kMaxWorld, cfg.quant_world));
  }
  // Float SUM keeps every rank's words of a round: slots x 2 x world x max_payload_bytes. An
  // allocation failure is a configuration the machine cannot hold, reported as such, not a crash.
  try {
    return std::unique_ptr<SlotTable>(new SlotTable(cfg));
  } catch (const std::bad_alloc&) {
    const uint64_t copies = uint64_t{cfg.num_slots} * 2;
    const uint64_t bytes =
        copies * cfg.max_payload_bytes * (uint64_t{cfg.world_size} + 1 + kAccBytesPerByte);
    return resource_exhausted(
        "slot table: cannot allocate " + std::to_string(bytes) + " bytes (num_slots " +
        std::to_string(cfg.num_slots) + " x 2 copies x max_payload_bytes " +
        std::to_string(cfg.max_payload_bytes) + " x (world_size " + std::to_string(cfg.world_size) +
        " for float SUM's raw words + result + accumulators))");
  }
}

SlotTable::SlotTable(const SlotTableConfig& cfg)
    : cfg_(cfg),
      quant_world_(cfg.quant_world != 0 ? cfg.quant_world : cfg.world_size),
      acc_words_(cfg.max_payload_bytes * kAccBytesPerByte / 8),
      bitmap_words_((cfg.world_size + 63) / 64),
      copies_(size_t{cfg.num_slots} * 2),
      acc_(size_t{cfg.num_slots} * 2 * acc_words_),
      result_(size_t{cfg.num_slots} * 2 * cfg.max_payload_bytes),
      raw_(size_t{cfg.num_slots} * 2 * cfg.world_size * cfg.max_payload_bytes),
      bitmaps_(size_t{cfg.num_slots} * 2 * bitmap_words_),
      other_bitmaps_(size_t{cfg.num_slots} * 2 * bitmap_words_),
      rank_words_(cfg.world_size) {}

SlotTable::~SlotTable() = default;

void SlotTable::reset() {
  std::fill(copies_.begin(), copies_.end(), Copy{});
  std::fill(bitmaps_.begin(), bitmaps_.end(), uint64_t{0});
  std::fill(other_bitmaps_.begin(), other_bitmaps_.end(), uint64_t{0});
}

// The round of copy k is complete: its result in the user's type (or, deferred at a leaf, the
// raw words wait for the root's exponent).
void SlotTable::finish(size_t k, const uint8_t* last, uint32_t last_rank) {
  Copy& c = copies_[k];
  int64_t* acc = acc_.data() + k * acc_words_;
  uint8_t* out = result_.data() + k * cfg_.max_payload_bytes;
  const bool is_float = c.dtype != DType::kInt32;
  if (c.nonfinite && is_float) {
    codec::fill_nan(out, c.count, c.dtype);
    return;
  }
  switch (c.mode) {
    case CopyMode::kReduce:
      // int32 reduces in the result itself (on_data); the float MIN/MAX keys are converted.
      if (is_float)
        codec::from_keys32(reinterpret_cast<const int32_t*>(acc), c.count, c.dtype, out);
      return;
    case CopyMode::kRaw: {
      if (cfg_.defer_float_sum) return;
      // Every rank's words quantized with E = MAX, added and converted in one pass (codec.h);
      // bounded: every word is finite (nonfinite returned above) and E is at least each rank's
      // exponent, scanned from the very words read here.
      const uint8_t* raw = raw_.data() + k * cfg_.world_size * cfg_.max_payload_bytes;
      for (uint32_t r = 0; r < cfg_.world_size; ++r) {
        rank_words_[r] = raw + size_t{r} * cfg_.max_payload_bytes;
      }
      if (last != nullptr) rank_words_[last_rank] = last;
      codec::quantize_sum(rank_words_.data(), cfg_.world_size, c.count, c.dtype, c.exp,
                          quant_world_, out, /*bounded=*/true);
      return;
    }
    case CopyMode::kExp: c.answer_exp = c.exp; return;
    case CopyMode::kPartial: {
      const int scale = c.exp == kNoExponent ? codec::kNoScale : c.exp;
      if (c.dtype == DType::kFloat32) {
        codec::dequantize(acc, c.count, c.dtype, scale, out);
        return;
      }
      // The narrower types' int32 sums (on_data), sign-extended a tile at a time for the
      // dequantizer (an L1-resident tile: no second array).
      const auto* sum = reinterpret_cast<const int32_t*>(acc);
      constexpr size_t kTile = 256;
      alignas(64) int64_t tile[kTile];
      for (size_t at = 0; at < c.count; at += kTile) {
        const size_t m = std::min<size_t>(kTile, c.count - at);
        std::copy_n(sum + at, m, tile);
        codec::dequantize(tile, m, c.dtype, scale, out + at * dtype_size(c.dtype));
      }
      return;
    }
  }
}

uint8_t* SlotTable::raw_words_for(const wire::Header& h, bool* completes) {
  if (completes != nullptr) *completes = false;
  if ((h.flags & (wire::kFlagPartial | wire::kFlagHello | wire::kFlagResult | wire::kFlagError)) !=
          0 ||
      !codec::needs_exponent(h.dtype, h.op) || h.slot >= cfg_.num_slots ||
      h.rank >= cfg_.world_size || size_t{h.count} * dtype_size(h.dtype) > cfg_.max_payload_bytes) {
    return nullptr;
  }
  const size_t k = copy_index(h.slot, h.shadow);
  const Copy& c = copies_[k];
  const bool held = (bitmaps_[k * bitmap_words_ + h.rank / 64] >> (h.rank % 64) & 1) != 0;
  // A complete round's words were quantized into its result by finish(), unless a leaf defers
  // that to the root's exponent (quantize_partial reads them).
  const bool live =
      c.used && c.mode == CopyMode::kRaw && held && (!c.complete || cfg_.defer_float_sum);
  if (live) return nullptr;
  if (completes != nullptr) {
    // on_data's path to finish() for this packet (none of its early returns taken).
    *completes = !cfg_.defer_float_sum && c.used && !c.complete && c.seq == h.seq &&
                 c.mode == CopyMode::kRaw && !c.poisoned && c.aborted_by == CopyView::kNoAbort &&
                 c.contributors + 1 == cfg_.world_size && same_shape(c, h);
  }
  return raw_.data() + (k * cfg_.world_size + h.rank) * cfg_.max_payload_bytes;
}

Verdict SlotTable::on_data(const wire::PacketView& pkt, const StoredWords* stored) {
  const wire::Header& h = pkt.hdr;
  if (h.slot >= cfg_.num_slots) [[unlikely]]
    return Verdict::kBadSlot;
  if (h.rank >= cfg_.world_size) [[unlikely]]
    return Verdict::kBadRank;
  const bool partial = h.has(wire::kFlagPartial);
  // A block of the user's type fits max_payload_bytes; PARTIAL words are wider, their count is
  // still at most a block's elements.
  if (size_t{h.count} * dtype_size(h.dtype) > cfg_.max_payload_bytes) [[unlikely]] {
    return Verdict::kTooLarge;
  }
  const CopyMode mode = partial ? (h.count == 0 ? CopyMode::kExp : CopyMode::kPartial)
                        : codec::needs_exponent(h.dtype, h.op) ? CopyMode::kRaw
                                                               : CopyMode::kReduce;

  const size_t k = copy_index(h.slot, h.shadow);
  Copy& c = copies_[k];
  uint64_t* bitmap = bitmaps_.data() + k * bitmap_words_;
  int64_t* acc = acc_.data() + k * acc_words_;

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
  } else if (c.mode == CopyMode::kExp && mode == CopyMode::kPartial && c.complete) {
    // Root: the first leaf's words after the exponent round: the words stage of the same round
    // (the exponent and the non-finite mark stay). Words of another type than the round's are a
    // broken leaf's (and would not fit the accumulators: acc_words_).
    if (h.dtype != c.dtype) return Verdict::kMismatch;
    c.contributors = 0;
    c.complete = false;
    c.mode = CopyMode::kPartial;
    c.count = h.count;
    c.exp = h.exp;
    std::fill_n(bitmap, bitmap_words_, uint64_t{0});
    std::memset(acc, 0, size_t{h.count} * wire::acc_bytes(c.dtype));
  } else if (mode == CopyMode::kExp && c.mode == CopyMode::kPartial) {
    return Verdict::kResendExp;  // a leaf that lost the answer asks again
  }

  const uint64_t bit = uint64_t{1} << (h.rank % 64);
  uint64_t& word = bitmap[h.rank / 64];
  if (c.aborted_by != CopyView::kNoAbort) [[unlikely]]
    return Verdict::kAborted;
  if (c.poisoned) return poisoned_data(k, h);
  if ((word & bit) != 0) {
    if (c.complete) return c.mode == CopyMode::kExp ? Verdict::kResendExp : Verdict::kResendResult;
    return h.has(wire::kFlagRetransmit) ? Verdict::kReportMissing : Verdict::kDuplicate;
  }

  bool first_reduce = false;  // the first contribution of a kReduce round: stored as it is
  if (c.contributors == 0 && c.mode != CopyMode::kPartial) {
    // Words without the exponent round before them: a broken or confused leaf.
    if (mode == CopyMode::kPartial) return Verdict::kMismatch;
    // The round's first contributor defines its shape.
    c.count = h.count;
    c.dtype = h.dtype;
    c.op = h.op;
    c.elems = h.elems;
    c.coll = h.coll;
    c.root = h.root;
    c.mode = mode;
    c.exp = kNoExponent;
    // int32 SUM and MIN/MAX and float MIN/MAX reduce in int32 words (on_data below), from the
    // first contribution's, stored as they are: no initial fill.
    first_reduce = mode == CopyMode::kReduce;
  } else if (mode == CopyMode::kPartial &&
             (mode != c.mode || h.exp != c.exp || h.dtype != c.dtype || h.count != c.count)) {
    // A leaf's words that do not fit the round (another exponent, or words of another width or
    // number than on_data reads below): a broken leaf.
    return Verdict::kMismatch;
  } else if (!same_shape(c, h) || mode != c.mode) {
    // The ranks called the collective with different arguments: the round is poisoned. It
    // collects which rank sent which shape until every rank is in, then tells each of them the
    // same thing (engine.cc), so that no rank times out where another hears of the mismatch.
    c.poisoned = true;
    c.other_count = h.count;
    c.other_dtype = h.dtype;
    c.other_op = h.op;
    c.other_elems = h.elems;
    c.other_root = h.root;
    std::fill_n(other_bitmaps_.data() + k * bitmap_words_, bitmap_words_, uint64_t{0});
    return poisoned_data(k, h);
  }

  const uint8_t* src = pkt.payload;
  const uint8_t* last_words = nullptr;  // kRaw: the completing words, left in the datagram
  switch (mode) {
    case CopyMode::kReduce:
      if (c.dtype == DType::kInt32) {
        // SUM wraps modulo 2^32 and MIN/MAX are exact in int32 (QUANTIZATION.md): the result's
        // words are the accumulators.
        auto* out = reinterpret_cast<int32_t*>(result_.data() + k * cfg_.max_payload_bytes);
        if (first_reduce) {
          if (h.count > 0) std::memcpy(out, src, size_t{h.count} * 4);
        } else {
          codec::fold_int32(src, h.count, c.op, out);
        }
        break;
      }
      // A float's order-preserving key is an int32 (QUANTIZATION.md): int32 words too.
      c.nonfinite = c.nonfinite || codec::scan(src, h.count, c.dtype, c.op).nonfinite;
      if (first_reduce) {
        codec::keys32(src, h.count, c.dtype, reinterpret_cast<int32_t*>(acc));
      } else {
        codec::keys_minmax32(src, h.count, c.dtype, c.op, reinterpret_cast<int32_t*>(acc));
      }
      break;
    case CopyMode::kRaw: {
      uint8_t* words = raw_.data() + (k * cfg_.world_size + h.rank) * cfg_.max_payload_bytes;
      // The round's last words are read once, by the completion below: from the datagram. Any
      // others are kept in the table until then.
      const bool last = c.contributors + 1 == cfg_.world_size && !cfg_.defer_float_sum;
      const uint8_t* at = words;
      if (stored == nullptr || stored->in_datagram) {
        if (last) {
          at = src;
          last_words = src;
        } else {
          std::memcpy(words, src, pkt.payload_bytes);
        }
      }
      // Scanned from the stored words (in the L1 cache) when the pass that stored them did not.
      const codec::Scan s = stored != nullptr && stored->scanned
                                ? stored->scan
                                : codec::scan(at, h.count, c.dtype, c.op);
      c.exp = codec::max_exponent(c.exp, s.exp);
      c.nonfinite = c.nonfinite || s.nonfinite;
      break;
    }
    case CopyMode::kExp: c.exp = codec::max_exponent(c.exp, h.exp); break;
    case CopyMode::kPartial:
      if (c.dtype == DType::kFloat32) {
        codec::add_acc(src, h.count, c.dtype, acc);
      } else {
        // The narrower types' words are int32 and so are their sums: B = 30 - ceil(log2 N) keeps
        // any sum over the N ranks within 2^30 (QUANTIZATION.md), so int32 never wraps here.
        codec::fold_int32(src, h.count, ReduceOp::kSum, reinterpret_cast<int32_t*>(acc));
      }
      break;
  }
  word |= bit;
  c.nonfinite = c.nonfinite || h.has(wire::kFlagNonFinite);
  if (++c.contributors == cfg_.world_size) {
    c.complete = true;
    finish(k, last_words, h.rank);
    return c.mode == CopyMode::kExp ? Verdict::kExpCompleted : Verdict::kCompleted;
  }
  return Verdict::kAdded;
}

// A contribution's shape against its round's first contributor's (the collective id is not part
// of it).
bool SlotTable::same_shape(const Copy& c, const wire::Header& h) {
  return h.count == c.count && h.dtype == c.dtype && h.op == c.op && h.elems == c.elems &&
         h.root == c.root;
}

Verdict SlotTable::poisoned_data(size_t k, const wire::Header& h) {
  Copy& c = copies_[k];
  uint64_t* bitmap = bitmaps_.data() + k * bitmap_words_;
  const uint64_t bit = uint64_t{1} << (h.rank % 64);
  if ((bitmap[h.rank / 64] & bit) == 0) {
    bitmap[h.rank / 64] |= bit;
    if (!same_shape(c, h)) other_bitmaps_[k * bitmap_words_ + h.rank / 64] |= bit;
    ++c.contributors;
  }
  return c.contributors == cfg_.world_size ? Verdict::kMismatch : Verdict::kMismatchPending;
}

bool SlotTable::quantize_partial(uint16_t slot, bool shadow, BlockSeq seq, int16_t exp,
                                 bool nonfinite) {
  if (slot >= cfg_.num_slots) return false;
  const size_t k = copy_index(slot, shadow);
  Copy& c = copies_[k];
  if (!c.used || !c.complete || c.seq != seq || c.mode != CopyMode::kRaw) return false;
  if (c.partial_ready) return true;
  // Every rank's words quantized with the root's E and added in one pass (codec.h), into the
  // copy's accumulators as PARTIAL words.
  const uint8_t* raw = raw_.data() + k * cfg_.world_size * cfg_.max_payload_bytes;
  for (uint32_t r = 0; r < cfg_.world_size; ++r) {
    rank_words_[r] = raw + size_t{r} * cfg_.max_payload_bytes;
  }
  codec::quantize_sum_words(rank_words_.data(), cfg_.world_size, c.count, c.dtype, exp,
                            quant_world_, reinterpret_cast<uint8_t*>(acc_.data() + k * acc_words_));
  c.answer_exp = exp;
  c.nonfinite = c.nonfinite || nonfinite;
  c.partial_ready = true;
  return true;
}

bool SlotTable::store_result(const wire::PacketView& pkt) {
  const wire::Header& h = pkt.hdr;
  if (h.slot >= cfg_.num_slots) return false;
  const size_t k = copy_index(h.slot, h.shadow);
  Copy& c = copies_[k];
  if (!c.used || !c.complete || c.seq != h.seq || c.count != h.count || c.dtype != h.dtype ||
      c.op != h.op || pkt.payload_bytes != size_t{h.count} * dtype_size(h.dtype)) {
    return false;
  }
  std::memcpy(result_.data() + k * cfg_.max_payload_bytes, pkt.payload, pkt.payload_bytes);
  c.nonfinite = h.has(wire::kFlagNonFinite);
  return true;
}

bool SlotTable::abort(const wire::Header& h, uint32_t rank, uint32_t cause) {
  if (h.slot >= cfg_.num_slots) return false;
  const size_t k = copy_index(h.slot, h.shadow);
  Copy& c = copies_[k];
  if (c.used) {
    const int32_t ahead = static_cast<int32_t>(h.seq - c.seq);  // as on_data()
    // A root's finished exponent round is not the round's result: the words are still to come.
    if (ahead < 0 || (ahead == 0 && c.complete && c.mode != CopyMode::kExp)) return false;
    if (ahead == 0 && c.aborted_by != CopyView::kNoAbort) return true;  // the first one stays
  }
  if (!c.used || h.seq != c.seq) {
    // The round has not started here (the rank that gave up may be the only one that sent it, and
    // its DATA was lost): it starts aborted, so that the ranks still to come cannot complete it.
    c = Copy{};
    c.used = true;
    c.seq = h.seq;
    std::fill_n(bitmaps_.data() + k * bitmap_words_, bitmap_words_, uint64_t{0});
  }
  c.aborted_by = rank;
  c.abort_cause = cause;
  return true;
}

uint32_t SlotTable::contributors(uint16_t slot, bool shadow) const {
  if (slot >= cfg_.num_slots) return 0;
  return copies_[copy_index(slot, shadow)].contributors;
}

CopyView SlotTable::copy(uint16_t slot, bool shadow) const {
  CopyView v;
  v.slot = slot;
  v.shadow = shadow;
  if (slot >= cfg_.num_slots) return v;
  const size_t k = copy_index(slot, shadow);
  const Copy& c = copies_[k];
  v.used = c.used;
  v.complete = c.complete;
  v.seq = c.seq;
  v.count = c.count;
  v.dtype = c.dtype;
  v.op = c.op;
  v.elems = c.elems;
  v.coll = c.coll;
  v.root = c.root;
  v.mode = c.mode;
  v.exp = c.exp;
  v.answer_exp = c.answer_exp;
  v.nonfinite = c.nonfinite;
  v.partial_ready = c.partial_ready;
  v.contributors = c.contributors;
  v.result = result_.data() + k * cfg_.max_payload_bytes;
  v.partial = reinterpret_cast<const uint8_t*>(acc_.data() + k * acc_words_);
  v.bitmap = std::span<const uint64_t>(bitmaps_.data() + k * bitmap_words_, bitmap_words_);
  v.poisoned = c.poisoned;
  v.other_count = c.other_count;
  v.other_dtype = c.other_dtype;
  v.other_op = c.other_op;
  v.other_elems = c.other_elems;
  v.other_root = c.other_root;
  v.other_ranks =
      std::span<const uint64_t>(other_bitmaps_.data() + k * bitmap_words_, bitmap_words_);
  v.aborted_by = c.aborted_by;
  v.abort_cause = c.abort_cause;
  return v;
}

}  // namespace ina::agg
