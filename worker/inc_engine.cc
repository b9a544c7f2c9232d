// In-network allreduce: the worker's side of the streaming schedule.
//
// The aggregator gives a job `num_slots` slots, each with two copies (the shadow bit). A slot copy
// collects one block from every rank, reduces it, and sends the result to all ranks. The worker
// streams its buffer through a window of slots:
//
//   K  = block size (elements per packet),  n = ceil(count / K) blocks
//   W' = min(W, n): the slots this collective uses; block i goes through slot s = i mod W'
//   u[s]  = how many rounds this communicator has ever sent on slot s; a round uses copy
//           u[s] & 1, then u[s] += 1. The counters persist across collectives, so the first round
//           of a collective on slot s uses the other copy than the last round of the previous one
//   seq   = a running block counter of the communicator, one per round; every rank computes the
//           same values because every rank makes the same calls. The aggregator uses it to tell
//           a retransmission of the current round from a stale packet of an older one.
//
// A slot carries one outstanding round at a time: block i + W' is sent on slot s only after the
// result of block i arrived. That is what makes the two copies enough. When a rank sends round
// r + 2 into copy c, it has received round r + 1's result (copy !c), which completed only after
// every rank sent round r + 1, which each did only after receiving round r's result from copy c.
// So no rank can still need copy c's old result: the aggregator may overwrite it. Until then,
// a rank whose result packet was lost retransmits and gets the stored result again (a duplicate
// is never added twice).
//
// Every block travels in the user's width (wire v2): DATA carries the raw elements, copied from
// the input buffer, and RESULT the reduced elements, copied into the output. The aggregator does
// the arithmetic (a float SUM is quantized there, late, once it has every rank's block:
// protocol/QUANTIZATION.md), so every dtype and op takes one round trip per block from the first
// block, and block i takes seq base + i. A block that held a NaN (or, for SUM, an Inf) comes back
// flagged NONFINITE and all NaN, the signal AMP's loss scaler looks for.
//
// The block is the WELCOME's max_payload_bytes long: the smallest of the aggregator's block and
// each rank's limit in its HELLO (the configured block_elems * 4 bytes, 8 KiB by default, and one
// datagram on the path to the aggregator: 1432 bytes on a 1500-byte MTU, 8 KiB on jumbo frames
// or loopback). Every rank gets the same WELCOME, so all cut their buffers into the same blocks.
//
// In place (send == recv) is safe: block i's output is written when its result arrives, and by
// then block i has been copied into its packet (kept for retransmission: never re-read).
//
// Loss: each outstanding round has a retransmission timer; when it fires the kept packet goes out
// again flagged RETRANSMIT and the timer doubles (up to kMaxBackoff times the configured one).
// A round presumed lost by the loss detector (a round sent after it got its result; congestion.cc,
// "Loss recovery") has its timer brought forward to that time, and goes out without doubling it.
// A new round's timer starts from the controller's timeout (congestion.cc: above SRTT + 4 RTTVAR
// and above the time the window takes to drain, so queueing delay does not fire it; Karn's rule).
// The window: at most cwnd rounds are outstanding (congestion.cc, delay-based); a slot whose next
// block is ready waits in a FIFO until a result frees the window. The
// aggregator answers a retransmission to an incomplete copy with its contributor bitmap, which
// names the ranks that have not contributed if the deadline passes. Results are matched by
// (slot, shadow, seq); anything else is a duplicate or stale and is counted and ignored.
//
// Waiting. A rank that has nothing to read polls its transport for up to kSpin (yielding the CPU
// between polls) before it blocks, when every round it has left is outstanding and they are at
// most kSpinRounds: then the collective waits on a round trip that nothing else overlaps (a small
// collective, or a large one's last rounds), and a blocked rank would add a wake-up to it (10-15
// us on the 2-core VM, at each end: the aggregator polls after traffic too, udp_lane.cc). While
// blocks remain to be sent the window hides the wake-up, however small the window (the delay-based
// window of a loaded host is often below kSpinRounds), and each wake-up returns a batch of
// results, so the rank blocks and leaves the CPU to the others: polling there cost each rank a
// sched_yield (a context switch when the cores are shared) per empty poll, in steady state. On the
// 2-core VM (testbed/results/spin-20261205/) an 8 B AllReduce at 4 ranks took 83-112 us blocking,
// more than libina's host halving-doubling (63-75 us); polling, 50-68 us (medians: 0.87x
// halving-doubling, 0.59x Open MPI over TCP).
//
// Cost per packet: one copy (out of the result; a DATA packet's payload is sent from the user's
// buffer, its header sealed over it in place), no allocation, no lock, no log; the window's
// bookkeeping is O(1) amortised per round (launch_ready), and only the loss detector's pass
// (presume_lost) and the timers' (retransmit_due) visit every slot, once per receive batch at
// most. Sends of one loop iteration go out as one batch: in a stream a wake-up costs one ppoll,
// one recvmmsg and one sendmmsg (udp_transport.cc).
//
// The engine's other phases have files of their own: the join barrier in inc_join.cc; failure
// handling (a dead or silent aggregator, the deadline, aborts and the error text) in
// inc_failure.cc. Its codec is protocol/codec.h and its I/O the transports.
#include "worker/inc_engine.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <functional>
#include <thread>

#include "ina/base/log.h"
#include "worker/inc_engine_internal.h"
#include "worker/transport/fault_transport.h"

namespace ina::worker {

IncEngine::IncEngine(const Config& cfg, std::unique_ptr<Transport> transport)
    : cfg_(cfg),
      transport_(std::move(transport)),
      world_(static_cast<uint32_t>(cfg.world_size)),
      cc_(CongestionControl::Options{}),
      straggle_state_(effective_fault_seed(cfg) ^ 0x5354524147474c45ull) {  // "STRAGGLE"
  stats_.rto_us = static_cast<uint64_t>(cfg.retransmit.count());
}

IncEngine::~IncEngine() = default;

// ---------------------------------------------------------------------------------------------
// Allreduce

Status IncEngine::allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                            uint64_t shape_elems) {
  mismatch_body_.clear();  // capacity kept: no allocation per collective
  if (!joined_) return failed_precondition("allreduce before the communicator joined its job");
  if (!is_valid_dtype(static_cast<uint8_t>(dtype)) || !is_valid_op(static_cast<uint8_t>(op))) {
    return invalid_argument("allreduce: unknown dtype or op");
  }
  ++stats_.collectives;
  coll_.blocks = 0;  // block_received: nothing of this collective until it is set up
  if (count == 0) return ok_status();
  if (send == nullptr || recv == nullptr) {
    return invalid_argument("allreduce: null buffer with count " + std::to_string(count));
  }
  if (const uint64_t us = collective_delay_us(cfg_.fault, &straggle_state_); us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }

  // The schedule (see the top of this file).
  Collective& c = coll_;
  c.send = static_cast<const uint8_t*>(send);
  c.recv = static_cast<uint8_t*>(recv);
  c.count = count;
  c.dtype = dtype;
  c.op = op;
  c.shape_elems = shape_elems != 0 ? shape_elems : count;
  c.elem_size = dtype_size(dtype);
  c.block_elems = payload_bytes_ / static_cast<uint32_t>(c.elem_size);
  c.blocks = (count + c.block_elems - 1) / c.block_elems;
  c.width = static_cast<uint32_t>(std::min<uint64_t>(window_, c.blocks));
  c.base_seq = next_seq_;
  c.coll = next_coll_++;
  c.rounds_total = c.blocks;
  c.rounds_left = c.rounds_total;
  // Advance the communicator's counters for the whole collective now, so that a collective that
  // fails part-way leaves every rank's counters where the others' are.
  next_seq_ = static_cast<BlockSeq>(next_seq_ + c.rounds_total);
  ensure_slot_buffers(c.width);
  tx_slots_.clear();  // a collective that failed may have left sends queued
  for (uint32_t s = 0; s < c.width; ++s) {
    Slot& sl = slots_[s];
    sl.first_use = use_[s];
    sl.rounds = 0;
    sl.results = 0;
    sl.active = false;
    sl.queued = false;
    const uint64_t blocks_on_slot = (c.blocks - s + c.width - 1) / c.width;
    use_[s] += static_cast<uint32_t>(blocks_on_slot);
  }
  inflight_ = 0;
  ready_.clear();
  low_ = 0;
  low_slot_ = 0;
  low_round_ = 0;
  missing_.valid = false;
  for (MissingReport& r : slot_missing_) r.valid = false;
  heard_ = false;
  refusals_at_start_ = transport_->refusals();
  const CommStats before = stats_;

  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + cfg_.timeout;
  next_due_ = Clock::time_point::max();
  for (uint32_t s = 0; s < c.width; ++s) {
    start_or_defer(s, s, start);
  }
  INA_RETURN_IF_ERROR(flush());

  Clock::time_point last_rx = start;  // when a datagram last came from the aggregator
  Clock::time_point last_probe = start;
  // The silence rule: when an authentic datagram last came, and the retransmissions by then.
  Clock::time_point last_heard = start;
  uint64_t heard_count = authentic_;
  uint64_t resends_at_heard = stats_.retransmits;
  while (c.rounds_left > 0) {
    Clock::time_point now = Clock::now();
    if (now >= deadline) return settle_at_deadline(deadline_status(cfg_.timeout));
    if (cancel_ != nullptr && cancel_->load(std::memory_order_relaxed)) {
      return Status(StatusCode::kAborted, describe_collective() +
                                              ": given up: another shard of the job found that the "
                                              "ranks disagree on this collective's arguments");
    }
    const Clock::time_point probe_at = std::max(last_rx, last_probe) + kSilenceProbe;
    const auto wait = std::chrono::ceil<std::chrono::microseconds>(
        std::min({next_due_, deadline, probe_at}) - now);
    transport_->set_spin(spin_for(inflight_, c.rounds_left));
    INA_ASSIGN_OR_RETURN(size_t n, transport_->recv_batch(rx_, wait));
    for (size_t i = 0; i < n; ++i) INA_RETURN_IF_ERROR(on_datagram(rx_[i]));
    if (loss_moved_) presume_lost();
    now = Clock::now();
    if (n > 0) {
      last_rx = now;
    } else if (now - last_rx >= kRefusedSilence && transport_->refusals() != refusals_at_start_) {
      return gone_status(now - last_rx);
    } else if (now >= probe_at) {
      transport_->probe();  // silent for kSilenceProbe: is anything still listening?
      last_probe = now;
    }
    if (authentic_ != heard_count) {
      heard_count = authentic_;
      last_heard = now;
      resends_at_heard = stats_.retransmits;
    } else if (silence_limit_.count() > 0 && now - last_heard >= silence_limit_ &&
               stats_.retransmits - resends_at_heard >= kSilentResends) {
      return silent_status(now - last_heard, stats_.retransmits - resends_at_heard);
    }
    // A full batch means more datagrams are waiting: results may be among them, so timers are
    // checked only once the receive queue is drained. Otherwise a rank that was descheduled for a
    // few milliseconds wakes up to expired timers and resends blocks whose results sit unread in
    // its socket (each such resend costs the aggregator a full result packet).
    if (n < rx_.size() && now >= next_due_) retransmit_due(now);
    INA_RETURN_IF_ERROR(flush());
  }

  INA_DEBUG("worker",
            "rank %d: %s done in %.3f ms: %" PRIu64 " blocks of %u, window %u, %" PRIu64
            " packets sent, %" PRIu64 " retransmits (%" PRIu64 " presumed lost), %" PRIu64
            " duplicate results; timeout %.2f ms, srtt %.3f ms, base rtt %.3f ms",
            cfg_.rank, describe_collective().c_str(), ms_since(start), c.blocks, c.block_elems,
            cc_.window(), stats_.packets_sent - before.packets_sent,
            stats_.retransmits - before.retransmits,
            stats_.fast_retransmits - before.fast_retransmits,
            stats_.duplicate_results - before.duplicate_results,
            std::chrono::duration<double, std::milli>(cc_.rto()).count(),
            std::chrono::duration<double, std::milli>(cc_.srtt()).count(),
            std::chrono::duration<double, std::milli>(cc_.base_rtt()).count());
  return ok_status();
}

void IncEngine::ensure_slot_buffers(uint32_t width) {
  if (slots_.size() >= width) return;
  // Grows to the widest collective seen (at most the window); pointers are refreshed because the
  // storage may move, which is fine between collectives.
  slots_.resize(width);
  ready_.reserve(width);  // each slot waits there at most once: no allocation per packet
  slot_missing_.resize(width);
  pkt_storage_.resize((size_t{width} + 1) * kSlotPacket);
  uint8_t* base = pkt_storage_.data();
  base += (kSlotPacket - reinterpret_cast<uintptr_t>(base) % kSlotPacket) % kSlotPacket;
  for (size_t s = 0; s < slots_.size(); ++s) slots_[s].pkt = base + s * kSlotPacket;
}

size_t IncEngine::block_len(uint64_t block) const {
  const uint64_t first = block * coll_.block_elems;
  return static_cast<size_t>(std::min<uint64_t>(coll_.block_elems, coll_.count - first));
}

const uint8_t* IncEngine::block_in(uint64_t block) const {
  return coll_.send + block * coll_.block_elems * coll_.elem_size;
}

uint8_t* IncEngine::block_out(uint64_t block) const {
  return coll_.recv + block * coll_.block_elems * coll_.elem_size;
}

void IncEngine::finish_header(Slot& sl, uint8_t flags, uint16_t count) {
  wire::Header h;
  h.flags = flags;
  h.job = cfg_.job;
  h.seq = sl.seq;
  h.rank = static_cast<uint16_t>(cfg_.rank);
  h.slot = static_cast<uint16_t>(&sl - slots_.data());
  h.shadow = sl.shadow;
  h.count = count;
  h.dtype = coll_.dtype;
  h.op = coll_.op;
  h.coll = coll_.coll;
  h.elems = static_cast<uint32_t>(coll_.shape_elems);
  h.exp = kNoExponent;
  h.root = wire::kNoRoot;
  wire::encode_header(h, sl.pkt);
  sl.pkt_len = static_cast<uint32_t>(wire::kHeaderSize + count * coll_.elem_size);
  sl.count = count;
}

void IncEngine::start_block(uint32_t s, uint64_t block) {
  Slot& sl = slots_[s];
  const Collective& c = coll_;
  const size_t len = block_len(block);
  sl.block = block;
  sl.seq = static_cast<BlockSeq>(c.base_seq + block);
  sl.shadow = ((sl.first_use + sl.rounds) & 1) != 0;
  ++sl.rounds;
  finish_header(sl, 0, static_cast<uint16_t>(len));
  // The raw elements, little-endian as the user's buffer is (wire.h), stay where they are: the
  // header is sealed over them and the transport gathers them into the datagram (flush()). The
  // user's send buffer is not written while the collective runs, and a block's result (which may
  // overwrite it in place) arrives only once the block is sent for good.
  sl.pkt_len = static_cast<uint32_t>(wire::kHeaderSize);
  sl.body = block_in(block);
  sl.body_len = static_cast<uint32_t>(len * c.elem_size);
}

void IncEngine::queue(uint32_t s, Clock::time_point now) {
  Slot& sl = slots_[s];
  sl.active = true;
  sl.resealed = false;
  sl.retransmitted = false;
  sl.presumed_lost = false;
  sl.sent_at = now;
  sl.xmit_at = now;
  sl.rto = cc_.rto();
  ++inflight_;
  sl.due = now + sl.rto;
  next_due_ = std::min(next_due_, sl.due);
  if (!sl.queued) {
    sl.queued = true;
    tx_slots_.push_back(s);
  }
}

Status IncEngine::flush() {
  if (tx_slots_.empty()) return ok_status();
  // Spans are built now, not at queue time: the packet is final once the iteration is over.
  gtx_.clear();
  for (uint32_t s : tx_slots_) {
    Slot& sl = slots_[s];
    sl.queued = false;
    const std::span<uint8_t> head(sl.pkt, sl.pkt_len);
    const std::span<const uint8_t> body = sl.pkt_len == wire::kHeaderSize
                                              ? std::span<const uint8_t>(sl.body, sl.body_len)
                                              : std::span<const uint8_t>();
    if (!sl.resealed) {
      wire::seal_parts(head, body, traffic_key_);
      sl.resealed = true;
    }
    gtx_.push_back(GatherDatagram{head, body});
  }
  tx_slots_.clear();
  stats_.packets_sent += gtx_.size();
  return transport_->send_gather(gtx_);
}

void IncEngine::retransmit_due(Clock::time_point now) {
  const Clock::duration rto_max = cfg_.retransmit * kMaxBackoff;
  next_due_ = Clock::time_point::max();
  for (uint32_t s = 0; s < coll_.width; ++s) {
    Slot& sl = slots_[s];
    if (!sl.active) continue;
    if (sl.due <= now && !sl.queued) {
      sl.pkt[wire::kOffFlags] |= wire::kFlagRetransmit;
      sl.resealed = false;
      sl.retransmitted = true;
      sl.xmit_at = now;
      // A round presumed lost goes out again on its current timeout; a timer that fired (the
      // result is late: a slow rank, or the resend was lost too) backs off.
      if (sl.presumed_lost) {
        ++stats_.fast_retransmits;
      } else {
        sl.rto = std::min(sl.rto * 2, rto_max);
      }
      sl.presumed_lost = false;
      sl.due = now + sl.rto;
      sl.queued = true;
      tx_slots_.push_back(s);
      ++stats_.retransmits;
      cc_.on_timeout(now);
    }
    next_due_ = std::min(next_due_, sl.due);
  }
}

void IncEngine::presume_lost() {
  loss_moved_ = false;
  for (uint32_t s = 0; s < coll_.width; ++s) {
    Slot& sl = slots_[s];
    if (!sl.active || sl.queued) continue;
    const Clock::time_point lost = loss_.lost_at(sl.xmit_at);
    if (lost < sl.due) {
      sl.due = lost;
      sl.presumed_lost = true;
      next_due_ = std::min(next_due_, lost);
    }
  }
}

Status IncEngine::on_datagram(Datagram d) {
  ++stats_.packets_received;
  wire::PacketView pv;
  if (wire::decode(d, &pv) != wire::DecodeError::kOk || pv.hdr.job != cfg_.job) {
    ++stats_.malformed;
    return ok_status();
  }
  // Only the aggregator holds the job's key: a forged or corrupted reply, or one of an earlier
  // incarnation, changes nothing. A RESULT for a round this rank waits on is verified by the pass
  // that copies its payload into the user's buffer (mac.h, packet_mac_copy: one read of the
  // datagram instead of two) where a forged one's bytes change nothing (result_out).
  uint8_t* out = result_out(pv);
  if (out != nullptr ? !wire::tag_ok_copy(d, traffic_key_, out, CopyDst::kStream)
                     : !wire::tag_ok(d, traffic_key_)) {
    // A late duplicate WELCOME (sealed with the job's key) is not worth a bad_tag.
    if (!pv.hdr.has(wire::kFlagHello) || !wire::tag_ok(d, cfg_.job_key)) ++stats_.bad_tag;
    return ok_status();
  }
  heard_ = true;
  ++authentic_;
  const wire::Header& h = pv.hdr;
  if (h.has(wire::kFlagError)) return on_error(pv);
  if (h.has(wire::kFlagHello)) return ok_status();
  if (h.has(wire::kFlagResult)) return on_result(pv, out != nullptr);
  ++stats_.malformed;  // DATA is never sent to a worker
  return ok_status();
}

IncEngine::ResultFit IncEngine::result_fit(const wire::Header& h) const {
  const Collective& c = coll_;
  if (h.slot >= c.width) return ResultFit::kDuplicate;
  const Slot& sl = slots_[h.slot];
  // A result for a round already done (or of an older collective).
  if (!sl.active || h.seq != sl.seq || h.shadow != sl.shadow) return ResultFit::kDuplicate;
  if (h.count != sl.count || h.dtype != c.dtype || h.op != c.op || h.has(wire::kFlagPartial)) {
    return ResultFit::kMalformed;
  }
  return ResultFit::kFits;
}

// A RESULT that fits its round may be copied before its tag is known only where a forged one's
// bytes change nothing: the user's block of an active round, which nothing reads until its
// genuine result overwrites it, unless the collective is in place (send and recv overlap: that
// block is also the DATA a retransmission sends, so there the tag is checked first).
uint8_t* IncEngine::result_out(const wire::PacketView& pv) const {
  const wire::Header& h = pv.hdr;
  if ((h.flags & (wire::kFlagResult | wire::kFlagHello | wire::kFlagError)) != wire::kFlagResult ||
      result_fit(h) != ResultFit::kFits) {
    return nullptr;
  }
  const Collective& c = coll_;
  const uintptr_t send = reinterpret_cast<uintptr_t>(c.send);
  const uintptr_t recv = reinterpret_cast<uintptr_t>(c.recv);
  const uintptr_t bytes = c.count * c.elem_size;
  if (send < recv + bytes && recv < send + bytes) return nullptr;
  return block_out(slots_[h.slot].block);
}

Status IncEngine::on_result(const wire::PacketView& pv, bool copied) {
  const wire::Header& h = pv.hdr;
  Collective& c = coll_;
  switch (result_fit(h)) {
    case ResultFit::kFits: break;
    case ResultFit::kDuplicate: ++stats_.duplicate_results; return ok_status();
    case ResultFit::kMalformed: ++stats_.malformed; return ok_status();
  }
  const uint32_t s = h.slot;
  Slot& sl = slots_[s];
  sl.active = false;
  --c.rounds_left;
  const Clock::time_point now = Clock::now();
  // Karn's rule: a round that was resent gives no sample, unless this is the aggregator's
  // original result (not marked RETRANSMIT): then the first transmission completed the round,
  // the resend was spurious, and leaving out exactly these slow rounds would bias the
  // estimate low and cause more spurious resends.
  if (settling_) {
    // Answered after the deadline: the round waited for a late rank, not for the path.
    rtt_sample(now, Clock::duration::zero());
  } else if (!sl.retransmitted) {
    rtt_sample(now, now - sl.sent_at);
  } else if (!h.has(wire::kFlagRetransmit)) {
    ++stats_.spurious_retransmits;
    rtt_sample(now, now - sl.sent_at);
  } else {
    rtt_sample(now, Clock::duration::zero());  // a delivery, no sample (Karn)
  }
  --inflight_;
  // Only a round sent once tells when it was sent (Karn again).
  if (!sl.retransmitted && !settling_) {
    loss_moved_ |= loss_.on_delivered(sl.xmit_at, now, cc_.srtt());
  }
  const uint64_t block = sl.block;
  ++sl.results;
  // The reduced elements in the user's type (a NONFINITE block: the aggregator's NaNs), unless
  // the pass that verified the tag put them there.
  if (!copied) std::memcpy(block_out(block), pv.payload, pv.payload_bytes);
  if (h.has(wire::kFlagNonFinite) && c.dtype != DType::kInt32) ++stats_.nonfinite_blocks;
  const uint64_t next = block + c.width;
  if (next < c.blocks) start_or_defer(s, next, now);
  launch_ready(now);
  return ok_status();
}

void IncEngine::start_or_defer(uint32_t s, uint64_t block, Clock::time_point now) {
  if (ready_.empty() && may_launch(block)) {
    // The usual case in a stream (a result frees the window for its slot's next block): what
    // the heap would return at once, without the heap.
    start_block(s, block);
    queue(s, now);
    return;
  }
  ready_.push_back(block);  // its slot: block mod W'
  std::push_heap(ready_.begin(), ready_.end(), std::greater<>());
  launch_ready(now);
}

// Ready blocks go out lowest block first, and the lowest block this rank has not completed goes
// out even when the window is full. Without that, ranks could deadlock: a block completes only
// when every rank sent it, and a rank whose window is full of blocks another rank has not sent
// would wait for that rank, whose own full window waits for this one. With it, the lowest block
// no rank has completed is always sent by every rank (at each, every lower block is done, or
// outstanding and recovered by retransmission), so it completes.
//
// "No lower block is out" is tested in O(1) amortised: the blocks this rank has not completed are
// each slot's current one (outstanding, waiting in ready_, or not yet started at the start of a
// collective, all above the lowest ready one), so a lower block is out exactly when the lowest
// incomplete block (low_) is below the lowest ready one. low_ only moves up, once per block of
// the collective: block b is complete when its slot b mod W' has more than b / W' results.
bool IncEngine::may_launch(uint64_t block) {
  if (inflight_ < cc_.window()) return true;
  const uint32_t width = coll_.width;
  while (low_ < block && slots_[low_slot_].results > low_round_) {
    ++low_;
    if (++low_slot_ == width) {
      low_slot_ = 0;
      ++low_round_;
    }
  }
  return low_ == block;  // (low_ <= block always: block is not complete)
}

void IncEngine::launch_ready(Clock::time_point now) {
  while (!ready_.empty()) {
    const uint64_t block = ready_.front();
    if (!may_launch(block)) return;  // a lower one is out
    std::pop_heap(ready_.begin(), ready_.end(), std::greater<>());
    ready_.pop_back();
    const auto s = static_cast<uint32_t>(block % coll_.width);
    start_block(s, block);
    queue(s, now);
  }
}

void IncEngine::rtt_sample(Clock::time_point now, Clock::duration rtt) {
  // `inflight_` still counts the round this result retires.
  cc_.on_result(now, rtt, inflight_);
  stats_.rto_us = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(cc_.rto()).count());
}

}  // namespace ina::worker
