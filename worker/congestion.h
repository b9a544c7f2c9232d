// The in-network engine's window and retransmission timer: pure logic (no clock read, no I/O), fed
// with the times the engine observes. The reasoning is at the top of congestion.cc.
#pragma once

#include <chrono>
#include <cstdint>

namespace ina::worker {

// RFC 6298's smoothed RTT and its variation (gains 1/8 and 1/4), fed with samples (Karn's rule
// is the caller's: only rounds sent once).
struct RttEstimator {
  using Duration = std::chrono::steady_clock::duration;
  Duration srtt{};
  Duration rttvar{};
  void sample(Duration rtt) {
    if (srtt == Duration::zero()) {
      srtt = rtt;
      rttvar = rtt / 2;
    } else {
      const Duration err = srtt > rtt ? srtt - rtt : rtt - srtt;
      rttvar = (3 * rttvar + err) / 4;
      srtt = (7 * srtt + rtt) / 8;
    }
  }
  // SRTT + 4 RTTVAR, the timeout before its clamps.
  Duration rto() const { return srtt + 4 * rttvar; }
};

// Loss detection by time order (RACK, RFC 8985, for rounds): once a round this rank sent after
// round r has its result, r is presumed lost when the time that round took, plus a reordering
// allowance, has passed since r was sent, instead of waiting for r's retransmission timer
// (congestion.cc, "Loss recovery").
class LossDetector {
 public:
  using Clock = std::chrono::steady_clock;
  using Duration = Clock::duration;
  using TimePoint = Clock::time_point;

  // A round last transmitted at `xmit` got its result at `now` (only a round sent once: a
  // resent round's result may answer either transmission). `srtt` sizes the reordering
  // allowance. Returns whether the latest-sent delivered round moved on.
  bool on_delivered(TimePoint xmit, TimePoint now, Duration srtt) {
    if (xmit < xmit_) return false;
    xmit_ = xmit;
    rtt_ = now - xmit;
    reorder_ = srtt / 4;
    return true;
  }
  // When a round still outstanding, last transmitted at `xmit`, is presumed lost: never
  // (TimePoint::max()) unless a round sent after it has been delivered.
  TimePoint lost_at(TimePoint xmit) const {
    return xmit < xmit_ ? xmit + rtt_ + reorder_ : TimePoint::max();
  }

 private:
  TimePoint xmit_{};  // transmission time of the latest-sent round delivered
  Duration rtt_{};    // ... and the time it took
  Duration reorder_{};
};

class CongestionControl {
 public:
  using Clock = std::chrono::steady_clock;
  using Duration = Clock::duration;
  using TimePoint = Clock::time_point;

  struct Options {
    uint32_t max_window = 128;  // rounds in flight at most (the job's slots)
    uint32_t initial_window = 16;
    uint32_t min_window = 2;
    Duration rto_floor = std::chrono::microseconds(2000);  // Config::retransmit
    Duration rto_ceiling = std::chrono::microseconds(128000);
    // The standing queue a rank may keep at the bottleneck: max(target_queue, base RTT x
    // target_queue_factor).
    Duration target_queue = std::chrono::microseconds(500);
    double target_queue_factor = 1.0;
    // The base (propagation) RTT is the minimum over the last one or two epochs of this length.
    Duration base_epoch = std::chrono::seconds(10);
  };

  explicit CongestionControl(const Options& o);

  // A round's result arrived at `now`. `rtt`: send-to-result time of a round sent once (Karn's
  // rule), or zero for a round that was resent (counts as a delivery only). `inflight`: rounds
  // outstanding when it was sent... or now, before this one is retired.
  void on_result(TimePoint now, Duration rtt, uint32_t inflight);
  // A round's timer fired at `now` (a loss, or a slow rank); its resend goes out.
  void on_timeout(TimePoint now);

  // Rounds this rank may have outstanding.
  uint32_t window() const;
  // The timeout of a new round.
  Duration rto() const { return rto_; }

  double cwnd() const { return cwnd_; }
  Duration srtt() const { return rtt_.srtt; }
  Duration base_rtt() const;
  Duration standing_queue() const { return standing_; }
  bool in_slow_start() const { return slow_start_; }

 private:
  void end_interval(TimePoint now);
  void update_rto();
  Duration target() const;

  Options o_;
  double cwnd_;
  bool slow_start_ = true;
  // RFC 6298 estimator.
  RttEstimator rtt_;
  Duration rto_;
  // Base RTT: minima of the current and the previous epoch.
  Duration base_cur_ = Duration::max();
  Duration base_prev_ = Duration::max();
  TimePoint epoch_start_{};
  bool started_ = false;
  // The measurement interval (about one smoothed RTT): its minimum RTT, results, and the most
  // rounds that were outstanding in it.
  TimePoint interval_start_{};
  Duration interval_min_ = Duration::max();
  uint32_t interval_results_ = 0;
  uint32_t interval_max_inflight_ = 0;
  Duration standing_{};       // the last interval's minimum RTT less the base RTT
  double delivery_rate_ = 0;  // results per second, smoothed over intervals
  TimePoint last_decrease_{};
};

}  // namespace ina::worker
