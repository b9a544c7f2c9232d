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
// A dead aggregator: its host answers our datagrams with ICMP port unreachable, which the kernel
// UDP transport counts as refusals. Refusals during a collective and no datagram from the
// aggregator for kRefusedSilence end the collective at once with Unavailable (the communicator
// redoes it on the host path when the fallback is armed), instead of waiting for the deadline,
// which stays for aggregators that are alive but silent and for ranks that are missing. An
// aggregator that is alive answers every retransmission (a result or its contributor bitmap), so
// silence with refusals is not what a slow job looks like. After kSilenceProbe without a datagram
// the rank sends the aggregator an empty datagram (Transport::probe; the aggregator ignores it),
// so that a dead one is refused within tens of milliseconds: otherwise, with no result coming
// back, the rank would send nothing, and learn nothing, until a retransmission timer fired
// (hundreds of milliseconds on a loaded machine). Joining, the same holds after
// kRefusedJoin of refusals with no answer at all (longer: an aggregator may start a little after
// its ranks), so a dead or mistyped aggregator, and the probe that asks whether a lost one is
// back, fail within a second instead of the join's whole deadline.
//
// A silent aggregator: one restarted on the same port (a supervisor's restart) neither refuses
// nor answers (it has no key for this incarnation: every DATA is a bad tag there), and neither
// does a host that is down. An aggregator that is alive answers every retransmission, with a
// result or, while ranks are missing, its contributor bitmap (a straggler of seconds keeps
// getting them). So where the host path can take over (the path policy arms this with
// set_silence_limit), kSilentResends retransmissions unanswered and nothing authentic for the
// limit end the collective with Unavailable too. Without the fallback only the deadline ends the
// wait, as before: an early error would gain a user nothing over a stall of the aggregator that
// may pass.
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
// between polls) before it blocks, when at most kSpinRounds rounds are outstanding: then the
// collective waits on a round trip that nothing else overlaps (a small collective, or a large
// one's last rounds), and a blocked rank would add a wake-up to it (10-15 us on the 2-core VM, at
// each end: the aggregator polls after traffic too, udp_lane.cc). With more rounds outstanding
// the window hides the wake-up, and each one returns a batch of results, so the rank blocks and
// leaves the CPU to the others. On the 2-core VM (issue 16, testbed/results/spin-20261205/) an
// 8 B AllReduce at 4 ranks took 83-112 us blocking, more than libina's host halving-doubling
// (63-75 us); polling, 50-68 us (medians: 0.87x halving-doubling, 0.59x Open MPI over TCP).
//
// Cost per packet: two copies (into the kept packet, out of the result), no allocation, no lock,
// no log. Sends of one loop iteration go out as one batch.
//
// Length: one state machine (the window, resends, the deadline and its error) documented where
// it is implemented; its codec is protocol/codec.h and its I/O the transports.
#include "worker/inc_engine.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <thread>

#include "ina/base/log.h"
#include "worker/communicator_impl.h"
#include "worker/transport/fault_transport.h"

namespace ina::worker {
namespace {

constexpr size_t kRecvBatch = 64;

// Serial-number distance: how far `seq` is past `base` (mod 2^32).
uint32_t seq_offset(BlockSeq seq, BlockSeq base) { return static_cast<uint32_t>(seq - base); }

// The tag (WIRE.md, mac.h: POLYVAL, then SipHash-2-4) over the whole packet, sealed before it is
// sent (a retransmission re-seals, the RETRANSMIT flag being covered): HELLO under the job's key,
// DATA and aborts under the incarnation's (traffic_key_), so that the aggregator can tell them from
// an earlier incarnation's, whose block sequence started at 1 too.
void seal_tag(std::span<uint8_t> packet, const Key128& key) { wire::seal(packet, key); }

// The incarnation nonce of a join (wire::next_nonce): from the clock, and past every nonce this
// process gave before (two communicators of one rank created within one tick differ too). The
// aggregator drops a HELLO older than the rank's newest, so a captured HELLO replayed later
// cannot restart the barrier; a rank restarted on a host whose clock is behind the previous
// one's waits for it to catch up (a deadline error names the join).
uint32_t incarnation_nonce() {
  static std::atomic<uint32_t> last{0};
  const auto unix_ms =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  uint32_t prev = last.load(std::memory_order_relaxed);
  uint32_t n;
  do {
    n = wire::next_nonce(unix_ms, prev);
  } while (!last.compare_exchange_weak(prev, n, std::memory_order_relaxed));
  return n;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

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
// Join barrier

Status IncEngine::join(std::chrono::milliseconds timeout, std::chrono::milliseconds refused) {
  joined_ = false;
  const std::chrono::milliseconds limit_ms = timeout.count() > 0 ? timeout : cfg_.timeout;
  const uint32_t nonce = incarnation_nonce();
  // The largest block this rank can carry: the configured one, and what one datagram holds on
  // the path to the aggregator (its MTU: no IP fragments). The aggregator WELCOMEs every rank
  // with the smallest any rank named, so all cut their buffers alike (WIRE.md, "Join barrier").
  const auto path_bytes = static_cast<uint32_t>(
      std::min<size_t>(transport_->max_datagram() - wire::kHeaderSize, 0xFFFF));
  // A multiple of 4 bytes (every element width divides it), at least 4 (the aggregator's floor).
  const uint32_t block_limit =
      std::max<uint32_t>(4, std::min(cfg_.block_elems * 4, path_bytes) & ~uint32_t{3});
  std::array<uint8_t, wire::control_packet_size(2)> hello{};
  wire::Header h;
  h.flags = wire::kFlagHello;
  h.job = cfg_.job;
  h.seq = nonce;
  h.rank = static_cast<uint16_t>(cfg_.rank);
  h.slot = 0;
  h.count = 2;
  h.dtype = DType::kInt32;
  h.op = ReduceOp::kSum;
  wire::encode_header(h, hello.data());
  const int32_t payload[2] = {static_cast<int32_t>(world_), static_cast<int32_t>(block_limit)};
  wire::store_words(hello.data() + wire::kHeaderSize, payload, 2);
  seal_tag(hello, cfg_.job_key);
  const std::span<const uint8_t> pkt[1] = {std::span<const uint8_t>(hello)};

  rx_.assign(kRecvBatch, Datagram());
  missing_ = MissingReport{};
  heard_ = false;
  const uint64_t refusals0 = transport_->refusals();
  const uint64_t bad_tags0 = stats_.bad_tag;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + limit_ms;
  const Clock::duration rto_max = cfg_.retransmit * kMaxBackoff;
  Clock::duration rto = cfg_.retransmit;
  Clock::time_point due = start + rto;
  bool prompted = false;  // the aggregator's barrier notice made us resend the HELLO
  INA_RETURN_IF_ERROR(transport_->send_batch(pkt));
  ++stats_.packets_sent;
  transport_->set_spin(std::chrono::microseconds(0));  // the other ranks may take seconds

  const std::string who = "joining job " + std::to_string(cfg_.job) + " as rank " +
                          std::to_string(cfg_.rank) + " of " + std::to_string(world_) +
                          " at aggregator " + transport_->peer_name();
  for (;;) {
    Clock::time_point now = Clock::now();
    if (now >= deadline) break;
    if (!heard_ && now - start >= refused && transport_->refusals() != refusals0) {
      return unavailable(who + ": the aggregator refused every datagram for " +
                         std::to_string(refused.count()) +
                         " ms (ICMP port unreachable: nothing listens at its port; is it running, "
                         "and is INA_AGGREGATOR's port right?)");
    }
    const auto wait = std::chrono::ceil<std::chrono::microseconds>(std::min(due, deadline) - now);
    INA_ASSIGN_OR_RETURN(size_t n, transport_->recv_batch(rx_, wait));
    for (size_t i = 0; i < n; ++i) {
      ++stats_.packets_received;
      wire::PacketView pv;
      if (wire::decode(rx_[i], &pv) != wire::DecodeError::kOk || pv.hdr.job != cfg_.job) {
        ++stats_.malformed;
        continue;
      }
      // Only the aggregator holds the job's key: anything else is dropped unseen.
      if (!wire::tag_ok(rx_[i], cfg_.job_key)) {
        ++stats_.bad_tag;
        continue;
      }
      heard_ = true;
      const wire::Header& r = pv.hdr;
      if (r.has(wire::kFlagError)) {
        ++stats_.error_reports;
        if (r.count < 1) {
          ++stats_.malformed;
          continue;
        }
        const auto reason = static_cast<wire::ErrorReason>(pv.word(0));
        if (reason == wire::ErrorReason::kWorldSizeMismatch) {
          const std::string theirs = r.count >= 2 ? std::to_string(pv.word(1)) : "another";
          return invalid_argument(who + ": world size mismatch: this rank has world size " +
                                  std::to_string(world_) +
                                  " (INA_WORLD_SIZE), the aggregator's job " +
                                  std::to_string(cfg_.job) + " has world size " + theirs);
        }
        if (reason == wire::ErrorReason::kMissingRanks ||
            reason == wire::ErrorReason::kJobNotReady) {
          remember_missing(pv, reason);  // the HELLO bitmap: who has joined
        }
        continue;
      }
      if (r.has(wire::kFlagHello) && r.has(wire::kFlagResult)) {
        if (r.count < wire::kWelcomeWords || pv.word(0) < 1 || pv.word(1) < 1) {
          ++stats_.malformed;
          continue;
        }
        if (r.seq != nonce) {
          // Only the WELCOME that answers this HELLO (seq = its nonce) is adopted: one of an
          // earlier incarnation, replayed, would name an old epoch (WIRE.md, "Incarnations").
          // seq 0 is the aggregator's notice to every rank that the barrier completed: the HELLO
          // goes again at once (once per join; then the timer's), to be answered.
          if (r.seq == 0 && !prompted) {
            prompted = true;
            due = Clock::now();
          }
          continue;
        }
        const auto num_slots = static_cast<uint32_t>(pv.word(0));
        const auto max_bytes = static_cast<uint32_t>(pv.word(1));
        // A multiple of 4 bytes, so that every element width divides it; at most this rank's
        // limit (an aggregator that ignores the HELLO's second word offers its own block).
        payload_bytes_ = std::min(block_limit, max_bytes) & ~uint32_t{3};
        if (payload_bytes_ == 0) {
          ++stats_.malformed;
          continue;
        }
        window_ = std::min({cfg_.window, num_slots, uint32_t{wire::kMaxSlot} + 1});
        traffic_key_ = wire::incarnation_key(cfg_.job_key, wire::welcome_epoch(pv));
        // The aggregator reset the job's slot table when the barrier completed: start afresh.
        use_.assign(window_, 0);
        next_seq_ = 1;
        next_coll_ = 1;
        slots_.clear();
        pkt_storage_.clear();
        pkt_capacity_ = wire::kHeaderSize + payload_bytes_;
        tx_.clear();
        tx_.reserve(window_);
        tx_slots_.clear();
        tx_slots_.reserve(window_);
        joined_ = true;
        CongestionControl::Options cco;
        cco.max_window = window_;
        cco.initial_window = std::min<uint32_t>(window_, 16);
        cco.min_window = std::min<uint32_t>(window_, 8);
        cco.rto_floor = cfg_.retransmit;
        cco.rto_ceiling = cfg_.retransmit * kMaxBackoff;
        cc_ = CongestionControl(cco);
        INA_DEBUG("worker",
                  "rank %d joined job %u at %s in %.1f ms: block %u bytes, window %u "
                  "(aggregator offers %u slots, %u bytes)",
                  cfg_.rank, cfg_.job, transport_->peer_name().c_str(), ms_since(start),
                  payload_bytes_, window_, num_slots, max_bytes);
        return ok_status();
      }
      // Anything else (a stale result) is of no interest before the barrier.
    }
    now = Clock::now();
    if (now >= due && now < deadline) {
      hello[wire::kOffFlags] |= wire::kFlagRetransmit;
      seal_tag(hello, cfg_.job_key);  // the flag is covered by the tag
      INA_RETURN_IF_ERROR(transport_->send_batch(pkt));
      ++stats_.packets_sent;
      ++stats_.retransmits;
      rto = std::min(rto * 2, rto_max);
      due = now + rto;
    }
  }

  const std::string limit = std::to_string(limit_ms.count()) + " ms";
  if (missing_.valid) {
    const std::string ranks = missing_ranks_text(missing_.bitmap);
    if (!ranks.empty()) {
      return deadline_exceeded(who + ": deadline " + limit + " exceeded; ranks " + ranks +
                               " have not joined (aggregator bitmap)");
    }
  }
  if (heard_) {
    return deadline_exceeded(who + ": deadline " + limit +
                             " exceeded without a WELCOME from the aggregator");
  }
  std::string forged;
  if (stats_.bad_tag != bad_tags0) {
    forged = "; " + std::to_string(stats_.bad_tag - bad_tags0) +
             " datagrams for the job had a tag this key does not give (dropped)";
  }
  return unavailable(who + ": no answer from aggregator " + transport_->peer_name() + " within " +
                     limit + " (is it running and serving job " + std::to_string(cfg_.job) +
                     " with this key? it drops, unanswered, every packet whose tag its job key "
                     "does not give: INA_JOB_KEY must be the job's)" +
                     forged + refused_note(refusals0));
}

void IncEngine::lower_payload_bytes(uint32_t bytes) {
  bytes &= ~uint32_t{3};
  if (bytes == 0 || bytes >= payload_bytes_) return;
  payload_bytes_ = bytes;
  slots_.clear();
  pkt_storage_.clear();
  pkt_capacity_ = wire::kHeaderSize + payload_bytes_;
}

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
    transport_->set_spin(spin_for(inflight_));
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
  slot_missing_.resize(width);
  pkt_storage_.resize(size_t{width} * pkt_capacity_);
  for (size_t s = 0; s < slots_.size(); ++s) {
    slots_[s].pkt = pkt_storage_.data() + s * pkt_capacity_;
  }
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
  // incarnation, changes nothing.
  if (!wire::tag_ok(d, traffic_key_)) {
    // A late duplicate WELCOME (sealed with the job's key) is not worth a bad_tag.
    if (!pv.hdr.has(wire::kFlagHello) || !wire::tag_ok(d, cfg_.job_key)) ++stats_.bad_tag;
    return ok_status();
  }
  heard_ = true;
  ++authentic_;
  const wire::Header& h = pv.hdr;
  if (h.has(wire::kFlagError)) return on_error(pv);
  if (h.has(wire::kFlagHello)) return ok_status();
  if (h.has(wire::kFlagResult)) return on_result(pv);
  ++stats_.malformed;  // DATA is never sent to a worker
  return ok_status();
}

Status IncEngine::on_result(const wire::PacketView& pv) {
  const wire::Header& h = pv.hdr;
  Collective& c = coll_;
  if (h.slot >= c.width) {
    ++stats_.duplicate_results;
    return ok_status();
  }
  const uint32_t s = h.slot;
  Slot& sl = slots_[s];
  if (!sl.active || h.seq != sl.seq || h.shadow != sl.shadow) {
    ++stats_.duplicate_results;  // a result for a round already done (or of an older collective)
    return ok_status();
  }
  if (h.count != sl.count || h.dtype != c.dtype || h.op != c.op || h.has(wire::kFlagPartial)) {
    ++stats_.malformed;
    return ok_status();
  }
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
  // The reduced elements in the user's type (a NONFINITE block: the aggregator's NaNs).
  std::memcpy(block_out(block), pv.payload, pv.payload_bytes);
  if (h.has(wire::kFlagNonFinite) && c.dtype != DType::kInt32) ++stats_.nonfinite_blocks;
  const uint64_t next = block + c.width;
  if (next < c.blocks) start_or_defer(s, next, now);
  launch_ready(now);
  return ok_status();
}

void IncEngine::start_or_defer(uint32_t s, uint64_t block, Clock::time_point now) {
  Slot& sl = slots_[s];
  sl.next_block = block;
  ready_.push_back(s);
  std::push_heap(ready_.begin(), ready_.end(), ReadyLater{&slots_});
  launch_ready(now);
}

// Ready blocks go out lowest block first, and the lowest block this rank has not completed goes
// out even when the window is full. Without that, ranks could deadlock: a block completes only
// when every rank sent it, and a rank whose window is full of blocks another rank has not sent
// would wait for that rank, whose own full window waits for this one. With it, the lowest block
// no rank has completed is always sent by every rank (at each, every lower block is done, or
// outstanding and recovered by retransmission), so it completes.
void IncEngine::launch_ready(Clock::time_point now) {
  const uint32_t window = cc_.window();
  while (!ready_.empty()) {
    const uint32_t s = ready_.front();
    const uint64_t block = slots_[s].next_block;
    if (inflight_ >= window) {
      for (uint32_t t = 0; t < coll_.width; ++t) {
        const Slot& o = slots_[t];
        if (o.active && o.block < block) return;  // a lower one is out
      }
    }
    std::pop_heap(ready_.begin(), ready_.end(), ReadyLater{&slots_});
    ready_.pop_back();
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

Status IncEngine::on_error(const wire::PacketView& pv) {
  ++stats_.error_reports;
  const wire::Header& h = pv.hdr;
  if (h.count < 1) {
    ++stats_.malformed;
    return ok_status();
  }
  const auto reason = static_cast<wire::ErrorReason>(pv.word(0));
  switch (reason) {
    case wire::ErrorReason::kMissingRanks:
    case wire::ErrorReason::kJobNotReady:
      if (in_collective(h.seq)) remember_missing(pv, reason);
      break;
    case wire::ErrorReason::kRoundMismatch:
      if (in_collective(h.seq)) {
        resync_after_mismatch();
        // A flat aggregator's poisoned round: both shapes and their ranks (wire.h).
        if (h.count >= 6 + (world_ + 31) / 32) {
          mismatch_body_ = mismatch_text(pv);
          return invalid_argument("collective " + std::to_string(coll_.coll) + ": " +
                                  mismatch_body_);
        }
        mismatch_body_ =
            "ranks disagree on count/dtype/op: every rank must call allreduce with the same "
            "arguments (and the same INA_BLOCK_ELEMS and INA_WINDOW)";
        std::string m = describe_collective() + ": " + mismatch_body_;
        if (h.count >= 2) {
          const uint16_t slot = h.slot;
          m += "; the aggregator's round for block seq " + std::to_string(h.seq) + " (slot " +
               std::to_string(slot) + ") expects " + std::to_string(pv.word(1)) + " elements";
          if (slot < coll_.width) m += ", this rank sent " + std::to_string(slots_[slot].count);
        }
        return invalid_argument(std::move(m));
      }
      break;
    case wire::ErrorReason::kAborted:
    case wire::ErrorReason::kSuperseded: {
      // Another rank gave up on a round this rank still waits for (it reached its deadline
      // before this rank's block arrived), or the others have moved past it since: every rank
      // fails the collective. Only the outstanding round counts: the answer to a delayed
      // duplicate of an older round says nothing.
      const Slot* sl = h.slot < coll_.width ? &slots_[h.slot] : nullptr;
      const bool aborted = reason == wire::ErrorReason::kAborted;
      if (sl == nullptr || !sl->active || sl->seq != h.seq || sl->shadow != h.shadow ||
          h.count < (aborted ? 3 : 2)) {
        break;
      }
      // The copy holds a round at or past this collective's resynchronization point: the others
      // moved on because the aggregator told them the ranks disagree on this collective, and
      // this rank was not told (its answer was lost, or it has not resent yet). Its next resend
      // of the poisoned round gets the same mismatch words (the aggregator keeps them for the
      // collective), so it waits for them instead of failing otherwise than the others did.
      if (!aborted && seq_offset(static_cast<BlockSeq>(pv.word(1)), resync_point(coll_.base_seq)) <
                          (uint32_t{1} << 31)) {
        break;
      }
      const std::string who = aborted ? "rank " + std::to_string(pv.word(1)) + " gave up on"
                                      : std::string("the other ranks gave up on and moved past");
      // What the aggregator last said it lacked for that round (or any), when it said so: the
      // ranks that made the others give up.
      const MissingReport* rep = report_for(h.slot, h.seq);
      std::string lacking;
      if (rep != nullptr && rep->reason == wire::ErrorReason::kMissingRanks) {
        lacking = missing_clause(*rep);
      }
      // The ranks that did not contribute, when known, come first: they are the cause, and the
      // rank that gave up is only the first to reach its deadline.
      std::string cause;
      if (!lacking.empty()) cause = lacking.substr(2) + "; ";  // without its leading "; "
      return deadline_exceeded(describe_collective() + ": aborted: " + cause + who + " block seq " +
                               std::to_string(h.seq) + " (slot " + std::to_string(h.slot) +
                               ") at the deadline (INA_TIMEOUT_MS), before the round completed; "
                               "every rank fails this collective, and the communicator stays "
                               "usable for the next one");
    }
    case wire::ErrorReason::kWorldSizeMismatch:
    default: break;  // not about a collective; joining handles it
  }
  return ok_status();
}

void IncEngine::remember_missing(const wire::PacketView& pv, wire::ErrorReason reason) {
  missing_.valid = true;
  missing_.reason = reason;
  missing_.seq = pv.hdr.seq;
  missing_.slot = pv.hdr.slot;
  missing_.bitmap.resize(pv.hdr.count - 1u);  // capacity stays after the first report
  for (size_t w = 1; w < pv.hdr.count; ++w) {
    missing_.bitmap[w - 1] = static_cast<uint32_t>(pv.word(w));
  }
  if (pv.hdr.slot < slot_missing_.size()) {
    MissingReport& r = slot_missing_[pv.hdr.slot];
    r.valid = true;
    r.reason = reason;
    r.seq = missing_.seq;
    r.slot = missing_.slot;
    r.bitmap.assign(missing_.bitmap.begin(), missing_.bitmap.end());  // capacity reused
  }
}

std::string IncEngine::tree_note_text(const MissingReport& r) const {
  // A tree leaf's note after the world's bitmap words (see wire::ErrorReason::kMissingRanks):
  // the tag, flags, the number of leaves the missing ranks are behind, the first few of them.
  const std::vector<uint32_t>& b = r.bitmap;
  const size_t words = (size_t{world_} + 31) / 32;
  if (!r.valid || r.reason != wire::ErrorReason::kMissingRanks || b.size() < words + 3 ||
      b[words] != wire::kTreeNoteTag) {
    return {};
  }
  const bool by_rule = (b[words + 1] & wire::kTreeNoteByRule) != 0;
  const uint32_t leaves = b[words + 2];
  if (leaves == 0) return {};
  const size_t listed = std::min<size_t>({b.size() - words - 3, leaves, wire::kTreeNoteMaxLeaves});
  std::string s = leaves == 1 ? " (behind tree leaf " : " (behind tree leaves ";
  for (size_t i = 0; i < listed; ++i) {
    if (i != 0) s += ", ";
    s += std::to_string(b[words + 3 + i]);
  }
  if (leaves > listed) s += ", ... (" + std::to_string(leaves) + " in all)";
  if (by_rule) {
    s += "; the root names leaves only, their ranks follow from the balanced rule leaf i of n "
         "serves [i*W/n, (i+1)*W/n)";
  }
  return s + ")";
}

bool IncEngine::in_collective(BlockSeq seq) const {
  return seq_offset(seq, coll_.base_seq) < coll_.rounds_total;
}

// ---------------------------------------------------------------------------------------------
// Messages

std::string IncEngine::describe_collective() const {
  std::string s = "allreduce of " + std::to_string(coll_.count) + " ";
  s += dtype_name(coll_.dtype);
  s += " elements (";
  s += op_name(coll_.op);
  s += ")";
  return s;
}

// A poisoned round's words (wire.h, kRoundMismatch): the same text on every rank. The group
// holding rank 0 comes first, whichever shape reached the aggregator first.
std::string IncEngine::mismatch_text(const wire::PacketView& pv) const {
  const uint32_t words = (world_ + 31) / 32;
  std::vector<uint32_t> other(words), first(words);
  for (uint32_t w = 0; w < words; ++w) {
    other[w] = static_cast<uint32_t>(pv.word(6 + w));
    first[w] = ~other[w];
  }
  auto shape = [](uint32_t elems, uint32_t packed) {
    const auto t = static_cast<DType>(packed & 0xFF);
    const auto op = static_cast<ReduceOp>((packed >> 8) & 0xFF);
    const auto root = static_cast<uint16_t>(packed >> 16);
    std::string s = std::to_string(elems) + " " + std::string(dtype_name(t)) + " elements (" +
                    std::string(op_name(op)) + ")";
    if (root != wire::kNoRoot) s += " to root " + std::to_string(root);
    return s;
  };
  // missing_ranks_text lists the ranks whose bit is clear.
  const std::string a = "ranks " + missing_ranks_text(other) + ": " +
                        shape(static_cast<uint32_t>(pv.word(2)), static_cast<uint32_t>(pv.word(3)));
  const std::string b = "ranks " + missing_ranks_text(first) + ": " +
                        shape(static_cast<uint32_t>(pv.word(4)), static_cast<uint32_t>(pv.word(5)));
  const bool rank0_other = (other[0] & 1u) != 0;
  return "ranks disagree on count/dtype/op (" + (rank0_other ? b + "; " + a : a + "; " + b) +
         "): every rank must call allreduce with the same arguments; the communicator stays "
         "usable for the next collective";
}

// At the deadline. This rank gives up on its outstanding rounds (ERROR kAborted), but a late
// rank's last block may reach the aggregator before the abort does: then the round completes
// there, the late rank returns success, and this rank must not fail. The two race to the
// aggregator, and only there is their order known, so it decides: it answers each abort with the
// round's result (the round completed first) or with the abort (the abort came first; every
// later DATA for the round gets the same words, so the late rank fails too). This rank waits for
// those answers, up to kAbortSettle, resending its aborts on the retransmission timer: a result
// for every remaining round completes the collective (late, and the same on every rank); any
// abort, or no answer, fails it. A block this rank never sent cannot have completed anywhere, so
// with one left the collective fails at once. An aggregator that is alive answers within a round
// trip: a rank that is gone costs the others one round trip past their deadline, not
// kAbortSettle.
Status IncEngine::settle_at_deadline(Status failed) {
  uint64_t outstanding = 0;
  for (uint32_t s = 0; s < coll_.width; ++s) outstanding += slots_[s].active ? 1 : 0;
  const bool all_sent = outstanding == coll_.rounds_left;
  send_aborts(/*keep_active=*/all_sent);
  if (!all_sent) return failed;
  // However the wait ends, results sample RTTs again and no round stays outstanding.
  settling_ = true;
  struct Settled {
    IncEngine* e;
    ~Settled() {
      e->settling_ = false;
      for (uint32_t s = 0; s < e->coll_.width; ++s) e->slots_[s].active = false;
    }
  } settled{this};
  const Clock::time_point start = Clock::now();
  const Clock::time_point until = start + kAbortSettle;
  Clock::duration rto = cc_.rto();
  Clock::time_point due = start + rto;
  transport_->set_spin(std::chrono::microseconds(0));  // waiting on the slow, not on a round trip
  for (;;) {
    if (coll_.rounds_left == 0) {
      ++stats_.late_completions;
      INA_DEBUG("worker",
                "rank %d: %s completed %.1f ms after its deadline: the aggregator had completed "
                "every outstanding round before this rank's abort",
                cfg_.rank, describe_collective().c_str(), ms_since(start));
      return ok_status();
    }
    Clock::time_point now = Clock::now();
    if (now >= until) break;
    const auto wait = std::chrono::ceil<std::chrono::microseconds>(std::min(due, until) - now);
    Result<size_t> n = transport_->recv_batch(rx_, wait);
    if (!n.ok()) break;
    for (size_t i = 0; i < n.value(); ++i) {
      // An answer that ends the collective (an abort, a mismatch) fails it. The deadline's own
      // message stays: it names the ranks the aggregator missed.
      Status st = on_datagram(rx_[i]);
      if (!st.ok()) return st.code() == StatusCode::kDeadlineExceeded ? failed : st;
    }
    now = Clock::now();
    if (now >= due && coll_.rounds_left > 0) {
      resend_aborts();
      rto *= 2;
      due = now + rto;
    }
  }
  return failed;
}

void IncEngine::resend_aborts() {
  tx_.clear();
  for (uint32_t s = 0; s < coll_.width; ++s) {
    const Slot& sl = slots_[s];
    if (sl.active) tx_.emplace_back(sl.pkt, sl.pkt_len);
  }
  if (tx_.empty()) return;
  stats_.packets_sent += tx_.size();
  (void)transport_->send_batch(tx_);
}

void IncEngine::send_aborts(bool keep_active) {
  tx_.clear();
  for (uint32_t s = 0; s < coll_.width; ++s) {
    Slot& sl = slots_[s];
    if (!sl.active) continue;
    wire::Header h;  // dtype int32, op sum: the payload is control words
    h.flags = wire::kFlagError;
    h.job = cfg_.job;
    h.seq = sl.seq;
    h.rank = static_cast<uint16_t>(cfg_.rank);
    h.slot = static_cast<uint16_t>(s);
    h.shadow = sl.shadow;
    h.count = 3;
    h.coll = coll_.coll;
    h.elems = static_cast<uint32_t>(coll_.count);
    wire::encode_header(h, sl.pkt);
    const int32_t words[3] = {static_cast<int32_t>(wire::ErrorReason::kAborted), cfg_.rank,
                              static_cast<int32_t>(wire::kAbortDeadline)};
    wire::store_words(sl.pkt + wire::kHeaderSize, words, 3);
    sl.pkt_len = static_cast<uint32_t>(wire::control_packet_size(3));
    seal_tag(std::span<uint8_t>(sl.pkt, sl.pkt_len), traffic_key_);
    sl.active = keep_active;  // the round is given up (or its answer awaited)
    tx_.emplace_back(sl.pkt, sl.pkt_len);
  }
  if (tx_.empty()) return;
  // Twice: one lost copy must not let a late rank complete the round. Best effort: the
  // collective has failed already, and a send error says nothing new.
  for (int i = 0; i < 2; ++i) {
    stats_.packets_sent += tx_.size();
    (void)transport_->send_batch(tx_);
  }
}

// After a mismatch every rank fails the collective (the poisoned rounds tell them all), but each
// advanced its counters by its own block count: every rank moves to the same next point instead
// (the next multiple of 2^24 of the block sequence above this collective's first block, every
// slot's copy parity reset), so the next collective's rounds line up again.
void IncEngine::resync_after_mismatch() { resync(coll_.base_seq, next_coll_); }

BlockSeq IncEngine::resync_point(BlockSeq from) {
  constexpr BlockSeq kStep = BlockSeq{1} << 24;
  const auto next = static_cast<BlockSeq>((from / kStep + 1) * kStep);
  return next == 0 ? 1 : next;  // 0 is never a block's seq
}

void IncEngine::resync(BlockSeq from, uint32_t next_coll) {
  next_seq_ = resync_point(from);
  next_coll_ = next_coll;
  std::fill(use_.begin(), use_.end(), 0u);
}

std::string IncEngine::missing_ranks_text(const std::vector<uint32_t>& bitmap) const {
  // "3", "0-2, 5", capped so a huge job does not produce a huge message.
  constexpr size_t kMaxRanges = 16;
  auto present = [&](uint32_t r) {
    const size_t w = r / 32;
    return w < bitmap.size() && ((bitmap[w] >> (r % 32)) & 1u) != 0;
  };
  std::string s;
  size_t ranges = 0;
  uint32_t missing = 0;
  for (uint32_t r = 0; r < world_;) {
    if (present(r)) {
      ++r;
      continue;
    }
    uint32_t end = r;
    while (end + 1 < world_ && !present(end + 1)) ++end;
    missing += end - r + 1;
    if (ranges < kMaxRanges) {
      if (!s.empty()) s += ", ";
      s += std::to_string(r);
      if (end > r) s += "-" + std::to_string(end);
    }
    ++ranges;
    r = end + 1;
  }
  if (ranges > kMaxRanges) s += ", ... (" + std::to_string(missing) + " in all)";
  return s;
}

std::string IncEngine::refused_note(uint64_t refusals_at_start) const {
  if (transport_->refusals() <= refusals_at_start) return {};
  return "; aggregator " + transport_->peer_name() + " refused (no process listening?)";
}

Status IncEngine::gone_status(Clock::duration silent) const {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(silent).count();
  return unavailable(describe_collective() + ": aggregator " + transport_->peer_name() +
                     " is gone: it refused our datagrams (ICMP port unreachable: nothing listens "
                     "at its port) and sent nothing for " +
                     std::to_string(ms) + " ms");
}

Status IncEngine::silent_status(Clock::duration silent, uint64_t resends) const {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(silent).count();
  return unavailable(describe_collective() + ": aggregator " + transport_->peer_name() +
                     " is silent: nothing authentic from it for " + std::to_string(ms) +
                     " ms and " + std::to_string(resends) +
                     " retransmissions unanswered (stopped, restarted without this job's "
                     "incarnation, or its host down?)");
}

// The aggregator's report on round `seq` of slot `slot` when it has one, else its latest report of
// any block; null without one.
const IncEngine::MissingReport* IncEngine::report_for(size_t slot, BlockSeq seq) const {
  if (slot < slot_missing_.size() && slot_missing_[slot].valid && slot_missing_[slot].seq == seq) {
    return &slot_missing_[slot];
  }
  return missing_.valid ? &missing_ : nullptr;
}

// "; ranks 4-7 (behind tree leaf 1) did not contribute (aggregator bitmap)", from a report of the
// aggregator (a kMissingRanks bitmap, or kJobNotReady's HELLO bitmap).
std::string IncEngine::missing_clause(const MissingReport& rep) const {
  const std::string ranks = missing_ranks_text(rep.bitmap);
  if (rep.reason == wire::ErrorReason::kJobNotReady) {
    return "; the aggregator reports job " + std::to_string(cfg_.job) + " not ready: ranks " +
           (ranks.empty() ? std::string("?") : ranks) + " have not joined (did a rank restart?)";
  }
  if (ranks.empty())
    return "; every rank contributed (aggregator bitmap) but the result did not arrive";
  const bool one = ranks.find_first_of(",-") == std::string::npos;
  return (one ? "; rank " : "; ranks ") + ranks + tree_note_text(rep) +
         " did not contribute (aggregator bitmap)";
}

Status IncEngine::deadline_status(std::chrono::milliseconds limit) const {
  // The oldest outstanding round is the one the collective is waiting for.
  const Slot* oldest = nullptr;
  for (uint32_t s = 0; s < coll_.width; ++s) {
    const Slot& sl = slots_[s];
    if (!sl.active) continue;
    if (oldest == nullptr ||
        seq_offset(sl.seq, coll_.base_seq) < seq_offset(oldest->seq, coll_.base_seq)) {
      oldest = &sl;
    }
  }
  std::string m =
      describe_collective() + ": deadline " + std::to_string(limit.count()) + " ms exceeded";
  if (oldest != nullptr) {
    m += " waiting for block seq " + std::to_string(oldest->seq) + " (slot " +
         std::to_string(oldest - slots_.data()) + ")";
  }
  // The aggregator's report on the oldest outstanding block, when it has one: a rank that is gone
  // is missing from every block from its last one on, while the live ranks, whose windows stop
  // W blocks further, have all sent the oldest; a later block's report would name them too.
  const MissingReport* rep =
      oldest != nullptr ? report_for(static_cast<size_t>(oldest - slots_.data()), oldest->seq)
                        : (missing_.valid ? &missing_ : nullptr);
  if (rep != nullptr)
    return deadline_exceeded(m + missing_clause(*rep) + refused_note(refusals_at_start_));
  if (heard_) {
    return deadline_exceeded(m + "; the aggregator did not report which ranks are missing" +
                             refused_note(refusals_at_start_));
  }
  return unavailable(m + ": no answer from aggregator " + transport_->peer_name() +
                     refused_note(refusals_at_start_));
}

}  // namespace ina::worker
