// The join barrier of the in-network engine (inc_engine.h): the HELLO with a fresh incarnation
// nonce, resent with backoff until the aggregator's WELCOME names the block and the window every
// rank adopts (WIRE.md, "Join barrier"), and the errors of a join that fails.
#include <algorithm>
#include <array>
#include <atomic>
#include <string>

#include "ina/base/log.h"
#include "worker/inc_engine.h"
#include "worker/inc_engine_internal.h"

namespace ina::worker {
namespace {

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

}  // namespace

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
}

}  // namespace ina::worker
