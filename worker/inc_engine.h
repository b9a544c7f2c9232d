// The in-network collective engine: joins a job at an aggregator and streams allreduce blocks
// through the aggregator's slots over any Transport. The schedule is explained at the top of
// inc_engine.cc (the join: inc_join.cc; failure handling: inc_failure.cc). One engine per
// communicator; not thread-safe (one caller at a time).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ina/base/status.h"
#include "ina/ina.hpp"
#include "ina/protocol/types.h"
#include "ina/protocol/wire.h"
#include "worker/congestion.h"
#include "worker/transport/transport.h"

namespace ina::worker {

// Adds an engine's packet counters (packets, retransmits, duplicates, malformed, non-finite
// blocks, error reports, spurious and fast retransmits, late completions) from `from` to `to`; not
// collectives, rto_us or the host-path counters, which each caller combines its own way.
inline void add_packet_counters(const CommStats& from, CommStats* to) {
  to->packets_sent += from.packets_sent;
  to->packets_received += from.packets_received;
  to->retransmits += from.retransmits;
  to->duplicate_results += from.duplicate_results;
  to->malformed += from.malformed;
  to->nonfinite_blocks += from.nonfinite_blocks;
  to->error_reports += from.error_reports;
  to->spurious_retransmits += from.spurious_retransmits;
  to->fast_retransmits += from.fast_retransmits;
  to->bad_tag += from.bad_tag;
  to->late_completions += from.late_completions;
}

class IncEngine {
 public:
  // Retransmission timeouts double from cfg.retransmit up to this multiple of it.
  static constexpr uint32_t kMaxBackoff = 64;
  // Refusals (ICMP port unreachable) and this long without a datagram from the aggregator: it is
  // gone, the collective ends with Unavailable before its deadline (see inc_failure.cc).
  static constexpr std::chrono::milliseconds kRefusedSilence{50};
  // This long without a datagram from the aggregator during a collective: the rank sends it a
  // liveness probe (Transport::probe), so that a dead aggregator is refused (and found gone)
  // before any retransmission timer fires.
  static constexpr std::chrono::milliseconds kSilenceProbe{20};
  // The same while joining, with nothing heard from the aggregator since the first HELLO.
  static constexpr std::chrono::milliseconds kRefusedJoin{1000};
  // At the deadline, how long a rank waits for the aggregator's answers to its aborts (the
  // result of a round that completed before the abort, or the abort itself) before it fails
  // the collective anyway (see inc_failure.cc, "At the deadline").
  static constexpr std::chrono::milliseconds kAbortSettle{100};
  // Waiting for results (inc_engine.cc, "Waiting"): when every round left is outstanding and
  // they are at most kSpinRounds the rank polls for up to kSpin before it blocks; otherwise it
  // blocks at once.
  static constexpr std::chrono::microseconds kSpin{200};
  static constexpr uint32_t kSpinRounds = 16;
  static constexpr std::chrono::microseconds spin_for(uint32_t outstanding, uint64_t left) {
    return outstanding <= kSpinRounds && left <= outstanding ? kSpin : std::chrono::microseconds(0);
  }

  // A silent aggregator (inc_failure.cc, "A dead aggregator"): once set_silence_limit() armed it,
  // nothing authentic from the aggregator for the limit, with at least kSilentResends
  // retransmissions unanswered, ends the collective with Unavailable before its deadline.
  static constexpr uint32_t kSilentResends = 4;
  static constexpr std::chrono::milliseconds kSilenceLimit{500};  // the path policy's choice

  // `cfg` must be valid (Config::validate). The engine owns the transport.
  IncEngine(const Config& cfg, std::unique_ptr<Transport> transport);
  ~IncEngine();
  IncEngine(const IncEngine&) = delete;
  IncEngine& operator=(const IncEngine&) = delete;

  // The join barrier: HELLO with a fresh incarnation nonce, retransmitted with backoff until the
  // aggregator's WELCOME (every rank joined) or cfg.timeout. Adopts the smaller of the
  // configured and the aggregator's block size and window. `timeout` zero: cfg.timeout (a probe
  // of a lost aggregator uses a shorter one). Refusals and nothing heard for `refused`: the
  // aggregator is gone (a probe, which tries again later, gives up sooner than a first join).
  Status join(std::chrono::milliseconds timeout = std::chrono::milliseconds::zero(),
              std::chrono::milliseconds refused = kRefusedJoin);

  // Sums (or takes the MIN/MAX of) `count` elements over all ranks. recv may equal send. All
  // ranks must call it with the same count, dtype and op, in the same order. A call whose
  // count, dtype or op differs between ranks fails on every rank with the same kInvalidArgument
  // (the aggregator's mismatch words name both shapes and their ranks), and the engine moves to
  // the block sequence every rank moves to, so the next matched collective works.
  // `shape_elems`: the count the DATA headers name as the collective's (0: `count`); a sharded
  // job names the whole collective's, so that a shard's mismatch report names the user's call.
  Status allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                   uint64_t shape_elems = 0);

  // Set by the last allreduce: it failed because the ranks disagreed on its shape. Then
  // mismatch_body() is the aggregator's account ("ranks disagree on count/dtype/op (...)"),
  // the same on every rank.
  bool last_mismatch() const { return !mismatch_body_.empty(); }
  const std::string& mismatch_body() const { return mismatch_body_; }
  // Where the communicator's counters stand (the next collective's first block and id).
  BlockSeq next_seq() const { return next_seq_; }
  uint32_t next_coll() const { return next_coll_; }
  // Moves the counters to the point every rank moves to after a mismatched collective that began
  // at block sequence `from`: the next multiple of 2^24 above it, collective id `next_coll`, every
  // slot's copy parity reset (see resync_after_mismatch in inc_failure.cc). A sharded job calls it
  // on the shards that did not see the mismatch, with what they stood at before the collective.
  void resync(BlockSeq from, uint32_t next_coll);
  // A flag another thread sets to make the running allreduce give up at once (kAborted): a
  // sharded job's other shard found the mismatch. Null: none. Borrowed.
  void set_cancel_flag(const std::atomic<bool>* flag) { cancel_ = flag; }

  // Lowers the adopted block to `bytes` (rounded down to a multiple of 4; no-op when it is not
  // smaller): a sharded job uses one block over all its aggregators (sharded_engine.h). Only
  // between join and the first collective.
  void lower_payload_bytes(uint32_t bytes);

  // After allreduce returned (OK or not): whether the result of `block` of that collective is in
  // its recv buffer. In place, a block without its result still holds its input (see
  // inc_engine.cc), so the host path can redo exactly those blocks (path_policy.cc).
  bool block_received(uint64_t block) const {
    if (block >= coll_.blocks || coll_.width == 0) return false;
    return block / coll_.width < slots_[block % coll_.width].results;
  }

  // Arms the silence rule above (zero: off, the default: only the deadline ends a silent wait).
  // The path policy arms it where the host path can take over (path_policy.cc).
  void set_silence_limit(std::chrono::milliseconds limit) { silence_limit_ = limit; }

  bool joined() const { return joined_; }
  // The block in bytes (adopted at join) and in elements of each type.
  uint32_t payload_bytes() const { return payload_bytes_; }
  uint32_t block_elems(DType t) const {
    return payload_bytes_ / static_cast<uint32_t>(dtype_size(t));
  }
  uint32_t block_elems() const { return payload_bytes_ / 4; }  // 4-byte elements
  uint32_t window() const { return window_; }                  // adopted at join
  const CommStats& stats() const { return stats_; }
  Transport& transport() { return *transport_; }

 private:
  using Clock = std::chrono::steady_clock;

  // One slot of the window while a collective runs.
  struct Slot {
    uint8_t* pkt = nullptr;  // the last packet sent on this slot (kept for retransmission)
    uint32_t pkt_len = 0;
    // A DATA packet is its header in pkt (pkt_len == wire::kHeaderSize) followed by its payload,
    // read in place from the user's buffer (sent by Transport::send_gather: no copy here); any
    // other packet (pkt_len > kHeaderSize: an abort) lies whole in pkt.
    const uint8_t* body = nullptr;
    uint32_t body_len = 0;
    uint64_t block = 0;  // block of the outstanding round
    BlockSeq seq = 0;
    uint32_t rounds = 0;     // rounds sent on this slot in this collective
    uint32_t results = 0;    // block results received on this slot in this collective
    uint32_t first_use = 0;  // the slot's use counter u[s] when the collective began
    uint16_t count = 0;      // payload elements of the outstanding round
    bool shadow = false;
    bool resealed = false;       // the tag covers the packet as it is now (wire::seal)
    bool active = false;         // a round is outstanding
    bool queued = false;         // its packet is in the pending send batch
    bool retransmitted = false;  // the outstanding round was resent (no RTT sample: Karn)
    bool presumed_lost = false;  // `due` was brought forward by the loss detector
    Clock::time_point sent_at;   // first transmission of the outstanding round
    Clock::time_point xmit_at;   // its latest transmission
    Clock::time_point due;       // when to retransmit
    Clock::duration rto{};       // current retransmission timeout (doubles, capped)
  };

  // The collective in flight: its arguments and schedule.
  struct Collective {
    const uint8_t* send = nullptr;
    uint8_t* recv = nullptr;
    size_t count = 0;
    DType dtype = DType::kInt32;
    ReduceOp op = ReduceOp::kSum;
    size_t elem_size = 4;
    uint32_t block_elems = 0;  // K = payload bytes / elem_size
    uint64_t blocks = 0;       // n = ceil(count / K)
    uint32_t width = 0;        // W' = min(W, n)
    BlockSeq base_seq = 0;     // seq of block 0
    uint32_t coll = 0;         // collective id (the header's coll)
    uint64_t shape_elems = 0;  // the header's elems: the collective's count as the user called it
    uint64_t rounds_total = 0;
    uint64_t rounds_left = 0;
  };

  // What the aggregator last told us about missing ranks (ERROR kMissingRanks / kJobNotReady).
  struct MissingReport {
    bool valid = false;
    wire::ErrorReason reason = wire::ErrorReason::kMissingRanks;
    BlockSeq seq = 0;
    uint16_t slot = 0;
    std::vector<uint32_t> bitmap;  // words as on the wire: bit r of word r/32 = rank r present
    // kMissingRanks from a tree leaf: a note follows the world's words (tree_note_text).
  };

  void ensure_slot_buffers(uint32_t width);
  size_t block_len(uint64_t block) const;
  const uint8_t* block_in(uint64_t block) const;
  uint8_t* block_out(uint64_t block) const;

  // Build a round's packet in the slot's buffer and queue it for sending.
  void start_block(uint32_t s, uint64_t block);
  void finish_header(Slot& sl, uint8_t flags, uint16_t count);
  void queue(uint32_t s, Clock::time_point now);
  Status flush();

  // Handles one received datagram while a collective runs; a non-OK Status ends it.
  Status on_datagram(Datagram d);
  // `copied`: the receive pass already put the payload in the user's buffer (result_out).
  Status on_result(const wire::PacketView& pv, bool copied);
  // Whether a RESULT fits the round its slot waits on (else on_result counts it and drops it).
  enum class ResultFit : uint8_t { kFits, kDuplicate, kMalformed };
  ResultFit result_fit(const wire::Header& h) const;
  // Where the receive pass may copy a RESULT's payload as it verifies its tag: the user's block,
  // when the RESULT fits its round and the collective is out of place; else null.
  uint8_t* result_out(const wire::PacketView& pv) const;
  Status on_error(const wire::PacketView& pv);
  void retransmit_due(Clock::time_point now);
  // Brings forward the timer of every outstanding round the loss detector presumes lost (a round
  // sent after it got its result): it goes out again at that time, without backing off.
  void presume_lost();
  // Feeds a round's result to the window/timer controller (congestion.h).
  void rtt_sample(Clock::time_point now, Clock::duration rtt);
  // The next block of slot s waits for the window (cwnd rounds outstanding at most): started now
  // when the window allows, else when a result frees it (launch_ready: lowest block first, and
  // the lowest incomplete one regardless of the window).
  void start_or_defer(uint32_t s, uint64_t block, Clock::time_point now);
  void launch_ready(Clock::time_point now);
  // Whether a ready block may go out now: the window has room, or no lower block is out.
  bool may_launch(uint64_t block);

  // Messages.
  std::string describe_collective() const;
  Status deadline_status(std::chrono::milliseconds limit) const;
  std::string missing_clause(const MissingReport& rep) const;
  const MissingReport* report_for(size_t slot, BlockSeq seq) const;
  std::string missing_ranks_text(const std::vector<uint32_t>& bitmap) const;
  std::string mismatch_text(const wire::PacketView& pv) const;
  void resync_after_mismatch();
  // The block sequence every rank moves to after a mismatched collective that began at `from`.
  static BlockSeq resync_point(BlockSeq from);
  // At the deadline: gives up on every outstanding round and learns from the aggregator whether
  // each completed before that (then the collective succeeds, late) or not (`failed`).
  Status settle_at_deadline(Status failed);
  // Tells the aggregator this rank gives up on every round it has outstanding (ERROR kAborted,
  // each sent twice, best effort), so that a rank arriving late cannot complete them and return
  // success where this one fails. The slots' packet buffers are reused. `keep_active`: the
  // slots stay active, so that a result still completes its round (settle_at_deadline).
  void send_aborts(bool keep_active = false);
  // The aborts again, for the slots still active.
  void resend_aborts();
  // " (behind tree leaf 1)" from a leaf's tree note in the last missing report; empty without.
  std::string tree_note_text(const MissingReport& r) const;
  std::string refused_note(uint64_t refusals_at_start) const;
  Status gone_status(Clock::duration silent) const;
  Status silent_status(Clock::duration silent, uint64_t resends) const;
  bool in_collective(BlockSeq seq) const;
  void remember_missing(const wire::PacketView& pv, wire::ErrorReason reason);

  const Config cfg_;
  std::unique_ptr<Transport> transport_;
  CommStats stats_;
  bool settling_ = false;  // in settle_at_deadline: results give no RTT sample
  bool joined_ = false;
  // The key of this incarnation's packets (WIRE.md, "Incarnations"): every DATA and abort is
  // sealed with it and every reply but WELCOME verified with it. From the WELCOME that answers
  // this join's HELLO: wire::incarnation_key(job key, epoch).
  Key128 traffic_key_;
  uint32_t payload_bytes_ = 0;
  uint32_t window_ = 0;
  uint32_t world_ = 0;
  BlockSeq next_seq_ = 1;   // running block sequence of this communicator
  uint32_t next_coll_ = 1;  // collective id of the next allreduce (every rank counts alike)
  // Empty unless the last allreduce was mismatched.
  std::string mismatch_body_;
  const std::atomic<bool>* cancel_ = nullptr;
  // Adaptive retransmission timeout: a round's "RTT" is send-to-result, which includes waiting
  // for the slowest rank and the queue of the rest of the window, so it varies with load; a fixed
  // timeout below it resends every block (and adds to the load). Kept across collectives.
  // The window and the timeout of a new round (congestion.h), kept across collectives, reset at
  // join.
  CongestionControl cc_;
  LossDetector loss_;
  bool loss_moved_ = false;  // a result moved loss_ on: presume_lost() is due
  uint32_t inflight_ = 0;    // rounds outstanding
  // The lowest block of the collective this rank has not completed (may_launch): its slot and
  // round (low_ = low_round_ * W' + low_slot_).
  uint64_t low_ = 0;
  uint32_t low_slot_ = 0;
  uint64_t low_round_ = 0;
  // Blocks that wait for the window, each its slot's next (slot = block mod W'): a min-heap
  // (launch_ready). The blocks themselves, not slot indices: comparing them reads no slot.
  std::vector<uint64_t> ready_;
  uint64_t straggle_state_ = 0;  // draws of the intermittent-straggler test hook
  std::vector<uint32_t> use_;    // u[s]: rounds ever sent on slot s (shadow = u & 1)

  // Per-collective state, allocated at join / first use and reused.
  std::vector<Slot> slots_;
  // The slots' packet buffers, kSlotPacket bytes each, one cache line apart: a DATA packet's
  // header (its payload is gathered from the user's buffer) or an abort, whole.
  static constexpr size_t kSlotPacket = 64;
  static_assert(kSlotPacket >= wire::kHeaderSize && kSlotPacket >= wire::control_packet_size(3));
  std::vector<uint8_t> pkt_storage_;  // slots_.size() buffers, aligned to kSlotPacket
  std::vector<std::span<const uint8_t>> tx_;
  std::vector<GatherDatagram> gtx_;  // flush()'s batch (capacity kept)
  std::vector<uint32_t> tx_slots_;
  std::vector<Datagram> rx_;
  Collective coll_;
  MissingReport missing_;                    // the latest report, of any block
  std::vector<MissingReport> slot_missing_;  // per slot: its latest report (seq tells the round)
  Clock::time_point next_due_;               // earliest retransmission time over active slots
  bool heard_ = false;                       // any valid packet of this job in this collective
  uint64_t authentic_ = 0;                   // valid packets of this job, ever
  uint64_t refusals_at_start_ = 0;
  std::chrono::milliseconds silence_limit_{0};  // set_silence_limit
};

}  // namespace ina::worker
