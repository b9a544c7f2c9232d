// ina-dpdk-bench over net_memif: two processes on one host, each pinned to its own CPU, joined by a
// memif interface (shared-memory rings). The DUT, the memif server, copies every frame in and out
// of the shared buffers whatever it is; the generator, the client, runs memif's zero-copy mode on
// hugepages (the server copies straight from and into the generator's mbufs), else (--gen-copy,
// --no-huge) copy mode, where it copies every frame too.
//
//   generator (memif client, --role gen)  <== memif ==>  DUT (memif server): the aggregator
//                                                         (--role agg) or dpdk-testpmd forwarding
//
// The generator plays `world` ranks streaming blocks through the slots (the same frames as the
// ring mode, dpdk_bench_common.h, prebuilt once: per send only a reference and the block sequence);
// after the join (aggregator) or the link (testpmd) it prints
// START, sends and receives for `seconds`, prints END with its counts, drains, stops its port and
// exits. The parent samples the DUT's lcore thread CPU time (/proc) at START and END, so both DUTs
// are measured by the same meters: frames the generator got back per second (results: one per
// rank per block, as many as the DATA frames in; testpmd: the frames themselves) and per CPU
// second of the DUT's polling thread. The share of generator tx bursts that found the ring full
// says who limits: near 0 the generator (the DUT kept up), near 1 the DUT.
#include "testbed/instruments/dpdk_bench_memif.h"

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <time.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "aggregator/dpdk_backend.h"
#include "testbed/instruments/dpdk_bench_common.h"

namespace ina::bench {

namespace {
constexpr uint16_t kBurst = 32;

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

std::string vdev(const MemifArgs& a, bool server) {
  std::string v = "net_memif0,role=" + std::string(server ? "server" : "client") +
                  ",socket=" + a.sock + ",bsize=" + std::to_string(memif_bsize(a));
  if (!server && memif_gen_zero_copy(a)) v += ",zero-copy=yes";
  return v;
}

std::vector<std::string> eal_args(const char* name, const MemifArgs& a, bool server,
                                  const std::string& lcores) {
  std::string used;
  std::vector<std::string> eal = {name};
  for (auto& m : eal_memory(a.mem, 128, &used)) eal.push_back(m);
  // memif's zero-copy client shares its memory segments with the server by file descriptor: one
  // file per segment list.
  if (!server && memif_gen_zero_copy(a)) eal.push_back("--single-file-segments");
  for (const char* s : {"--no-pci", "--no-telemetry", "--log-level=3"}) eal.push_back(s);
  eal.push_back("--file-prefix");
  eal.push_back(std::string(name) + "_" + std::to_string(getpid()));
  eal.push_back("--lcores");
  eal.push_back(lcores);
  eal.push_back("--vdev");
  eal.push_back(vdev(a, server));
  return eal;
}
}  // namespace

agg::DpdkOptions::Fanout parse_fanout(const std::string& s) {
  if (s == "chains") return agg::DpdkOptions::Fanout::kChains;
  if (s == "copies") return agg::DpdkOptions::Fanout::kCopies;
  return agg::DpdkOptions::Fanout::kAuto;
}

DType parse_dtype(const std::string& s) { return s == "float32" ? DType::kFloat32 : DType::kInt32; }

double testpmd_cycles_per_packet(const std::string& log) {
  // Printed when forwarding stops: "CPU cycles/packet=1234.56 (busy cycles=... / total ...".
  std::ifstream f(log);
  std::string line;
  double v = -1;
  while (std::getline(f, line)) {
    const size_t p = line.find("CPU cycles/packet=");
    if (p != std::string::npos) v = std::strtod(line.c_str() + p + 18, nullptr);
  }
  return v;
}

size_t memif_frame_len(uint16_t elems) { return frame::kUdpHeadroom + wire::packet_size(elems, 4); }

bool memif_gen_zero_copy(const MemifArgs& a) {
  std::string used;
  return a.gen_zero_copy && eal_memory(a.mem, 128, &used).front() == "--in-memory";
}

uint16_t memif_bsize(const MemifArgs& a) {
  if (a.bsize != 0) return a.bsize;
  const size_t f = (memif_frame_len(a.elems) + 127) / 128 * 128;
  return static_cast<uint16_t>(std::max<size_t>(f, 2048));
}

int memif_generator(const MemifArgs& a) {
  std::vector<std::string> eal = eal_args("ina_dbg", a, false, "0@" + std::to_string(a.cpu));
  const Status st = agg::dpdk_eal_init(eal);
  if (!st.ok()) {
    std::printf("ERROR generator EAL: %s\n", st.to_string().c_str());
    return 1;
  }
  const size_t flen = memif_frame_len(a.elems);
  // The generator sends prebuilt frames: a ring of `nframes` mbufs, a whole number of (rank, slot,
  // copy) cycles and at least four times the memif ring, each sent again `nframes` frames later
  // with its block sequence patched in. Each send takes a reference (the PMD's free after the
  // copy or, in zero-copy mode, after the server took the frame drops it), so no frame is built
  // or copied per send; a frame is rewritten only long after the server has read its last send.
  const uint32_t cycle = a.world * a.slots * 2;
  const uint32_t nframes = (4096 + cycle - 1) / cycle * cycle;
  rte_mempool* pool = rte_pktmbuf_pool_create(
      "gen", nframes + 4095, 256, 0,
      static_cast<uint16_t>(RTE_PKTMBUF_HEADROOM + std::max<size_t>(flen + 64, 2048)),
      static_cast<int>(rte_socket_id()));
  if (pool == nullptr) {
    std::printf("ERROR generator pool: %s\n", rte_strerror(rte_errno));
    return 1;
  }
  rte_eth_conf conf{};
  int rc = rte_eth_dev_configure(0, 1, 1, &conf);
  if (rc == 0) rc = rte_eth_rx_queue_setup(0, 0, 1024, rte_socket_id(), nullptr, pool);
  if (rc == 0) rc = rte_eth_tx_queue_setup(0, 0, 1024, rte_socket_id(), nullptr);
  if (rc == 0) rc = rte_eth_dev_start(0);
  if (rc != 0) {
    std::printf("ERROR generator port: %s\n", rte_strerror(rc < 0 ? -rc : rc));
    return 1;
  }
  const uint64_t hz = rte_get_tsc_hz();
  auto seconds_since = [&](uint64_t t) {
    return static_cast<double>(rte_rdtsc() - t) / static_cast<double>(hz);
  };
  // The memif link comes up once the server accepted us.
  uint64_t t = rte_rdtsc();
  for (;;) {
    rte_eth_link link{};
    if (rte_eth_link_get_nowait(0, &link) == 0 && link.link_status == RTE_ETH_LINK_UP) break;
    if (seconds_since(t) > 40) {
      std::printf("ERROR generator: the memif link did not come up within 40 s (socket %s)\n",
                  a.sock.c_str());
      return 1;
    }
    rte_delay_ms(10);
  }
  FrameTemplates tmpl(a.elems, a.world, a.slots, frame::Endpoint{kAggMac, kAggIp, kAggPort},
                      parse_dtype(a.dtype));
  std::vector<rte_mbuf*> frames(nframes);
  if (rte_pktmbuf_alloc_bulk(pool, frames.data(), nframes) != 0) {
    std::printf("ERROR generator: cannot take %u mbufs for the frames\n", nframes);
    return 1;
  }
  {
    BlockCursor build;
    for (rte_mbuf* m : frames) {
      build.next(tmpl, rte_pktmbuf_mtod(m, uint8_t*));
      m->data_len = static_cast<uint16_t>(flen);
      m->pkt_len = static_cast<uint32_t>(flen);
    }
  }
  rte_mbuf* rx[256];
  if (a.to_agg) {
    // The join barrier: one HELLO per rank, then a WELCOME per rank comes back. The HELLOs go
    // again every 200 ms until the WELCOMEs are in: a frame sent just as the link came up can be
    // lost (the server may not poll its queue yet), and the aggregator answers a repeated HELLO.
    // Only a rank's own WELCOME (seq = its HELLO's nonce) counts; the barrier's notice (seq 0)
    // gets the HELLOs again at once. The WELCOMEs name the incarnation whose key seals the DATA
    // (WIRE.md "Incarnations").
    uint64_t got = 0;
    std::vector<bool> welcomed(a.world, false);
    uint64_t epoch = 0;
    t = rte_rdtsc();
    uint64_t hello_at = 0;
    while (got < a.world) {
      if (hello_at == 0 || seconds_since(hello_at) > 0.2) {
        hello_at = rte_rdtsc();
        for (uint32_t r = 0; r < a.world; ++r) {
          rte_mbuf* m = rte_pktmbuf_alloc(pool);
          if (m == nullptr) break;
          const auto& h = tmpl.hellos[r];
          std::memcpy(rte_pktmbuf_append(m, static_cast<uint16_t>(h.size())), h.data(), h.size());
          if (rte_eth_tx_burst(0, 0, &m, 1) == 0) rte_pktmbuf_free(m);
        }
      }
      const uint16_t k = rte_eth_rx_burst(0, 0, rx, 256);
      for (uint16_t i = 0; i < k; ++i) {
        const int r =
            welcome_rank(rte_pktmbuf_mtod(rx[i], const uint8_t*), rx[i]->data_len, a.world, &epoch);
        if (r < 0) {
          hello_at = 0;  // the notice: HELLO again now
        } else if (!welcomed[static_cast<size_t>(r)]) {
          welcomed[static_cast<size_t>(r)] = true;
          ++got;
        }
      }
      rte_pktmbuf_free_bulk(rx, k);
      if (seconds_since(t) > 10) {
        std::printf("ERROR generator: %" PRIu64 " of %u WELCOMEs within 10 s\n", got, a.world);
        return 1;
      }
    }
    tmpl.traffic = wire::incarnation_key(kBenchKey, epoch);
  }
  std::printf("START\n");
  std::fflush(stdout);

  uint64_t next = 0;  // frames handed out: frame next % nframes, block next / world
  uint64_t sent = 0, received = 0, full = 0, tries = 0;
  rte_mbuf* pending[kBurst];
  unsigned np = 0;
  const double cpu0 = thread_cpu_s();
  const uint64_t t0 = rte_rdtsc();
  const uint64_t t_end = t0 + static_cast<uint64_t>(a.seconds * static_cast<double>(hz));
  constexpr size_t kSeqAt = frame::kUdpHeadroom + wire::kOffSeq;
  for (uint64_t now = t0; now < t_end; now = rte_rdtsc()) {
    for (int it = 0; it < 64; ++it) {
      if (np == 0) {
        for (unsigned i = 0; i < kBurst; ++i, ++next) {
          rte_mbuf* m = frames[next % nframes];
          rte_mbuf_refcnt_update(m, 1);
          wire::put_u32(rte_pktmbuf_mtod(m, uint8_t*) + kSeqAt,
                        static_cast<uint32_t>(next / a.world + 1));
          // A worker's cost too: the tag is resealed over the patched sequence.
          wire::seal(
              std::span<uint8_t>(rte_pktmbuf_mtod(m, uint8_t*) + frame::kUdpHeadroom, tmpl.dlen),
              tmpl.traffic);
          pending[i] = m;
        }
        np = kBurst;
      }
      const uint16_t k = rte_eth_tx_burst(0, 0, pending + (kBurst - np), static_cast<uint16_t>(np));
      ++tries;
      if (k < np) ++full;
      np -= k;
      sent += k;
      const uint16_t r = rte_eth_rx_burst(0, 0, rx, 256);
      if (r > 0) rte_pktmbuf_free_bulk(rx, r);
      received += r;
    }
  }
  const double secs = seconds_since(t0);
  const double cpu = thread_cpu_s() - cpu0;
  std::printf("END sent=%" PRIu64 " received=%" PRIu64 " seconds=%.6f full=%.6f cpu=%.6f\n", sent,
              received, secs, tries ? static_cast<double>(full) / static_cast<double>(tries) : 0.0,
              cpu);
  std::fflush(stdout);
  // Stop sending and wait (connected, idle) until the parent has stopped the DUT, so that testpmd
  // counts its statistics before the link goes; then take what is still in flight and stop the
  // port (DPDK 22.11's memif can crash when a peer disconnects under traffic).
  for (unsigned i = kBurst - np; i < kBurst; ++i) rte_mbuf_refcnt_update(pending[i], -1);
  char go[64];
  while (read(0, go, sizeof go) > 0) {
  }
  t = rte_rdtsc();
  while (seconds_since(t) < 0.3) {
    const uint16_t k = rte_eth_rx_burst(0, 0, rx, 256);
    rte_pktmbuf_free_bulk(rx, k);
  }
  (void)rte_eth_dev_stop(0);
  (void)rte_eth_dev_close(0);
  rte_pktmbuf_free_bulk(frames.data(), nframes);
  return 0;
}

int memif_aggregator(const MemifArgs& a) {
  const std::string c = std::to_string(a.cpu);
  std::vector<std::string> eal = eal_args("ina_dba", a, true, "0@" + c + ",1@" + c);
  const Status st = agg::dpdk_eal_init(eal);
  if (!st.ok()) {
    std::printf("ERROR aggregator EAL: %s\n", st.to_string().c_str());
    return 1;
  }
  agg::DpdkOptions o;
  o.port = "net_memif0";
  o.ip = kAggIp;
  o.udp_port = kAggPort;
  o.mac_set = true;
  o.mac = kAggMac;
  o.lcores = 1;
  o.mbufs = 16383;
  o.fanout = parse_fanout(a.results);
  o.check_tag = !a.no_tag;
  o.stage_cycles = a.stages;
  agg::JobConfig job;
  job.job = kJob;
  job.slots.world_size = a.world;
  job.slots.num_slots = a.slots;
  job.slots.max_payload_bytes = static_cast<uint32_t>(a.elems) * 4;
  auto created = agg::DpdkAggregator::create(o, {job});
  if (!created.ok()) {
    std::printf("ERROR aggregator: %s\n", created.status().to_string().c_str());
    return 1;
  }
  std::unique_ptr<agg::DpdkAggregator> ag = std::move(*created);
  const Status s = ag->start();
  if (!s.ok()) {
    std::printf("ERROR aggregator start: %s\n", s.to_string().c_str());
    return 1;
  }
  std::printf("READY chains=%d\n", ag->chains() ? 1 : 0);
  std::fflush(stdout);
  char buf[64];
  while (read(0, buf, sizeof buf) > 0) {
  }  // until the parent closes our stdin
  ag->stop();
  const auto e = ag->engine_totals();
  const auto l = ag->loop_totals();
  auto per_frame = [&](uint64_t tsc) {
    return l.rx ? static_cast<double>(tsc) / static_cast<double>(l.rx) : -1.0;
  };
  std::printf("RESULT packets_in=%" PRIu64 " completed=%" PRIu64 " tx=%" PRIu64
              " tx_dropped=%" PRIu64 " no_mbuf=%" PRIu64 " polls=%" PRIu64 " idle_polls=%" PRIu64
              " cycles=%.1f malformed=%" PRIu64
              " rx_cyc=%.1f work_cyc=%.1f tx_cyc=%.1f hellos=%" PRIu64 "\n",
              e.packets_in, e.completed, l.tx, l.tx_dropped, l.no_mbuf, l.polls, l.idle_polls,
              per_frame(l.busy_tsc), e.malformed, per_frame(l.rx_tsc), per_frame(l.work_tsc),
              per_frame(l.tx_tsc), e.hellos);
  std::fflush(stdout);
  ag.reset();  // stops and closes the port
  return 0;
}

MemifRow memif_measure(const std::string& argv0, const std::string& testpmd, const std::string& dut,
                       MemifArgs a, int gen_cpu, int dut_cpu) {
  MemifRow row;
  static int serial = 0;
  const std::string tag = std::to_string(getpid()) + "_" + std::to_string(serial++);
  a.sock = "/tmp/ina-dpdk-bench-" + tag + ".sock";
  const std::string dut_log = "/tmp/ina-dpdk-bench-dut-" + tag + ".log";
  const std::string gen_log = "/tmp/ina-dpdk-bench-gen-" + tag + ".log";
  const bool to_agg = dut == "agg";
  const std::string E = std::to_string(a.elems);
  auto fail = [&](const std::string& why) {
    row.ok = false;
    row.error = why;
    return row;
  };
  // The child roles' common arguments (this binary as --role agg or gen, on its CPU).
  auto role_args = [&](const char* role, int cpu) {
    return std::vector<std::string>{argv0,
                                    "--role",
                                    role,
                                    "--sock",
                                    a.sock,
                                    "--elems",
                                    E,
                                    "--world",
                                    std::to_string(a.world),
                                    "--slots",
                                    std::to_string(a.slots),
                                    "--cpu",
                                    std::to_string(cpu),
                                    "--mem",
                                    a.mem,
                                    "--bsize",
                                    std::to_string(memif_bsize(a)),
                                    "--dtype",
                                    a.dtype};
  };

  Child d;
  if (to_agg) {
    std::vector<std::string> args = role_args("agg", dut_cpu);
    for (const std::string& x : {std::string("--results"), a.results}) args.push_back(x);
    if (a.no_tag) args.push_back("--no-tag");
    if (a.stages) args.push_back("--stages");
    if (!d.spawn(args, dut_log, true)) return fail("cannot start the aggregator process");
    std::string line;
    bool ready = false;
    while (!ready && d.read_line(&line, std::chrono::seconds(60))) {
      ready = std::sscanf(line.c_str(), "READY chains=%d", &row.dut_chains) == 1;
      if (line.rfind("ERROR", 0) == 0) break;
    }
    if (!ready) {
      d.stop(std::chrono::milliseconds(100));
      return fail("the aggregator did not start: " + line + " (log " + dut_log + ")");
    }
  } else {
    std::string used;
    std::vector<std::string> args = {testpmd};
    for (auto& m : eal_memory(a.mem, 128, &used)) args.push_back(m);
    const std::string c = std::to_string(dut_cpu);
    for (const std::string& s :
         {std::string("--no-pci"), std::string("--no-telemetry"), std::string("--log-level=3"),
          std::string("--file-prefix"), "ina_dbt_" + tag, std::string("--lcores"),
          "0@" + c + ",1@" + c, std::string("--vdev"), vdev(a, true), std::string("--"),
          "--forward-mode=" + dut, std::string("--port-topology=loop"), std::string("--nb-cores=1"),
          "--mbuf-size=" + std::to_string(std::max<size_t>(2176, memif_frame_len(a.elems) + 256)),
          std::string("--total-num-mbufs=16384"), std::string("--record-core-cycles"),
          std::string("-i")}) {
      args.push_back(s);
    }
    if (!d.spawn(args, dut_log, false)) return fail("cannot start " + testpmd);
    // Interactive, commands on its stdin: "start" at its first prompt; "stop" (which prints the
    // statistics and cycles per packet) and "quit" once the generator is done, while the memif
    // link is still up (its port statistics reset when the link goes).
    if (!wait_for_text(dut_log, "testpmd>", std::chrono::seconds(60), d.pid)) {
      d.stop(std::chrono::milliseconds(100));
      return fail("testpmd did not start (log " + dut_log + ")");
    }
    const char start[] = "start\n";
    if (write(d.in_fd, start, sizeof start - 1) < 0) return fail("testpmd: no stdin");
  }

  Child g;
  std::vector<std::string> gargs = role_args("gen", gen_cpu);
  for (const std::string& x : {std::string("--seconds"), std::to_string(a.seconds),
                               std::string("--to"), std::string(to_agg ? "agg" : "testpmd")}) {
    gargs.push_back(x);
  }
  if (!a.gen_zero_copy) gargs.push_back("--gen-copy");
  if (!g.spawn(gargs, gen_log, true)) {
    d.stop(std::chrono::milliseconds(100));
    return fail("cannot start the generator process");
  }
  std::string line, err;
  double c0 = -1;
  bool done = false;
  while (!done && g.read_line(&line, std::chrono::seconds(60 + static_cast<int>(a.seconds)))) {
    if (line == "START") {
      c0 = worker_cpu_seconds(d.pid);
    } else if (line.rfind("END ", 0) == 0) {
      const double c1 = worker_cpu_seconds(d.pid);
      if (c0 >= 0 && c1 >= 0) row.dut_cpu_s = c1 - c0;
      done =
          std::sscanf(line.c_str(),
                      "END sent=%" SCNu64 " received=%" SCNu64 " seconds=%lf full=%lf cpu=%lf",
                      &row.sent, &row.received, &row.seconds, &row.full_share, &row.gen_cpu_s) == 5;
    } else if (line.rfind("ERROR", 0) == 0) {
      err = line;
      break;
    }
  }
  if (!to_agg) {
    const char stop[] = "stop\nquit\n";
    if (write(d.in_fd, stop, sizeof stop - 1) < 0) err = "testpmd: no stdin";
  } else {
    close(d.in_fd);  // the aggregator stops and prints its counters
    d.in_fd = -1;
    while (d.read_line(&line, std::chrono::seconds(10))) {
      if (line.rfind("RESULT ", 0) == 0) {
        std::sscanf(line.c_str(),
                    "RESULT packets_in=%" SCNu64 " completed=%" SCNu64 " tx=%" SCNu64
                    " tx_dropped=%" SCNu64 " no_mbuf=%" SCNu64 " polls=%" SCNu64
                    " idle_polls=%" SCNu64 " cycles=%lf malformed=%" SCNu64
                    " rx_cyc=%lf work_cyc=%lf tx_cyc=%lf hellos=%" SCNu64,
                    &row.dut_packets_in, &row.dut_completed, &row.dut_tx, &row.dut_tx_dropped,
                    &row.dut_no_mbuf, &row.dut_polls, &row.dut_idle_polls, &row.dut_cycles,
                    &row.dut_malformed, &row.dut_rx_cycles, &row.dut_work_cycles,
                    &row.dut_tx_cycles, &row.dut_hellos);
        break;
      }
    }
  }
  d.stop(std::chrono::seconds(5));
  g.stop(std::chrono::seconds(10));
  if (!to_agg) row.dut_cycles = testpmd_cycles_per_packet(dut_log);
  if (!done) {
    return fail(err.empty() ? "the generator gave no result (log " + gen_log + ")" : err);
  }
  row.ok = true;
  if (std::getenv("INA_DPDK_BENCH_KEEP_LOGS") == nullptr) {
    std::remove(dut_log.c_str());
    std::remove(gen_log.c_str());
  }
  std::remove(a.sock.c_str());
  return row;
}

}  // namespace ina::bench
