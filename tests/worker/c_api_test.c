/* The C ABI of libina, from plain C11, linked against the shared library (so only exported
 * symbols are reachable).
 *
 *   c_api_test unit          config, errors, result strings, version: no sockets
 *   c_api_test integration   spawns $INA_AGGREGATOR_BIN (skips without it), runs collectives
 *                            through the C ABI, then checks that a dead aggregator is named
 *   c_api_test host          3 threads as ranks, host only (INA_TRANSPORT=host, INA_STORE on a
 *                            free port): every host collective through the C ABI
 *
 * Exit status: 0 pass, 1 fail, 77 skip (Meson's convention). */
#define _POSIX_C_SOURCE 200809L

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "c_check.h"
#include "config_env_vars.h"
#include "ina/ina.h"

#define CHECK_CONTAINS(haystack, needle)                                             \
  do {                                                                               \
    const char* h_ = (haystack);                                                     \
    if (h_ == NULL || strstr(h_, (needle)) == NULL) {                                \
      fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, \
              h_ ? h_ : "(null)", (needle));                                         \
      ++g_failures;                                                                  \
    }                                                                                \
  } while (0)

static void clear_env(void) {
  for (size_t i = 0; i < INA_CONFIG_ENV_VAR_COUNT; ++i) unsetenv(kInaConfigEnvVars[i]);
}

/* ---- unit ---- */

static void test_config_init(void) {
  ina_config_t a = INA_CONFIG_INITIALIZER;
  ina_config_t b;
  memset(&b, 0x5A, sizeof b);
  ina_config_init(&b);
  CHECK(a.struct_size == sizeof(ina_config_t));
  CHECK(b.struct_size == sizeof(ina_config_t));
  CHECK(a.version == INA_CONFIG_VERSION && b.version == INA_CONFIG_VERSION);
  CHECK(a.rank == -1 && b.rank == -1);
  CHECK(a.world_size == 0 && b.world_size == 0);
  CHECK(a.aggregator == NULL && b.aggregator == NULL);
  CHECK(b.job == 0 && b.job_key == NULL && b.block_elems == 0 && b.window == 0);
  CHECK(b.timeout_ms == 0 && b.retransmit_us == 0);
  ina_config_init(NULL); /* must not crash */
}

static void test_create_rejects_bad_config(void) {
  ina_comm_t* comm = (ina_comm_t*)0x1;
  ina_config_t cfg = INA_CONFIG_INITIALIZER;
  cfg.rank = 5;
  cfg.world_size = 2;
  cfg.aggregator = "127.0.0.1:9";
  CHECK(ina_comm_create(&cfg, &comm) == INA_INVALID_ARGUMENT);
  CHECK(comm == NULL);
  CHECK(strlen(ina_last_create_error()) > 0);
  CHECK_CONTAINS(ina_last_create_error(), "rank 5");

  cfg.rank = 0;
  cfg.world_size = 70000;
  CHECK(ina_comm_create(&cfg, &comm) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_last_create_error(), "world_size");

  cfg.world_size = 1;
  cfg.aggregator = "127.0.0.1:";
  CHECK(ina_comm_create(&cfg, &comm) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_last_create_error(), "config.aggregator");

  /* A sharded list: each element is checked, errors name it. */
  cfg.aggregator = "127.0.0.1:9,,127.0.0.1:10";
  CHECK(ina_comm_create(&cfg, &comm) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_last_create_error(), "config.aggregator element 2 of 3");
  cfg.aggregator = "127.0.0.1:9,127.0.0.1:9";
  CHECK(ina_comm_create(&cfg, &comm) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_last_create_error(), "repeats element 1");

  cfg.aggregator = "127.0.0.1:9";
  cfg.block_elems = 20000;
  CHECK(ina_comm_create(&cfg, &comm) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_last_create_error(), "block_elems");

  ina_config_t small = INA_CONFIG_INITIALIZER;
  small.struct_size = 8;
  CHECK(ina_comm_create(&small, &comm) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_last_create_error(), "struct_size");

  ina_config_t newer = INA_CONFIG_INITIALIZER;
  newer.version = INA_CONFIG_VERSION + 1;
  CHECK(ina_comm_create(&newer, &comm) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_last_create_error(), "version");

  CHECK(ina_comm_create(&cfg, NULL) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_last_create_error(), "NULL");
}

static void test_environment_fills_unset_fields(void) {
  ina_comm_t* comm = NULL;
  /* A malformed variable is named even when the config sets other fields. */
  setenv("INA_WINDOW", "lots", 1);
  ina_config_t cfg = INA_CONFIG_INITIALIZER;
  cfg.rank = 0;
  cfg.world_size = 1;
  CHECK(ina_comm_create(&cfg, &comm) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_last_create_error(), "INA_WINDOW");
  CHECK_CONTAINS(ina_last_create_error(), "lots");
  unsetenv("INA_WINDOW");

  /* rank comes from the environment when the config leaves it at -1 ... */
  setenv("INA_RANK", "3", 1);
  setenv("INA_WORLD_SIZE", "2", 1);
  CHECK(ina_comm_create(NULL, &comm) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_last_create_error(), "rank 3");
  /* ... and a config field overrides it. */
  cfg = (ina_config_t)INA_CONFIG_INITIALIZER;
  cfg.rank = 4;
  CHECK(ina_comm_create(&cfg, &comm) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_last_create_error(), "rank 4");
  clear_env();
}

static void* other_thread(void* arg) {
  *(int*)arg = strlen(ina_last_create_error()) == 0;
  return NULL;
}

static void test_create_error_is_per_thread(void) {
  ina_comm_t* comm = NULL;
  ina_config_t cfg = INA_CONFIG_INITIALIZER;
  cfg.world_size = 0; /* invalid */
  CHECK(ina_comm_create(&cfg, &comm) == INA_INVALID_ARGUMENT);
  CHECK(strlen(ina_last_create_error()) > 0);
  int empty_there = 0;
  pthread_t t;
  CHECK(pthread_create(&t, NULL, other_thread, &empty_there) == 0);
  pthread_join(t, NULL);
  CHECK(empty_there);
}

static void test_result_strings(void) {
  const ina_result_t codes[] = {INA_SUCCESS,       INA_INVALID_ARGUMENT, INA_TIMEOUT,
                                INA_UNAVAILABLE,   INA_REMOTE_ERROR,     INA_NO_MEMORY,
                                INA_NOT_SUPPORTED, INA_INTERNAL_ERROR};
  const size_t n = sizeof codes / sizeof codes[0];
  for (size_t i = 0; i < n; ++i) {
    const char* s = ina_result_string(codes[i]);
    CHECK(s != NULL && strlen(s) > 0);
    for (size_t j = 0; j < i; ++j) CHECK(strcmp(s, ina_result_string(codes[j])) != 0);
  }
  CHECK_CONTAINS(ina_result_string((ina_result_t)99), "unknown");
}

static void test_version_and_null_handles(void) {
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", INA_VERSION_MAJOR, INA_VERSION_MINOR, INA_VERSION_PATCH);
  CHECK(strcmp(ina_version(), want) == 0);
  CHECK(strcmp(ina_version(), "0.1.0") == 0);
  float x = 1;
  CHECK(ina_allreduce(NULL, &x, &x, 1, INA_FLOAT32, INA_SUM) == INA_INVALID_ARGUMENT);
  CHECK(ina_comm_rank(NULL) == -1);
  CHECK(ina_comm_size(NULL) == -1);
  CHECK(strcmp(ina_comm_last_error(NULL), "") == 0);
  ina_comm_destroy(NULL);
  ina_request_t* req = (ina_request_t*)&x; /* must be overwritten with NULL */
  CHECK(ina_allreduce_async(NULL, &x, &x, 1, INA_FLOAT32, INA_SUM, NULL, &req) ==
        INA_INVALID_ARGUMENT);
  int done = 0;
  CHECK(ina_test(NULL, &done) == INA_INVALID_ARGUMENT);
  CHECK(ina_wait(NULL) == INA_INVALID_ARGUMENT);
  CHECK(strcmp(ina_request_error(NULL), "") == 0);
  ina_request_free(NULL);
  /* Loads and answers without a GPU or driver: 0 with a reason (1 on a GPU machine). */
  const char* why = NULL;
  const int cuda = ina_cuda_available(&why);
  CHECK(cuda == 0 || cuda == 1);
  CHECK(why != NULL);
  if (cuda == 0) CHECK(why != NULL && strlen(why) > 0);
}

static int run_unit(void) {
  clear_env();
  test_config_init();
  test_create_rejects_bad_config();
  test_environment_fills_unset_fields();
  test_create_error_is_per_thread();
  test_result_strings();
  test_version_and_null_handles();
  return g_failures == 0 ? 0 : 1;
}

/* ---- integration ---- */

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Starts the aggregator for a 1-rank job on an ephemeral port; returns its pid and port. */
static pid_t spawn_aggregator(const char* bin, const char* port_file, unsigned* port) {
  unlink(port_file);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    execl(bin, bin, "--world-size", "1", "--port", "0", "--port-file", port_file, "--bind",
          "127.0.0.1", (char*)NULL);
    fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
    _exit(127);
  }
  for (int i = 0; i < 1000; ++i) { /* up to 10 s */
    FILE* f = fopen(port_file, "r");
    if (f != NULL) {
      const int got = fscanf(f, "%u", port);
      fclose(f);
      if (got == 1 && *port > 0) return pid;
    }
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      fprintf(stderr, "aggregator exited before listening (status %d)\n", status);
      return -1;
    }
    sleep_ms(10);
  }
  fprintf(stderr, "aggregator did not write %s\n", port_file);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

static int stop_aggregator(pid_t pid) {
  kill(pid, SIGTERM);
  for (int i = 0; i < 500; ++i) { /* up to 5 s, then SIGKILL */
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    sleep_ms(10);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

static void test_collectives(ina_comm_t* comm) {
  CHECK(ina_comm_rank(comm) == 0);
  CHECK(ina_comm_size(comm) == 1);

  enum { N = 1000 };
  static float fin[N], fout[N];
  for (int i = 0; i < N; ++i) fin[i] = (float)(sin(i * 0.37) * pow(10.0, (i / 256) - 2));
  CHECK(ina_allreduce(comm, fin, fout, N, INA_FLOAT32, INA_SUM) == INA_SUCCESS);
  for (int i = 0; i < N; ++i) {
    /* One rank: the quantizer's bound is M * 2^-30 plus one float32 ulp. */
    const double tol = 1e-9 * pow(10.0, (i / 256) - 2) + fabs(fin[i]) * 1.2e-7;
    if (fabs((double)fout[i] - fin[i]) > tol) {
      fprintf(stderr, "float32 sum element %d: %g vs %g\n", i, fout[i], fin[i]);
      ++g_failures;
      break;
    }
  }

  static int32_t iv[N];
  for (int i = 0; i < N; ++i) iv[i] = i * 7919 - 3000000;
  CHECK(ina_allreduce(comm, iv, iv, N, INA_INT32, INA_SUM) == INA_SUCCESS); /* in place */
  int ok = 1;
  for (int i = 0; i < N; ++i) ok &= iv[i] == i * 7919 - 3000000;
  CHECK(ok);

  CHECK(ina_allreduce(comm, fin, fout, N, INA_FLOAT32, INA_MAX) == INA_SUCCESS);
  CHECK(memcmp(fin, fout, sizeof fin) == 0); /* MIN/MAX are exact */

  fin[300] = NAN;
  CHECK(ina_allreduce(comm, fin, fout, N, INA_FLOAT32, INA_SUM) == INA_SUCCESS);
  CHECK(isnan(fout[256]) && isnan(fout[511]) && !isnan(fout[255]) && !isnan(fout[512]));

  CHECK(ina_allreduce(comm, NULL, NULL, 0, INA_FLOAT32, INA_SUM) == INA_SUCCESS);

  CHECK(ina_allreduce(comm, fin, fout, N, (ina_dtype_t)99, INA_SUM) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_comm_last_error(comm), "dtype 99");
  CHECK(ina_allreduce(comm, fin, fout, N, INA_FLOAT32, (ina_op_t)257) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_comm_last_error(comm), "op 257");
  CHECK(ina_allreduce(comm, NULL, fout, N, INA_FLOAT32, INA_SUM) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_comm_last_error(comm), "null");

  /* The asynchronous form on host buffers: the same result as the blocking call. */
  {
    static float aout[N], bout[N];
    fin[300] = 1.0f;
    CHECK(ina_allreduce(comm, fin, bout, N, INA_FLOAT32, INA_SUM) == INA_SUCCESS);
    ina_request_t* req = NULL;
    CHECK(ina_allreduce_async(comm, fin, aout, N, INA_FLOAT32, INA_SUM, NULL, &req) == INA_SUCCESS);
    CHECK(req != NULL);
    int done = 0;
    for (int i = 0; i < 20000 && !done; ++i) {
      CHECK(ina_test(req, &done) == INA_SUCCESS);
      if (!done) sleep_ms(1);
    }
    CHECK(done == 1);
    CHECK(ina_wait(req) == INA_SUCCESS);
    CHECK(strcmp(ina_request_error(req), "") == 0);
    ina_request_free(req);
    CHECK(memcmp(aout, bout, sizeof aout) == 0);
    /* Freed while pending (detached), then a blocking call that runs after it. */
    CHECK(ina_allreduce_async(comm, fin, aout, N, INA_FLOAT32, INA_MAX, NULL, &req) == INA_SUCCESS);
    ina_request_free(req);
    CHECK(ina_allreduce(comm, fin, bout, N, INA_FLOAT32, INA_MAX) == INA_SUCCESS);
    CHECK(memcmp(aout, fin, sizeof aout) == 0 && memcmp(bout, fin, sizeof bout) == 0);
    CHECK(ina_allreduce_async(comm, fin, aout, N, INA_FLOAT32, INA_SUM, NULL, NULL) ==
          INA_INVALID_ARGUMENT);
    CHECK_CONTAINS(ina_comm_last_error(comm), "req");
    if (ina_cuda_available(NULL) == 0) {
      int fake_stream = 0;
      const ina_result_t r =
          ina_allreduce_async(comm, fin, aout, N, INA_FLOAT32, INA_SUM, &fake_stream, &req);
      CHECK(r == INA_UNAVAILABLE || r == INA_NOT_SUPPORTED);
      CHECK(req == NULL);
      CHECK_CONTAINS(ina_comm_last_error(comm), "a CUDA stream was given");
    }
  }

  /* float8 in-network, one byte per element: one rank's sum is its input (1, 2, 3, 6; exact). */
  {
    uint8_t q8[4] = {0x38, 0x40, 0x44, 0x4C}, r8[4] = {0};
    CHECK(ina_allreduce(comm, q8, r8, 4, INA_FLOAT8_E4M3, INA_SUM) == INA_SUCCESS);
    CHECK(memcmp(q8, r8, 4) == 0);
    CHECK(ina_allreduce(comm, q8, r8, 4, INA_FLOAT8_E5M2, INA_MAX) == INA_SUCCESS);
    CHECK(memcmp(q8, r8, 4) == 0);
  }

  /* No store configured: in-network only, and the host collectives say what is missing. */
  CHECK(ina_comm_on_host_path(comm) == 0);
  CHECK(ina_barrier(comm) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_comm_last_error(comm), "INA_STORE");
  CHECK(ina_broadcast(comm, fin, 4, INA_FLOAT32, 0) == INA_INVALID_ARGUMENT);
  CHECK_CONTAINS(ina_comm_last_error(comm), "MASTER_ADDR");
}

static int run_integration(void) {
  clear_env();
  const char* bin = getenv("INA_AGGREGATOR_BIN");
  if (bin == NULL || *bin == '\0') {
    fprintf(stderr, "INA_AGGREGATOR_BIN not set: skipping\n");
    return 77;
  }
  char port_file[64];
  snprintf(port_file, sizeof port_file, "/tmp/ina_c_api_test.%ld.port", (long)getpid());
  unsigned port = 0;
  const pid_t pid = spawn_aggregator(bin, port_file, &port);
  if (pid < 0) return 1;

  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
  ina_config_t cfg = INA_CONFIG_INITIALIZER;
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.aggregator = addr;
  cfg.timeout_ms = 5000;
  cfg.block_elems = 256; /* blocks of 256 float32: the NaN check names their bounds */
  ina_comm_t* comm = NULL;
  const ina_result_t rc = ina_comm_create(&cfg, &comm);
  CHECK(rc == INA_SUCCESS);
  if (rc != INA_SUCCESS) {
    fprintf(stderr, "ina_comm_create: %s: %s\n", ina_result_string(rc), ina_last_create_error());
  } else {
    test_collectives(comm);
    ina_comm_destroy(comm);
  }
  CHECK(stop_aggregator(pid) == 0);
  unlink(port_file);

  /* Nothing listens on the port now: creation fails within the deadline and says so. */
  cfg.timeout_ms = 300;
  comm = NULL;
  CHECK(ina_comm_create(&cfg, &comm) == INA_UNAVAILABLE);
  CHECK(comm == NULL);
  CHECK_CONTAINS(ina_last_create_error(), "no answer from aggregator 127.0.0.1");
  CHECK_CONTAINS(ina_last_create_error(), "refused (no process listening?)");
  return g_failures == 0 ? 0 : 1;
}

/* ---- host only, 3 threads ---- */

enum { HOST_WORLD = 3 };

struct host_rank {
  int rank;
  int failures;
};

#define HCHECK(a, cond)                                                                            \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "rank %d: %s:%d: CHECK failed: %s\n", (a)->rank, __FILE__, __LINE__, #cond); \
      ++(a)->failures;                                                                             \
    }                                                                                              \
  } while (0)

static void* host_rank_main(void* p) {
  struct host_rank* a = (struct host_rank*)p;
  const int r = a->rank;
  ina_config_t cfg = INA_CONFIG_INITIALIZER;
  cfg.rank = r;
  cfg.world_size = HOST_WORLD;
  cfg.timeout_ms = 20000;
  ina_comm_t* comm = NULL;
  const ina_result_t rc = ina_comm_create(&cfg, &comm);
  HCHECK(a, rc == INA_SUCCESS);
  if (rc != INA_SUCCESS) {
    fprintf(stderr, "rank %d: ina_comm_create: %s\n", r, ina_last_create_error());
    return NULL;
  }
  HCHECK(a, ina_comm_on_host_path(comm) == 1);

  /* broadcast from rank 1 */
  int32_t b[5];
  for (int i = 0; i < 5; ++i) b[i] = r * 100 + i;
  HCHECK(a, ina_broadcast(comm, b, 5, INA_INT32, 1) == INA_SUCCESS);
  for (int i = 0; i < 5; ++i) HCHECK(a, b[i] == 100 + i);

  /* alltoallv: rank s sends (s + d) % 3 floats to rank d (zero for some pairs, self included) */
  size_t scount[HOST_WORLD], sdispl[HOST_WORLD], rcount[HOST_WORLD], rdispl[HOST_WORLD];
  size_t stotal = 0, rtotal = 0;
  for (int j = 0; j < HOST_WORLD; ++j) {
    scount[j] = (size_t)((r + j) % HOST_WORLD);
    sdispl[j] = stotal;
    stotal += scount[j];
    rcount[j] = (size_t)((j + r) % HOST_WORLD);
    rdispl[j] = rtotal + 1; /* a gap of one element before each block */
    rtotal += rcount[j] + 1;
  }
  float sbuf[16], rbuf[16];
  for (int j = 0; j < HOST_WORLD; ++j)
    for (size_t k = 0; k < scount[j]; ++k)
      sbuf[sdispl[j] + k] = (float)(r * 1000 + j * 10 + (int)k);
  for (int i = 0; i < 16; ++i) rbuf[i] = -1.0f;
  HCHECK(a, ina_alltoallv(comm, sbuf, scount, sdispl, rbuf, rcount, rdispl, INA_FLOAT32) ==
                INA_SUCCESS);
  for (int i = 0; i < HOST_WORLD; ++i) {
    HCHECK(a, rbuf[rdispl[i] - 1] == -1.0f); /* the gaps are untouched */
    for (size_t k = 0; k < rcount[i]; ++k)
      HCHECK(a, rbuf[rdispl[i] + k] == (float)(i * 1000 + r * 10 + (int)k));
  }

  /* allgather, reduce_scatter, alltoall, barrier */
  int32_t mine[2] = {r, r + 10}, all[2 * HOST_WORLD];
  HCHECK(a, ina_allgather(comm, mine, all, 2, INA_INT32) == INA_SUCCESS);
  for (int i = 0; i < HOST_WORLD; ++i) HCHECK(a, all[2 * i] == i && all[2 * i + 1] == i + 10);
  int32_t rs_in[2 * HOST_WORLD], rs_out[2];
  for (int i = 0; i < 2 * HOST_WORLD; ++i) rs_in[i] = i * (r + 1);
  HCHECK(a, ina_reduce_scatter(comm, rs_in, rs_out, 2, INA_INT32, INA_SUM) == INA_SUCCESS);
  HCHECK(a, rs_out[0] == 2 * r * 6 && rs_out[1] == (2 * r + 1) * 6); /* 1 + 2 + 3 = 6 */
  int32_t a2a_in[HOST_WORLD], a2a_out[HOST_WORLD];
  for (int j = 0; j < HOST_WORLD; ++j) a2a_in[j] = r * 10 + j;
  HCHECK(a, ina_alltoall(comm, a2a_in, a2a_out, 1, INA_INT32) == INA_SUCCESS);
  for (int i = 0; i < HOST_WORLD; ++i) HCHECK(a, a2a_out[i] == i * 10 + r);
  HCHECK(a, ina_barrier(comm) == INA_SUCCESS);

  /* allreduce on the host path (exact mode): small integers sum exactly */
  float f[600];
  for (int i = 0; i < 600; ++i) f[i] = (float)((i % 7) * (r + 1));
  HCHECK(a, ina_allreduce(comm, f, f, 600, INA_FLOAT32, INA_SUM) == INA_SUCCESS);
  for (int i = 0; i < 600; ++i) HCHECK(a, f[i] == (float)((i % 7) * 6));

  /* float8 e4m3 on the host path: (r + 1) on rank r sums to 6 (codes 1.0 0x38, 2.0 0x40, 3.0 0x44,
     6.0 0x4C); e5m2 MAX (1.0 0x3C, 2.0 0x40, 3.0 0x42) */
  const uint8_t e4m3_of[3] = {0x38, 0x40, 0x44}, e5m2_of[3] = {0x3C, 0x40, 0x42};
  uint8_t q8[5], m8[5];
  for (int i = 0; i < 5; ++i) {
    q8[i] = e4m3_of[r];
    m8[i] = e5m2_of[r];
  }
  HCHECK(a, ina_allreduce(comm, q8, q8, 5, INA_FLOAT8_E4M3, INA_SUM) == INA_SUCCESS);
  HCHECK(a, ina_allreduce(comm, m8, m8, 5, INA_FLOAT8_E5M2, INA_MAX) == INA_SUCCESS);
  for (int i = 0; i < 5; ++i) HCHECK(a, q8[i] == 0x4C && m8[i] == 0x42);

  /* bad arguments */
  HCHECK(a, ina_broadcast(comm, b, 5, INA_INT32, 5) == INA_INVALID_ARGUMENT);
  HCHECK(a, strstr(ina_comm_last_error(comm), "root 5") != NULL);
  HCHECK(a, ina_alltoall(comm, a2a_in, a2a_out, 1, (ina_dtype_t)9) == INA_INVALID_ARGUMENT);
  ina_comm_destroy(comm);
  return NULL;
}

static unsigned free_tcp_port(void) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  unsigned port = 0;
  if (bind(fd, (struct sockaddr*)&sa, sizeof sa) == 0 &&
      getsockname(fd, (struct sockaddr*)&sa, &len) == 0) {
    port = ntohs(sa.sin_port);
  }
  close(fd);
  return port;
}

static int run_host(void) {
  clear_env();
  const unsigned port = free_tcp_port();
  CHECK(port != 0);
  char store[64];
  snprintf(store, sizeof store, "127.0.0.1:%u", port);
  setenv("INA_STORE", store, 1);
  setenv("INA_TRANSPORT", "host", 1);
  pthread_t t[HOST_WORLD];
  struct host_rank ranks[HOST_WORLD];
  for (int i = 0; i < HOST_WORLD; ++i) {
    ranks[i].rank = i;
    ranks[i].failures = 0;
    CHECK(pthread_create(&t[i], NULL, host_rank_main, &ranks[i]) == 0);
  }
  for (int i = 0; i < HOST_WORLD; ++i) {
    pthread_join(t[i], NULL);
    g_failures += ranks[i].failures;
  }
  clear_env();
  return g_failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "unit";
  int rc;
  if (strcmp(mode, "unit") == 0) {
    rc = run_unit();
  } else if (strcmp(mode, "integration") == 0) {
    rc = run_integration();
  } else if (strcmp(mode, "host") == 0) {
    rc = run_host();
  } else {
    fprintf(stderr, "usage: %s [unit|integration|host]\n", argv[0]);
    return 1;
  }
  if (rc == 0) printf("c_api_test %s: pass\n", mode);
  return rc;
}
