// The main() of the in-process DPDK aggregator tests (dpdk_backend_test, dpdk_multiqueue_test):
// the EAL without hugepages, three lcores (main + two workers) mapped onto the CPUs this process
// may use (even one), its own file prefix, and a pool for the test's frames; exit 77 (SKIP) with
// the reason when either cannot start.
#pragma once

#include <gtest/gtest.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "aggregator/dpdk_backend.h"

namespace ina::agg::testing {

// Starts the EAL as `name` with file prefix `prefix` + pid, creates the frame pool `pool_name`
// into *pool, sets *workers to the worker lcores, runs every test and releases the EAL.
inline int run_dpdk_tests(int argc, char** argv, const std::string& name, const std::string& prefix,
                          const char* pool_name, rte_mempool** pool, unsigned* workers) {
  ::testing::InitGoogleTest(&argc, argv);
  const std::string lcores = spread_lcores(3);
  const std::vector<std::string> eal = {name,
                                        "--no-huge",
                                        "-m",
                                        "512",
                                        "--no-shconf",
                                        "--no-pci",
                                        "--no-telemetry",
                                        "--log-level=3",
                                        "--file-prefix",
                                        prefix + std::to_string(getpid()),
                                        "--lcores",
                                        lcores};
  const Status st = dpdk_eal_init(eal);
  if (!st.ok()) {
    std::printf("SKIP: %s\n", st.to_string().c_str());
    return 77;
  }
  *workers = rte_lcore_count() - 1;
  *pool = rte_pktmbuf_pool_create(pool_name, 8191, 256, 0, 4096 + 128,
                                  static_cast<int>(rte_socket_id()));
  if (*pool == nullptr) {
    std::printf("SKIP: cannot create the test's mbuf pool: %s\n", rte_strerror(rte_errno));
    return 77;
  }
  const int rc = RUN_ALL_TESTS();
  dpdk_eal_cleanup();
  return rc;
}

}  // namespace ina::agg::testing
