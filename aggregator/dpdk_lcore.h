// Private to the DPDK backend (dpdk_port.cc, dpdk_lcore.cc, dpdk_control.cc): the per-lcore state
// of DpdkAggregator (its Engine, rings, tx array, address book, mailbox, counters) and the few
// constants and helpers these files share. The public interface is dpdk_backend.h.
#pragma once

#include <rte_errno.h>
#include <rte_mbuf.h>
#include <time.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "aggregator/backend_shell.h"
#include "aggregator/dpdk_backend.h"
#include "aggregator/engine.h"
#include "aggregator/snapshot.h"
#include "ina/base/status.h"
#include "ina/protocol/frame.h"
#include "ina/protocol/mac.h"

namespace ina::agg::dpdk {

inline constexpr const char* kComponent = "dpdk";
inline constexpr uint16_t kMaxBurst = 256;
inline constexpr unsigned kPrefetchAhead = 3;
inline constexpr unsigned kRecycle = 64;  // absorbed frames kept per lcore for the next results

inline Status dpdk_error(const std::string& what, int err) {
  return Status(StatusCode::kInternal, "dpdk: " + what + ": " + rte_strerror(err < 0 ? -err : err));
}

inline uint64_t now_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

// A job's largest packet of `world` ranks' control replies: DATA, RESULT, control; a tree root's
// also the leaves' PARTIAL words (dpdk_port.cc).
size_t job_packet_size(const JobConfig& j, size_t world);

// Published counters, read by the main lcore while the loop runs.
struct alignas(64) Published {
  std::atomic<uint64_t> rx{0}, tx{0}, completed{0}, dropped{0}, handed_off{0};
};

}  // namespace ina::agg::dpdk

namespace ina::agg {

struct alignas(64) DpdkAggregator::Lcore {
  // A rank's address as learnt from its packets.
  struct Peer {
    bool known = false;
    frame::Endpoint ep;
    frame::UdpHeaderTemplate hdr;  // our headers to ep, rebuilt when ep changes
  };

  DpdkAggregator* self = nullptr;
  unsigned idx = 0;
  unsigned lcore_id = 0;
  bool has_rxq = false;
  uint16_t queue = 0;  // rx queue (when has_rxq) and tx queue
  std::unique_ptr<Engine> engine;
  frame::Counters fc;
  DpdkLoopCounters c;
  dpdk::Published pub;
  AddressBook<Peer> book;                     // per job, by rank: learnt from packets
  std::vector<rte_ring*> in;                  // from lcore src (nullptr for self)
  std::vector<rte_ring*> out;                 // to lcore dst (nullptr for self)
  std::vector<std::vector<rte_mbuf*>> stage;  // per destination, capacity burst
  std::vector<rte_mbuf*> tx;                  // replies waiting for tx_burst
  rte_ring* tx_out = nullptr;                 // set: replies go to lcore 0 instead (tx_rings_)
  std::vector<rte_ring*> tx_in;               // lcore 0: the other lcores' tx_out
  size_t tx_n = 0;
  uint16_t ip_id = 0;
  uint64_t now = 0;  // telemetry: CLOCK_MONOTONIC of this loop pass, read at its first INA frame

  // Control mailbox (see dpdk_backend.h): the main lcore writes the request, then releases
  // `posted`; this lcore acquires it between bursts, applies the jobs, answers in `snap`, then
  // releases `done`. Its own cache line: the lcore reads `posted` on every pass.
  struct alignas(64) Mailbox {
    std::atomic<uint64_t> posted{0};
    std::atomic<uint64_t> done{0};
    bool has_jobs = false;
    std::vector<JobConfig> jobs;
    AggregatorSnapshot snap;
  } mail;
  uint64_t mail_seen = 0;                   // the last request this lcore handled
  std::map<JobId, std::string> job_errors;  // of the last jobs applied

  // DATA frames the Engine absorbed (no reply) are kept here instead of going back to the pool,
  // and the next results to every rank are written into them: their mbuf header and buffer are
  // still in this core's cache, and a pool put + get is saved per reply.
  std::array<rte_mbuf*, dpdk::kRecycle> recycled{};
  unsigned n_recycled = 0;

  // INA frames of the burst this lcore processes itself, held by on_frame() until the burst is
  // classified; then process_pending() verifies the tags of their DATA at once
  // (packet_mac_many: the MACs of several datagrams overlap, where one datagram's chain of
  // reductions and SipHash rounds leaves the core waiting) and hands each to the Engine.
  struct Pending {
    rte_mbuf* m;
    frame::Parsed p;
    bool hello;
    bool hello_copy;
  };
  std::array<Pending, dpdk::kMaxBurst> pending;
  unsigned n_pending = 0;
  // process_pending()'s arrays (members, not a 10 KiB stack frame per burst): the datagrams whose
  // tags it verifies, their keys, their index in `pending` and MACs; per pending frame, the key its
  // tag was verified with.
  struct TagBatch {
    std::array<const MacKey*, dpdk::kMaxBurst> keys;
    std::array<std::span<const uint8_t>, dpdk::kMaxBurst> msgs;
    std::array<uint16_t, dpdk::kMaxBurst> which;
    std::array<uint64_t, dpdk::kMaxBurst> macs;
    std::array<const Key128*, dpdk::kMaxBurst> checked;
  } tb;
  // A job's current traffic key (Engine::current_keys) expanded for the MAC, renewed when the
  // job's incarnation changes it; allocated when the lcore first sees a served job's DATA (not per
  // packet), at a stable address while a burst refers to it, the oldest dropped between bursts
  // beyond kTagKeys.
  struct TagKey {
    JobId job = 0;
    Key128 traffic;
    MacKey mac;
  };
  static constexpr size_t kTagKeys = 64;
  // Replies to a run's frames, encoded but not sealed yet: send_unsealed() seals them at once
  // (packet_mac_many, as the run's tags were verified), then sends them.
  struct Unsealed {
    rte_mbuf* m;
    const frame::Parsed* p;  // the request's (pending): a reply to its sender
    uint32_t len;            // the datagram's, at kUdpHeadroom
    uint32_t payload_sum;    // sum16 of its payload
    JobId job;
    bool to_sender;
    Key128 key;
  };
  std::array<Unsealed, dpdk::kMaxBurst> unsealed;
  unsigned n_unsealed = 0;
  bool defer_seal = false;  // process_ina of a run's frames
  std::vector<std::unique_ptr<TagKey>> tag_keys;

  // dpdk_port.cc: lcore `i` of `a` (EAL lcore `lcore_id`) serving `jobs`, with its rings and a tx
  // array of `tx_cap`; create() calls it once the port and the rings are set up.
  static Result<std::unique_ptr<Lcore>> make(DpdkAggregator* a, unsigned i, unsigned lcore_id,
                                             const std::vector<JobConfig>& jobs, size_t tx_cap);

  // dpdk_lcore.cc: the loop and the replies.
  void loop();
  void recycle(rte_mbuf* m);
  rte_mbuf* reply_mbuf();
  void on_frame(rte_mbuf* m, bool verified);
  // The frames on_frame() held, verified and processed in order.
  void process_pending();
  // The tags of pending[from, to) (no HELLO among them) verified at once: tb.checked.
  void verify_run(unsigned from, unsigned to);
  void send_unsealed();
  // The expanded key of `job`'s traffic now; nullptr when the engine does not serve it.
  const TagKey* tag_key(JobId job);
  // hello_copy: a HELLO another lcore received and counts (every lcore runs the join barrier).
  // tag_checked: the datagram's tag verified under this key (Engine::on_packet).
  void process_ina(rte_mbuf* m, const frame::Parsed& p, bool hello, bool hello_copy,
                   const Key128* tag_checked = nullptr);
  // process_ina's steps, defined inline in dpdk_lcore.cc (call them there only).
  // The job's address book with the sender's address learnt (rank >= 0), or nullptr.
  std::vector<Peer>* learn_peer(int32_t rank, JobId job, const frame::Parsed& p);
  // An mbuf of our own with room for a frame of `flen` bytes: `m` when it can be written, else
  // a fresh one (`m` freed); nullptr when there is none (counted, `m` freed).
  rte_mbuf* writable_reply(rte_mbuf* m, size_t flen);
  // Encodes and seals the reply's datagram at `dg`; returns the UDP checksum's sum over it.
  static uint32_t encode_reply(const Reply& r, uint8_t* dg, size_t len);
  // encode_reply's steps: the header and payload (returns the payload's sum), then the seal
  // (returns the whole sum).
  static uint32_t encode_unsealed(const Reply& r, uint8_t* dg);
  static uint32_t seal_reply(uint8_t* dg, size_t len, const Key128& key, uint32_t payload_sum);
  // The reply in `m` (its datagram at kUdpHeadroom: `len` bytes whose sum is `sum`) to the
  // sender of `p`.
  void unicast(rte_mbuf* m, const frame::Parsed& p, size_t len, uint32_t sum);
  // The same to every rank of `job` whose address is known (`peers`: its book, when found).
  void multicast(rte_mbuf* m, std::vector<Peer>* peers, JobId job, size_t len, uint32_t sum);
  // Rank `last` is the highest known; it gets `m` (as do the others, through clones or copies).
  void multicast_chains(rte_mbuf* m, const std::vector<Peer>& peers, int last, size_t len,
                        uint32_t sum);
  void multicast_copy(rte_mbuf* m, const std::vector<Peer>& peers, int last, size_t len,
                      uint32_t sum);
  void send(rte_mbuf* m);
  void flush_tx();
  void flush_stage();

  // dpdk_control.cc: the mailbox, jobs and snapshots.
  void handle_mail();
  // Answers a request posted since the last one (handle_mail, then releases `done`).
  void answer_mail();
  void apply_jobs(const std::vector<JobConfig>& desired);
  AggregatorSnapshot take_snapshot() const;
};

}  // namespace ina::agg
