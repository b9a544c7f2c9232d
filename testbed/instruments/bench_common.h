/* Shared by the AllReduce benchmarks of the testbed (ina-bench, ina-gloo-bench, ina-mpi-bench):
 * size parsing, the size sweep, the nccl-tests style table, the CSV rows, the machine
 * description, the deterministic input data and the per-rank report records that forked ranks
 * send to their parent. Plain C (the MPI benchmark is C); everything is static so each tool
 * compiles its own copy.
 *
 * Table: the columns of nccl-tests (size, count, type, redop, time, algbw, busbw, #wrong).
 *   algbw = bytes / time (GB/s, 1e9 bytes)
 *   busbw = algbw * 2 (N - 1) / N, the nccl-tests AllReduce convention: the bandwidth a ring
 *           would need on each link, so numbers of different algorithms compare on one scale.
 */
#ifndef INA_TESTBED_BENCH_COMMON_H_
#define INA_TESTBED_BENCH_COMMON_H_

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- sizes ---- */

/* Parses "8", "64K", "64M", "1G" (also "KB"/"KiB", any case; powers of 1024, as nccl-tests).
 * Returns 0 on success, -1 on a malformed or overflowing value. */
static inline int bench_parse_size(const char* s, size_t* out) {
  if (s == NULL || *s == '\0') return -1;
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s || s[0] == '-') return -1;
  unsigned long long mult = 1;
  if (*end != '\0') {
    switch (*end) {
      case 'k':
      case 'K': mult = 1ULL << 10; break;
      case 'm':
      case 'M': mult = 1ULL << 20; break;
      case 'g':
      case 'G': mult = 1ULL << 30; break;
      case 'b':
      case 'B':
        mult = 1;
        end--;
        break; /* "8B": no multiplier */
      default: return -1;
    }
    end++;
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end != '\0') return -1;
  }
  if (v != 0 && mult > ~0ULL / v) return -1;
  *out = (size_t)(v * mult);
  return 0;
}

/* Formats a byte count for messages: "64 MiB", "8 B". */
static inline void bench_format_size(size_t bytes, char* buf, size_t n) {
  if (bytes >= (1u << 30) && bytes % (1u << 30) == 0)
    snprintf(buf, n, "%zu GiB", bytes >> 30);
  else if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
    snprintf(buf, n, "%zu MiB", bytes >> 20);
  else if (bytes >= (1u << 10) && bytes % (1u << 10) == 0)
    snprintf(buf, n, "%zu KiB", bytes >> 10);
  else
    snprintf(buf, n, "%zu B", bytes);
}

#define BENCH_MAX_SIZES 256

/* The sweep of nccl-tests: min, min*f, min*f^2, ... <= max; each size rounded down to whole
 * elements (sizes that round to 0 elements or repeat are skipped). Returns the number of sizes
 * written to bytes_out (at most BENCH_MAX_SIZES), or -1 on bad arguments. */
static inline int bench_sizes(size_t min_bytes, size_t max_bytes, double factor, size_t elem_size,
                              size_t* bytes_out) {
  if (min_bytes == 0 || max_bytes < min_bytes || factor <= 1.0 || elem_size == 0) return -1;
  int n = 0;
  double s = (double)min_bytes;
  while (s <= (double)max_bytes && n < BENCH_MAX_SIZES) {
    size_t count = (size_t)s / elem_size;
    size_t bytes = count * elem_size;
    if (count > 0 && (n == 0 || bytes_out[n - 1] != bytes)) bytes_out[n++] = bytes;
    double next = s * factor;
    if ((size_t)next == (size_t)s) next = s + 1;
    s = next;
  }
  return n;
}

/* Iterations for one size. cap_bytes > 0 bounds iters * bytes (big sizes run fewer iterations,
 * at least one); the warmup shrinks along. Every rank computes the same numbers. */
static inline void bench_iters_for(size_t bytes, int iters, int warmup, size_t cap_bytes,
                                   int* iters_out, int* warmup_out) {
  int it = iters;
  int wu = warmup;
  if (cap_bytes > 0 && bytes > 0) {
    size_t fit = cap_bytes / bytes;
    if (fit < 1) fit = 1;
    if ((size_t)it > fit) {
      it = (int)fit;
      int w = it / 4;
      if (w < 1) w = 1;
      if (wu > w) wu = w;
    }
  }
  *iters_out = it;
  *warmup_out = wu;
}

static inline double bench_busbw_factor(int ranks) {
  return ranks > 1 ? 2.0 * (double)(ranks - 1) / (double)ranks : 0.0;
}

/* AllToAll (nccl-tests' alltoall_perf): each rank sends (N-1)/N of its buffer over the wire. */
static inline double bench_alltoall_busbw_factor(int ranks) {
  return ranks > 1 ? (double)(ranks - 1) / (double)ranks : 0.0;
}

/* AllToAllv with expert loads (--coll alltoallv --zipf S): each rank sends `elems` elements in
 * all (the size's share of one rank), rank j (expert j) receiving the share 1/(j+1)^S of every
 * rank's tokens, normalized (S = 0: uniform, every pair gets elems/N), rounded down; what
 * rounding leaves goes to rank 0. Every sender routes by the same popularity, as tokens of one
 * step go to the same popular experts: rank 0 is the hot receiver (Zipf(1.2) at 8 ranks: 12x the
 * coldest rank's bytes). The counts of every pair are computed by every rank alike. */
static inline size_t bench_a2av_count(size_t elems, int ranks, int to, double zipf_s) {
  double sum = 0;
  for (int j = 0; j < ranks; ++j) sum += pow((double)(j + 1), -zipf_s);
  size_t given = 0;
  size_t mine = 0;
  for (int j = 0; j < ranks; ++j) {
    size_t c = (size_t)((double)elems * pow((double)(j + 1), -zipf_s) / sum);
    if (c > elems - given) c = elems - given;
    given += c;
    if (j == to) mine = c;
  }
  return to == 0 ? mine + (elems - given) : mine;
}

static inline double bench_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* ---- machine and date ---- */

static inline void bench_cpu_model(char* buf, size_t n) {
  snprintf(buf, n, "unknown CPU");
  FILE* f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return;
  char line[512];
  while (fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, "model name", 10) == 0) {
      const char* colon = strchr(line, ':');
      if (colon != NULL) {
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        snprintf(buf, n, "%s", colon);
        size_t len = strlen(buf);
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' ')) buf[--len] = '\0';
      }
      break;
    }
  }
  fclose(f);
}

/* "Linux 6.1.0 x86_64, 2 CPUs, AMD EPYC 7B13" (uname -srm, nproc, CPU model). */
static inline void bench_machine(char* buf, size_t n) {
  struct utsname u;
  char cpu[256];
  bench_cpu_model(cpu, sizeof cpu);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (uname(&u) == 0)
    snprintf(buf, n, "%s %s %s, %ld CPUs, %s", u.sysname, u.release, u.machine, cpus, cpu);
  else
    snprintf(buf, n, "unknown OS, %ld CPUs, %s", cpus, cpu);
}

static inline void bench_date(char* buf, size_t n) {
  time_t t = time(NULL);
  struct tm tmv;
  gmtime_r(&t, &tmv);
  strftime(buf, n, "%Y-%m-%d %H:%M:%S UTC", &tmv);
}

/* The common top of every table: tool line, machine, date. */
static inline void bench_print_preamble(FILE* out, const char* tool_line) {
  char machine[512];
  char date[64];
  bench_machine(machine, sizeof machine);
  bench_date(date, sizeof date);
  fprintf(out, "# %s\n# machine: %s\n# date: %s\n", tool_line, machine, date);
}

/* ---- the table ---- */

static inline void bench_print_table_header(FILE* out) {
  fprintf(out, "#\n");
  fprintf(out, "#       size         count      type   redop     time   algbw   busbw  #wrong\n");
  fprintf(out, "#        (B)    (elements)                       (us)  (GB/s)  (GB/s)        \n");
  fflush(out);
}

/* wrong < 0 prints N/A (no check). */
static inline void bench_print_row(FILE* out, size_t bytes, size_t count, const char* type,
                                   const char* op, double time_us, double algbw, double busbw,
                                   long long wrong) {
  char t[32];
  char w[32];
  if (time_us >= 10000.0)
    snprintf(t, sizeof t, "%7.0f", time_us);
  else if (time_us >= 100.0)
    snprintf(t, sizeof t, "%7.1f", time_us);
  else
    snprintf(t, sizeof t, "%7.2f", time_us);
  if (wrong < 0)
    snprintf(w, sizeof w, "N/A");
  else
    snprintf(w, sizeof w, "%lld", wrong);
  fprintf(out, "%12zu  %12zu  %8s  %6s  %7s  %6.2f  %6.2f  %6s\n", bytes, count, type, op, t, algbw,
          busbw, w);
  fflush(out);
}

/* algbw and busbw (GB/s) of one row. */
static inline void bench_bandwidth(size_t bytes, double time_us, int ranks, double* algbw,
                                   double* busbw) {
  double a = time_us > 0 ? (double)bytes / (time_us * 1e-6) / 1e9 : 0.0;
  *algbw = a;
  *busbw = a * bench_busbw_factor(ranks);
}

static inline void bench_print_footer(FILE* out, double busbw_sum, int rows, long long wrong_total,
                                      int check) {
  if (check)
    fprintf(out, "# Out of bounds values : %lld %s\n", wrong_total,
            wrong_total == 0 ? "OK" : "FAILED");
  fprintf(out, "# Avg bus bandwidth    : %g \n#\n", rows > 0 ? busbw_sum / rows : 0.0);
  fflush(out);
}

/* Appends one row to a CSV file, writing the column line first when the file is new or empty.
 * Returns 0 on success, -1 (errno set) on failure. */
static inline int bench_csv_append(const char* path, const char* tool, int ranks, size_t bytes,
                                   size_t count, const char* type, const char* op, double time_us,
                                   double algbw, double busbw, long long wrong) {
  if (path == NULL || *path == '\0') return 0;
  FILE* f = fopen(path, "a");
  if (f == NULL) return -1;
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && st.st_size == 0)
    fprintf(f, "tool,ranks,bytes,count,dtype,op,time_us,algbw,busbw,wrong\n");
  char w[32];
  if (wrong < 0)
    snprintf(w, sizeof w, "NA");
  else
    snprintf(w, sizeof w, "%lld", wrong);
  fprintf(f, "%s,%d,%zu,%zu,%s,%s,%.3f,%.4f,%.4f,%s\n", tool, ranks, bytes, count, type, op,
          time_us, algbw, busbw, w);
  return fclose(f) == 0 ? 0 : -1;
}

/* ---- input data (identical in every tool) ---- */

/* A power-of-two factor that keeps the sum over `ranks` of values <= 100 in absolute value
 * below `limit` (the largest finite value of the type, e.g. 65504 for float16). */
static inline double bench_float_scale(int ranks, double limit) {
  double scale = 1.0;
  while (100.0 * (double)ranks * scale > limit * 0.5) scale *= 0.5;
  return scale;
}

/* Rank r's element i for float types: a multiple of 1/8 in [-6.25, 6.25] times 2^s, with
 * s in [-4, 4] changing from one block of `block` elements to the next, so that every block
 * has its own exponent (a block quantized with the wrong exponent shows up as wrong values).
 * At most 6 significant bits: exact in float32, float16 and bfloat16. */
static inline double bench_float_value(size_t i, int r, size_t block, double scale) {
  long base = (long)((i * 7u + (size_t)r * 13u) % 101u) - 50;
  size_t b = block > 0 ? i / block : 0;
  int s = (int)((b * 5u) % 9u) - 4;
  return ldexp((double)base / 8.0, s) * scale;
}

/* Rank r's element i for int32: a 32-bit hash of (i, r), so sums wrap and every bit moves. */
static inline int32_t bench_int_value(size_t i, int r) {
  uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ULL + (uint64_t)(r + 1) * 0xBF58476D1CE4E5B9ULL;
  z ^= z >> 31;
  z *= 0x94D049BB133111EBULL;
  z ^= z >> 29;
  uint32_t u = (uint32_t)z;
  int32_t v;
  memcpy(&v, &u, sizeof v);
  return v;
}

/* ---- forked ranks report to their parent through one pipe ---- */

enum {
  BENCH_REC_SIZE = 1,  /* one size done */
  BENCH_REC_STATS = 2, /* counters at the end */
  BENCH_REC_FAIL = 3,  /* the rank gave up (msg says why) */
  BENCH_REC_READY = 4, /* the rank is connected (rendezvous done) */
};

/* Counters in a BENCH_REC_STATS record. */
#define BENCH_STATS 13

/* Fixed-size record (< PIPE_BUF, so writes of concurrent children do not interleave). */
typedef struct {
  int32_t kind; /* BENCH_REC_* */
  int32_t rank;
  int32_t size_index;          /* BENCH_REC_SIZE: index into the sweep */
  int32_t ok;                  /* 1: every collective of this size succeeded */
  double time_us;              /* average time of one collective */
  int64_t wrong;               /* elements outside the bound (-1: not checked) */
  double cpu_s;                /* BENCH_REC_SIZE: the process's CPU seconds (user + system, all
                                  threads) over the timed iterations; 0: not measured */
  uint64_t stats[BENCH_STATS]; /* BENCH_REC_STATS: tool-specific counters */
  char msg[256];               /* failure message */
} bench_record;

static inline int bench_write_record(int fd, const bench_record* rec) {
  const char* p = (const char*)rec;
  size_t left = sizeof *rec;
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    left -= (size_t)w;
  }
  return 0;
}

/* Returns 1 for a record, 0 at end of file, -1 on error (or a truncated record). */
static inline int bench_read_record(int fd, bench_record* rec) {
  char* p = (char*)rec;
  size_t got = 0;
  while (got < sizeof *rec) {
    ssize_t r = read(fd, p + got, sizeof *rec - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) return got == 0 ? 0 : -1;
    got += (size_t)r;
  }
  return 1;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* INA_TESTBED_BENCH_COMMON_H_ */
