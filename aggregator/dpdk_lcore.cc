// DPDK backend (see dpdk_backend.h): the worker lcores' loop and the replies they send, and
// start()/stop(), which launch and join the loops.
//
// Each worker lcore runs the same loop, chosen once before it starts:
//   1. rx_burst on its rx queue (when it has one), prefetching a few frames ahead;
//   2. classify each frame (frame.h, with the NIC's checksum flags when it reports them): ARP and
//      ICMP echo are answered in place; drops are counted and freed; an INA frame of a slot owned
//      by another lcore is staged for that lcore, a HELLO copied to every lcore; the INA frames
//      this lcore processes are held for the burst's pass (process_pending): in runs between
//      HELLOs, the tags of a run's DATA are verified at once (mac.h, packet_mac_many: one
//      datagram's MAC is a chain of dependent reductions and SipHash rounds, several datagrams'
//      chains overlap; 83 instead of 199 TSC cycles per 1 KiB datagram), the Engine processes each
//      frame told so, and the run's replies are sealed at once too before they go out;
//   3. the staged frames go out in one enqueue per destination ring;
//   4. frames handed over by the other lcores are processed alike (their checksums were checked);
//   5. replies collected in a tx array go out in bursts (on net_memif, from an lcore beyond the
//      queue pairs the peer connects, to lcore 0, which sends them with its own); the few
//      counters are published.
// A reply to the sender reuses the received mbuf. A result for every rank is encoded once in the
// received mbuf (header, payload copied out of the slot's shadow and summed for the UDP checksum in
// one pass, then sealed); where the port transmits chains (DpdkOptions::fanout) each rank gets a
// header mbuf chained to that one datagram, else a fresh mbuf with a copy of it and its own
// headers (the UDP checksum of the datagram is summed once either way).
#include "aggregator/dpdk_lcore.h"

#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_prefetch.h>
#include <rte_ring.h>

#include <algorithm>
#include <cstring>

#include "aggregator/dpdk_backend.h"
#include "ina/protocol/codec.h"
#include "ina/protocol/frame_dpdk.h"
#include "ina/protocol/wire.h"

namespace ina::agg {

using dpdk::kMaxBurst;
using dpdk::kPrefetchAhead;
using dpdk::kRecycle;
using dpdk::now_ns;

namespace {
int launch(void* arg) {
  static_cast<DpdkAggregator::Lcore*>(arg)->loop();
  return 0;
}

// Every cache line of a frame (headers and payload, at most kPrefetchBytes), for the read by
// classify() and the Engine's add.
constexpr size_t kPrefetchBytes = 4352;
inline void prefetch_frame(const rte_mbuf* m) {
  const char* p = rte_pktmbuf_mtod(m, const char*);
  const size_t n = std::min<size_t>(m->data_len, kPrefetchBytes);
  for (size_t o = 0; o < n; o += RTE_CACHE_LINE_SIZE) rte_prefetch0(p + o);
}

// Six bytes as two loads (std::array's operator!= called memcmp here, per packet).
inline bool same_mac(const frame::Mac& a, const frame::Mac& b) {
  uint32_t a4, b4;
  uint16_t a2, b2;
  std::memcpy(&a4, a.data(), 4);
  std::memcpy(&b4, b.data(), 4);
  std::memcpy(&a2, a.data() + 4, 2);
  std::memcpy(&b2, b.data() + 4, 2);
  return a4 == b4 && a2 == b2;
}

void set_len(rte_mbuf* m, size_t len) {
  m->data_len = static_cast<uint16_t>(len);
  m->pkt_len = static_cast<uint32_t>(len);
}
}  // namespace

Status DpdkAggregator::start() {
  if (running_) return Status(StatusCode::kFailedPrecondition, "dpdk: already running");
  stop_.store(false);
  for (auto& l : lcores_) {
    const int rc = rte_eal_remote_launch(launch, l.get(), l->lcore_id);
    if (rc != 0) {
      stop_.store(true);
      for (auto& o : lcores_) {
        if (o.get() == l.get()) break;
        rte_eal_wait_lcore(o->lcore_id);
      }
      return dpdk::dpdk_error("rte_eal_remote_launch on lcore " + std::to_string(l->lcore_id), rc);
    }
  }
  running_ = true;
  return ok_status();
}

void DpdkAggregator::stop() {
  if (!running_) return;
  stop_.store(true, std::memory_order_relaxed);
  for (auto& l : lcores_) rte_eal_wait_lcore(l->lcore_id);
  running_ = false;
  // A request posted after an lcore's last pass is handled here, so service() completes it.
  for (auto& l : lcores_) {
    l->answer_mail();
  }
  if (port_started_) {
    (void)rte_eth_dev_stop(port_);
    port_started_ = false;
  }
}

void DpdkAggregator::Lcore::loop() {
  DpdkAggregator& a = *self;
  const uint16_t burst = a.opts_.burst;
  const unsigned n = static_cast<unsigned>(a.lcores_.size());
  rte_mbuf* pkts[kMaxBurst];
  uint64_t last_dropped = 0;
  const uint64_t cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID), wall0 = now_ns(CLOCK_MONOTONIC);
  // busy_tsc without a TSC read per idle poll (24 ns each on some VMs, most of an idle loop):
  // a busy iteration starts where the previous busy one ended, or after its rx burst when the
  // previous iteration was idle (that burst's rx time is then not counted).
  uint64_t busy_from = 0;  // 0: the previous iteration was idle
  const bool stages = a.opts_.stage_cycles;
  uint64_t t_rx = 0, t_work = 0;  // stages: TSC before the rx burst, after it
  while (!a.stop_.load(std::memory_order_relaxed)) {
    answer_mail();
    now = 0;
    uint16_t got = 0;
    if (stages) t_rx = t_work = rte_rdtsc();
    if (has_rxq) {
      got = rte_eth_rx_burst(a.port_, queue, pkts, burst);
      if (got != 0 && busy_from == 0) busy_from = rte_rdtsc();
      if (stages) {
        t_work = rte_rdtsc();
        if (got != 0) c.rx_tsc += t_work - t_rx;
      }
      // The mbufs and frames were written by another core (the PMD's or a peer's): the mbuf
      // headers of the whole burst first, then each frame's headers and payload a few frames
      // ahead of its processing, so that their cache misses overlap.
      for (uint16_t i = 0; i < got; ++i) rte_prefetch0(pkts[i]);
      for (uint16_t i = 0; i < got && i < kPrefetchAhead; ++i) prefetch_frame(pkts[i]);
      for (uint16_t i = 0; i < got; ++i) {
        if (i + kPrefetchAhead < got) prefetch_frame(pkts[i + kPrefetchAhead]);
        on_frame(pkts[i], false);
      }
      if (n_pending != 0) process_pending();
      c.rx += got;
      if (n > 1) flush_stage();
    }
    for (unsigned s = 0; s < n; ++s) {
      if (in[s] == nullptr) continue;
      const unsigned k =
          rte_ring_dequeue_burst(in[s], reinterpret_cast<void**>(pkts), burst, nullptr);
      for (unsigned i = 0; i < k; ++i) rte_prefetch0(pkts[i]);
      for (unsigned i = 0; i < k && i < kPrefetchAhead; ++i) prefetch_frame(pkts[i]);
      for (unsigned i = 0; i < k; ++i) {
        if (i + kPrefetchAhead < k) prefetch_frame(pkts[i + kPrefetchAhead]);
        on_frame(pkts[i], true);
      }
      if (n_pending != 0) process_pending();
      c.handoff_received += k;
      got = static_cast<uint16_t>(got + k);
    }
    for (rte_ring* r : tx_in) {
      // Replies of lcores without a tx queue the peer reads, sent with ours.
      const size_t room = std::min<size_t>(tx.size() - tx_n, kMaxBurst);
      const unsigned k = rte_ring_dequeue_burst(r, reinterpret_cast<void**>(&tx[tx_n]),
                                                static_cast<unsigned>(room), nullptr);
      tx_n += k;
      got = static_cast<uint16_t>(got + k);
    }
    if (stages && got != 0) {
      const uint64_t t_tx = rte_rdtsc();
      c.work_tsc += t_tx - t_work;
      if (tx_n != 0) flush_tx();
      c.tx_tsc += rte_rdtsc() - t_tx;
    } else if (tx_n != 0) {
      flush_tx();
    }
    ++c.polls;
    if (got == 0) {
      ++c.idle_polls;
      busy_from = 0;
    } else {
      const uint64_t tsc = rte_rdtsc();
      if (busy_from != 0) c.busy_tsc += tsc - busy_from;
      busy_from = tsc;
      pub.rx.store(c.rx, std::memory_order_relaxed);
      pub.tx.store(c.tx, std::memory_order_relaxed);
      pub.completed.store(engine->counters().completed, std::memory_order_relaxed);
      const uint64_t dropped = fc.dropped() + engine->counters().malformed + c.tx_dropped +
                               c.handoff_dropped + c.multi_segment;
      if (dropped != last_dropped) {
        pub.dropped.store(dropped, std::memory_order_relaxed);
        last_dropped = dropped;
      }
      pub.handed_off.store(c.handed_off, std::memory_order_relaxed);
    }
  }
  // Frames staged or queued for tx are sent; frames other lcores may still hand over are freed
  // by the destructor.
  flush_tx();
  if (n_recycled > 0) rte_pktmbuf_free_bulk(recycled.data(), n_recycled);
  n_recycled = 0;
  c.cpu_ns += now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
  c.wall_ns += now_ns(CLOCK_MONOTONIC) - wall0;
}

// `verified`: handed over by another lcore, which classified it and checked its checksums.
void DpdkAggregator::Lcore::on_frame(rte_mbuf* m, bool verified) {
  DpdkAggregator& a = *self;
  if (m->nb_segs != 1) [[unlikely]] {
    ++c.multi_segment;
    rte_pktmbuf_free(m);
    return;
  }
  uint8_t* data = rte_pktmbuf_mtod(m, uint8_t*);
  frame::Parsed p;
  const frame::RxOffload off = verified
                                   ? frame::RxOffload{frame::HwCheck::kGood, frame::HwCheck::kGood}
                                   : frame::rx_offload(m->ol_flags);
  const frame::Verdict v =
      frame::classify(std::span<const uint8_t>(data, m->data_len), a.local_, off, &p);
  if (!verified) fc.add(v);
  switch (v) {
    case frame::Verdict::kIna: break;
    case frame::Verdict::kArpRequest:
      set_len(m, frame::arp_reply(data, p, a.local_));
      send(m);
      return;
    case frame::Verdict::kIcmpEcho:
      if (rte_mbuf_refcnt_read(m) != 1 || RTE_MBUF_CLONED(m)) [[unlikely]] {
        rte_pktmbuf_free(m);  // never write into a shared buffer
        return;
      }
      set_len(m, frame::icmp_echo_reply(data, p, a.local_));
      send(m);
      return;
    default: rte_pktmbuf_free(m); return;
  }
  const std::span<const uint8_t> ina = p.ina;
  const bool hello =
      ina.size() >= wire::kHeaderSize && (ina[wire::kOffFlags] & wire::kFlagHello) != 0;
  const unsigned n = static_cast<unsigned>(a.lcores_.size());
  if (n > 1 && !verified && ina.size() >= wire::kHeaderSize) {
    if (hello) {
      // Every lcore runs the join barrier: each gets a copy (rare: once per rank and incarnation).
      for (unsigned d = 0; d < n; ++d) {
        if (d == idx) continue;
        rte_mbuf* cp = rte_pktmbuf_copy(m, a.pool_, 0, UINT32_MAX);
        if (cp == nullptr) {
          ++c.no_mbuf;
          continue;
        }
        if (rte_ring_enqueue(out[d], cp) != 0) {
          ++c.handoff_dropped;
          rte_pktmbuf_free(cp);
        } else {
          ++c.handed_off;
        }
      }
    } else {
      const uint16_t slot = wire::get_u16(ina.data() + wire::kOffSlot) & wire::kMaxSlot;
      const unsigned owner = slot % n;
      if (owner != idx) {
        stage[owner].push_back(m);
        if (stage[owner].size() == stage[owner].capacity()) flush_stage();
        return;
      }
    }
  }
  pending[n_pending++] = Pending{m, p, hello, hello && verified};
}

inline const DpdkAggregator::Lcore::TagKey* DpdkAggregator::Lcore::tag_key(JobId job) {
  Key128 traffic, up;
  if (!engine->current_keys(job, &traffic, &up)) return nullptr;
  for (auto& k : tag_keys) {
    if (k->job != job) continue;
    if (k->traffic != traffic) {  // a new incarnation (a burst's earlier DATA verified already)
      k->traffic = traffic;
      k->mac = expand_mac_key(traffic);
    }
    return k.get();
  }
  tag_keys.push_back(std::make_unique<TagKey>(TagKey{job, traffic, expand_mac_key(traffic)}));
  return tag_keys.back().get();
}

// Float SUM payloads beyond this many bytes are left to the engine's one-pass verify, copy and
// scan (ina-dpdk-bench --mode tags --dtype float32, the Engine's work per DATA frame on a 2-core
// Xeon VM: with this pass 0.83x the cycles at 1 KiB of payload, 0.98x at 2 KiB, 1.15x at 4 KiB).
constexpr size_t kFusedFrom = 2048;

void DpdkAggregator::Lcore::process_pending() {
  const unsigned n = n_pending;
  n_pending = 0;
  if (tag_keys.size() > kTagKeys)  // no burst refers to them now
    tag_keys.erase(tag_keys.begin(), tag_keys.end() - kTagKeys);
  // In runs between HELLOs (a HELLO, or a parent's WELCOME, may start an incarnation: a new key
  // for the frames after it), each run's tags verified at once, then its frames processed.
  for (unsigned from = 0; from < n;) {
    unsigned to = from;
    while (to < n && !pending[to].hello) ++to;
    verify_run(from, to);
    defer_seal = true;
    for (unsigned i = from; i < to; ++i) {
      const Pending& e = pending[i];
      process_ina(e.m, e.p, false, false, tb.checked[i]);
    }
    defer_seal = false;
    if (n_unsealed != 0) send_unsealed();
    if (to < n) process_ina(pending[to].m, pending[to].p, true, pending[to].hello_copy);
    from = to + 1;
  }
}

void DpdkAggregator::Lcore::verify_run(unsigned from, unsigned to) {
  // The DATA and PARTIAL frames (the packets the engine verifies under their job's traffic key:
  // no HELLO, RESULT or ERROR flag) are verified here, all at once; the others, and any whose tag
  // is not right under that key, by the engine as usual (which counts a bad tag).
  TagBatch& b = tb;
  unsigned nm = 0;
  const TagKey* last = nullptr;
  for (unsigned i = from; i < to; ++i) b.checked[i] = nullptr;
  if (!self->opts_.check_tag) return;
  for (unsigned i = from; i < to; ++i) {
    const std::span<const uint8_t> d = pending[i].p.ina;
    if (d.size() < wire::kHeaderSize ||
        (d[wire::kOffFlags] & (wire::kFlagHello | wire::kFlagResult | wire::kFlagError)) != 0)
      continue;
    // A float SUM block larger than kFusedFrom: the engine's receive pass verifies, copies and
    // scans it in one read, which beat this pass plus its copy and scan there.
    if (d.size() - wire::kHeaderSize > kFusedFrom &&
        codec::needs_exponent(static_cast<DType>(d[wire::kOffDtype]),
                              static_cast<ReduceOp>(d[wire::kOffOp])))
      continue;
    const JobId job = wire::get_u32(d.data() + wire::kOffJob);
    if (last == nullptr || last->job != job) last = tag_key(job);
    if (last == nullptr) continue;
    b.keys[nm] = &last->mac;
    b.msgs[nm] = d;
    b.which[nm++] = static_cast<uint16_t>(i);
  }
  if (nm == 0) return;
  packet_mac_many(b.keys.data(), b.msgs.data(), nm, wire::kOffTag / 8, b.macs.data());
  for (unsigned j = 0; j < nm; ++j) {
    if (b.macs[j] == wire::get_u64(b.msgs[j].data() + wire::kOffTag)) {
      b.checked[b.which[j]] = &b.keys[j]->prf;
      ++c.tags_in_burst;
    }
  }
}

void DpdkAggregator::Lcore::process_ina(rte_mbuf* m, const frame::Parsed& p, bool hello,
                                        bool hello_copy, const Key128* tag_checked) {
  int32_t rank = -1;
  JobId job = 0;
  if (self->opts_.telemetry && now == 0) now = now_ns(CLOCK_MONOTONIC);
  const Reply r = engine->on_packet(p.ina, now, &rank, &job, hello_copy, tag_checked);
  std::vector<Peer>* peers = learn_peer(rank, job, p);
  // Only lcore 0 answers HELLOs (every lcore saw them).
  if (r.target == Reply::Target::kNone || (hello && idx != 0)) {
    recycle(m);
    return;
  }
  const size_t len = r.packet_size();
  m = writable_reply(m, frame::kUdpHeadroom + len);
  if (m == nullptr) [[unlikely]]
    return;
  uint8_t* dg = rte_pktmbuf_mtod(m, uint8_t*) + frame::kUdpHeadroom;
  if (defer_seal) {
    unsealed[n_unsealed++] = Unsealed{m,
                                      &p,
                                      static_cast<uint32_t>(len),
                                      encode_unsealed(r, dg),
                                      r.hdr.job,
                                      r.target == Reply::Target::kSender,
                                      r.key};
    return;
  }
  const uint32_t sum = encode_reply(r, dg, len);
  if (r.target == Reply::Target::kSender) {
    unicast(m, p, len, sum);
  } else {
    multicast(m, peers, r.hdr.job, len, sum);
  }
}

// The steps of process_ina are inline (called there only) so that they compile into it, as one
// function on the packet path.
inline std::vector<DpdkAggregator::Lcore::Peer>* DpdkAggregator::Lcore::learn_peer(
    int32_t rank, JobId job, const frame::Parsed& p) {
  if (rank < 0) return nullptr;
  std::vector<Peer>* peers = book.find(job);
  if (peers == nullptr) return nullptr;
  Peer& pe = (*peers)[static_cast<size_t>(rank)];
  if (!pe.known || pe.ep.ip != p.src_ip || pe.ep.port != p.src_port ||
      !same_mac(pe.ep.mac, p.src_mac)) [[unlikely]] {
    const frame::LocalConfig& local = self->local_;
    pe.known = true;
    pe.ep = frame::Endpoint{p.src_mac, p.src_ip, p.src_port};
    pe.hdr = frame::UdpHeaderTemplate(frame::Endpoint{local.mac, local.ip, local.udp_port}, pe.ep);
  }
  return peers;
}

inline rte_mbuf* DpdkAggregator::Lcore::writable_reply(rte_mbuf* m, size_t flen) {
  if (rte_mbuf_refcnt_read(m) != 1 || RTE_MBUF_CLONED(m) ||
      flen > static_cast<size_t>(m->buf_len - m->data_off)) [[unlikely]] {
    // Never write into a shared buffer; a reply larger than the room left needs a fresh mbuf.
    rte_mbuf* fresh = rte_pktmbuf_alloc(self->pool_);
    if (fresh == nullptr || flen > rte_pktmbuf_tailroom(fresh)) {
      if (fresh == nullptr)
        ++c.no_mbuf;
      else
        ++c.reply_too_big;
      rte_pktmbuf_free(fresh);
      rte_pktmbuf_free(m);
      return nullptr;
    }
    rte_pktmbuf_free(m);
    return fresh;
  }
  return m;
}

inline uint32_t DpdkAggregator::Lcore::encode_unsealed(const Reply& r, uint8_t* dg) {
  wire::encode_header(r.hdr, dg);
  // The payload is copied and summed for the UDP checksum in one pass (frame.h); then the tag is
  // sealed over the datagram and the header, tag included, summed (seal_reply). One sealed frame
  // serves a multicast: the tag does not cover the addresses.
  return r.payload_bytes() > 0
             ? frame::copy_sum16(dg + wire::kHeaderSize, r.payload, r.payload_bytes())
             : 0;
}

inline uint32_t DpdkAggregator::Lcore::seal_reply(uint8_t* dg, size_t len, const Key128& key,
                                                  uint32_t payload_sum) {
  wire::seal(std::span<uint8_t>(dg, len), key);
  return frame::sum16(dg, wire::kHeaderSize, payload_sum);
}

inline uint32_t DpdkAggregator::Lcore::encode_reply(const Reply& r, uint8_t* dg, size_t len) {
  return seal_reply(dg, len, r.key, encode_unsealed(r, dg));
}

void DpdkAggregator::Lcore::send_unsealed() {
  // The replies under their job's current traffic key (results and most answers to DATA) are
  // sealed at once, the others one by one; then each is summed and sent, in order.
  const unsigned n = n_unsealed;
  n_unsealed = 0;
  TagBatch& b = tb;
  unsigned nm = 0;
  const TagKey* last = nullptr;
  for (unsigned i = 0; i < n; ++i) {
    Unsealed& u = unsealed[i];
    uint8_t* dg = rte_pktmbuf_mtod(u.m, uint8_t*) + frame::kUdpHeadroom;
    if (last == nullptr || last->job != u.job) last = tag_key(u.job);
    if (last != nullptr && last->traffic == u.key && u.len >= wire::kHeaderSize) {
      b.keys[nm] = &last->mac;
      b.msgs[nm] = std::span<const uint8_t>(dg, u.len);
      b.which[nm++] = static_cast<uint16_t>(i);
    } else {
      wire::seal(std::span<uint8_t>(dg, u.len), u.key);
    }
  }
  if (nm > 0) packet_mac_many(b.keys.data(), b.msgs.data(), nm, wire::kOffTag / 8, b.macs.data());
  for (unsigned j = 0; j < nm; ++j) {
    wire::put_u64(const_cast<uint8_t*>(b.msgs[j].data()) + wire::kOffTag, b.macs[j]);
  }
  for (unsigned i = 0; i < n; ++i) {
    const Unsealed& u = unsealed[i];
    const uint8_t* dg = rte_pktmbuf_mtod(u.m, const uint8_t*) + frame::kUdpHeadroom;
    const uint32_t sum = frame::sum16(dg, wire::kHeaderSize, u.payload_sum);
    if (u.to_sender) {
      unicast(u.m, *u.p, u.len, sum);
    } else {
      multicast(u.m, nullptr, u.job, u.len, sum);
    }
  }
}

inline void DpdkAggregator::Lcore::unicast(rte_mbuf* m, const frame::Parsed& p, size_t len,
                                           uint32_t sum) {
  set_len(m, frame::udp_reply(rte_pktmbuf_mtod(m, uint8_t*), p, self->local_, len, sum, ip_id++));
  send(m);
}

inline void DpdkAggregator::Lcore::multicast(rte_mbuf* m, std::vector<Peer>* peers, JobId job,
                                             size_t len, uint32_t sum) {
  // To every rank whose address is known; the received mbuf goes to the last one.
  if (peers == nullptr) peers = book.find(job);
  int last = -1;
  if (peers != nullptr) {
    for (size_t k = peers->size(); k-- > 0;) {
      if ((*peers)[k].known) {
        last = static_cast<int>(k);
        break;
      }
    }
  }
  if (last < 0) {
    c.unroutable += peers != nullptr ? peers->size() : 1;
    rte_pktmbuf_free(m);
    return;
  }
  if (self->chains_) {
    multicast_chains(m, *peers, last, len, sum);
  } else {
    multicast_copy(m, *peers, last, len, sum);
  }
}

void DpdkAggregator::Lcore::multicast_chains(rte_mbuf* m, const std::vector<Peer>& peers, int last,
                                             size_t len, uint32_t sum) {
  // m becomes the datagram alone, the one tail of every rank's chain: a header mbuf (42 bytes,
  // this rank's addresses) whose next is m. m's reference count is the number of chains, so the
  // PMD frees it with the last of them (rte_pktmbuf_free walks each chain and only drops a
  // reference of a segment still shared); nothing of the datagram is copied or cloned per rank.
  set_len(m, frame::kUdpHeadroom + len);  // first: m may be a fresh mbuf (writable_reply)
  rte_pktmbuf_adj(m, static_cast<uint16_t>(frame::kUdpHeadroom));
  uint16_t refs = 0;
  for (int k = 0; k <= last; ++k) refs = static_cast<uint16_t>(refs + peers[size_t(k)].known);
  rte_mbuf_refcnt_set(m, refs);
  for (int k = 0; k <= last; ++k) {
    const Peer& pe = peers[static_cast<size_t>(k)];
    if (!pe.known) {
      ++c.unroutable;
      continue;
    }
    rte_mbuf* h = reply_mbuf();
    if (h == nullptr) [[unlikely]] {
      ++c.no_mbuf;
      rte_pktmbuf_free(m);  // this rank's reference
      continue;
    }
    const size_t hlen = pe.hdr.write(rte_pktmbuf_mtod(h, uint8_t*), len, sum, ip_id++) - len;
    h->data_len = static_cast<uint16_t>(hlen);
    h->pkt_len = static_cast<uint32_t>(hlen + len);
    h->next = m;
    h->nb_segs = 2;
    send(h);
  }
}

void DpdkAggregator::Lcore::multicast_copy(rte_mbuf* m, const std::vector<Peer>& peers, int last,
                                           size_t len, uint32_t sum) {
  uint8_t* data = rte_pktmbuf_mtod(m, uint8_t*);
  const uint8_t* dg = data + frame::kUdpHeadroom;
  for (int k = 0; k < last; ++k) {
    const Peer& pe = peers[static_cast<size_t>(k)];
    if (!pe.known) {
      ++c.unroutable;
      continue;
    }
    rte_mbuf* cp = reply_mbuf();
    if (cp == nullptr) [[unlikely]] {
      ++c.no_mbuf;
      continue;
    }
    uint8_t* cd = rte_pktmbuf_mtod(cp, uint8_t*);
    rte_memcpy(cd + frame::kUdpHeadroom, dg, len);
    set_len(cp, pe.hdr.write(cd, len, sum, ip_id++));
    send(cp);
  }
  set_len(m, peers[static_cast<size_t>(last)].hdr.write(data, len, sum, ip_id++));
  send(m);
}

void DpdkAggregator::Lcore::recycle(rte_mbuf* m) {
  // Only a plain single-segment mbuf of our own, large enough for any reply.
  if (n_recycled < kRecycle && rte_mbuf_refcnt_read(m) == 1 && RTE_MBUF_DIRECT(m) &&
      m->nb_segs == 1 && m->buf_len >= RTE_PKTMBUF_HEADROOM + self->max_frame()) {
    recycled[n_recycled++] = m;
    return;
  }
  rte_pktmbuf_free(m);
}

rte_mbuf* DpdkAggregator::Lcore::reply_mbuf() {
  if (n_recycled == 0) return rte_pktmbuf_alloc(self->pool_);
  rte_mbuf* m = recycled[--n_recycled];
  // rte_pktmbuf_reset() minus its stores to the mbuf's second cache line (next, tx_offload), which
  // the receive path never touched and which is often cold (written by another core's pool
  // refill): recycle() takes only direct single-segment mbufs, whose next is already NULL and
  // nb_segs 1, and with ol_flags 0 no PMD reads tx_offload.
  m->ol_flags = 0;
  m->packet_type = 0;
  m->vlan_tci = 0;
  m->vlan_tci_outer = 0;
  m->port = RTE_MBUF_PORT_INVALID;
  rte_pktmbuf_reset_headroom(m);
  m->data_len = 0;
  m->pkt_len = 0;
  return m;
}

void DpdkAggregator::Lcore::send(rte_mbuf* m) {
  if (tx_n == tx.size()) flush_tx();
  tx[tx_n++] = m;
}

void DpdkAggregator::Lcore::flush_tx() {
  DpdkAggregator& a = *self;
  if (tx_out != nullptr) {
    const unsigned k = rte_ring_enqueue_burst(tx_out, reinterpret_cast<void* const*>(tx.data()),
                                              static_cast<unsigned>(tx_n), nullptr);
    c.tx_handed_off += k;
    for (size_t i = k; i < tx_n; ++i) {
      ++c.tx_dropped;
      rte_pktmbuf_free(tx[i]);
    }
    tx_n = 0;
    return;
  }
  size_t done = 0;
  int idle = 0;
  while (done < tx_n) {
    const uint16_t want = static_cast<uint16_t>(std::min<size_t>(tx_n - done, kMaxBurst));
    const uint16_t k = rte_eth_tx_burst(a.port_, queue, &tx[done], want);
    done += k;
    if (k == 0 && ++idle > 3) break;  // the queue is full: drop the rest
  }
  c.tx += done;
  for (size_t i = done; i < tx_n; ++i) {
    ++c.tx_dropped;
    rte_pktmbuf_free(tx[i]);
  }
  tx_n = 0;
}

void DpdkAggregator::Lcore::flush_stage() {
  for (size_t d = 0; d < stage.size(); ++d) {
    auto& s = stage[d];
    if (s.empty()) continue;
    const unsigned k = rte_ring_enqueue_burst(out[d], reinterpret_cast<void* const*>(s.data()),
                                              static_cast<unsigned>(s.size()), nullptr);
    c.handed_off += k;
    for (size_t i = k; i < s.size(); ++i) {
      ++c.handoff_dropped;
      rte_pktmbuf_free(s[i]);
    }
    s.clear();
  }
}

}  // namespace ina::agg
