// Forked ranks on one machine (ina-bench local mode, ina-gloo-bench): the parent forks one
// process per rank before it starts any thread, every child reports one bench_record per size
// through a shared pipe, and the parent prints a row as soon as every rank has reported that
// size: time = max over ranks, #wrong = sum over ranks.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

#include "bench_common.h"

namespace bench {

// One size of the sweep, reduced over the ranks that reported it.
struct SizeRow {
  int reports = 0;
  double time_us = 0;  // max over ranks
  int64_t wrong = 0;   // sum over ranks (-1: not checked)
  double cpu_s = 0;    // sum over ranks of their CPU seconds in the timed iterations
  bool ok = true;      // every rank's collectives succeeded
  bool printed = false;
};

struct Collected {
  std::vector<SizeRow> rows;
  std::vector<std::array<uint64_t, BENCH_STATS>> stats;  // per rank (BENCH_REC_STATS)
  std::vector<bool> have_stats;
  std::vector<std::string> failures;  // "rank r: message"
  bool protocol_error = false;        // a truncated record
};

// Forks `ranks` children. Child r runs child(r, write_fd) and leaves with _exit(its return
// value), without running destructors or atexit handlers (the parent's objects are not the
// child's to tear down); a child is killed when the parent dies. Call before the process
// starts any thread; stdout/stderr are flushed first so buffered text is not printed twice.
// On failure kills the children forked so far.
inline bool spawn_ranks(int ranks, const std::function<int(int rank, int fd)>& child,
                        std::vector<pid_t>* pids, int* read_fd) {
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("pipe");
    return false;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t p : *pids) kill(p, SIGKILL);
      for (pid_t p : *pids) waitpid(p, nullptr, 0);
      pids->clear();
      close(fds[0]);
      close(fds[1]);
      return false;
    }
    if (pid == 0) {
      // A rank must not outlive the parent (killed by a timeout, say): it would wait for a
      // partner that is gone until its own deadline.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      close(fds[0]);
      int code = child(r, fds[1]);
      std::fflush(stdout);
      std::fflush(stderr);
      close(fds[1]);
      _exit(code);
    }
    pids->push_back(pid);
  }
  close(fds[1]);
  *read_fd = fds[0];
  return true;
}

// Reads records until every child has closed the pipe. print_row(k, row) runs for size k, in
// order, once all ranks reported it (sizes left incomplete are printed at the end, marked by
// row.reports < ranks).
// on_all_ready (optional) runs once every rank has sent BENCH_REC_READY.
inline void collect(int fd, int ranks, int nsizes,
                    const std::function<void(int, const SizeRow&)>& print_row, Collected* out,
                    const std::function<void()>& on_all_ready = nullptr) {
  int ready = 0;
  out->rows.assign(static_cast<size_t>(nsizes), SizeRow{});
  out->stats.assign(static_cast<size_t>(ranks), std::array<uint64_t, BENCH_STATS>{});
  out->have_stats.assign(static_cast<size_t>(ranks), false);
  int next = 0;
  for (;;) {
    bench_record rec;
    int r = bench_read_record(fd, &rec);
    if (r == 0) break;
    if (r < 0) {
      out->protocol_error = true;
      break;
    }
    rec.msg[sizeof rec.msg - 1] = '\0';
    if (rec.rank < 0 || rec.rank >= ranks) continue;
    if (rec.kind == BENCH_REC_STATS) {
      std::memcpy(out->stats[static_cast<size_t>(rec.rank)].data(), rec.stats, sizeof rec.stats);
      out->have_stats[static_cast<size_t>(rec.rank)] = true;
      continue;
    }
    if (rec.kind == BENCH_REC_READY) {
      if (++ready == ranks && on_all_ready) on_all_ready();
      continue;
    }
    if (rec.kind == BENCH_REC_FAIL) {
      out->failures.push_back("rank " + std::to_string(rec.rank) + ": " + rec.msg);
      continue;
    }
    if (rec.kind != BENCH_REC_SIZE || rec.size_index < 0 || rec.size_index >= nsizes) continue;
    SizeRow& row = out->rows[static_cast<size_t>(rec.size_index)];
    row.reports++;
    if (rec.time_us > row.time_us) row.time_us = rec.time_us;
    row.cpu_s += rec.cpu_s;
    if (rec.wrong < 0)
      row.wrong = -1;
    else if (row.wrong >= 0)
      row.wrong += rec.wrong;
    if (!rec.ok) {
      row.ok = false;
      if (rec.msg[0] != '\0')
        out->failures.push_back("rank " + std::to_string(rec.rank) + ": " + rec.msg);
    }
    while (next < nsizes && out->rows[static_cast<size_t>(next)].reports == ranks) {
      print_row(next, out->rows[static_cast<size_t>(next)]);
      out->rows[static_cast<size_t>(next)].printed = true;
      next++;
    }
  }
  close(fd);
  for (int k = next; k < nsizes; ++k) {
    SizeRow& row = out->rows[static_cast<size_t>(k)];
    if (row.reports > 0 && !row.printed) {
      print_row(k, row);
      row.printed = true;
    }
  }
}

// Waits for every child; returns true when all exited with status 0. Describes the others.
inline bool wait_ranks(const std::vector<pid_t>& pids, std::vector<std::string>* failures) {
  bool all_ok = true;
  for (size_t r = 0; r < pids.size(); ++r) {
    int status = 0;
    pid_t w;
    do {
      w = waitpid(pids[r], &status, 0);
    } while (w < 0 && errno == EINTR);
    if (w < 0) {
      failures->push_back("rank " + std::to_string(r) + ": waitpid: " + std::strerror(errno));
      all_ok = false;
    } else if (WIFSIGNALED(status)) {
      failures->push_back("rank " + std::to_string(r) + ": killed by signal " +
                          std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) +
                          ")");
      all_ok = false;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      all_ok = false;  // the child printed or reported why
    }
  }
  return all_ok;
}

// Sends one size record (children).
inline void report_size(int fd, int rank, int k, double time_us, int64_t wrong, bool ok,
                        const std::string& msg, double cpu_s = 0) {
  bench_record rec;
  std::memset(&rec, 0, sizeof rec);
  rec.kind = BENCH_REC_SIZE;
  rec.rank = rank;
  rec.size_index = k;
  rec.ok = ok ? 1 : 0;
  rec.time_us = time_us;
  rec.wrong = wrong;
  rec.cpu_s = cpu_s;
  std::snprintf(rec.msg, sizeof rec.msg, "%s", msg.c_str());
  (void)bench_write_record(fd, &rec);
}

inline void report_failure(int fd, int rank, const std::string& msg) {
  bench_record rec;
  std::memset(&rec, 0, sizeof rec);
  rec.kind = BENCH_REC_FAIL;
  rec.rank = rank;
  std::snprintf(rec.msg, sizeof rec.msg, "%s", msg.c_str());
  (void)bench_write_record(fd, &rec);
}

inline void report_ready(int fd, int rank) {
  bench_record rec;
  std::memset(&rec, 0, sizeof rec);
  rec.kind = BENCH_REC_READY;
  rec.rank = rank;
  (void)bench_write_record(fd, &rec);
}

inline void report_stats(int fd, int rank, const std::array<uint64_t, BENCH_STATS>& stats) {
  bench_record rec;
  std::memset(&rec, 0, sizeof rec);
  rec.kind = BENCH_REC_STATS;
  rec.rank = rank;
  std::memcpy(rec.stats, stats.data(), sizeof rec.stats);
  (void)bench_write_record(fd, &rec);
}

// A fresh directory for the forked ranks' rendezvous store: $TMPDIR (or /tmp)/<name>-XXXXXX.
// Empty on failure (errno says why).
inline std::string make_temp_dir(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  std::string dir =
      std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/" + name + "-XXXXXX";
  return mkdtemp(dir.data()) != nullptr ? dir : std::string();
}

// Removes that directory and everything below it.
inline void remove_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace bench
