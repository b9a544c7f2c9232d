// The kernel-bypass transports' configuration (dpdk_options_from_env, xdp_options_from_env, and
// INA_TRANSPORT in Config::from_env): every malformed variable is an error naming it and the
// expected form; good values are parsed. No EAL is started and no socket is bound here.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "ina/ina.hpp"
#include "ina_config.h"
#if INA_HAVE_DPDK
#include "worker/transport/dpdk_transport.h"
#endif
#if INA_HAVE_XDP
#include "worker/transport/xdp_transport.h"
#endif

namespace ina::worker {
namespace {

class Env : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
  }
  static Config cfg(int rank = 1) {
    Config c;
    c.rank = rank;
    c.world_size = 4;
    c.aggregator_host = "10.1.2.3";
    c.aggregator_port = 5000;
    return c;
  }
  static constexpr const char* kVars[] = {"INA_TRANSPORT",      "INA_DPDK_ARGS", "INA_DPDK_PORT",
                                          "INA_LOCAL_IP",       "INA_LOCAL_MAC", "INA_LOCAL_PORT",
                                          "INA_AGGREGATOR_MAC", "INA_XDP_IFACE", "INA_XDP_QUEUE",
                                          "INA_XDP_COPY",       "INA_RANK",      "INA_WORLD_SIZE"};
};

void expect_error(const Status& s, const std::string& names) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find(names), std::string::npos) << s.to_string();
}

TEST_F(Env, TransportNamesAreStrict) {
  setenv("INA_RANK", "0", 1);
  setenv("INA_WORLD_SIZE", "2", 1);
  for (const char* ok : {"dpdk", "xdp", "udp", "auto"}) {
    setenv("INA_TRANSPORT", ok, 1);
    EXPECT_TRUE(Config::from_env().ok()) << ok;
  }
  setenv("INA_TRANSPORT", "dpdkk", 1);
  auto r = Config::from_env();
  ASSERT_FALSE(r.ok());
  expect_error(r.status(), "INA_TRANSPORT");
  EXPECT_NE(r.status().message().find("dpdk, xdp"), std::string::npos) << r.status().to_string();
}

#if INA_HAVE_DPDK
TEST_F(Env, DpdkOptionsAreParsedStrictly) {
  expect_error(dpdk_options_from_env(cfg()).status(), "INA_DPDK_ARGS");
  setenv("INA_DPDK_ARGS", "--vdev 'net_memif0'", 1);
  expect_error(dpdk_options_from_env(cfg()).status(), "INA_DPDK_ARGS");
  setenv("INA_DPDK_ARGS", "  --no-huge   -m 256\t--vdev=net_memif0,role=client ", 1);
  expect_error(dpdk_options_from_env(cfg()).status(), "INA_LOCAL_IP");
  setenv("INA_LOCAL_IP", "10.1.2", 1);
  expect_error(dpdk_options_from_env(cfg()).status(), "INA_LOCAL_IP");
  setenv("INA_LOCAL_IP", "10.1.2.4", 1);
  setenv("INA_LOCAL_PORT", "70000", 1);
  expect_error(dpdk_options_from_env(cfg()).status(), "INA_LOCAL_PORT");
  setenv("INA_LOCAL_PORT", "65535", 1);
  expect_error(dpdk_options_from_env(cfg()).status(), "INA_LOCAL_PORT");  // + rank 1
  setenv("INA_LOCAL_PORT", "40000", 1);
  setenv("INA_AGGREGATOR_MAC", "02:00:00:00:00", 1);
  expect_error(dpdk_options_from_env(cfg()).status(), "INA_AGGREGATOR_MAC");
  setenv("INA_AGGREGATOR_MAC", "02:00:00:00:00:0a", 1);
  Config named = cfg();
  named.aggregator_host = "aggregator.local";
  expect_error(dpdk_options_from_env(named).status(), "INA_AGGREGATOR");

  auto o = dpdk_options_from_env(cfg());
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->eal_args,
            (std::vector<std::string>{"--no-huge", "-m", "256", "--vdev=net_memif0,role=client"}));
  EXPECT_EQ(o->local_ip, 0x0A010204u);
  EXPECT_EQ(o->local_port, 40001);
  EXPECT_EQ(o->aggregator_ip, 0x0A010203u);
  EXPECT_EQ(o->aggregator_port, 5000);
  EXPECT_TRUE(o->aggregator_mac_set);
  EXPECT_EQ(o->aggregator_mac[5], 0x0A);
  EXPECT_FALSE(o->local_mac_set);
}
#endif

#if INA_HAVE_XDP
TEST_F(Env, XdpOptionsAreParsedStrictly) {
  expect_error(xdp_options_from_env(cfg()).status(), "INA_XDP_IFACE");
  setenv("INA_XDP_IFACE", "nonexistent9", 1);
  setenv("INA_XDP_QUEUE", "x1", 1);
  expect_error(xdp_options_from_env(cfg()).status(), "INA_XDP_QUEUE");
  setenv("INA_XDP_QUEUE", "3", 1);
  setenv("INA_XDP_COPY", "yes", 1);
  expect_error(xdp_options_from_env(cfg()).status(), "INA_XDP_COPY");
  setenv("INA_XDP_COPY", "1", 1);
  expect_error(xdp_options_from_env(cfg()).status(), "INA_LOCAL_IP");
  setenv("INA_LOCAL_IP", "10.1.2.9", 1);
  setenv("INA_LOCAL_MAC", "zz:00:00:00:00:01", 1);
  expect_error(xdp_options_from_env(cfg()).status(), "INA_LOCAL_MAC");
  unsetenv("INA_LOCAL_MAC");
  auto o = xdp_options_from_env(cfg(2));
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->iface, "nonexistent9");
  EXPECT_EQ(o->queue, 3u);
  EXPECT_TRUE(o->force_copy);
  EXPECT_EQ(o->local_port, 47502);
  // The interface is checked when the transport is created: a clear error, before any bind.
  Config x = cfg(2);
  x.transport = AggregatorTransport::kXdp;  // what INA_TRANSPORT=xdp gives through from_env
  auto comm = Communicator::create(x);
  ASSERT_FALSE(comm.ok());
  expect_error(comm.status(), "INA_XDP_IFACE");
}
#endif

}  // namespace
}  // namespace ina::worker
