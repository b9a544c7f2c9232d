// ina-dpdk-bench: the DPDK aggregator loop at full rate over an in-process net_ring port, beside
// dpdk-testpmd's io forwarding on a net_ring vdev with the same frame size, in the same run.
//
//   ina-dpdk-bench [--elems 64,256,1024] [--seconds 1] [--world 4] [--slots 128] [--lcores 1]
//                  [--indirect] [--testpmd dpdk-testpmd|none] [-- <EAL arguments>]
//
// The generator runs on the main lcore: it plays `world` ranks streaming blocks through the
// slots (every block: one DATA frame per rank), each frame an mbuf filled from a per-(rank, slot
// copy) template with the block's sequence patched in (UDP checksum 0, "none"); it drains and
// frees the replies. The aggregator runs on the worker lcores. Printed per size: aggregator Mpps
// (frames in) and aggregated elements/s, per wall second and per CPU second of the polling lcore
// (where CPU is capped or shared, as on CI machines, only the latter compares), beside testpmd's
// io forwarding (Rx-pps, and forwarded packets per CPU second of its forwarding thread).
// io forwarding on a ring never touches a frame (it passes pointers), so it is an upper bound no
// packet-processing loop reaches; it is printed because the issue asks for it.
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_memcpy.h>
#include <rte_ring.h>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "aggregator/dpdk_backend.h"
#include "ina/protocol/frame.h"
#include "ina/protocol/wire.h"

extern char** environ;

namespace {

using ina::agg::DpdkAggregator;
namespace frame = ina::frame;
namespace wire = ina::wire;

constexpr uint32_t kAggIp = 0x0A0C0001;
constexpr uint16_t kAggPort = 47474;
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
  double cpu_s = 0;    // CPU time of the aggregator lcores in their loop
  double wall_s = 0;   // wall time of the first lcore's loop
};

struct TestpmdResult {
  double mpps = -1;          // best Rx-pps of its 1 s statistics
  double mpps_per_cpu = -1;  // forwarded packets / CPU seconds of its forwarding thread
};

// CPU seconds (user + system) of the threads of `pid` whose name contains "worker".
double worker_cpu_seconds(pid_t pid) {
  double total = 0;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), closedir);
  if (!d) return -1;
  while (dirent* e = readdir(d.get())) {
    if (e->d_name[0] == '.') continue;
    char buf[1024];
    const std::string stat = dir + "/" + e->d_name + "/stat";
    FILE* f = std::fopen(stat.c_str(), "r");
    if (f == nullptr) continue;
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = 0;
    // pid (comm) state ... field 14 utime, 15 stime; comm may hold spaces: parse after ')'.
    const char* open = std::strchr(buf, '(');
    const char* close = std::strrchr(buf, ')');
    if (open == nullptr || close == nullptr) continue;
    if (std::string(open + 1, close).find("worker") == std::string::npos) continue;
    unsigned long long ut = 0, st = 0;
    if (std::sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                    &st) == 2) {
      total += static_cast<double>(ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
  }
  return total;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

// dpdk-testpmd io forwarding on a net_ring vdev (its rx and tx are one ring: a loop fed by
// --tx-first) for `seconds`; the highest Rx-pps of its periodic statistics, in Mpps.
TestpmdResult run_testpmd(const std::string& bin, const std::string& lcores, size_t frame_len,
                          double seconds) {
  TestpmdResult res;
  const std::string out = "/tmp/ina-dpdk-bench-testpmd-" + std::to_string(getpid()) + ".log";
  const std::string prefix = "ina_bench_tpmd_" + std::to_string(getpid());
  const std::string mbuf = std::to_string(std::max<size_t>(2176, frame_len + 256));
  std::vector<std::string> args = {bin, "--no-huge", "-m", "1024", "--no-shconf", "--no-pci",
                                   "--no-telemetry", "--log-level=3", "--file-prefix", prefix,
                                   "--lcores", lcores, "--vdev", "net_ring0", "--",
                                   "--mbuf-size=" + mbuf, "--total-num-mbufs=16384", "--forward-mode=io", "--tx-first",
                                   "--txpkts=" + std::to_string(frame_len), "--stats-period=1",
                                   "--nb-cores=1"};
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
      while (std::fgets(line, sizeof line, f) != nullptr) n += std::strstr(line, "Rx-pps:") != nullptr;
      std::fclose(f);
    }
    return n;
  };
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (count_stats() == 0 && std::chrono::steady_clock::now() < give_up &&
         waitpid(pid, nullptr, WNOHANG) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(1100 + std::max(1.0, seconds) * 1000)));
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
  if (cpu > 0) res.mpps_per_cpu = forwarded / cpu / 1e6;
  if (best < 0) {
    std::fprintf(stderr, "ina-dpdk-bench: no Rx-pps from testpmd (its output: %s)\n", out.c_str());
  } else {
    std::remove(out.c_str());
  }
  return res;
}

bool run_size(uint16_t elems, uint32_t world, uint32_t slots, unsigned lcores, double seconds,
              bool indirect, rte_mempool* gen_pool, SizeResult* res) {
  static int serial = 0;
  const std::string base = "b" + std::to_string(serial++);
  rte_ring* rx = rte_ring_create((base + "rx").c_str(), 4096, rte_socket_id(),
                                 RING_F_SP_ENQ | RING_F_SC_DEQ);
  std::vector<rte_ring*> tx;
  for (unsigned q = 0; q < lcores; ++q) {
    tx.push_back(rte_ring_create((base + "tx" + std::to_string(q)).c_str(), 8192, rte_socket_id(),
                                 RING_F_SP_ENQ | RING_F_SC_DEQ));
  }
  const int port = rte_eth_from_rings((base + "p").c_str(), &rx, 1, tx.data(), lcores,
                                      rte_socket_id());
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
  o.indirect_multicast = indirect;
  ina::agg::JobConfig job;
  job.job = 1;
  job.key = 42;
  job.slots.world_size = world;
  job.slots.num_slots = slots;
  job.slots.max_elems = elems;
  auto created = DpdkAggregator::create(o, {job});
  if (!created.ok()) {
    std::fprintf(stderr, "ina-dpdk-bench: %s\n", created.status().to_string().c_str());
    return false;
  }
  std::unique_ptr<DpdkAggregator> agg = std::move(*created);
  const frame::LocalConfig local = agg->local();
  const frame::Endpoint agg_ep{local.mac, local.ip, local.udp_port};

  // Templates: (rank, slot, shadow) -> frame; the block's seq is patched per send.
  const size_t dlen = wire::packet_size(elems);
  const size_t flen = frame::kUdpHeadroom + dlen;
  res->frame_len = flen;
  std::vector<uint8_t> tmpl(size_t{world} * slots * 2 * flen);
  auto tmpl_at = [&](uint32_t r, uint32_t s, uint32_t sh) {
    return tmpl.data() + ((size_t{r} * slots + s) * 2 + sh) * flen;
  };
  std::vector<int32_t> pl(elems);
  for (uint32_t r = 0; r < world; ++r) {
    const frame::Endpoint ep{{0x02, 0xCC, 0, 0, 0, static_cast<uint8_t>(r)}, 0x0A0C0100 + r,
                             static_cast<uint16_t>(41000 + r)};
    for (uint32_t s = 0; s < slots; ++s) {
      for (uint32_t sh = 0; sh < 2; ++sh) {
        uint8_t* f = tmpl_at(r, s, sh);
        wire::Header h;
        h.job = job.job;
        h.key = job.key;
        h.rank = static_cast<uint16_t>(r);
        h.slot = static_cast<uint16_t>(s);
        h.shadow = sh != 0;
        h.count = elems;
        for (uint16_t i = 0; i < elems; ++i) pl[i] = static_cast<int32_t>(r * 1000 + i);
        wire::encode_header(h, f + frame::kUdpHeadroom);
        wire::store_payload(f + frame::kUdpHeadroom + wire::kHeaderSize, pl.data(), elems);
        frame::write_udp_headers(f, ep, agg_ep, dlen, 0, 1);
        f[40] = f[41] = 0;  // UDP checksum: none (the seq changes per send)
      }
    }
  }
  // The join barrier first.
  for (uint32_t r = 0; r < world; ++r) {
    rte_mbuf* m = rte_pktmbuf_alloc(gen_pool);
    uint8_t* f = reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m, static_cast<uint16_t>(flen)));
    rte_memcpy(f, tmpl_at(r, 0, 0), flen);
    wire::Header h;
    h.flags = wire::kFlagHello;
    h.job = job.job;
    h.key = job.key;
    h.seq = 77 + r;
    h.rank = static_cast<uint16_t>(r);
    h.count = 1;
    const size_t hl = wire::packet_size(1);
    wire::encode_header(h, f + frame::kUdpHeadroom);
    wire::put_u32(f + frame::kUdpHeadroom + wire::kHeaderSize, world);
    const frame::Endpoint ep{{0x02, 0xCC, 0, 0, 0, static_cast<uint8_t>(r)}, 0x0A0C0100 + r,
                             static_cast<uint16_t>(41000 + r)};
    frame::write_udp_headers(f, ep, agg_ep, hl, frame::sum16(f + frame::kUdpHeadroom, hl), 1);
    rte_pktmbuf_trim(m, static_cast<uint16_t>(flen - frame::kUdpHeadroom - hl));
    while (rte_ring_enqueue(rx, m) != 0) {
    }
  }
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
  // Wait for the WELCOMEs.
  for (uint64_t got = 0; got < world;) got += drain();

  uint64_t block = 0;
  uint32_t rank = 0;
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
          const uint32_t s = static_cast<uint32_t>(block % slots);
          const uint32_t sh = static_cast<uint32_t>((block / slots) & 1);
          uint8_t* f = rte_pktmbuf_mtod(m, uint8_t*);
          rte_memcpy(f, tmpl_at(rank, s, sh), flen);
          wire::put_u32(f + frame::kUdpHeadroom + wire::kOffSeq, static_cast<uint32_t>(block + 1));
          m->data_len = static_cast<uint16_t>(flen);
          m->pkt_len = static_cast<uint32_t>(flen);
          if (++rank == world) {
            rank = 0;
            ++block;
          }
        }
        np = kBurst;
      }
      const unsigned k = rte_ring_enqueue_burst(rx, reinterpret_cast<void* const*>(
                                                        pending + (kBurst - np)), np, nullptr);
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
  if (e.malformed != 0 || e.stale != 0 || e.completed + 1 < sent / world) {
    std::fprintf(stderr,
                 "ina-dpdk-bench: unexpected counters (sent %" PRIu64 " completed %" PRIu64
                 " malformed %" PRIu64 " stale %" PRIu64 ")\n",
                 sent, e.completed, e.malformed, e.stale);
  }
  agg.reset();  // closes the port
  drain();
  rte_ring_free(rx);
  for (rte_ring* t : tx) rte_ring_free(t);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ina-dpdk-bench: DPDK aggregator loop vs dpdk-testpmd io forwarding (net_ring)"};
  std::vector<uint16_t> sizes = {64, 256, 1024};
  double seconds = 1.0;
  uint32_t world = 4;
  uint32_t slots = 128;
  unsigned lcores = 1;
  std::string testpmd = "dpdk-testpmd";
  bool indirect = false;
  std::vector<std::string> eal_extra;
  app.add_option("--elems", sizes, "elements per packet")->delimiter(',')->capture_default_str();
  app.add_option("--seconds", seconds, "per size (keep it short: shared machines)")
      ->check(CLI::Range(0.1, 30.0))
      ->capture_default_str();
  app.add_option("--world", world, "simulated ranks")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--slots", slots, "slots")->check(CLI::Range(1, 32768))->capture_default_str();
  app.add_option("--lcores", lcores, "aggregator worker lcores")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_flag("--indirect", indirect,
               "results to every rank as header + indirect datagram chains instead of copies");
  app.add_option("--testpmd", testpmd, "dpdk-testpmd binary, or 'none'")->capture_default_str();
  app.add_option("eal", eal_extra, "extra EAL arguments, after --");
  CLI11_PARSE(app, argc, argv);

  const std::vector<int> cpus = allowed_cpus();
  std::string lcore_map;
  for (unsigned l = 0; l <= lcores; ++l) {
    if (l) lcore_map += ",";
    lcore_map += std::to_string(l) + "@" + std::to_string(cpus[l % cpus.size()]);
  }
  std::vector<std::string> eal = {"ina-dpdk-bench", "--no-huge", "-m", "1024", "--no-shconf",
                                  "--no-pci", "--no-telemetry", "--log-level=3", "--file-prefix",
                                  "ina_dpdk_bench_" + std::to_string(getpid()), "--lcores",
                                  lcore_map};
  eal.insert(eal.end(), eal_extra.begin(), eal_extra.end());
  const ina::Status st = ina::agg::dpdk_eal_init(eal);
  if (!st.ok()) {
    std::fprintf(stderr, "ina-dpdk-bench: %s\n", st.to_string().c_str());
    return 77;
  }
  rte_mempool* gen_pool = rte_pktmbuf_pool_create("gen", 16383, 256, 0, 4096 + 512,
                                                  static_cast<int>(rte_socket_id()));
  if (gen_pool == nullptr) {
    std::fprintf(stderr, "ina-dpdk-bench: generator pool: %s\n", rte_strerror(rte_errno));
    return 1;
  }
  std::printf("# ina-dpdk-bench: world %u, slots %u, %u aggregator lcore(s), %.1f s per size, "
              "results %s, net_ring in process; testpmd io fwd on net_ring0 (lcores %s)\n",
              world, slots, lcores, seconds, indirect ? "indirect (chains)" : "copied",
              lcore_map.c_str());
  std::printf("# Mpps: frames per wall second; /cpu: per CPU second of the polling thread(s) (the\n"
              "# fair figure where CPU is shared or capped); ratio = agg/cpu over testpmd/cpu.\n");
  std::printf("# %5s %5s %9s %9s %8s %8s %6s %10s %10s %7s %6s  %s\n", "elems", "frame",
              "agg_Mpps", "agg/cpu", "Gelem/s", "Gel/cpu", "cpu%", "tpmd_Mpps", "tpmd/cpu",
              "ratio", "drops", "per-lcore Mpps/cpu");
  int rc = 0;
  for (uint16_t e : sizes) {
    SizeResult r;
    if (!run_size(e, world, slots, lcores, seconds, indirect, gen_pool, &r)) {
      rc = 1;
      break;
    }
    TestpmdResult tp;
    if (testpmd != "none") {
      std::string tp_map = "0@" + std::to_string(cpus[0]) + ",1@" +
                           std::to_string(cpus[1 % cpus.size()]);
      tp = run_testpmd(testpmd, tp_map, r.frame_len, seconds);
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
    std::printf("  %5u %5zu %9.2f %9.2f %8.3f %8.3f %5.0f%% %10.2f %10.2f %7.4f %6" PRIu64 "  %s\n",
                unsigned{e}, r.frame_len, mpps, per_cpu, mpps * e / 1e3, per_cpu * e / 1e3,
                r.wall_s > 0 ? 100 * r.cpu_s / (r.wall_s * lcores) : 0, tp.mpps, tp.mpps_per_cpu,
                tp.mpps_per_cpu > 0 ? per_cpu / tp.mpps_per_cpu : 0.0, r.tx_dropped, per.c_str());
    std::fflush(stdout);
  }
  ina::agg::dpdk_eal_cleanup();
  return rc;
}
