/* Run by minimal_root_test.py inside a root that holds only libc, libstdc++, libm, libgcc_s,
 * ld-linux, libina and some of its plugins: no DPDK, rdma-core, libxdp or CUDA.
 *
 *   minimal_root_program <aggregator host:port> <store port> <all|none> <built> [lib.so ...]
 *
 * all: every plugin of the build lies in /opt/ina/lib beside libina (their system libraries are
 * absent); none: no plugin. <built>: the plugins this build has ("dpdk,xdp,verbs,cuda", or "-"):
 * a transport without one must say libina was built without it.
 *
 * Checks that libina loaded (this program links it), then
 *   - a kernel-UDP AllReduce against the aggregator (outside the root, on loopback);
 *   - the host mesh over TCP (INA_TRANSPORT=host, INA_STORE), an AllReduce on it;
 *   - INA_TRANSPORT=dpdk and =xdp, INA_HOST_TRANSPORT=verbs: creation fails with an error naming
 *     the transport, the plugin and dlerror()'s reason (the plugin, or its system library);
 *   - ina_cuda_available says why the device path is off (the plugin, or no CUDA driver);
 *   - each further library given (libnccl-net-ina.so) loads with dlopen.
 * Exits 0 when every check passed, 1 otherwise (each failure printed). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"
#include "ina/ina.h"

static void check_contains(const char* what, const char* text, const char* needle) {
  if (text == NULL || strstr(text, needle) == NULL) {
    fprintf(stderr, "%s: \"%s\" does not contain \"%s\"\n", what, text ? text : "(null)", needle);
    ++g_failures;
  }
}

static int allreduce_ok(ina_comm_t* comm) {
  float in[64], out[64];
  for (int i = 0; i < 64; ++i) in[i] = (float)i * 0.5f;
  const ina_result_t rc = ina_allreduce(comm, in, out, 64, INA_FLOAT32, INA_SUM);
  if (rc != INA_SUCCESS) {
    fprintf(stderr, "ina_allreduce: %s: %s\n", ina_result_string(rc), ina_comm_last_error(comm));
    return 0;
  }
  for (int i = 0; i < 64; ++i) {
    if (out[i] != in[i]) {
      fprintf(stderr, "allreduce element %d: %g, expected %g\n", i, out[i], in[i]);
      return 0;
    }
  }
  return 1;
}

/* ina_comm_create with the aggregator given, world 1; returns the communicator or NULL. */
static ina_comm_t* create(const char* aggregator) {
  ina_config_t cfg = INA_CONFIG_INITIALIZER;
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.aggregator = aggregator;
  cfg.timeout_ms = 5000;
  ina_comm_t* comm = NULL;
  if (ina_comm_create(&cfg, &comm) != INA_SUCCESS) return NULL;
  return comm;
}

/* Creation must fail, its error containing each needle. */
static void expect_create_error(const char* what, const char* aggregator, const char* needles[]) {
  ina_comm_t* comm = create(aggregator);
  CHECK(comm == NULL);
  if (comm != NULL) {
    fprintf(stderr, "%s: ina_comm_create succeeded\n", what);
    ina_comm_destroy(comm);
    return;
  }
  const char* e = ina_last_create_error();
  fprintf(stderr, "%s: %s\n", what, e);
  for (int i = 0; needles[i] != NULL; ++i) check_contains(what, e, needles[i]);
}

static const char* g_built = "";

static int built(const char* name) {
  const size_t n = strlen(name);
  for (const char* p = strstr(g_built, name); p != NULL; p = strstr(p + 1, name)) {
    if ((p == g_built || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
  }
  return 0;
}

/* What the error of transport `name` must say after naming its plugin: the plugin's missing
 * system library (all), the plugin itself missing (none), or that it was not built. */
static const char* reason(const char* name, int plugins, const char* syslib) {
  static char buf[4][256];
  static int next = 0;
  char* b = buf[next++ % 4];
  if (!built(name)) {
    snprintf(b, 256, "built without");
  } else if (plugins) {
    snprintf(b, 256, "/opt/ina/lib/libina-%s.so: %s", name, syslib);
  } else {
    snprintf(b, 256, "/opt/ina/lib/libina-%s.so: cannot open shared object file", name);
  }
  return b;
}

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr,
            "usage: %s <aggregator host:port> <store port> <all|none> <built> [lib.so ...]\n",
            argv[0]);
    return 2;
  }
  const char* aggregator = argv[1];
  const char* store_port = argv[2];
  const int plugins = strcmp(argv[3], "all") == 0;
  g_built = argv[4];

  /* Kernel UDP, in-network. */
  ina_comm_t* comm = create(aggregator);
  CHECK(comm != NULL);
  if (comm == NULL) {
    fprintf(stderr, "kernel UDP: ina_comm_create: %s\n", ina_last_create_error());
  } else {
    CHECK(allreduce_ok(comm));
    CHECK(ina_comm_on_host_path(comm) == 0);
    ina_comm_destroy(comm);
  }

  /* The host mesh over TCP (INA_HOST_TRANSPORT=auto finds no verbs and takes TCP). */
  char store[64];
  snprintf(store, sizeof store, "127.0.0.1:%s", store_port);
  setenv("INA_STORE", store, 1);
  setenv("INA_TRANSPORT", "host", 1);
  comm = create(aggregator);
  CHECK(comm != NULL);
  if (comm == NULL) {
    fprintf(stderr, "host mesh: ina_comm_create: %s\n", ina_last_create_error());
  } else {
    CHECK(ina_comm_on_host_path(comm) == 1);
    CHECK(allreduce_ok(comm));
    ina_comm_destroy(comm);
  }
  /* INA_HOST_TRANSPORT=verbs: the verbs plugin, or libibverbs, cannot be loaded. */
  setenv("INA_HOST_TRANSPORT", "verbs", 1);
  {
    const char* n[] = {"INA_HOST_TRANSPORT=verbs", built("verbs") ? "libina-verbs.so" : "rdma",
                       reason("verbs", plugins, "libibverbs.so.1: cannot open shared object file"),
                       NULL};
    expect_create_error("verbs", aggregator, n);
  }
  unsetenv("INA_HOST_TRANSPORT");
  unsetenv("INA_STORE");

  /* INA_TRANSPORT=dpdk and xdp: the variables are valid, the plugin or its libraries missing. */
  setenv("INA_LOCAL_IP", "127.0.0.2", 1);
  setenv("INA_TRANSPORT", "dpdk", 1);
  setenv("INA_DPDK_ARGS", "--no-huge -m 64 --no-shconf --no-pci --vdev=net_null0", 1);
  {
    const char* n[] = {"INA_TRANSPORT=dpdk", built("dpdk") ? "libina-dpdk.so" : "dpdk",
                       reason("dpdk", plugins, "librte_"), NULL};
    expect_create_error("dpdk", "127.0.0.1:47474", n);
  }
  setenv("INA_TRANSPORT", "xdp", 1);
  setenv("INA_XDP_IFACE", "lo", 1);
  {
    const char* n[] = {"INA_TRANSPORT=xdp", built("xdp") ? "libina-xdp.so" : "xdp",
                       reason("xdp", plugins, "libxdp.so.1: cannot open shared object file"), NULL};
    expect_create_error("xdp", "127.0.0.1:47474", n);
  }
  unsetenv("INA_TRANSPORT");

  /* The device path says why it is off. */
  const char* why = NULL;
  CHECK(ina_cuda_available(&why) == 0);
  fprintf(stderr, "cuda: %s\n", why ? why : "(null)");
  if (!built("cuda")) {
    check_contains("cuda", why, "built without CUDA");
  } else if (plugins) {
    check_contains("cuda", why, "cuda"); /* the plugin loaded: the runtime finds no driver */
  } else {
    check_contains("cuda", why, "cannot load the CUDA plugin libina-cuda.so");
    check_contains("cuda", why, "/opt/ina/lib/libina-cuda.so: cannot open shared object file");
  }

  for (int i = 5; i < argc; ++i) {
    void* h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
      fprintf(stderr, "dlopen %s: %s\n", argv[i], dlerror());
      ++g_failures;
    }
  }
  fprintf(stderr, "%s: %d failure(s)\n", argv[0], g_failures);
  return g_failures == 0 ? 0 : 1;
}
