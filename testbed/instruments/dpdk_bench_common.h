// Pieces shared by ina-dpdk-bench's in-process ring mode (dpdk_bench.cc) and its two-process
// net_memif mode (dpdk_bench_memif.cc): the generator's frame templates, the CPU time of a
// process's lcore threads from /proc, the EAL memory arguments (hugepages when free ones exist,
// else --no-huge), and child processes with a stdin pipe. The CPUs this process may run on and
// an lcore map over them: allowed_cpus / spread_lcores in aggregator/dpdk_backend.h.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ina/protocol/frame.h"
#include "ina/protocol/wire.h"

extern char** environ;

namespace ina::bench {

inline constexpr uint32_t kAggIp = 0x0A0C0001;
inline constexpr uint16_t kAggPort = 47474;
inline constexpr frame::Mac kAggMac = {0x02, 0x1A, 0, 0, 0, 0x01};
inline constexpr uint64_t kJob = 1;
inline constexpr uint64_t kKey = 42;

inline frame::Endpoint rank_endpoint(uint32_t r) {
  return frame::Endpoint{{0x02, 0xCC, 0, 0, static_cast<uint8_t>(r >> 8), static_cast<uint8_t>(r)},
                         0x0A0C0100 + r,
                         static_cast<uint16_t>(41000 + r)};
}

// The generator's frames: one DATA frame per (rank, slot, copy), its block sequence patched in and
// its tag resealed per send (so its UDP checksum is 0, "none"), and one HELLO per rank (nonce
// kHelloNonce0 + rank). The job has no key configured: HELLOs are sealed under the zero key
// (kBenchKey), DATA under the key of the incarnation the WELCOMEs name (`traffic`, WIRE.md
// "Incarnations"), which the aggregator verifies.
inline constexpr Key128 kBenchKey{};
inline constexpr uint32_t kHelloNonce0 = 77;

// The rank whose HELLO the WELCOME frame `f` answers (seq = that HELLO's nonce), with the epoch it
// names in *epoch; -1 for any other frame (the barrier's notice to every rank, seq 0, included).
inline int welcome_rank(const uint8_t* f, size_t len, uint32_t world, uint64_t* epoch) {
  if (len < frame::kUdpHeadroom) return -1;
  wire::PacketView v;
  if (wire::decode(std::span<const uint8_t>(f + frame::kUdpHeadroom, len - frame::kUdpHeadroom),
                   &v) != wire::DecodeError::kOk) {
    return -1;
  }
  const uint8_t welcome = wire::kFlagHello | wire::kFlagResult;
  if ((v.hdr.flags & welcome) != welcome || v.hdr.count < wire::kWelcomeWords ||
      v.hdr.seq - kHelloNonce0 >= world) {
    return -1;
  }
  *epoch = wire::welcome_epoch(v);
  return static_cast<int>(v.hdr.seq - kHelloNonce0);
}

struct FrameTemplates {
  uint16_t elems = 0;
  uint32_t world = 0, slots = 0;
  size_t dlen = 0, flen = 0;  // datagram, frame length
  std::vector<uint8_t> data;
  std::vector<std::vector<uint8_t>> hellos;
  Key128 traffic = kBenchKey;  // set from the WELCOMEs' epoch (welcome_rank) before DATA goes

  // `dtype`: int32 (the integer SUM: tag, add and result, no codec) or float32 (the float SUM:
  // the aggregator's codec quantizes, adds and rounds each block at completion).
  FrameTemplates(uint16_t e, uint32_t w, uint32_t s, const frame::Endpoint& agg,
                 DType dtype = DType::kInt32)
      : elems(e), world(w), slots(s) {
    dlen = wire::packet_size(elems, 4);
    flen = frame::kUdpHeadroom + dlen;
    data.resize(size_t{world} * slots * 2 * flen);
    std::vector<int32_t> pl(elems);
    for (uint32_t r = 0; r < world; ++r) {
      for (uint32_t sl = 0; sl < slots; ++sl) {
        for (uint32_t sh = 0; sh < 2; ++sh) {
          uint8_t* f = at(r, sl, sh);
          wire::Header h;
          h.job = kJob;
          h.rank = static_cast<uint16_t>(r);
          h.slot = static_cast<uint16_t>(sl);
          h.shadow = sh != 0;
          h.count = elems;
          h.dtype = dtype;
          for (uint16_t i = 0; i < elems; ++i) {
            pl[i] = static_cast<int32_t>(r * 1000 + i);
            if (dtype == DType::kFloat32) {
              const float v = static_cast<float>(pl[i]) * 0.25f - 100.0f;
              std::memcpy(&pl[i], &v, 4);
            }
          }
          wire::encode_header(h, f + frame::kUdpHeadroom);
          wire::store_words(f + frame::kUdpHeadroom + wire::kHeaderSize, pl.data(), elems);
          frame::write_udp_headers(f, rank_endpoint(r), agg, dlen, 0, 1);
          f[40] = f[41] = 0;  // UDP checksum: none (the seq changes per send)
        }
      }
      wire::Header h;
      h.flags = wire::kFlagHello;
      h.job = kJob;
      h.seq = kHelloNonce0 + r;
      h.rank = static_cast<uint16_t>(r);
      h.count = 1;
      const size_t hl = wire::packet_size(1, 4);
      std::vector<uint8_t> f(frame::kUdpHeadroom + hl);
      wire::encode_header(h, f.data() + frame::kUdpHeadroom);
      wire::put_le32(f.data() + frame::kUdpHeadroom + wire::kHeaderSize,
                     world);  // control words: LE
      wire::seal(std::span<uint8_t>(f.data() + frame::kUdpHeadroom, hl), kBenchKey);
      frame::write_udp_headers(f.data(), rank_endpoint(r), agg, hl,
                               frame::sum16(f.data() + frame::kUdpHeadroom, hl), 1);
      hellos.push_back(std::move(f));
    }
  }
  uint8_t* at(uint32_t r, uint32_t s, uint32_t sh) {
    return data.data() + ((size_t{r} * slots + s) * 2 + sh) * flen;
  }
};

// Walks blocks through the slots: every block one frame per rank, block b in slot b % slots, copy
// (b / slots) & 1, sequence b + 1.
struct BlockCursor {
  uint64_t block = 0;
  uint32_t rank = 0;
  // Writes the next frame into `dst` (flen bytes).
  void next(FrameTemplates& t, uint8_t* dst) {
    const uint32_t s = static_cast<uint32_t>(block % t.slots);
    const uint32_t sh = static_cast<uint32_t>((block / t.slots) & 1);
    std::memcpy(dst, t.at(rank, s, sh), t.flen);
    wire::put_u32(dst + frame::kUdpHeadroom + wire::kOffSeq, static_cast<uint32_t>(block + 1));
    wire::seal(std::span<uint8_t>(dst + frame::kUdpHeadroom, t.dlen), t.traffic);
    if (++rank == t.world) {
      rank = 0;
      ++block;
    }
  }
};

// CPU seconds (user + system) of the threads of `pid` whose name contains "worker" (DPDK's lcore
// threads, rte-worker-N, in ina-dpdk-bench and dpdk-testpmd alike); -1 when unreadable.
inline double worker_cpu_seconds(pid_t pid) {
  double total = 0;
  bool any = false;
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
    if (std::sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) ==
        2) {
      total += static_cast<double>(ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
      any = true;
    }
  }
  return any ? total : -1;
}

// Free 2 MiB hugepages on a mounted hugetlbfs (scripts/dpdk-hugepages.sh reserves them).
inline long free_hugepages() {
  std::ifstream mounts("/proc/mounts");
  std::string line;
  bool mounted = false;
  while (std::getline(mounts, line)) mounted |= line.find(" hugetlbfs ") != std::string::npos;
  if (!mounted) return 0;
  std::ifstream mi("/proc/meminfo");
  while (std::getline(mi, line)) {
    if (line.rfind("HugePages_Free:", 0) == 0) return std::strtol(line.c_str() + 15, nullptr, 10);
  }
  return 0;
}

// EAL memory arguments for `mode` ("huge", "nohuge" or "auto": hugepages when at least
// `min_pages` are free). `used` says which was chosen.
inline std::vector<std::string> eal_memory(const std::string& mode, long min_pages,
                                           std::string* used) {
  const bool huge = mode == "huge" || (mode == "auto" && free_hugepages() >= min_pages);
  *used = huge ? "hugepages (2 MiB, --in-memory)" : "--no-huge (4 KiB pages)";
  if (huge) return {"--in-memory"};
  return {"--no-huge", "-m", "1024", "--no-shconf"};
}

// A child process whose stdin is a pipe we hold (closing it tells testpmd and our own roles to
// stop) and whose stdout and stderr go to `log` or, when `out_pipe`, to a pipe read by lines.
struct Child {
  pid_t pid = -1;
  int in_fd = -1;
  int out_fd = -1;
  std::string buf;

  bool spawn(const std::vector<std::string>& args, const std::string& log, bool out_pipe) {
    std::vector<char*> argv;
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    int in_p[2], out_p[2] = {-1, -1};
    // O_CLOEXEC: a later child must not inherit our ends (the DUT would never see EOF).
    if (pipe2(in_p, O_CLOEXEC) != 0) return false;
    if (out_pipe && pipe2(out_p, O_CLOEXEC) != 0) return false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in_p[0], 0);
    posix_spawn_file_actions_addclose(&fa, in_p[1]);
    if (out_pipe) {
      posix_spawn_file_actions_adddup2(&fa, out_p[1], 1);
      posix_spawn_file_actions_addclose(&fa, out_p[0]);
    } else {
      posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    if (!log.empty() && out_pipe) {
      posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    } else {
      posix_spawn_file_actions_adddup2(&fa, 1, 2);
    }
    const int rc = posix_spawnp(&pid, copy[0].c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in_p[0]);
    if (out_pipe) close(out_p[1]);
    if (rc != 0) {
      std::fprintf(stderr, "ina-dpdk-bench: cannot run %s: %s\n", copy[0].c_str(),
                   std::strerror(rc));
      close(in_p[1]);
      if (out_pipe) close(out_p[0]);
      pid = -1;
      return false;
    }
    in_fd = in_p[1];
    out_fd = out_p[0];
    return true;
  }

  // The next line of its stdout pipe (without the newline), or false at EOF or after `timeout`.
  bool read_line(std::string* line, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const size_t nl = buf.find('\n');
      if (nl != std::string::npos) {
        *line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return true;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0 || out_fd < 0) return false;
      pollfd p{out_fd, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char tmp[4096];
      const ssize_t n = read(out_fd, tmp, sizeof tmp);
      if (n <= 0) return false;
      buf.append(tmp, static_cast<size_t>(n));
    }
  }

  // Closes its stdin, then SIGINT after `grace`, SIGKILL after 5 s more; returns its exit status.
  int stop(std::chrono::milliseconds grace) {
    if (pid <= 0) return -1;
    if (in_fd >= 0) close(in_fd);
    in_fd = -1;
    int status = 0;
    const auto t0 = std::chrono::steady_clock::now();
    bool sent_int = false;
    for (;;) {
      const pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid || w < 0) break;
      const auto el = std::chrono::steady_clock::now() - t0;
      if (!sent_int && el > grace) {
        kill(pid, SIGINT);
        sent_int = true;
      }
      if (el > grace + std::chrono::seconds(5)) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (out_fd >= 0) close(out_fd);
    out_fd = -1;
    pid = -1;
    return status;
  }
};

// True once `path` holds `needle` (polled every 100 ms) before `timeout`, false otherwise.
inline bool wait_for_text(const std::string& path, const char* needle,
                          std::chrono::milliseconds timeout, pid_t alive) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
      if (line.find(needle) != std::string::npos) return true;
    }
    if (alive > 0) {
      siginfo_t info{};
      // WNOWAIT: look without reaping (Child::stop reaps it).
      if (waitid(P_PID, static_cast<id_t>(alive), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == alive) {
        return false;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

}  // namespace ina::bench
