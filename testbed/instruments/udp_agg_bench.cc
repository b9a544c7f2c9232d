// ina-udp-agg-bench: the kernel UDP aggregator's rate with 1, 2, ... serving threads, fed over
// loopback by a generator that costs it as little as possible, configurations interleaved in one
// run (median of the repetitions).
//
//   ina-udp-agg-bench [--threads 1,2] [--world 4] [--elems 256] [--slots 256] [--blocks 150000]
//                     [--reps 3] [--dtype int32,float32]
//
// The generator plays every rank from one thread: the ranks' DATA packets are encoded and sealed
// before the clock starts (engine_stream.h's stream), one contiguous buffer per rank, and sent as
// UDP GSO trains (up to 61 datagrams per sendmsg), so that sending costs a syscall per train and
// no per-packet work. It keeps at most --slots blocks in flight (a block may use its slot copy
// again once the block `slots` before it completed, as a worker does) and counts rank 0's results
// (GRO buffers). The other ranks' results are not read: their small receive buffers drop them.
// Each measurement starts a fresh aggregator (the same stream again from a fresh join). Printed:
// elements aggregated per second, the aggregator's CPU (process CPU less the generator thread's),
// and the share of datagrams the threads handed to each other.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "aggregator/udp_backend.h"
#include "aggregator/udp_net.h"  // UDP_SEGMENT, UDP_GRO where libc lacks them
#include "ina/protocol/types.h"
#include "ina/protocol/wire.h"
#include "ina_config.h"
#include "testbed/instruments/engine_stream.h"

namespace {

using namespace ina;
constexpr uint64_t kKey = 0x5EED5EED12345678ull;

double cpu_seconds(int who) {
  rusage u{};
  getrusage(who, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

struct Stream {
  uint32_t world = 0, blocks = 0, slots = 0, elems = 0;
  size_t pkt = 0;                             // bytes per datagram (all equal)
  std::vector<std::vector<uint8_t>> by_rank;  // rank r's packets, block order, back to back
  std::vector<std::vector<uint8_t>> hellos;
};

Stream make_stream(uint32_t world, uint32_t blocks, uint32_t slots, uint32_t elems, DType dt) {
  Stream s;
  s.world = world;
  s.blocks = blocks;
  s.slots = slots;
  s.elems = elems;
  const auto pkts = bench::data_stream(blocks, world, slots, elems, dt, kKey);
  s.pkt = pkts[0].size();
  s.by_rank.assign(world, {});
  for (uint32_t r = 0; r < world; ++r) s.by_rank[r].reserve(size_t{blocks} * s.pkt);
  for (size_t i = 0; i < pkts.size(); ++i) {
    auto& dst = s.by_rank[i % world];
    dst.insert(dst.end(), pkts[i].begin(), pkts[i].end());
  }
  for (uint32_t r = 0; r < world; ++r) {
    s.hellos.push_back(bench::hello_packet(static_cast<uint16_t>(r), world, kKey, 1000 + r));
  }
  return s;
}

struct Run {
  bool ok = false;
  std::string error;
  double seconds = 0;
  double agg_cpu = 0;  // aggregator CPU seconds
  double gen_cpu = 0;  // generator CPU seconds
  uint64_t handed_off = 0;
  uint64_t datagrams = 0;
  unsigned threads = 0;
};

int loopback_socket(uint16_t agg_port, int rcvbuf, bool gro) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
  const int one = 1;
  if (gro) (void)setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one);
  sa.sin_port = htons(agg_port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Blocks [b0, b0 + n) of rank r as one GSO train.
bool send_train(int fd, const Stream& s, uint32_t r, uint32_t b0, uint32_t n) {
  iovec iov{const_cast<uint8_t*>(s.by_rank[r].data()) + size_t{b0} * s.pkt, size_t{n} * s.pkt};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(uint16_t))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (n > 1) {
    m.msg_control = ctrl;
    m.msg_controllen = sizeof ctrl;
    cmsghdr* cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_UDP;
    cm->cmsg_type = UDP_SEGMENT;
    cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    const auto seg = static_cast<uint16_t>(s.pkt);
    std::memcpy(CMSG_DATA(cm), &seg, sizeof seg);
  }
  ssize_t rc;
  do {
    rc = ::sendmsg(fd, &m, 0);
  } while (rc < 0 && errno == EINTR);
  return rc == static_cast<ssize_t>(iov.iov_len);
}

// Datagrams waiting on fd (GRO buffers counted by their segments); -1 on error.
long drain(int fd, std::vector<uint8_t>& buf) {
  long got = 0;
  for (;;) {
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
    iovec iov{buf.data(), buf.size()};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctrl;
    m.msg_controllen = sizeof ctrl;
    const ssize_t n = ::recvmsg(fd, &m, MSG_DONTWAIT);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? got : -1;
    size_t seg = static_cast<size_t>(n);
    for (cmsghdr* cm = CMSG_FIRSTHDR(&m); cm != nullptr; cm = CMSG_NXTHDR(&m, cm)) {
      if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
        int g = 0;
        std::memcpy(&g, CMSG_DATA(cm), sizeof g);
        if (g > 0) seg = static_cast<size_t>(g);
      }
    }
    got += n == 0 ? 1 : static_cast<long>((static_cast<size_t>(n) + seg - 1) / seg);
  }
}

// Rank 0's own WELCOME (seq = its HELLO's nonce 1000) after the barrier's notice, which the
// generator answers with rank 0's HELLO again; every packet of the stream is then resealed with
// the key of the incarnation it names (WIRE.md "Incarnations": each aggregator draws its own
// salt, so each run has its own). False when none came within 3 s.
bool adopt_epoch(int fd0, Stream& s, std::vector<uint8_t>& buf) {
  if (::send(fd0, s.hellos[0].data(), s.hellos[0].size(), 0) !=
      static_cast<ssize_t>(s.hellos[0].size())) {
    return false;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd0, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    const ssize_t n = ::recv(fd0, buf.data(), buf.size(), 0);
    wire::PacketView v;
    if (n <= 0 || wire::decode(std::span<const uint8_t>(buf.data(), static_cast<size_t>(n)), &v) !=
                      wire::DecodeError::kOk) {
      continue;
    }
    const uint8_t welcome = wire::kFlagHello | wire::kFlagResult;
    if ((v.hdr.flags & welcome) != welcome || v.hdr.seq != 1000 ||
        v.hdr.count < wire::kWelcomeWords) {
      continue;
    }
    const Key128 traffic = wire::incarnation_key(Key128{kKey}, wire::welcome_epoch(v));
    for (auto& rank : s.by_rank) {
      for (size_t off = 0; off + s.pkt <= rank.size(); off += s.pkt) {
        wire::seal(std::span<uint8_t>(rank.data() + off, s.pkt), traffic);
      }
    }
    return true;
  }
  return false;
}

Run measure(Stream& s, unsigned threads, bool cut_runs) {
  Run res;
  agg::UdpOptions o;
  o.bind_host = "127.0.0.1";
  o.port = 0;
  o.threads = threads;
  agg::JobConfig job = bench::job_config(s.world, s.slots, s.elems, kKey);
  auto created = agg::UdpAggregator::create(o, {job});
  if (!created.ok()) {
    res.error = created.status().to_string();
    return res;
  }
  agg::UdpAggregator& a = **created;
  res.threads = a.threads();
  std::atomic<bool> stop{false};
  Status run_st;
  std::thread server([&] { run_st = a.run(stop); });

  std::vector<int> fds;
  for (uint32_t r = 0; r < s.world; ++r) {
    fds.push_back(loopback_socket(a.port(), r == 0 ? (8 << 20) : 4096, r == 0));
  }
  std::vector<uint8_t> buf(65536);
  bool ok = std::find(fds.begin(), fds.end(), -1) == fds.end();
  if (!ok) res.error = "cannot open the generator's sockets";
  // Join: every rank's HELLO; rank 0's WELCOME says the barrier passed.
  for (uint32_t r = 0; ok && r < s.world; ++r) {
    ok = ::send(fds[r], s.hellos[r].data(), s.hellos[r].size(), 0) ==
         static_cast<ssize_t>(s.hellos[r].size());
  }
  if (ok) {
    pollfd p{fds[0], POLLIN, 0};
    ok = ::poll(&p, 1, 3000) == 1 && drain(fds[0], buf) >= 1;
    if (!ok) res.error = "no WELCOME within 3 s";
  }
  if (ok) {
    ok = adopt_epoch(fds[0], s, buf);
    if (!ok) res.error = "no WELCOME naming rank 0's HELLO within 3 s";
  }

  const uint32_t seg_max = static_cast<uint32_t>(std::min<size_t>(61, 65507 / s.pkt));
  const double cpu0 = cpu_seconds(RUSAGE_SELF);
  const double gen0 = cpu_seconds(RUSAGE_THREAD);
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t done = 0;
  uint32_t sent = 0;
  while (ok && done < s.blocks) {
    // Blocks may go while fewer than `slots` are in flight; trains of at least a quarter of the
    // window (or what is left), so that a train is long even in steady state.
    const uint64_t room = done + s.slots - sent;
    const uint32_t left = s.blocks - sent;
    const uint32_t want = std::min<uint32_t>({seg_max, left, std::max<uint32_t>(1, s.slots / 4)});
    if (left > 0 && room >= want) {
      uint32_t n = static_cast<uint32_t>(std::min<uint64_t>({room, left, seg_max}));
      // As libina's transport does: a train stays within one run of wire::kSlotRun slots, so
      // that the aggregator's steering places it whole.
      if (cut_runs) n = std::min<uint32_t>(n, wire::kSlotRun - (sent % s.slots) % wire::kSlotRun);
      for (uint32_t r = 0; r < s.world && ok; ++r) ok = send_train(fds[r], s, r, sent, n);
      if (!ok) res.error = std::string("send: ") + std::strerror(errno);
      sent += n;
      continue;
    }
    const long got = drain(fds[0], buf);
    if (got < 0) {
      ok = false;
      res.error = std::string("recv: ") + std::strerror(errno);
    } else if (got > 0) {
      done += static_cast<uint64_t>(got);
    } else {
      pollfd p{fds[0], POLLIN, 0};
      if (::poll(&p, 1, 2000) != 1) {
        ok = false;
        res.error = "stalled: " + std::to_string(done) + " of " + std::to_string(s.blocks) +
                    " blocks completed, no result for 2 s";
      }
    }
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.gen_cpu = cpu_seconds(RUSAGE_THREAD) - gen0;
  res.agg_cpu = cpu_seconds(RUSAGE_SELF) - cpu0 - res.gen_cpu;
  stop.store(true);
  server.join();
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
  const agg::EngineCounters c = a.engine_totals();
  if (ok && c.completed != s.blocks) {
    ok = false;
    res.error = "the aggregator completed " + std::to_string(c.completed) + " of " +
                std::to_string(s.blocks) + " blocks";
  }
  if (ok && !run_st.ok()) {
    ok = false;
    res.error = run_st.to_string();
  }
  res.handed_off = a.handed_off();
  res.datagrams = c.packets_in;
  res.ok = ok;
  return res;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ina-udp-agg-bench: the kernel UDP aggregator's rate by serving threads"};
  app.set_version_flag("--version", "ina-udp-agg-bench " INA_VERSION);
  std::vector<unsigned> threads{1, 2};
  uint32_t world = 4, elems = 256, slots = 256, blocks = 150000, reps = 3;
  std::vector<std::string> dtypes{"int32", "float32"};
  app.add_option("--threads", threads, "serving thread counts to compare")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--world", world)->check(CLI::Range(2, 64))->capture_default_str();
  app.add_option("--elems", elems, "elements per block (of 4 bytes: 1 KiB at 256)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--slots", slots, "slots of the job: blocks in flight")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--blocks", blocks, "blocks per measurement")
      ->check(CLI::Range(100, 10000000))
      ->capture_default_str();
  bool no_cut = false;
  app.add_flag("--no-cut", no_cut,
               "trains of up to 61 blocks, across runs of slots (not as libina sends)");
  app.add_option("--reps", reps)->check(CLI::Range(1, 50))->capture_default_str();
  app.add_option("--dtype", dtypes, "int32, float32, float16, bfloat16 (SUM)")
      ->delimiter(',')
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  for (unsigned t : threads) {
    if (t < 1 || t > agg::kMaxUdpThreads) {
      std::fprintf(stderr, "--threads: each must be in 1..%u, got %u\n", agg::kMaxUdpThreads, t);
      return 2;
    }
  }
  const std::map<std::string, DType> known{{"int32", DType::kInt32},
                                           {"float32", DType::kFloat32},
                                           {"float16", DType::kFloat16},
                                           {"bfloat16", DType::kBFloat16}};
  for (const std::string& d : dtypes) {
    if (!known.contains(d)) {
      std::fprintf(stderr, "--dtype: '%s' is not one of int32, float32, float16, bfloat16\n",
                   d.c_str());
      return 2;
    }
  }
  std::printf(
      "# ina-udp-agg-bench: world %u, %u elements per block, %u slots, %u blocks per "
      "measurement, %u reps (median), %u CPUs\n",
      world, elems, slots, blocks, reps, std::thread::hardware_concurrency());
  std::printf("# %-9s %7s %12s %10s %10s %9s %9s %10s\n", "dtype", "threads", "Melem/s", "blocks/s",
              "vs 1st", "agg cores", "gen cores", "handed off");
  bool all_ok = true;
  for (const std::string& d : dtypes) {
    Stream s = make_stream(world, blocks, slots, elems, known.at(d));
    std::vector<std::vector<Run>> runs(threads.size());
    for (uint32_t rep = 0; rep < reps; ++rep) {
      for (size_t i = 0; i < threads.size(); ++i) {
        Run r = measure(s, threads[i], !no_cut);
        if (!r.ok) {
          std::fprintf(stderr, "%s, %u threads: %s\n", d.c_str(), threads[i], r.error.c_str());
          all_ok = false;
          continue;
        }
        runs[i].push_back(r);
      }
    }
    double first = 0;
    for (size_t i = 0; i < threads.size(); ++i) {
      if (runs[i].empty()) continue;
      std::vector<double> rate, agg, gen, hand;
      for (const Run& r : runs[i]) {
        rate.push_back(static_cast<double>(blocks) / r.seconds);
        agg.push_back(r.agg_cpu / r.seconds);
        gen.push_back(r.gen_cpu / r.seconds);
        hand.push_back(r.datagrams > 0 ? 100.0 * static_cast<double>(r.handed_off) /
                                             static_cast<double>(r.datagrams)
                                       : 0);
      }
      const double bps = median(rate);
      if (i == 0) first = bps;
      std::printf("  %-9s %7u %12.1f %10.0f %9.2fx %9.2f %9.2f %9.1f%%\n", d.c_str(),
                  runs[i][0].threads, bps * elems / 1e6, bps, first > 0 ? bps / first : 0,
                  median(agg), median(gen), median(hand));
    }
  }
  return all_ok ? 0 : 1;
}
