// The kernel-bypass transports' configuration (INA_TRANSPORT and the INA_LOCAL_*, INA_DPDK_*,
// INA_XDP_* variables parsed by Config::from_env, then dpdk_options_from_config and
// xdp_options_from_config): every malformed or missing variable is an error naming it and the
// expected form; good values reach the options. No EAL is started and no socket is bound here.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "config_env_vars.h"
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
    for (const char* v : kInaConfigEnvVars) unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kInaConfigEnvVars) unsetenv(v);
  }
  // Config::from_env over the variables set, with this rank and an aggregator by IPv4 literal.
  static Result<Config> cfg(int rank = 1) {
    INA_ASSIGN_OR_RETURN(Config c, Config::from_env());
    c.rank = rank;
    c.world_size = 4;
    c.aggregator_host = "10.1.2.3";
    c.aggregator_port = 5000;
    return c;
  }
#if INA_HAVE_DPDK
  static Result<DpdkTransportOptions> dpdk(const Result<Config>& c) {
    if (!c.ok()) return c.status();
    return dpdk_options_from_config(c.value());
  }
#endif
#if INA_HAVE_XDP
  static Result<XdpTransportOptions> xdp(const Result<Config>& c) {
    if (!c.ok()) return c.status();
    return xdp_options_from_config(c.value());
  }
#endif
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
  expect_error(dpdk(cfg()).status(), "INA_DPDK_ARGS");
  setenv("INA_DPDK_ARGS", "--vdev 'net_memif0'", 1);
  expect_error(dpdk(cfg()).status(), "INA_DPDK_ARGS");
  setenv("INA_DPDK_ARGS", "  --no-huge   -m 256\t--vdev=net_memif0,role=client ", 1);
  expect_error(dpdk(cfg()).status(), "INA_LOCAL_IP");
  setenv("INA_LOCAL_IP", "10.1.2", 1);
  expect_error(dpdk(cfg()).status(), "INA_LOCAL_IP");
  setenv("INA_LOCAL_IP", "10.1.2.4", 1);
  setenv("INA_LOCAL_PORT", "70000", 1);
  expect_error(dpdk(cfg()).status(), "INA_LOCAL_PORT");
  setenv("INA_LOCAL_PORT", "65535", 1);
  expect_error(dpdk(cfg()).status(), "INA_LOCAL_PORT");  // + rank 1
  setenv("INA_LOCAL_PORT", "40000", 1);
  setenv("INA_AGGREGATOR_MAC", "02:00:00:00:00", 1);
  expect_error(dpdk(cfg()).status(), "INA_AGGREGATOR_MAC");
  setenv("INA_AGGREGATOR_MAC", "02:00:00:00:00:0a", 1);
  Result<Config> named = cfg();
  ASSERT_TRUE(named.ok()) << named.status().to_string();
  named->aggregator_host = "aggregator.local";
  expect_error(dpdk(named).status(), "INA_AGGREGATOR");

  auto o = dpdk(cfg());
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
  expect_error(xdp(cfg()).status(), "INA_XDP_IFACE");
  setenv("INA_XDP_IFACE", "nonexistent9", 1);
  setenv("INA_XDP_QUEUE", "x1", 1);
  expect_error(xdp(cfg()).status(), "INA_XDP_QUEUE");
  setenv("INA_XDP_QUEUE", "3", 1);
  setenv("INA_XDP_COPY", "yes", 1);
  expect_error(xdp(cfg()).status(), "INA_XDP_COPY");
  setenv("INA_XDP_COPY", "1", 1);
  expect_error(xdp(cfg()).status(), "INA_LOCAL_IP");
  setenv("INA_LOCAL_IP", "10.1.2.9", 1);
  setenv("INA_LOCAL_MAC", "zz:00:00:00:00:01", 1);
  expect_error(xdp(cfg()).status(), "INA_LOCAL_MAC");
  unsetenv("INA_LOCAL_MAC");
  auto o = xdp(cfg(2));
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->iface, "nonexistent9");
  EXPECT_EQ(o->queue, 3u);
  EXPECT_TRUE(o->force_copy);
  EXPECT_EQ(o->local_port, 47502);
  // The interface is checked when the transport is created: a clear error, before any bind.
  setenv("INA_TRANSPORT", "xdp", 1);
  Result<Config> x = cfg(2);
  ASSERT_TRUE(x.ok()) << x.status().to_string();
  EXPECT_EQ(x->transport, AggregatorTransport::kXdp);
  auto comm = Communicator::create(x.value());
  ASSERT_FALSE(comm.ok());
  expect_error(comm.status(), "INA_XDP_IFACE");
}
#endif

}  // namespace
}  // namespace ina::worker
