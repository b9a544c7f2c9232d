// Every environment variable Config::from_env (worker/config.cc) reads, for the tests that clear
// the environment before each case (config_test.cc, c_api_test.c) and the config fuzzer, which
// sets only these. C and C++: a variable added to from_env is added here once.
#ifndef INA_TESTS_WORKER_CONFIG_ENV_VARS_H_
#define INA_TESTS_WORKER_CONFIG_ENV_VARS_H_

#include <stddef.h>

static const char* const kInaConfigEnvVars[] = {
    "INA_RANK",
    "INA_WORLD_SIZE",
    "RANK",
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "INA_AGGREGATOR",
    "INA_CONTROLLER",
    "INA_JOB_NAME",
    "INA_STORE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "INA_MESH_ADDR",
    "INA_FALLBACK",
    "INA_TRANSPORT",
    "INA_ALGO",
    "INA_VERBS_DEVICE",
    "INA_VERBS_GID_INDEX",
    "INA_HOST_TRANSPORT",
    "INA_COST_MODEL",
    "INA_JOB",
    "INA_JOB_KEY",
    "INA_BLOCK_ELEMS",
    "INA_WINDOW",
    "INA_TIMEOUT_MS",
    "INA_RETRANSMIT_US",
    "INA_DEVICE_CHUNK_ELEMS",
    "INA_DEVICE_BUFFERS",
    "INA_TEST_DROP_PERCENT",
    "INA_TEST_DUP_PERCENT",
    "INA_TEST_DELAY_US",
    "INA_TEST_STRAGGLE",
    "INA_TEST_SEED",
    "INA_LOCAL_IP",
    "INA_LOCAL_MAC",
    "INA_AGGREGATOR_MAC",
    "INA_LOCAL_PORT",
    "INA_DPDK_ARGS",
    "INA_DPDK_PORT",
    "INA_XDP_IFACE",
    "INA_XDP_QUEUE",
    "INA_XDP_COPY",
    "INA_SOCKET_IFNAME",
    "INA_REQUIRE_INC",
};
#define INA_CONFIG_ENV_VAR_COUNT (sizeof kInaConfigEnvVars / sizeof kInaConfigEnvVars[0])

#endif  // INA_TESTS_WORKER_CONFIG_ENV_VARS_H_
