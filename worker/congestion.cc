// The in-network engine's window and retransmission timer.
//
// What is controlled. A rank streams a collective's blocks through the job's W' slots; a round's
// result is its acknowledgement, and the next block on that slot follows it (inc_engine.cc). The
// slots fix how much may be outstanding at most; this controller decides how much is: a window of
// cwnd rounds (a slot whose next block is ready waits while cwnd rounds are outstanding). Every
// rank runs its own controller on its own measurements; they need not agree, because a slot's
// block and sequence number do not depend on when it is sent.
//
// Why the window must adapt. At W' = 128 slots of 1098-byte packets a rank keeps 140 kB in
// flight. On a 500 Mbit/s link that is 2.25 ms of queue in front of the last packet, above the
// 2 ms retransmission timeout: the timer fires on queueing delay, the resends add to the queue,
// and on the testbed's shaped star 11-24% of the packets were resent with nothing lost, holding the
// link at 71-89% of its bound. A window near the path's bandwidth-delay product plus a
// small standing queue keeps the link busy with none of that.
//
// The choice, from the field's practice:
//   - Loss-based AIMD (TCP Reno, ATP's window on loss) fills the bottleneck queue until it drops
//     a packet: with tbf's 1 MB queue that is 16 ms of delay at 500 Mbit/s, a timer that must sit
//     above it, and every job sharing the link waiting behind it. It also halves the window on
//     random loss (1% injected loss would hold the window near its minimum).
//   - Delay-based (TCP Vegas, Swift) keeps the standing queue at a target: the link stays busy,
//     the delay stays low, and AIMD on the delay signal converges several jobs sharing a link to
//     fair shares (Swift, SIGCOMM 2020). It is what is used here.
//   - BBR's pacing spreads a window over the RTT. Here the results pace the sends (each result
//     releases one block: the ack clock), and the standing queue is small by construction, so
//     pacing would buy little and cost a timer per packet in the engine's loop, against the
//     latency budget of the small collectives. Not used.
//
// The delay signal. A round's RTT (send to result) includes the wait for the other ranks, the
// aggregator's and the receivers' scheduling, so single samples are noisy: a rank descheduled for
// a millisecond sees a burst of long RTTs without any queue. The minimum RTT over an interval of
// about one smoothed RTT is not (Vegas, Copa): if any round in the interval went through without
// waiting, there was no standing queue. The standing queue is that minimum less the base RTT (the
// minimum over the last 10-20 s, refreshed so that a new path is learnt).
//
// Once per interval:
//   standing <= target: slow start (at the start, until the first excess or timeout) adds the
//                       interval's results to cwnd (doubling per RTT), then +1 per RTT (the
//                       interval's results / cwnd); only when the window was used (cwnd
//                       validation, RFC 7661: an application-limited window does not grow).
//   standing >  target: cwnd x max(1/2, 1 - 0.8 (standing - target) / minimum RTT)  (Swift).
// target = max(500 us, base RTT): 28 packets at 500 Mbit/s, 57 at 1 Gbit/s. Swift's targets are
// tens of microseconds, with NIC timestamps; these RTTs are software timestamps of processes that
// share their cores. On the shaped star (testbed/run.py linkbound, each against the former rules in
// one sitting) a target of 250 us gave away 10% of the link at load 14 (CPU scheduling counted as
// queue), 1 ms none at load 24; but a target above a shallow buffer's depth turns every overflow
// into a loss for the timer to repair, as the loss rule ignores losses below the target.
// On a timer that fires: a decrease by half (once per RTT) only when the queue was above its
// target; a loss without a standing queue is random loss (or a slow rank), not congestion, and
// leaves cwnd alone (TCP Veno's distinction), so 1% injected loss does not collapse the window.
//
// The timer cannot fire on queueing delay. The classical RFC 6298 timeout, SRTT + 4 RTTVAR, tracks
// the delay the rank saw, but the first round of a collective's burst sees none and the last one
// waits behind all of it. A rank's own packets cannot queue for longer than its window takes to
// drain at the rate results come back: cwnd / rate. So the timeout is
//   rto = clamp(max(SRTT + 4 RTTVAR, base RTT + 2 cwnd / rate), Config::retransmit, 64 x it),
// which stays above the worst queueing delay the window can cause, and still detects a loss
// within a few RTTs. (Karn's rule as before: a resent round gives no RTT sample.)
//
// Loss recovery does not wait for that timer (LossDetector, RACK of RFC 8985 for rounds). A round
// completes when the last rank's block arrives, and each rank sends its blocks lowest first, so
// the results come back in about the order this rank sent its rounds. Once a round sent after
// round r has its result, r is presumed lost when the time that round took, plus SRTT / 4 for
// reordering, has passed since r was sent; it goes out again then, on its current timeout (no
// back-off: the path is not in doubt), and the timer stays the backstop for the last rounds of a
// collective (nothing is sent after them) and for a rank that is late. Whoever lost the packet
// (this rank's block, another rank's, or this rank's result), every rank whose round is stuck
// resends it: the aggregator adds the missing block, answers a completed round with its result
// and an incomplete one with its bitmap. The timer alone was not enough: a lost round keeps its
// place in the window until its timer fires, and a round that waited for another rank's resend
// is a clean RTT sample here (Karn's rule only knows this rank's resends), so SRTT, and with it
// the timeout, grew with every repair. On the testbed's shaped star with 1% loss each way,
// 16 MiB took 357-370 ms (77-80% of the bound) with the default 2 ms floor, the timeout
// reaching 21 ms, and 1.2-1.3 s with an 8 ms floor (timeouts up to 385 ms); with the detector,
// 306-316 ms with either floor.

#include "worker/congestion.h"

#include <algorithm>
#include <cmath>

namespace ina::worker {
namespace {

constexpr double kBeta = 0.8;         // Swift's multiplicative decrease gain
constexpr double kMaxDecrease = 0.5;  // at most halve per interval
constexpr double kRateGain = 0.25;    // smoothing of the delivery rate over intervals
constexpr int kIdleIntervals = 4;     // an interval longer than this many SRTTs spans idle time

double seconds(CongestionControl::Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

CongestionControl::CongestionControl(const Options& o) : o_(o) {
  o_.max_window = std::max<uint32_t>(1, o_.max_window);
  o_.min_window = std::clamp<uint32_t>(o_.min_window, 1, o_.max_window);
  cwnd_ = std::clamp<double>(o_.initial_window, o_.min_window, o_.max_window);
  rto_ = o_.rto_floor;
}

uint32_t CongestionControl::window() const {
  return std::clamp<uint32_t>(static_cast<uint32_t>(cwnd_), o_.min_window, o_.max_window);
}

CongestionControl::Duration CongestionControl::base_rtt() const {
  const Duration b = std::min(base_cur_, base_prev_);
  return b == Duration::max() ? Duration::zero() : b;
}

CongestionControl::Duration CongestionControl::target() const {
  const auto scaled = std::chrono::duration_cast<Duration>(base_rtt() * o_.target_queue_factor);
  return std::max(o_.target_queue, scaled);
}

void CongestionControl::on_result(TimePoint now, Duration rtt, uint32_t inflight) {
  if (!started_) {
    started_ = true;
    epoch_start_ = now;
    interval_start_ = now;
  }
  ++interval_results_;
  interval_max_inflight_ = std::max(interval_max_inflight_, inflight);
  if (rtt > Duration::zero()) {
    rtt_.sample(rtt);
    base_cur_ = std::min(base_cur_, rtt);
    interval_min_ = std::min(interval_min_, rtt);
  }
  if (now - epoch_start_ >= o_.base_epoch) {
    base_prev_ = base_cur_;
    base_cur_ = rtt > Duration::zero() ? rtt : Duration::max();
    epoch_start_ = now;
  }
  if (rtt_.srtt > Duration::zero() && now - interval_start_ >= rtt_.srtt) end_interval(now);
  update_rto();
}

void CongestionControl::end_interval(TimePoint now) {
  const Duration elapsed = now - interval_start_;
  const bool idle = elapsed > kIdleIntervals * rtt_.srtt;
  if (!idle && elapsed > Duration::zero()) {
    const double rate = interval_results_ / seconds(elapsed);
    delivery_rate_ =
        delivery_rate_ == 0 ? rate : (1 - kRateGain) * delivery_rate_ + kRateGain * rate;
  }
  if (!idle && interval_min_ != Duration::max()) {
    standing_ = interval_min_ - base_rtt();
    const Duration t = target();
    if (standing_ > t) {
      slow_start_ = false;
      const double excess = seconds(standing_ - t) / seconds(interval_min_);
      cwnd_ *= std::max(kMaxDecrease, 1 - kBeta * excess);
      last_decrease_ = now;
    } else if (interval_max_inflight_ + 1 >= static_cast<uint32_t>(cwnd_)) {
      if (slow_start_) {
        cwnd_ = std::min(cwnd_ + interval_results_, 2 * cwnd_);
      } else {
        cwnd_ += interval_results_ / cwnd_;
      }
    }
    cwnd_ = std::clamp<double>(cwnd_, o_.min_window, o_.max_window);
  }
  interval_start_ = now;
  interval_min_ = Duration::max();
  interval_results_ = 0;
  interval_max_inflight_ = 0;
}

void CongestionControl::on_timeout(TimePoint now) {
  slow_start_ = false;
  if (standing_ > target() && now - last_decrease_ >= rtt_.srtt) {
    cwnd_ = std::max<double>(cwnd_ * kMaxDecrease, o_.min_window);
    last_decrease_ = now;
  }
}

void CongestionControl::update_rto() {
  if (rtt_.srtt == Duration::zero()) {
    rto_ = o_.rto_floor;
    return;
  }
  Duration r = rtt_.rto();
  if (delivery_rate_ > 0) {
    const auto drain = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(2 * cwnd_ / delivery_rate_));
    r = std::max(r, base_rtt() + drain);
  }
  rto_ = std::clamp(r, o_.rto_floor, std::max(o_.rto_floor, o_.rto_ceiling));
}

}  // namespace ina::worker
