/* ina-mpi-bench: MPI_Allreduce with the same sweep, data, check and table as ina-bench, as the
 * host-algorithm baseline (Open MPI picks its own algorithm per size: recursive doubling, ring,
 * Rabenseifner). --coll alltoall times MPI_Alltoall instead, as ina-bench --coll alltoall does:
 * each rank sends size/N bytes to each peer (sizes rounded down to whole elements per rank),
 * busbw = algbw (N-1)/N, and every received element is compared exactly. --coll alltoallv
 * --zipf S times MPI_Alltoallv with the expert loads of bench_a2av_count (bench_common.h): each
 * rank sends size bytes in all, rank j receiving the share 1/(j+1)^S of them (S = 0: uniform),
 * as ina-bench --coll alltoallv --zipf S does.
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 4 --mca btl tcp,self \
 *          --mca btl_tcp_if_include lo build/testbed/ina-mpi-bench -b 8 -e 64M
 *
 * time = max over ranks of the average time of one call; #wrong = sum over ranks of the
 * elements that differ from the exact result (the inputs have few significant bits, so the
 * float sum is exact in any order; a one-ulp tolerance is allowed anyway).
 */
#define _GNU_SOURCE 1

#include <getopt.h>
#include <mpi.h>

#include "bench_common.h"
#include "ina_config.h"

typedef struct {
  size_t min_b, max_b, cap_b;
  double factor;
  int iters, warmup, check;
  int is_int; /* 0: float32, 1: int32 */
  int op;     /* 0 sum, 1 min, 2 max */
  const char* csv;
  int alltoall; /* --coll alltoall: 1; alltoallv: 2 */
  double zipf;  /* --zipf S: alltoallv's expert popularity exponent */
} options;

static void usage(FILE* out) {
  fprintf(out,
          "usage: ina-mpi-bench [-b minbytes] [-e maxbytes] [-f stepfactor] [-n iters]\n"
          "                     [-w warmup_iters] [-c check] [-d float|int32] [-o sum|min|max]\n"
          "                     [--csv FILE] [--max-bytes-per-size BYTES]\n"
          "                     [--coll allreduce|alltoall|alltoallv] [--zipf S]\n"
          "sizes take K/M/G suffixes;\n"
          "defaults: -b 8 -e 64M -f 2 -n 20 -w 5 -c 1 -d float -o sum\n");
}

static int parse_options(int argc, char** argv, options* o) {
  static const struct option longopts[] = {
      {"minbytes", required_argument, NULL, 'b'},
      {"maxbytes", required_argument, NULL, 'e'},
      {"stepfactor", required_argument, NULL, 'f'},
      {"iters", required_argument, NULL, 'n'},
      {"warmup_iters", required_argument, NULL, 'w'},
      {"check", required_argument, NULL, 'c'},
      {"datatype", required_argument, NULL, 'd'},
      {"op", required_argument, NULL, 'o'},
      {"csv", required_argument, NULL, 'C'},
      {"max-bytes-per-size", required_argument, NULL, 'B'},
      {"coll", required_argument, NULL, 'L'},
      {"zipf", required_argument, NULL, 'Z'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int c;
  while ((c = getopt_long(argc, argv, "b:e:f:n:w:c:d:o:h", longopts, NULL)) != -1) {
    switch (c) {
      case 'b':
        if (bench_parse_size(optarg, &o->min_b) != 0) return -1;
        break;
      case 'e':
        if (bench_parse_size(optarg, &o->max_b) != 0) return -1;
        break;
      case 'B':
        if (bench_parse_size(optarg, &o->cap_b) != 0) return -1;
        break;
      case 'f': o->factor = atof(optarg); break;
      case 'n': o->iters = atoi(optarg); break;
      case 'w': o->warmup = atoi(optarg); break;
      case 'c': o->check = atoi(optarg); break;
      case 'd':
        if (strcmp(optarg, "float") == 0 || strcmp(optarg, "float32") == 0)
          o->is_int = 0;
        else if (strcmp(optarg, "int32") == 0 || strcmp(optarg, "int") == 0)
          o->is_int = 1;
        else
          return -1;
        break;
      case 'o':
        if (strcmp(optarg, "sum") == 0)
          o->op = 0;
        else if (strcmp(optarg, "min") == 0)
          o->op = 1;
        else if (strcmp(optarg, "max") == 0)
          o->op = 2;
        else
          return -1;
        break;
      case 'C': o->csv = optarg; break;
      case 'Z': {
        char* end = NULL;
        o->zipf = strtod(optarg, &end);
        if (end == optarg || *end != '\0' || !(o->zipf >= 0) || o->zipf > 10) return -1;
        break;
      }
      case 'L':
        if (strcmp(optarg, "allreduce") == 0)
          o->alltoall = 0;
        else if (strcmp(optarg, "alltoall") == 0)
          o->alltoall = 1;
        else if (strcmp(optarg, "alltoallv") == 0)
          o->alltoall = 2;
        else
          return -1;
        break;
      case 'h': return 1;
      default: return -1;
    }
  }
  if (o->iters < 1 || o->warmup < 0 || o->factor <= 1.0) return -1;
  return 0;
}

static double ulp_f32(double a) {
  int e = -126;
  if (a > 0) {
    int e2 = 0;
    frexp(a, &e2);
    e = e2 - 1 > -126 ? e2 - 1 : -126;
  }
  return ldexp(1.0, e - 23);
}

static void fill(const options* o, int rank, void* buf, size_t count, double scale) {
  if (o->is_int) {
    int32_t* p = (int32_t*)buf;
    for (size_t i = 0; i < count; ++i) p[i] = bench_int_value(i, rank);
  } else {
    float* p = (float*)buf;
    for (size_t i = 0; i < count; ++i) p[i] = (float)bench_float_value(i, rank, 256, scale);
  }
}

static long long check(const options* o, int rank, int ranks, const void* out, size_t count,
                       double scale) {
  long long wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    int bad = 0;
    if (o->is_int) {
      uint32_t sum = 0;
      int32_t mn = INT32_MAX, mx = INT32_MIN;
      for (int r = 0; r < ranks; ++r) {
        int32_t v = bench_int_value(i, r);
        sum += (uint32_t)v;
        if (v < mn) mn = v;
        if (v > mx) mx = v;
      }
      int32_t got = ((const int32_t*)out)[i];
      if (o->op == 0)
        bad = (uint32_t)got != sum;
      else
        bad = got != (o->op == 1 ? mn : mx);
    } else {
      double sum = 0, mn = 0, mx = 0;
      for (int r = 0; r < ranks; ++r) {
        double v = (float)bench_float_value(i, r, 256, scale);
        sum += v;
        if (r == 0 || v < mn) mn = v;
        if (r == 0 || v > mx) mx = v;
      }
      double got = ((const float*)out)[i];
      if (o->op == 0)
        bad = !(fabs(got - sum) <= ulp_f32(fabs(sum)));
      else
        bad = !(got == (o->op == 1 ? mn : mx));
    }
    if (bad) {
      if (wrong < 5) fprintf(stderr, "# rank %d: element %zu wrong\n", rank, i);
      wrong++;
    }
  }
  return wrong;
}

/* AllToAll: block j of `out` (per_peer elements) must be rank j's elements for `rank`. */
static long long check_alltoall(const options* o, int rank, int ranks, const void* out,
                                size_t per_peer, double scale) {
  long long wrong = 0;
  for (int j = 0; j < ranks; ++j) {
    for (size_t i = 0; i < per_peer; ++i) {
      size_t at = (size_t)j * per_peer + i;
      size_t src = (size_t)rank * per_peer + i;
      int bad;
      if (o->is_int)
        bad = ((const int32_t*)out)[at] != bench_int_value(src, j);
      else
        bad = ((const float*)out)[at] != (float)bench_float_value(src, j, 256, scale);
      if (bad) {
        if (wrong < 5)
          fprintf(stderr, "# rank %d: element %zu (from rank %d) wrong\n", rank, at, j);
        wrong++;
      }
    }
  }
  return wrong;
}

/* AllToAllv: rank `rank` receives c elements from every rank i, at i * c; they are i's elements
 * [off, off + c), off = what i sends to the ranks before `rank` (bench_a2av_count). */
static long long check_alltoallv(const options* o, int rank, int ranks, const void* out,
                                 size_t elems, double scale) {
  long long wrong = 0;
  const size_t c = bench_a2av_count(elems, ranks, rank, o->zipf);
  size_t off = 0;
  for (int j = 0; j < rank; ++j) off += bench_a2av_count(elems, ranks, j, o->zipf);
  for (int i = 0; i < ranks; ++i) {
    for (size_t k = 0; k < c; ++k) {
      size_t at = (size_t)i * c + k;
      int bad;
      if (o->is_int)
        bad = ((const int32_t*)out)[at] != bench_int_value(off + k, i);
      else
        bad = ((const float*)out)[at] != (float)bench_float_value(off + k, i, 256, scale);
      if (bad) {
        if (wrong < 5)
          fprintf(stderr, "# rank %d: element %zu (from rank %d) wrong\n", rank, at, i);
        wrong++;
      }
    }
  }
  return wrong;
}

int main(int argc, char** argv) {
  // --version without starting MPI (no launcher needed).
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--version") == 0) {
      printf("ina-mpi-bench %s\n", INA_VERSION);
      return 0;
    }
  }
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  options o = {8, 64u << 20, 0, 2.0, 20, 5, 1, 0, 0, NULL, 0, 0.0};
  int pr = parse_options(argc, argv, &o);
  if (pr != 0) {
    if (rank == 0) usage(pr > 0 ? stdout : stderr);
    MPI_Finalize();
    return pr > 0 ? 0 : 1;
  }
  const size_t esize = 4;
  size_t sizes[BENCH_MAX_SIZES];
  int nsizes = bench_sizes(o.min_b, o.max_b, o.factor, esize, sizes);
  if (o.alltoall && nsizes > 0) { /* whole elements per rank; drop empty and repeated sizes */
    size_t unit = (size_t)ranks * esize;
    int kept = 0;
    for (int k = 0; k < nsizes; ++k) {
      size_t b = sizes[k] / unit * unit;
      if (b > 0 && (kept == 0 || sizes[kept - 1] != b)) sizes[kept++] = b;
    }
    nsizes = kept;
  }
  if (nsizes <= 0) {
    if (rank == 0) fprintf(stderr, "ina-mpi-bench: no sizes in the range\n");
    MPI_Finalize();
    return 1;
  }
  size_t max_bytes = sizes[nsizes - 1];
  /* AllToAllv: the hot rank receives more than it sends (N times its share). */
  size_t recv_bytes =
      o.alltoall == 2
          ? (size_t)ranks * bench_a2av_count(max_bytes / esize, ranks, 0, o.zipf) * esize
          : max_bytes;
  if (recv_bytes < max_bytes) recv_bytes = max_bytes;
  int* scounts = calloc((size_t)ranks * 4, sizeof(int));
  void* send = malloc(max_bytes + 64);
  void* recv = malloc(recv_bytes + 64);
  if (send == NULL || recv == NULL || scounts == NULL) {
    fprintf(stderr, "ina-mpi-bench: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Datatype type = o.is_int ? (o.op == 0 ? MPI_UINT32_T : MPI_INT32_T) : MPI_FLOAT;
  MPI_Op op = o.op == 0 ? MPI_SUM : o.op == 1 ? MPI_MIN : MPI_MAX;
  const char* type_name = o.is_int ? "int32" : "float32";
  const char* op_name = o.alltoall ? "none" : o.op == 0 ? "sum" : o.op == 1 ? "min" : "max";
  const char* tool = o.alltoall == 2 ? "mpi-alltoallv" : o.alltoall ? "mpi-alltoall" : "mpi";
  int* sdispls = scounts + ranks;
  int* rcounts = scounts + 2 * ranks;
  int* rdispls = scounts + 3 * ranks;
  double scale = bench_float_scale(ranks, 3.0e38);

  if (rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    char* nl = strchr(version, '\n');
    if (nl != NULL) *nl = '\0';
    char* comma = strchr(version, ',');
    if (comma != NULL) *comma = '\0';
    bench_print_preamble(stdout, o.alltoall == 2 ? "ina-mpi-bench: MPI_Alltoallv"
                                 : o.alltoall    ? "ina-mpi-bench: MPI_Alltoall"
                                              : "ina-mpi-bench: MPI_Allreduce (host algorithms)");
    printf("# ranks %d, dtype %s, op %s, iters %d, warmup %d, check %d", ranks, type_name, op_name,
           o.iters, o.warmup, o.check);
    if (o.cap_b > 0) {
      char cap[64];
      bench_format_size(o.cap_b, cap, sizeof cap);
      printf(", iterations capped at %s per size", cap);
    }
    if (o.alltoall == 2) printf(", expert loads Zipf(%g)", o.zipf);
    printf("\n# library: %s\n", version);
    bench_print_table_header(stdout);
  }

  double busbw_sum = 0;
  int rows = 0;
  long long wrong_total = 0;
  for (int k = 0; k < nsizes; ++k) {
    size_t bytes = sizes[k];
    size_t count = bytes / esize;
    int iters = 0, warmup = 0;
    bench_iters_for(bytes, o.iters, o.warmup, o.cap_b, &iters, &warmup);
    fill(&o, rank, send, count, scale);
    memset(recv, 0xff,
           o.alltoall == 2 ? (size_t)ranks * bench_a2av_count(count, ranks, rank, o.zipf) * esize
                           : bytes);
    int per_peer = (int)(count / (size_t)ranks);
    if (o.alltoall == 2) {
      int off = 0;
      for (int j = 0; j < ranks; ++j) {
        scounts[j] = (int)bench_a2av_count(count, ranks, j, o.zipf);
        sdispls[j] = off;
        off += scounts[j];
        rcounts[j] = (int)bench_a2av_count(count, ranks, rank, o.zipf);
        rdispls[j] = j * rcounts[j];
      }
    }
#define RUN_ONCE()                                                                                 \
  (o.alltoall == 2                                                                                 \
       ? MPI_Alltoallv(send, scounts, sdispls, type, recv, rcounts, rdispls, type, MPI_COMM_WORLD) \
       : MPI_Alltoall(send, per_peer, type, recv, per_peer, type, MPI_COMM_WORLD))
    for (int i = 0; i < warmup; ++i) {
      if (o.alltoall)
        RUN_ONCE();
      else
        MPI_Allreduce(send, recv, (int)count, type, op, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = bench_now_us();
    for (int i = 0; i < iters; ++i) {
      if (o.alltoall)
        RUN_ONCE();
      else
        MPI_Allreduce(send, recv, (int)count, type, op, MPI_COMM_WORLD);
    }
    double t = (bench_now_us() - t0) / iters;
    long long wrong = !o.check          ? 0
                      : o.alltoall == 2 ? check_alltoallv(&o, rank, ranks, recv, count, scale)
                      : o.alltoall ? check_alltoall(&o, rank, ranks, recv, (size_t)per_peer, scale)
                                   : check(&o, rank, ranks, recv, count, scale);
    double tmax = 0;
    long long wsum = 0;
    MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &wsum, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      double algbw = 0, busbw = 0;
      bench_bandwidth(bytes, tmax, ranks, &algbw, &busbw);
      if (o.alltoall) busbw = algbw * bench_alltoall_busbw_factor(ranks);
      long long shown = o.check ? wsum : -1;
      bench_print_row(stdout, bytes, count, type_name, op_name, tmax, algbw, busbw, shown);
      if (o.csv != NULL && bench_csv_append(o.csv, tool, ranks, bytes, count, type_name, op_name,
                                            tmax, algbw, busbw, shown) != 0)
        fprintf(stderr, "ina-mpi-bench: cannot append to %s: %s\n", o.csv, strerror(errno));
      busbw_sum += busbw;
      rows++;
      wrong_total += wsum;
    }
  }
  if (rank == 0) bench_print_footer(stdout, busbw_sum, rows, wrong_total, o.check);
  free(send);
  free(recv);
  free(scounts);
  int failed = rank == 0 && wrong_total != 0;
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed ? 1 : 0;
}
