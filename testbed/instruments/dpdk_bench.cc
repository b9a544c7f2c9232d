// ina-dpdk-bench: the DPDK aggregator loop at full rate beside dpdk-testpmd forwarding on the same
// kind of port and frame size, in the same run, in two modes (and the tag check alone):
//
//   ina-dpdk-bench [--mode memif,ring,tags] [--elems 64,256,1024] [--seconds 1] [--world 4]
//                  [--slots 128] [--lcores 1] [--mem auto|huge|nohuge]
//                  [--results auto|chains|copies] [--dtype int32|float32] [--no-tag]
//                  [--bsize N] [--forward-mode io|macswap] [--gen-copy]
//                  [--testpmd dpdk-testpmd|none] [-- <EAL arguments of the ring mode>]
//
// memif (dpdk_bench_memif.cc): a generator process and the device under test, each pinned to its
// own CPU, joined by net_memif; the DUT is the aggregator (this binary's --role agg), then testpmd
// (--forward-mode io, --port-topology loop) against the same generator. Both DUTs copy every frame
// in and out of the shared rings, so this is the comparison that means something. The generator
// sends prebuilt frames (only the block sequence patched per send) and, on hugepages, runs memif's
// zero-copy client, so that it does less work per frame than either DUT and the DUT is the limit.
//
// ring: the generator on the main lcore plays `world` ranks streaming blocks through the slots
// (every block: one DATA frame per rank, an mbuf filled from a per-(rank, slot copy) template with
// the block's sequence patched in, UDP checksum 0, "none"); it drains and frees the replies. The
// aggregator runs on the worker lcores. testpmd io forwarding on a ring never touches a frame (it
// passes pointers), so it is an upper bound no packet-processing loop reaches.
//
// tags (tag_table): the DATA tag check alone on a burst of the generator's frames in cache, one
// frame at a time (the Engine's own check) against the burst at once (as the loop verifies it),
// in TSC cycles per frame; no EAL, no second process: a figure other work on the machine barely
// moves.
//
// Printed per size: Mpps (frames in; the aggregator returns one result per DATA frame) and
// aggregated elements/s, per wall second and per CPU second of the DUT's polling thread (where CPU
// is capped or shared only the latter compares), and TSC cycles per frame of the busy loop
// iterations (testpmd: --record-core-cycles). Hugepages when free (scripts/dpdk-hugepages.sh),
// else --no-huge; the header says which.
#include <dirent.h>
#include <fcntl.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_memcpy.h>
#include <rte_ring.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/dpdk_backend.h"
#include "ina/protocol/frame.h"
#include "ina/protocol/mac.h"
#include "ina/protocol/wire.h"
#include "ina_config.h"
#include "testbed/instruments/dpdk_bench_common.h"
#include "testbed/instruments/dpdk_bench_memif.h"
#include "testbed/instruments/engine_stream.h"

namespace {

using ina::DType;
using ina::Key128;
using ina::MacKey;
using ina::packet_mac_many;
using ina::agg::DpdkAggregator;
namespace frame = ina::frame;
namespace wire = ina::wire;

using namespace ina::bench;
constexpr uint16_t kBurst = 32;

struct SizeResult {
  uint16_t elems = 0;
  size_t frame_len = 0;
  double seconds = 0;
  uint64_t frames_in = 0;
  uint64_t completed = 0;
  uint64_t tx = 0;
  uint64_t tx_dropped = 0;
  double ring_full_share = 0;
  std::vector<uint64_t> per_lcore;
  double cpu_s = 0;         // CPU time of the aggregator lcores in their loop
  double wall_s = 0;        // wall time of the first lcore's loop
  double cycles = -1;       // TSC cycles per frame of the busy loop iterations, all lcores
  bool unexpected = false;  // counters that exact aggregation cannot give
};

struct TestpmdResult {
  double mpps = -1;          // best Rx-pps of its 1 s statistics
  double mpps_per_cpu = -1;  // forwarded packets / CPU seconds of its forwarding thread
  double cycles = -1;        // its --record-core-cycles "CPU cycles/packet"
};

// dpdk-testpmd io forwarding on a net_ring vdev (its rx and tx are one ring: a loop fed by
// --tx-first) for `seconds`; the highest Rx-pps of its periodic statistics, in Mpps.
TestpmdResult run_testpmd(const std::string& bin, const std::vector<std::string>& mem,
                          const std::string& lcores, size_t frame_len, double seconds) {
  TestpmdResult res;
  const std::string out = "/tmp/ina-dpdk-bench-testpmd-" + std::to_string(getpid()) + ".log";
  const std::string prefix = "ina_bench_tpmd_" + std::to_string(getpid());
  const std::string mbuf = std::to_string(std::max<size_t>(2176, frame_len + 256));
  std::vector<std::string> args = {bin};
  args.insert(args.end(), mem.begin(), mem.end());
  const std::vector<std::string> rest = {"--no-pci",
                                         "--no-telemetry",
                                         "--log-level=3",
                                         "--file-prefix",
                                         prefix,
                                         "--lcores",
                                         lcores,
                                         "--vdev",
                                         "net_ring0",
                                         "--",
                                         "--mbuf-size=" + mbuf,
                                         "--total-num-mbufs=16384",
                                         "--forward-mode=io",
                                         "--tx-first",
                                         "--txpkts=" + std::to_string(frame_len),
                                         "--stats-period=1",
                                         "--nb-cores=1",
                                         "--record-core-cycles"};
  args.insert(args.end(), rest.begin(), rest.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  // Non-interactive testpmd forwards until a line arrives on stdin (EOF ends it at once): a pipe
  // held open until it is stopped.
  int in_pipe[2];
  if (pipe(in_pipe) != 0) return res;
  posix_spawn_file_actions_adddup2(&fa, in_pipe[0], 0);
  posix_spawn_file_actions_addclose(&fa, in_pipe[1]);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in_pipe[0]);
  if (rc != 0) {
    close(in_pipe[1]);
    std::fprintf(stderr, "ina-dpdk-bench: cannot run %s: %s\n", bin.c_str(), std::strerror(rc));
    return res;
  }
  // EAL start-up takes a while with --no-huge: wait (at most 30 s) for its first statistics
  // (printed each second once forwarding runs), then at least two more periods.
  auto count_stats = [&] {
    int n = 0;
    if (FILE* f = std::fopen(out.c_str(), "r")) {
      char line[512];
      while (std::fgets(line, sizeof line, f) != nullptr)
        n += std::strstr(line, "Rx-pps:") != nullptr;
      std::fclose(f);
    }
    return n;
  };
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (count_stats() == 0 && std::chrono::steady_clock::now() < give_up &&
         waitpid(pid, nullptr, WNOHANG) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(
      std::chrono::milliseconds(static_cast<int>(1100 + std::max(1.0, seconds) * 1000)));
  const double cpu = worker_cpu_seconds(pid);
  kill(pid, SIGINT);
  close(in_pipe[1]);
  int status = 0;
  for (int i = 0; i < 100; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (i == 99) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  }
  double best = -1;
  double forwarded = 0;  // the last RX-packets total (the final statistics)
  if (FILE* f = std::fopen(out.c_str(), "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      const char* p = std::strstr(line, "Rx-pps:");
      if (p != nullptr) best = std::max(best, std::strtod(p + 7, nullptr) / 1e6);
      const char* q = std::strstr(line, "RX-packets:");
      if (q != nullptr) forwarded = std::strtod(q + 11, nullptr);
    }
    std::fclose(f);
  }
  res.mpps = best;
  res.cycles = ina::bench::testpmd_cycles_per_packet(out);
  if (cpu > 0) res.mpps_per_cpu = forwarded / cpu / 1e6;
  if (best < 0) {
    std::fprintf(stderr, "ina-dpdk-bench: no Rx-pps from testpmd (its output: %s)\n", out.c_str());
  } else {
    std::remove(out.c_str());
  }
  return res;
}

bool run_size(uint16_t elems, uint32_t world, uint32_t slots, unsigned lcores, double seconds,
              const std::string& results, DType dtype, rte_mempool* gen_pool, SizeResult* res) {
  static int serial = 0;
  const std::string base = "b" + std::to_string(serial++);
  rte_ring* rx =
      rte_ring_create((base + "rx").c_str(), 4096, rte_socket_id(), RING_F_SP_ENQ | RING_F_SC_DEQ);
  std::vector<rte_ring*> tx;
  for (unsigned q = 0; q < lcores; ++q) {
    tx.push_back(rte_ring_create((base + "tx" + std::to_string(q)).c_str(), 8192, rte_socket_id(),
                                 RING_F_SP_ENQ | RING_F_SC_DEQ));
  }
  const int port =
      rte_eth_from_rings((base + "p").c_str(), &rx, 1, tx.data(), lcores, rte_socket_id());
  if (port < 0 || rx == nullptr) {
    std::fprintf(stderr, "ina-dpdk-bench: ring port: %s\n", rte_strerror(rte_errno));
    return false;
  }
  ina::agg::DpdkOptions o;
  o.port = std::to_string(port);
  o.ip = kAggIp;
  o.udp_port = kAggPort;
  o.lcores = lcores;
  o.mbufs = 16383;
  o.fanout = parse_fanout(results);
  ina::agg::JobConfig job;
  job.job = kJob;
  job.slots.world_size = world;
  job.slots.num_slots = slots;
  job.slots.max_payload_bytes = static_cast<uint32_t>(elems) * 4;
  auto created = DpdkAggregator::create(o, {job});
  if (!created.ok()) {
    std::fprintf(stderr, "ina-dpdk-bench: %s\n", created.status().to_string().c_str());
    return false;
  }
  std::unique_ptr<DpdkAggregator> agg = std::move(*created);
  const frame::LocalConfig local = agg->local();
  const frame::Endpoint agg_ep{local.mac, local.ip, local.udp_port};

  // The generator's frames (dpdk_bench_common.h); the join barrier first.
  FrameTemplates tmpl(elems, world, slots, agg_ep, dtype);
  const size_t flen = tmpl.flen;
  res->frame_len = flen;
  auto send_hellos = [&] {
    for (uint32_t r = 0; r < world; ++r) {
      rte_mbuf* m = rte_pktmbuf_alloc(gen_pool);
      const auto& h = tmpl.hellos[r];
      rte_memcpy(rte_pktmbuf_append(m, static_cast<uint16_t>(h.size())), h.data(), h.size());
      while (rte_ring_enqueue(rx, m) != 0) {
      }
    }
  };
  send_hellos();
  if (!agg->start().ok()) return false;

  auto drain = [&] {
    rte_mbuf* out[256];
    uint64_t n = 0;
    for (rte_ring* t : tx) {
      const unsigned k = rte_ring_dequeue_burst(t, reinterpret_cast<void**>(out), 256, nullptr);
      if (k > 0) rte_pktmbuf_free_bulk(out, k);
      n += k;
    }
    return n;
  };
  // Wait for the barrier's notices, then HELLO again for each rank's own WELCOME, which names
  // the incarnation whose key seals the DATA (WIRE.md "Incarnations").
  for (uint64_t got = 0; got < world;) got += drain();
  send_hellos();
  {
    uint32_t welcomed = 0;
    uint64_t epoch = 0;
    rte_mbuf* out[256];
    while (welcomed < world) {
      for (rte_ring* t : tx) {
        const unsigned k = rte_ring_dequeue_burst(t, reinterpret_cast<void**>(out), 256, nullptr);
        for (unsigned i = 0; i < k; ++i) {
          if (welcome_rank(rte_pktmbuf_mtod(out[i], const uint8_t*), out[i]->data_len, world,
                           &epoch) >= 0) {
            ++welcomed;
          }
        }
        if (k > 0) rte_pktmbuf_free_bulk(out, k);
      }
    }
    tmpl.traffic = wire::incarnation_key(kBenchKey, epoch);
  }

  BlockCursor cur;
  uint64_t sent = 0, full = 0, tries = 0;
  rte_mbuf* pending[kBurst];
  unsigned np = 0;
  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t t0 = rte_rdtsc();
  const uint64_t t_end = t0 + static_cast<uint64_t>(seconds * static_cast<double>(hz));
  uint64_t now = t0;
  while (now < t_end) {
    for (int it = 0; it < 64; ++it) {
      if (np == 0) {
        if (rte_pktmbuf_alloc_bulk(gen_pool, pending, kBurst) != 0) {
          drain();
          continue;
        }
        for (unsigned i = 0; i < kBurst; ++i) {
          rte_mbuf* m = pending[i];
          cur.next(tmpl, rte_pktmbuf_mtod(m, uint8_t*));
          m->data_len = static_cast<uint16_t>(flen);
          m->pkt_len = static_cast<uint32_t>(flen);
        }
        np = kBurst;
      }
      const unsigned k = rte_ring_enqueue_burst(
          rx, reinterpret_cast<void* const*>(pending + (kBurst - np)), np, nullptr);
      ++tries;
      if (k < np) ++full;
      np -= k;
      sent += k;
      drain();
    }
    now = rte_rdtsc();
  }
  // Let the aggregator finish the ring, then stop.
  while (rte_ring_count(rx) > 0) drain();
  const double secs = static_cast<double>(rte_rdtsc() - t0) / static_cast<double>(hz);
  agg->stop();
  drain();
  if (np > 0) rte_pktmbuf_free_bulk(pending + (kBurst - np), np);

  const auto e = agg->engine_totals();
  const auto lc = agg->loop_totals();
  res->elems = elems;
  res->seconds = secs;
  res->frames_in = e.packets_in - world;  // without the HELLOs
  res->completed = e.completed;
  res->tx = lc.tx;
  res->tx_dropped = lc.tx_dropped;
  res->ring_full_share = tries ? static_cast<double>(full) / static_cast<double>(tries) : 0;
  for (unsigned i = 0; i < agg->lcores(); ++i) {
    res->per_lcore.push_back(agg->engine(i).counters().packets_in);
    res->cpu_s += static_cast<double>(agg->loop_counters(i).cpu_ns) / 1e9;
  }
  res->wall_s = static_cast<double>(agg->loop_counters(0).wall_ns) / 1e9;
  if (lc.rx > 0) res->cycles = static_cast<double>(lc.busy_tsc) / static_cast<double>(lc.rx);
  if (e.malformed != 0 || e.stale != 0 || e.completed + 1 < sent / world) {
    std::fprintf(stderr,
                 "ina-dpdk-bench: UNEXPECTED counters (sent %" PRIu64 " completed %" PRIu64
                 " malformed %" PRIu64 " stale %" PRIu64 ")\n",
                 sent, e.completed, e.malformed, e.stale);
    res->unexpected = true;
  }
  // The replies still queued go back to the aggregator's pool before the aggregator frees it.
  drain();
  agg.reset();  // closes the port
  rte_ring_free(rx);
  for (rte_ring* t : tx) rte_ring_free(t);
  return true;
}

constexpr uint64_t kMaxMemifFrames = 65536;

// The two-process memif sweep: per size the aggregator, then testpmd, each as the DUT of the
// same generator. Returns false when a measurement failed.
bool memif_sweep(const std::string& argv0, const std::string& testpmd, const std::string& fwd,
                 const std::vector<uint16_t>& sizes, MemifArgs a, const std::vector<int>& cpus) {
  const int gen_cpu = cpus[0];
  const int dut_cpu = cpus[1 % cpus.size()];
  // The generator keeps one prebuilt frame per (rank, slot, copy), each an mbuf.
  const uint64_t frames = uint64_t{a.world} * a.slots * 2;
  if (frames > kMaxMemifFrames) {
    std::fprintf(stderr,
                 "ina-dpdk-bench: memif mode prebuilds one frame per rank, slot and copy: --world "
                 "%u x --slots %u x 2 = %" PRIu64 " frames, more than %" PRIu64
                 "; use fewer slots\n",
                 a.world, a.slots, frames, kMaxMemifFrames);
    return false;
  }
  std::string used;
  // Decided once here: the children must not each look at the free hugepages (the DUT's take some).
  a.mem = eal_memory(a.mem, 128, &used).front() == "--in-memory" ? "huge" : "nohuge";
  std::printf(
      "# memif: generator process (memif client, %s, prebuilt frames) on CPU %d, DUT "
      "process (memif server, copy mode) on CPU %d; memory: %s; %s frames; aggregator results "
      "--results %s (fan: chains or copies, as chosen), tag check %s; testpmd "
      "--forward-mode=%s --port-topology=loop\n",
      memif_gen_zero_copy(a) ? "zero-copy" : "copy mode", gen_cpu, dut_cpu, used.c_str(),
      a.dtype.c_str(), a.results.c_str(), a.no_tag ? "off" : "on", fwd.c_str());
  std::printf(
      "# Mpps: frames back at the generator per second of its window; /cpu: per CPU second"
      " of the DUT's lcore\n# thread (from /proc, the same meter for both DUTs); cpu%%: "
      "that thread's share of the window;\n# cyc/f: TSC cycles per frame of the DUT's busy "
      "loop iterations (testpmd: --record-core-cycles;\n# the aggregator's omit the rx of "
      "a burst after an idle poll, so compare them with care); full:\n# share of generator"
      " tx bursts that found the ring full (near 0: the generator is the limit);\n# ratio: "
      "agg/cpu over tpm/cpu; r_wall: agg_Mpps over tpm_Mpps.\n");
  std::printf("# %5s %5s %5s | %8s %8s %8s %5s %7s %5s | %8s %8s %5s %7s %5s | %6s %6s %6s\n",
              "elems", "frame", "bsize", "agg_Mpps", "agg/cpu", "Gel/cpu", "cpu%", "cyc/f", "full",
              "tpm_Mpps", "tpm/cpu", "cpu%", "cyc/f", "full", "ratio", "r_wall", "fan");
  std::fflush(stdout);
  bool ok = true;
  for (uint16_t e : sizes) {
    a.elems = e;
    // One retry each: on a loaded machine a memif link may not come up in time.
    MemifRow ag = memif_measure(argv0, testpmd, "agg", a, gen_cpu, dut_cpu);
    if (!ag.ok) ag = memif_measure(argv0, testpmd, "agg", a, gen_cpu, dut_cpu);
    MemifRow tp;
    if (testpmd != "none") {
      tp = memif_measure(argv0, testpmd, fwd, a, gen_cpu, dut_cpu);
      if (!tp.ok) tp = memif_measure(argv0, testpmd, fwd, a, gen_cpu, dut_cpu);
    }
    if (!ag.ok)
      std::fprintf(stderr, "ina-dpdk-bench: memif %u elements, aggregator: %s\n", unsigned{e},
                   ag.error.c_str());
    if (testpmd != "none" && !tp.ok) {
      std::fprintf(stderr, "ina-dpdk-bench: memif %u elements, testpmd: %s\n", unsigned{e},
                   tp.error.c_str());
    }
    ok = ok && ag.ok && (testpmd == "none" || tp.ok);
    auto mpps = [](const MemifRow& r) {
      return r.ok && r.seconds > 0 ? static_cast<double>(r.received) / r.seconds / 1e6 : 0.0;
    };
    auto per_cpu = [](const MemifRow& r) {
      return r.ok && r.dut_cpu_s > 0 ? static_cast<double>(r.received) / r.dut_cpu_s / 1e6 : 0.0;
    };
    auto share = [](const MemifRow& r) {
      return r.ok && r.seconds > 0 ? 100 * r.dut_cpu_s / r.seconds : 0.0;
    };
    std::printf(
        "  %5u %5zu %5u | %8.3f %8.3f %8.3f %4.0f%% %7.0f %5.2f | %8.3f %8.3f %4.0f%% "
        "%7.0f %5.2f | %6.3f %6.3f %6s\n",
        unsigned{e}, memif_frame_len(e), unsigned{memif_bsize(a)}, mpps(ag), per_cpu(ag),
        per_cpu(ag) * e / 1e3, share(ag), ag.dut_cycles, ag.full_share, mpps(tp), per_cpu(tp),
        share(tp), tp.dut_cycles, tp.full_share, per_cpu(tp) > 0 ? per_cpu(ag) / per_cpu(tp) : 0.0,
        mpps(tp) > 0 ? mpps(ag) / mpps(tp) : 0.0,
        ag.dut_chains < 0 ? "-" : (ag.dut_chains ? "chains" : "copies"));
    if (a.stages && ag.ok) {
      std::printf(
          "  # %u elements, aggregator cycles per frame by stage: rx burst %.0f, "
          "processing %.0f, tx burst %.0f\n",
          unsigned{e}, ag.dut_rx_cycles, ag.dut_work_cycles, ag.dut_tx_cycles);
    }
    // Every block but the last completes (each rank's frame of a block is sent before the next
    // block's); HELLOs are in packets_in, as many as the aggregator counted: the generator sends
    // them again on the barrier's notice and every 200 ms until its WELCOMEs come, so a DUT slow
    // to answer (a loaded machine) gets more than two per rank. Results the generator no longer
    // took after its window (tx_dropped) are expected.
    if (ag.ok &&
        (ag.dut_malformed != 0 || ag.dut_hellos < a.world || ag.dut_packets_in < ag.dut_hellos ||
         (ag.dut_completed + 1) * a.world < ag.dut_packets_in - ag.dut_hellos)) {
      std::printf("  # UNEXPECTED aggregator counters: packets_in %" PRIu64 " (HELLOs %" PRIu64
                  ") completed %" PRIu64 " malformed %" PRIu64 "\n",
                  ag.dut_packets_in, ag.dut_hellos, ag.dut_completed, ag.dut_malformed);
      ok = false;
    }
    std::fflush(stdout);
  }
  return ok;
}

// --mode tags: what the aggregator's tag check costs per DATA frame, one datagram at a time
// (wire::tag_ok, the Engine's own check) against a burst's at once (mac.h, packet_mac_many, as the
// DPDK loop verifies each burst), over a burst of `burst` of the generator's frames in cache; then
// the Engine's whole work per DATA frame (on_packet: decode, tag, slot table, completion; no I/O)
// with its own tag check against the loop's (a burst's tags at once, then on_packet told so). TSC
// cycles per frame, the best of several repetitions (robust where other work shares the CPU).
// False when a genuine tag failed or a round did not complete (printed UNEXPECTED).
bool tag_table(const std::vector<uint16_t>& sizes, uint32_t world, uint32_t slots, uint16_t burst,
               DType dtype) {
  bool good = true;
  std::printf(
      "# tags: per DATA frame, TSC cycles (best of 15 or 7), %s, %u frames per burst: the tag "
      "check one frame at a time (tag_one) and a burst at once (tag_burst); the Engine's whole "
      "work with its own check (engine_one) and with the burst's (engine_burst)\n",
      dtype == DType::kFloat32 ? "float32" : "int32", unsigned{burst});
  std::printf("# %5s %9s %9s %6s %11s %12s %6s\n", "elems", "tag_one", "tag_burst", "x",
              "engine_one", "engine_burst", "x");
  const Key128 key{0x1234567890ABCDEFull, 0x0FEDCBA987654321ull};
  const MacKey mk = ina::expand_mac_key(key);
  for (uint16_t e : sizes) {
    FrameTemplates t(e, world, slots, frame::Endpoint{kAggMac, kAggIp, kAggPort}, dtype);
    const size_t n = std::min<size_t>(burst, size_t{world} * slots * 2);
    std::vector<std::span<const uint8_t>> msgs(n);
    std::vector<const MacKey*> keys(n, &mk);
    for (size_t i = 0; i < n; ++i) {
      uint8_t* dg = t.data.data() + i * t.flen + frame::kUdpHeadroom;
      wire::seal(std::span<uint8_t>(dg, t.dlen), key);
      msgs[i] = std::span<const uint8_t>(dg, t.dlen);
    }
    std::vector<uint64_t> macs(n);
    auto best = [&](int reps, int times, size_t frames, auto&& pass) {
      uint64_t b = ~uint64_t{0};
      for (int rep = 0; rep < reps; ++rep) {
        const uint64_t t0 = rte_rdtsc();
        for (int k = 0; k < times; ++k) pass();
        b = std::min(b, rte_rdtsc() - t0);
      }
      return static_cast<double>(b) / (times * static_cast<double>(frames));
    };
    size_t ok = 0;
    const double one = best(15, 50, n, [&] {
      for (size_t i = 0; i < n; ++i) ok += wire::tag_ok(msgs[i], key);
    });
    const double many = best(15, 50, n, [&] {
      packet_mac_many(keys.data(), msgs.data(), n, wire::kOffTag / 8, macs.data());
      for (size_t i = 0; i < n; ++i) ok += macs[i] == wire::get_u64(msgs[i].data() + wire::kOffTag);
    });
    if (ok != 2 * 15 * 50 * n) {
      std::printf("  # UNEXPECTED: a genuine tag failed\n");
      good = false;
    }

    // The Engine: `rounds` blocks of every rank through a fresh engine per repetition.
    constexpr uint32_t kRounds = 1024;
    constexpr uint64_t kEngineKey = 0x0123456789ABCDEFull;
    const auto pkts =
        data_stream(kRounds, world, slots, e, dtype, incarnation_key_of(kEngineKey, world, 77));
    std::vector<std::span<const uint8_t>> dgs(pkts.begin(), pkts.end());
    bool complete = true;
    auto engine_pass = [&](bool in_bursts) {
      ina::agg::EngineOptions eo;
      eo.telemetry = false;
      ina::agg::Engine eng(eo);
      (void)eng.add_job(job_config(world, slots, e, kEngineKey));
      int32_t rank;
      ina::JobId job;
      for (uint32_t r = 0; r < world; ++r)
        eng.on_packet(hello_packet(static_cast<uint16_t>(r), world, kEngineKey, 77), &rank, &job);
      Key128 traffic, up;
      (void)eng.current_keys(1, &traffic, &up);
      const MacKey tk = ina::expand_mac_key(traffic);
      std::vector<const MacKey*> bk(burst, &tk);
      std::vector<uint64_t> bm(burst);
      // Each burst is first copied into the same `burst` buffers, untimed, as a PMD's receive
      // leaves it in the mbufs: in cache, as the loop finds it.
      std::vector<uint8_t> rx(size_t{burst} * t.dlen);
      std::vector<std::span<const uint8_t>> in(burst);
      uint64_t cycles = 0;
      for (size_t at = 0; at < dgs.size(); at += burst) {
        const size_t k = std::min<size_t>(burst, dgs.size() - at);
        for (size_t i = 0; i < k; ++i) {
          std::memcpy(rx.data() + i * t.dlen, dgs[at + i].data(), dgs[at + i].size());
          in[i] = std::span<const uint8_t>(rx.data() + i * t.dlen, dgs[at + i].size());
        }
        const uint64_t t0 = rte_rdtsc();
        if (in_bursts) packet_mac_many(bk.data(), in.data(), k, wire::kOffTag / 8, bm.data());
        for (size_t i = 0; i < k; ++i) {
          const bool checked = in_bursts && bm[i] == wire::get_u64(in[i].data() + wire::kOffTag);
          eng.on_packet(in[i], 0, &rank, &job, false, checked ? &traffic : nullptr);
        }
        cycles += rte_rdtsc() - t0;
      }
      complete = complete && eng.counters().completed == kRounds && eng.counters().bad_tag == 0;
      return cycles;
    };
    double eng_one = 1e30, eng_burst = 1e30;
    for (int rep = 0; rep < 7; ++rep) {
      eng_one = std::min(eng_one, static_cast<double>(engine_pass(false)) / dgs.size());
      eng_burst = std::min(eng_burst, static_cast<double>(engine_pass(true)) / dgs.size());
    }
    if (!complete) {
      std::printf("  # UNEXPECTED: the engine did not complete every round\n");
      good = false;
    }
    std::printf("  %5u %9.0f %9.0f %6.2f %11.0f %12.0f %6.2f\n", unsigned{e}, one, many, one / many,
                eng_one, eng_burst, eng_one / eng_burst);
  }
  std::fflush(stdout);
  return good;
}

std::string self_exe(const char* argv0) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return argv0;
  buf[n] = 0;
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ina-dpdk-bench: the DPDK aggregator loop vs dpdk-testpmd forwarding, over "
      "net_memif (two processes) and an in-process net_ring"};
  app.set_version_flag("--version", "ina-dpdk-bench " INA_VERSION);
  std::vector<uint16_t> sizes = {64, 256, 1024};
  double seconds = 1.0;
  uint32_t world = 4;
  uint32_t slots = 128;
  unsigned lcores = 1;
  std::string testpmd = "dpdk-testpmd";
  std::string fwd = "io";
  std::vector<std::string> modes = {"memif", "ring"};
  std::string mem = "auto";
  bool indirect = false;
  std::string results = "auto";
  std::string dtype = "int32";
  bool gen_copy = false;
  uint16_t bsize = 0;
  std::string role, sock, to = "agg";
  int cpu = 0;
  std::vector<std::string> eal_extra;
  app.add_option("--elems", sizes, "elements per packet")->delimiter(',')->capture_default_str();
  app.add_option("--seconds", seconds, "per size and DUT (keep it short: shared machines)")
      ->check(CLI::Range(0.1, 30.0))
      ->capture_default_str();
  app.add_option("--world", world, "simulated ranks")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--slots", slots, "slots")->check(CLI::Range(1, 32768))->capture_default_str();
  app.add_option("--lcores", lcores, "aggregator worker lcores (ring mode)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--mode", modes,
                 "memif (two processes), ring (in process), or both; tags: the DATA tag check "
                 "alone, one frame at a time against a burst at once")
      ->delimiter(',')
      ->check(CLI::IsMember({"memif", "ring", "tags"}))
      ->capture_default_str();
  app.add_option("--mem", mem,
                 "EAL memory: huge (hugepages, see scripts/dpdk-hugepages.sh), nohuge, or auto "
                 "(hugepages when 128 are free)")
      ->check(CLI::IsMember({"auto", "huge", "nohuge"}))
      ->capture_default_str();
  app.add_flag("--gen-copy", gen_copy,
               "memif generator in copy mode (default: zero-copy client on hugepages, so that the "
               "generator does less work per frame than the DUT it drives)");
  app.add_option("--results", results,
                 "results to every rank: chains (a header mbuf per rank chained to the one "
                 "datagram), copies (a copy per rank), or auto (chains where the port sends them)")
      ->check(CLI::IsMember({"auto", "chains", "copies"}))
      ->capture_default_str();
  app.add_flag("--indirect", indirect, "the same as --results chains");
  app.add_option("--dtype", dtype,
                 "the DATA frames' type: int32 (integer SUM: no codec, the I/O path's own cost) or "
                 "float32 (float SUM: the codec at every completion)")
      ->check(CLI::IsMember({"int32", "float32"}))
      ->capture_default_str();
  bool no_tag = false;
  bool stages = false;
  app.add_flag("--no-tag", no_tag,
               "the aggregator skips the per-job tag check (SipHash), to measure what it costs");
  app.add_flag("--stages", stages,
               "memif: the aggregator's cycles per frame split into its rx burst, its processing "
               "and its tx burst (four TSC reads per busy loop iteration)");
  app.add_option("--bsize", bsize, "memif buffer size (0: one buffer per frame)")
      ->capture_default_str();
  app.add_option("--testpmd", testpmd, "dpdk-testpmd binary, or 'none'")->capture_default_str();
  app.add_option("--forward-mode", fwd, "testpmd's forwarding in memif mode")
      ->check(CLI::IsMember({"io", "macswap"}))
      ->capture_default_str();
  // The memif mode's child processes (this binary again).
  app.add_option("--role", role, "internal: gen or agg")->check(CLI::IsMember({"gen", "agg"}));
  app.add_option("--sock", sock, "internal: memif socket");
  app.add_option("--cpu", cpu, "internal: CPU of the role's lcores");
  app.add_option("--to", to, "internal: the generator's peer")
      ->check(CLI::IsMember({"agg", "testpmd"}));
  app.add_option("eal", eal_extra, "extra EAL arguments (ring mode), after --");
  CLI11_PARSE(app, argc, argv);

  // The memif settings the sweep passes on to its child roles.
  MemifArgs memif;
  memif.world = world;
  memif.slots = slots;
  memif.seconds = seconds;
  memif.mem = mem;
  memif.bsize = bsize;
  if (indirect) results = "chains";
  memif.results = results;
  memif.dtype = dtype;
  memif.no_tag = no_tag;
  memif.stages = stages;
  memif.gen_zero_copy = !gen_copy;
  if (!role.empty()) {
    MemifArgs a = memif;
    a.sock = sock;
    a.elems = sizes.empty() ? 256 : sizes[0];
    a.cpu = cpu;
    a.to_agg = to == "agg";
    return role == "gen" ? memif_generator(a) : memif_aggregator(a);
  }

  const std::vector<int> cpus = ina::agg::allowed_cpus();
  std::string used;
  const std::vector<std::string> mem_args = eal_memory(mem, 128, &used);
  std::printf("# ina-dpdk-bench: world %u, slots %u, %.1f s per size and DUT, CPUs allowed: %zu\n",
              world, slots, seconds, cpus.size());
  int rc = 0;
  if (std::find(modes.begin(), modes.end(), "tags") != modes.end()) {
    if (!tag_table(sizes, world, slots, 32, parse_dtype(dtype))) rc = 1;
  }
  if (std::find(modes.begin(), modes.end(), "memif") != modes.end()) {
    if (!memif_sweep(self_exe(argv[0]), testpmd, fwd, sizes, memif, cpus)) rc = 1;
  }
  if (std::find(modes.begin(), modes.end(), "ring") == modes.end()) return rc;

  const std::string lcore_map = ina::agg::spread_lcores(lcores + 1);
  std::vector<std::string> eal = {"ina-dpdk-bench"};
  eal.insert(eal.end(), mem_args.begin(), mem_args.end());
  for (const std::string& x :
       {std::string("--no-pci"), std::string("--no-telemetry"), std::string("--log-level=3"),
        std::string("--file-prefix"), "ina_dpdk_bench_" + std::to_string(getpid()),
        std::string("--lcores"), lcore_map}) {
    eal.push_back(x);
  }
  eal.insert(eal.end(), eal_extra.begin(), eal_extra.end());
  const ina::Status st = ina::agg::dpdk_eal_init(eal);
  if (!st.ok()) {
    std::fprintf(stderr, "ina-dpdk-bench: %s\n", st.to_string().c_str());
    return 77;
  }
  rte_mempool* gen_pool =
      rte_pktmbuf_pool_create("gen", 16383, 256, 0, 4096 + 512, static_cast<int>(rte_socket_id()));
  if (gen_pool == nullptr) {
    std::fprintf(stderr, "ina-dpdk-bench: generator pool: %s\n", rte_strerror(rte_errno));
    return 1;
  }
  std::printf(
      "# ring: %u aggregator lcore(s), results --results %s, %s frames, net_ring in process "
      "(generator on the main lcore); testpmd io fwd on net_ring0 (lcores %s); memory: %s\n",
      lcores, results.c_str(), dtype.c_str(), lcore_map.c_str(), used.c_str());
  std::printf(
      "# Mpps: frames per wall second; /cpu: per CPU second of the polling thread(s) (the\n"
      "# fair figure where CPU is shared or capped); ratio = agg/cpu over testpmd/cpu;\n"
      "# cyc/f: TSC cycles per frame of busy loop iterations (testpmd --record-core-cycles)."
      "\n"
      "# testpmd io fwd on a ring passes pointers and never touches a frame.\n");
  std::printf("# %5s %5s %9s %9s %8s %8s %6s %7s %10s %10s %7s %7s %6s  %s\n", "elems", "frame",
              "agg_Mpps", "agg/cpu", "Gelem/s", "Gel/cpu", "cpu%", "cyc/f", "tpmd_Mpps", "tpmd/cpu",
              "cyc/f", "ratio", "drops", "per-lcore Mpps/cpu");
  for (uint16_t e : sizes) {
    SizeResult r;
    if (!run_size(e, world, slots, lcores, seconds, results, parse_dtype(dtype), gen_pool, &r)) {
      rc = 1;
      break;
    }
    if (r.unexpected) rc = 1;
    TestpmdResult tp;
    if (testpmd != "none") {
      std::string tp_map =
          "0@" + std::to_string(cpus[0]) + ",1@" + std::to_string(cpus[1 % cpus.size()]);
      tp = run_testpmd(testpmd, mem_args, tp_map, r.frame_len, seconds);
    }
    const double mpps = static_cast<double>(r.frames_in) / r.seconds / 1e6;
    const double per_cpu = r.cpu_s > 0 ? static_cast<double>(r.frames_in) / r.cpu_s / 1e6 : 0;
    std::string per;
    for (size_t i = 0; i < r.per_lcore.size(); ++i) {
      char b[32];
      std::snprintf(b, sizeof b, "%s%.2f", per.empty() ? "" : " ",
                    static_cast<double>(r.per_lcore[i]) / (r.cpu_s / r.per_lcore.size()) / 1e6);
      per += b;
    }
    std::printf(
        "  %5u %5zu %9.2f %9.2f %8.3f %8.3f %5.0f%% %7.0f %10.2f %10.2f %7.1f %7.4f %6" PRIu64
        "  %s\n",
        unsigned{e}, r.frame_len, mpps, per_cpu, mpps * e / 1e3, per_cpu * e / 1e3,
        r.wall_s > 0 ? 100 * r.cpu_s / (r.wall_s * lcores) : 0, r.cycles, tp.mpps, tp.mpps_per_cpu,
        tp.cycles, tp.mpps_per_cpu > 0 ? per_cpu / tp.mpps_per_cpu : 0.0, r.tx_dropped,
        per.c_str());
    std::fflush(stdout);
  }
  ina::agg::dpdk_eal_cleanup();
  return rc;
}
