// Straggler location by lost time: which rank held the job up, how often, by how much
// and why. Pure logic: no I/O, no clock (the caller passes arrival times), no locks.
//
// What is measured. When a round (slot copy) completes, the rank L whose contribution came last
// held the job up since the later of the next-to-last contribution and the last contribution of
// any other rank to any round (until then the others were still sending: the job was not
// waiting). One late rank holds up many rounds at once, so its lost time is the union of these
// intervals: each completion adds only the part after the end of L's previous one. A collective
// whose rank starts D late thus costs D, not D per block. The amounts are kept per rank and cause
// in a ring of epochs (each at most `epoch_ns` long and `epoch_collectives` collectives): the
// window is the last `epochs` of them (defaults: 10 s and about 1000 collectives), plus
// cumulative totals for counters.
//
// Cause of each added amount, from what the aggregator sees of L. A hold-up (episode: a run of
// joined amounts) starts either with L silent (nothing of L arrived since the next-to-last
// contribution to the round it completes) or with L sending:
//   loss   L's completing contribution was a retransmission: its first copy never came;
//   return the hold-up started with L silent after L had resent DATA of a round that had already
//          completed: it was waiting for a result that did not reach it (return path);
//   start  the hold-up started with L silent before its first packet of the collective: it sent
//          late (compute or host side);
//   link   the hold-up started with L sending, or silent inside a collective it had begun (its
//          packets of one collective spread out), or L's packets came more than 1.5x further apart
//          than the job's usual spacing (an EWMA over every rank's gaps below 500 us): they were
//          queued on the way (bandwidth).
// The other amounts of a hold-up keep its cause.
// A collective, as the aggregator sees it, is a busy period: from a round starting while none is
// in flight, after the job was idle at least collective_gap_ns and 4 of its usual packet gaps,
// until no round is in flight again (collectives that overlap count as one).
//
// Which ranks are named. Under the null hypothesis (noise spread over all ranks), each lost
// amount x_i is as likely to fall on any of the N ranks. A rank's lost time S_r then has mean X/N
// and variance (1/N)(1-1/N) sum x_i^2 (X: everyone's lost time): z = (S_r - X/N) / sd is shown.
// The test itself does not trust the normal approximation, because a few large amounts (long
// deschedulings) dominate: the window is worth n = X^2 / sum x_i^2 equal amounts, of which the
// rank holds k = n S_r / X, and the rank is named when P(Binomial(n, 1/N) >= k) <= alpha / N
// (Bonferroni over the ranks), it lost at least `min_share` of X (scaled for small N, see
// rank_by_lost_time) and it had at least `min_episodes` hold-ups (episodes: disjoint intervals
// longer than episode_floor_ns). One long descheduling of one rank is n = 1 at best and cannot be
// named.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ina::agg {

enum class LagCause : uint8_t { kStart = 0, kLink = 1, kLoss = 2, kReturn = 3 };
inline constexpr size_t kLagCauses = 4;
// "start", "link", "loss", "return" (the Prometheus `cause` label and the JSON keys).
const char* lag_cause_name(LagCause c);
// What an operator should look at, in a few words ("late start (compute or host)", ...).
const char* lag_cause_meaning(LagCause c);

struct StragglerOptions {
  uint64_t epoch_ns = 1'000'000'000;    // an epoch ends after this long ...
  uint64_t epoch_collectives = 100;     // ... or after this many collectives
  uint32_t epochs = 10;                 // the window: the last this many epochs
  uint64_t episode_floor_ns = 100'000;  // a hold-up shorter than this is not an episode
  uint64_t collective_gap_ns = 20'000;  // idle at least this long (and 4 usual packet gaps)
                                        // before a round starts a new collective
  double alpha = 1e-3;                  // false naming rate of the test, for the whole job
  double min_share = 0.25;              // of everyone's lost time (for N >= 8, see the .cc)
  uint32_t min_episodes = 3;
};

// One rank's lost time over a window (or an epoch); summable.
struct RankLoss {
  std::array<uint64_t, kLagCauses> lost_ns{};  // by cause
  uint64_t rounds = 0;                         // completions that added lost time
  uint64_t episodes = 0;                       // disjoint hold-ups longer than the floor
  uint64_t collectives = 0;                    // collectives in which it had an episode
  uint64_t retransmits_added = 0;              // contributions that came only in a retransmission
  uint64_t resent_completed = 0;               // DATA resent for rounds that had completed
  uint64_t lost_total_ns() const {
    uint64_t s = 0;
    for (uint64_t v : lost_ns) s += v;
    return s;
  }
  void add(const RankLoss& o);
};

// A job's lost time over the window (per served rank) with what the test needs, and the
// cumulative per-cause totals since the job was added (Prometheus counters).
struct LossWindow {
  std::vector<RankLoss> ranks;
  std::vector<std::array<uint64_t, kLagCauses>> total_ns;
  uint64_t collectives = 0;  // collectives started in the window
  uint64_t span_ns = 0;      // how long the window covers (the longest part's, when merged)
  double sum_sq_s2 = 0;      // sum of squared lost amounts, in s^2
  // Adds another engine's window of the same job (the DPDK lcores: each serves some slots, so a
  // hold-up seen by several lcores counts on each; span and collectives take the larger).
  void add(const LossWindow& o);
};

// A rank's place in the lost-time ranking.
struct RankVerdict {
  uint32_t rank = 0;  // served rank (add the job's first rank for the global one)
  uint64_t lost_ns = 0;
  double share = 0;                   // of everyone's lost time in the window
  double z = 0;                       // against the job's noise floor (see above)
  double p = 1;                       // the test's tail probability (named: p <= alpha / N)
  bool named = false;                 // a straggler: significant, large enough, recurring
  LagCause cause = LagCause::kStart;  // where most of its lost time came from
  RankLoss loss;                      // the window's detail
  double collective_fraction = 0;     // of the window's collectives it held up
  double mean_episode_ms = 0;
};

// Ranks of `w` worst first: named ones by lost time, then the others by lost time (ties by rank).
// The main cause is the largest of start, link and loss+return, the last called loss when the
// rank's retransmissions that filled rounds (its uplink dropped too) are at least a quarter of
// its resends of completed rounds, both counted in excess of the job's median rank (every rank
// resends some on spurious timeouts), return otherwise.
std::vector<RankVerdict> rank_by_lost_time(const LossWindow& w, const StragglerOptions& o = {});

// Per job: the hot-path recorder (fixed memory after reset; no allocation, no lock per call).
class LossTracker {
 public:
  // Sizes the state for `nranks` served ranks and clears it (allocates).
  void reset(uint32_t nranks, const StragglerOptions& o = {});
  bool active() const { return nranks_ > 1; }
  // Every accepted contribution of `rank` at `now` (after on_completion for a completing one).
  void on_arrival(uint32_t rank, uint64_t now);
  // A round started with no round in flight.
  void on_collective_start(uint64_t now);
  // A contribution that came in a retransmission (its first copy had not arrived).
  void on_retransmit_added(uint32_t rank, uint64_t now);
  // A retransmission of a round that had completed (the rank had not received its result).
  void on_resent_completed(uint32_t rank, uint64_t now);
  // `rank` completed a round at `now`; the next-to-last contribution arrived at `second`.
  void on_completion(uint32_t rank, uint64_t now, uint64_t second, bool retransmit);
  // The window at `now` (epochs older than the window's time span are left out). Allocates.
  LossWindow window(uint64_t now) const;

 private:
  struct RankState {
    uint64_t prev_arrival = 0;
    uint64_t prev_collective = 0;     // collective_seq_ at prev_arrival
    uint64_t held_until = 0;          // end of its last hold-up interval
    uint64_t episode_ns = 0;          // length of its current hold-up so far
    uint64_t episode_collective = 0;  // collective of its last counted episode (+1; 0: none)
    bool episode_counted = false;
    bool return_pending = false;
    LagCause episode_cause = LagCause::kStart;
  };
  struct Epoch {
    uint64_t start = 0;  // 0: unused
    uint64_t collectives = 0;
    double sum_sq_s2 = 0;
  };
  RankLoss& cur(uint32_t rank) { return loss_[size_t{cur_} * nranks_ + rank]; }
  void rotate(uint64_t now);

  StragglerOptions opts_;
  uint32_t nranks_ = 0;
  uint32_t cur_ = 0;
  uint64_t collective_seq_ = 0;
  // The last two accepted contributions of different ranks (the last of "any other rank").
  uint32_t last_rank_ = 0;
  uint64_t last_t_ = 0;
  uint64_t other_t_ = 0;
  double gap_ewma_ns_ = 0;  // the job's usual gap between a rank's contributions
  uint64_t last_completion_ = 0;
  std::vector<RankState> state_;
  std::vector<Epoch> epochs_;
  std::vector<RankLoss> loss_;  // epochs * nranks
  std::vector<std::array<uint64_t, kLagCauses>> total_;
};

// Rate-limited warnings for named stragglers (pure: the caller logs the lines it returns). A
// rank is reported when it becomes named with at least `min_share` of the window's lost time, at
// most once per `every_ns` per job and rank.
class StragglerAlarm {
 public:
  explicit StragglerAlarm(uint64_t every_ns = 60'000'000'000ull, double min_share = 0.25)
      : every_ns_(every_ns), min_share_(min_share) {}
  // The lines to log for `job` (first_rank: the job's first served global rank) at `now`.
  // `member` names what the ranking ranks: "rank" (a flat job, a leaf), "leaf" (a tree's root,
  // whose contributors are its leaves, by child index).
  std::vector<std::string> check(uint32_t job, uint32_t first_rank,
                                 std::span<const RankVerdict> ranking, uint64_t window_span_ns,
                                 uint64_t now, const char* member = "rank");

 private:
  struct Last {
    uint32_t job;
    uint32_t rank;
    uint64_t at;
  };
  uint64_t every_ns_;
  double min_share_;
  std::vector<Last> last_;
};

}  // namespace ina::agg
