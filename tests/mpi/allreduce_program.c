/* An ordinary MPI program that knows nothing of INA: the subject of mpi_preload_test.py.
 *
 *   mpirun -np 4 mpi-allreduce-program OUTDIR
 *
 * Runs a fixed list of MPI_Allreduce / MPI_Iallreduce cases (int and float SUM/MIN/MAX, in place
 * or not, blocking and nonblocking, plus calls an interposer must pass through: MPI_DOUBLE,
 * MPI_PROD, a split communicator) on deterministic per-rank inputs. Each rank writes its results
 * to OUTDIR/r<rank>_c<case>.bin; rank 0 writes OUTDIR/manifest.txt (one line per case: index
 * name datatype op comm blocking count maxabs) and, for float SUM, OUTDIR/ref_c<case>.bin: the
 * exact sum in double of the inputs gathered with MPI_Allgather. The driver compares runs.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char* name;
  MPI_Datatype type;
  const char* type_name;
  MPI_Op op;
  const char* op_name;
  int split; /* 1: on a communicator split from MPI_COMM_WORLD */
  int inplace;
  int count;
} Case;

static int g_rank, g_size;
static const char* g_dir;

static void fill(void* buf, MPI_Datatype type, int count, int rank, int salt) {
  for (int i = 0; i < count; ++i) {
    const int k = i + 131 * salt;
    if (type == MPI_INT) {
      const uint32_t h = (uint32_t)k * 2654435761u + (uint32_t)rank * 40503u;
      ((int*)buf)[i] = (int)(h % (1u << 26)) - (1 << 25);
    } else {
      const double v = sin(k * 0.37 + rank * 1.3) * ldexp(1.0, (k * 7 + rank) % 20 - 10);
      if (type == MPI_FLOAT)
        ((float*)buf)[i] = (float)v;
      else
        ((double*)buf)[i] = v;
    }
  }
}

static size_t elem_size(MPI_Datatype t) {
  int s = 0;
  MPI_Type_size(t, &s);
  return (size_t)s;
}

static void write_file(const char* name, const void* data, size_t bytes) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", g_dir, name);
  FILE* f = fopen(path, "wb");
  if (f == NULL || (bytes > 0 && fwrite(data, 1, bytes, f) != bytes)) {
    fprintf(stderr, "rank %d: cannot write %s\n", g_rank, path);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  fclose(f);
}

/* Exact float sums for the driver's bound check: every rank's input in double. */
static double reference(const Case* c, int ci, FILE* manifest) {
  float* mine = malloc((size_t)c->count * sizeof(float) + 1);
  float* all = malloc((size_t)c->count * (size_t)g_size * sizeof(float) + 1);
  fill(mine, MPI_FLOAT, c->count, g_rank, ci);
  MPI_Allgather(mine, c->count, MPI_FLOAT, all, c->count, MPI_FLOAT, MPI_COMM_WORLD);
  double maxabs = 0;
  double* ref = malloc((size_t)c->count * sizeof(double) + 1);
  for (int i = 0; i < c->count; ++i) {
    double s = 0;
    for (int r = 0; r < g_size; ++r) {
      const double x = all[(size_t)r * (size_t)c->count + (size_t)i];
      s += x; /* inputs span 20 binades of 24 bits: exact in double's 53 */
      if (fabs(x) > maxabs) maxabs = fabs(x);
    }
    ref[i] = s;
  }
  if (g_rank == 0 && manifest != NULL) {
    char name[64];
    snprintf(name, sizeof(name), "ref_c%d.bin", ci);
    write_file(name, ref, (size_t)c->count * sizeof(double));
  }
  free(mine);
  free(all);
  free(ref);
  return maxabs;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (argc != 2) {
    if (g_rank == 0) fprintf(stderr, "usage: mpi-allreduce-program OUTDIR\n");
    MPI_Finalize();
    return 2;
  }
  g_dir = argv[1];
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_rank, &half);

  const Case cases[] = {
      {"int_sum", MPI_INT, "int", MPI_SUM, "sum", 0, 0, 1000},
      {"int_min_inplace", MPI_INT, "int", MPI_MIN, "min", 0, 1, 4099},
      {"int_max", MPI_INT, "int", MPI_MAX, "max", 0, 0, 70000},
      {"float_min", MPI_FLOAT, "float", MPI_MIN, "min", 0, 0, 5000},
      {"float_max_inplace", MPI_FLOAT, "float", MPI_MAX, "max", 0, 1, 4097},
      {"float_sum", MPI_FLOAT, "float", MPI_SUM, "sum", 0, 0, 10000},
      {"float_sum_inplace", MPI_FLOAT, "float", MPI_SUM, "sum", 0, 1, 3},
      {"int_sum_empty", MPI_INT, "int", MPI_SUM, "sum", 0, 0, 0},
      {"double_sum", MPI_DOUBLE, "double", MPI_SUM, "sum", 0, 0, 1000},
      {"int_prod", MPI_INT, "int", MPI_PROD, "prod", 0, 0, 100},
      {"int_sum_split", MPI_INT, "int", MPI_SUM, "sum", 1, 0, 2000},
  };
  const int ncases = (int)(sizeof(cases) / sizeof(cases[0]));
  FILE* manifest = NULL;
  if (g_rank == 0) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/manifest.txt", g_dir);
    manifest = fopen(path, "w");
    if (manifest == NULL) MPI_Abort(MPI_COMM_WORLD, 2);
  }

  for (int ci = 0; ci < ncases; ++ci) {
    const Case* c = &cases[ci];
    const size_t bytes = (size_t)c->count * elem_size(c->type);
    void* in = malloc(bytes + 1);
    void* out = malloc(bytes + 1);
    fill(in, c->type, c->count, g_rank, ci);
    int rc;
    MPI_Comm comm = c->split ? half : MPI_COMM_WORLD;
    if (c->inplace) {
      memcpy(out, in, bytes);
      rc = MPI_Allreduce(MPI_IN_PLACE, out, c->count, c->type, c->op, comm);
    } else {
      rc = MPI_Allreduce(in, out, c->count, c->type, c->op, comm);
    }
    if (rc != MPI_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 3);
    double maxabs = 0;
    if (c->type == MPI_FLOAT && c->op == MPI_SUM) maxabs = reference(c, ci, manifest);
    char name[64];
    snprintf(name, sizeof(name), "r%d_c%d.bin", g_rank, ci);
    write_file(name, out, bytes);
    if (manifest != NULL) {
      fprintf(manifest, "%d %s %s %s %s blocking %d %.17g\n", ci, c->name, c->type_name, c->op_name,
              c->split ? "split" : "world", c->count, maxabs);
    }
    free(in);
    free(out);
  }

  /* Nonblocking: two in flight at once, then one in place. */
  {
    const int n = 3000;
    int* ia = malloc(n * sizeof(int));
    int* ib = malloc(n * sizeof(int));
    float* fa = malloc(n * sizeof(float));
    float* fb = malloc(n * sizeof(float));
    float* fc = malloc(5000 * sizeof(float));
    fill(ia, MPI_INT, n, g_rank, 100);
    fill(fa, MPI_FLOAT, n, g_rank, 101);
    fill(fc, MPI_FLOAT, 5000, g_rank, 102);
    MPI_Request req[2];
    MPI_Iallreduce(ia, ib, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req[0]);
    MPI_Iallreduce(fa, fb, n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD, &req[1]);
    if (MPI_Waitall(2, req, MPI_STATUSES_IGNORE) != MPI_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 3);
    MPI_Request r3;
    MPI_Iallreduce(MPI_IN_PLACE, fc, 5000, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD, &r3);
    int done = 0;
    while (!done) MPI_Test(&r3, &done, MPI_STATUS_IGNORE);
    char name[64];
    snprintf(name, sizeof(name), "r%d_c%d.bin", g_rank, ncases);
    write_file(name, ib, n * sizeof(int));
    snprintf(name, sizeof(name), "r%d_c%d.bin", g_rank, ncases + 1);
    write_file(name, fb, n * sizeof(float));
    snprintf(name, sizeof(name), "r%d_c%d.bin", g_rank, ncases + 2);
    write_file(name, fc, 5000 * sizeof(float));
    if (manifest != NULL) {
      fprintf(manifest, "%d iallreduce_int_sum int sum world nonblocking %d 0\n", ncases, n);
      fprintf(manifest, "%d iallreduce_float_max float max world nonblocking %d 0\n", ncases + 1,
              n);
      fprintf(manifest, "%d iallreduce_float_min_inplace float min world nonblocking 5000 0\n",
              ncases + 2);
    }
    free(ia);
    free(ib);
    free(fa);
    free(fb);
    free(fc);
  }
  /* An MPI_Iallreduce must not block its caller: rank 0 posts one, then sends 4 MiB (beyond the
   * eager limit, so the send needs rank 1's receive) to rank 1, which receives before posting
   * its own. A library that ran the reduction inside MPI_Iallreduce would deadlock here. */
  {
    const int n = 2048;
    const int big = 1 << 20;
    int* a = malloc(n * sizeof(int));
    int* b = malloc(n * sizeof(int));
    int* msg = calloc(big, sizeof(int));
    fill(a, MPI_INT, n, g_rank, 103);
    MPI_Request r;
    if (g_rank == 0) {
      MPI_Iallreduce(a, b, n, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &r);
      for (int i = 0; i < big; ++i) msg[i] = i;
      MPI_Send(msg, big, MPI_INT, 1, 5, MPI_COMM_WORLD);
    } else if (g_rank == 1) {
      MPI_Recv(msg, big, MPI_INT, 0, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      for (int i = 0; i < big; ++i) {
        if (msg[i] != i) MPI_Abort(MPI_COMM_WORLD, 4);
      }
      MPI_Iallreduce(a, b, n, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &r);
    } else {
      MPI_Iallreduce(a, b, n, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &r);
    }
    MPI_Wait(&r, MPI_STATUS_IGNORE);
    char name[64];
    snprintf(name, sizeof(name), "r%d_c%d.bin", g_rank, ncases + 3);
    write_file(name, b, n * sizeof(int));
    if (manifest != NULL) {
      fprintf(manifest, "%d iallreduce_int_max_overlap int max world nonblocking %d 0\n",
              ncases + 3, n);
    }
    free(a);
    free(b);
    free(msg);
  }
  if (manifest != NULL) fclose(manifest);
  MPI_Comm_free(&half);
  MPI_Finalize();
  return 0;
}
