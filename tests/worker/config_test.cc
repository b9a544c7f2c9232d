// Config::from_env and Config::validate: every variable parsed, every malformed value rejected
// with a message that names the variable, and validate() naming the first bad field.
//
// Length: one suite over one subject; its cases share the helpers above them and each one is
// independent (run one with --gtest_filter).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "config_env_vars.h"
#include "ina/ina.hpp"
#include "worker/config_internal.h"

namespace ina {
namespace {

class ConfigEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kInaConfigEnvVars) unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kInaConfigEnvVars) unsetenv(v);
  }
  static Config parse_ok() {
    Result<Config> r = Config::from_env();
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r.value() : Config{};
  }
  // from_env must fail with kInvalidArgument and a message naming `var` and the bad value.
  static void expect_rejected(const char* var, const char* value) {
    setenv(var, value, 1);
    Result<Config> r = Config::from_env();
    ASSERT_FALSE(r.ok()) << var << "=" << value << " was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(var), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(std::string("\"") + value + "\""), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("expected"), std::string::npos) << r.status().message();
    unsetenv(var);
  }
};

TEST_F(ConfigEnvTest, DefaultsWithoutEnvironment) {
  const Config c = parse_ok();
  EXPECT_EQ(c.rank, -1);
  EXPECT_EQ(c.world_size, 0);
  EXPECT_EQ(c.aggregator_host, "127.0.0.1");
  EXPECT_EQ(c.aggregator_port, 47474);
  EXPECT_EQ(c.job, 1u);
  EXPECT_EQ(c.job_key, 0u);
  EXPECT_EQ(c.block_elems, 2048u);
  EXPECT_EQ(c.window, 128u);
  EXPECT_EQ(c.timeout.count(), 30000);
  EXPECT_EQ(c.retransmit.count(), 2000);
  EXPECT_EQ(c.fault.drop_send_percent, 0);
  EXPECT_EQ(c.fault.dup_send_percent, 0);
  EXPECT_EQ(c.fault.delay_us, 0u);
  EXPECT_EQ(c.fault.seed, 0u);
}

TEST_F(ConfigEnvTest, ParsesEveryVariable) {
  setenv("INA_RANK", "3", 1);
  setenv("INA_WORLD_SIZE", "8", 1);
  setenv("INA_AGGREGATOR", "agg.example:5000", 1);
  setenv("INA_JOB", "42", 1);
  setenv("INA_JOB_KEY", "0123456789ABCDEFdeadbeef00000001", 1);
  setenv("INA_BLOCK_ELEMS", "1024", 1);
  setenv("INA_WINDOW", "32768", 1);
  setenv("INA_TIMEOUT_MS", "1500", 1);
  setenv("INA_RETRANSMIT_US", "250", 1);
  setenv("INA_TEST_DROP_PERCENT", "2.5", 1);
  setenv("INA_TEST_DUP_PERCENT", "100", 1);
  setenv("INA_TEST_DELAY_US", "700", 1);
  setenv("INA_TEST_SEED", "12345", 1);
  const Config c = parse_ok();
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.world_size, 8);
  EXPECT_EQ(c.aggregator_host, "agg.example");
  EXPECT_EQ(c.aggregator_port, 5000);
  EXPECT_EQ(c.job, 42u);
  EXPECT_EQ(c.job_key, (Key128{0xDEADBEEF00000001ull, 0x0123456789ABCDEFull}));
  EXPECT_EQ(c.block_elems, 1024u);
  EXPECT_EQ(c.window, 32768u);
  EXPECT_EQ(c.timeout.count(), 1500);
  EXPECT_EQ(c.retransmit.count(), 250);
  EXPECT_DOUBLE_EQ(c.fault.drop_send_percent, 2.5);
  EXPECT_DOUBLE_EQ(c.fault.drop_recv_percent, 2.5);  // one knob for both directions
  EXPECT_DOUBLE_EQ(c.fault.dup_send_percent, 100.0);
  EXPECT_EQ(c.fault.delay_us, 700u);
  EXPECT_EQ(c.fault.seed, 12345u);
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
}

// Host only (a store, nothing in-network): float unless INA_FALLBACK says exact; the mesh's
// interface; INA_REQUIRE_INC.
TEST_F(ConfigEnvTest, HostOnlyFallbackInterfaceAndRequireInc) {
  Config c = parse_ok();
  EXPECT_FALSE(c.require_inc);
  EXPECT_EQ(c.mesh_interface, "");
  setenv("INA_STORE", "127.0.0.1:29500", 1);
  c = parse_ok();
  EXPECT_TRUE(c.host_only);
  EXPECT_EQ(c.fallback, FallbackMode::kFloat);  // nothing to be bitwise equal to
  setenv("INA_FALLBACK", "exact", 1);
  EXPECT_EQ(parse_ok().fallback, FallbackMode::kExact);
  unsetenv("INA_FALLBACK");
  setenv("INA_AGGREGATOR", "127.0.0.1:47474", 1);
  c = parse_ok();
  EXPECT_FALSE(c.host_only);
  EXPECT_EQ(c.fallback, FallbackMode::kExact);  // the fallback of an in-network job

  setenv("INA_SOCKET_IFNAME", "eth1", 1);
  setenv("INA_REQUIRE_INC", "1", 1);
  c = parse_ok();
  EXPECT_EQ(c.mesh_interface, "eth1");
  EXPECT_TRUE(c.require_inc);
  setenv("INA_REQUIRE_INC", "0", 1);
  EXPECT_FALSE(parse_ok().require_inc);
  expect_rejected("INA_REQUIRE_INC", "yes");
  expect_rejected("INA_SOCKET_IFNAME", "a/b");
  expect_rejected("INA_SOCKET_IFNAME", "averyveryverylongname0");
}

TEST_F(ConfigEnvTest, HostPathVariables) {
  Config c = parse_ok();
  EXPECT_EQ(c.store, "");
  EXPECT_FALSE(c.host_only);
  EXPECT_EQ(c.fallback, FallbackMode::kExact);
  EXPECT_EQ(c.mesh_address, "");  // found when the mesh forms (host/mesh_address.h)

  // MASTER_ADDR/MASTER_PORT without INA_AGGREGATOR: a store and no aggregator, so host only.
  setenv("MASTER_ADDR", "10.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  c = parse_ok();
  EXPECT_EQ(c.store, "10.0.0.1:29500");
  EXPECT_TRUE(c.host_only);

  // INA_STORE wins over MASTER_*; with an aggregator the host mesh is the fallback.
  setenv("INA_STORE", "store.example:1234", 1);
  setenv("INA_AGGREGATOR", "agg.example:5000", 1);
  setenv("INA_FALLBACK", "float", 1);
  setenv("INA_MESH_ADDR", "10.0.0.7", 1);
  c = parse_ok();
  EXPECT_EQ(c.store, "store.example:1234");
  EXPECT_FALSE(c.host_only);
  EXPECT_EQ(c.fallback, FallbackMode::kFloat);
  EXPECT_EQ(c.mesh_address, "10.0.0.7");

  setenv("INA_TRANSPORT", "host", 1);
  EXPECT_TRUE(parse_ok().host_only);
  setenv("INA_TRANSPORT", "auto", 1);
  EXPECT_FALSE(parse_ok().host_only);

  setenv("INA_COST_MODEL", "25,0.5", 1);
  EXPECT_EQ(parse_ok().cost_model, "25,0.5");
  unsetenv("INA_COST_MODEL");
  EXPECT_EQ(parse_ok().cost_model, "");

  expect_rejected("INA_FALLBACK", "fast");
  expect_rejected("INA_COST_MODEL", "25");
  expect_rejected("INA_COST_MODEL", "25,0.5us");
  expect_rejected("INA_TRANSPORT", "rdma2");
  expect_rejected("INA_STORE", "host:0");
  // A store needs its port (rank 0 serves it there): the message names INA_STORE.
  expect_rejected("INA_STORE", "bogus");
  expect_rejected("INA_STORE", "[::1]");
  unsetenv("INA_STORE");
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  expect_rejected("INA_STORE", "bogus");
}

// The variables the communicator and the host mesh used to read themselves (INA_TRANSPORT's kind,
// INA_ALGO, INA_VERBS_*): parsed into Config once, strictly. INA_ALGO=bogus was ignored before
// (the cost model's choice ran instead).
TEST_F(ConfigEnvTest, TransportAlgorithmAndVerbsAreParsedStrictly) {
  Config c = parse_ok();
  EXPECT_EQ(c.transport, AggregatorTransport::kAuto);
  EXPECT_EQ(c.host_algorithm, "");
  EXPECT_EQ(c.verbs_device, "");
  EXPECT_EQ(c.verbs_gid_index, 0);
  const std::pair<const char*, AggregatorTransport> kinds[] = {
      {"auto", AggregatorTransport::kAuto},
      {"udp", AggregatorTransport::kUdp},
      {"dpdk", AggregatorTransport::kDpdk},
      {"xdp", AggregatorTransport::kXdp},
      {"host", AggregatorTransport::kHost}};
  for (const auto& [name, kind] : kinds) {
    setenv("INA_TRANSPORT", name, 1);
    c = parse_ok();
    EXPECT_EQ(c.transport, kind) << name;
    EXPECT_EQ(c.host_only, kind == AggregatorTransport::kHost) << name;
  }
  unsetenv("INA_TRANSPORT");
  for (const char* a : {"ring", "hd", "tree"}) {
    setenv("INA_ALGO", a, 1);
    EXPECT_EQ(parse_ok().host_algorithm, a);
  }
  setenv("INA_VERBS_DEVICE", "mlx5_0:1", 1);
  setenv("INA_VERBS_GID_INDEX", "3", 1);
  c = parse_ok();
  EXPECT_EQ(c.verbs_device, "mlx5_0:1");
  EXPECT_EQ(c.verbs_gid_index, 3);
  unsetenv("INA_VERBS_DEVICE");
  unsetenv("INA_VERBS_GID_INDEX");
  unsetenv("INA_ALGO");

  expect_rejected("INA_ALGO", "bogus");
  {
    setenv("INA_ALGO", "bogus", 1);
    Result<Config> r = Config::from_env();
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("ring, hd or tree"), std::string::npos)
        << r.status().message();
    unsetenv("INA_ALGO");
  }
  expect_rejected("INA_ALGO", "Ring");
  expect_rejected("INA_TRANSPORT", "bogus");
  expect_rejected("INA_VERBS_DEVICE", "mlx5_0:0");
  expect_rejected("INA_VERBS_DEVICE", "a/b");
  expect_rejected("INA_VERBS_GID_INDEX", "256");
  expect_rejected("INA_VERBS_GID_INDEX", "1x");

  // The same fields set in code are checked by validate, naming the field and the variable.
  Config v;
  v.rank = 0;
  v.world_size = 1;
  v.host_algorithm = "bogus";
  EXPECT_NE(v.validate().message().find("INA_ALGO"), std::string::npos) << v.validate().message();
  v.host_algorithm = "hd";
  EXPECT_TRUE(v.validate().ok()) << v.validate().to_string();
  v.verbs_gid_index = -1;
  EXPECT_NE(v.validate().message().find("verbs_gid_index"), std::string::npos);
  v.verbs_gid_index = 0;
  v.verbs_device = "x y";
  EXPECT_NE(v.validate().message().find("INA_VERBS_DEVICE"), std::string::npos);
  v.verbs_device.clear();
  v.transport = static_cast<AggregatorTransport>(9);
  EXPECT_NE(v.validate().message().find("INA_TRANSPORT"), std::string::npos);
}

// The kernel-bypass transports' variables (INA_TRANSPORT=dpdk|xdp), which bypass_endpoint.cc read
// itself when the transport was built: parsed by from_env whatever INA_TRANSPORT says, a missing
// required one rejected by validate for the transport that needs it.
TEST_F(ConfigEnvTest, BypassVariablesAreParsedStrictly) {
  Config c = parse_ok();
  EXPECT_EQ(c.local_ip, 0u);
  EXPECT_FALSE(c.local_mac.has_value());
  EXPECT_FALSE(c.aggregator_mac.has_value());
  EXPECT_EQ(c.local_port, 47500);
  EXPECT_TRUE(c.dpdk_args.empty());
  EXPECT_EQ(c.dpdk_port, "");
  EXPECT_EQ(c.xdp_iface, "");
  EXPECT_EQ(c.xdp_queue, 0u);
  EXPECT_FALSE(c.xdp_copy);

  setenv("INA_LOCAL_IP", "10.1.2.4", 1);
  setenv("INA_LOCAL_MAC", "02:00:00:00:00:0b", 1);
  setenv("INA_AGGREGATOR_MAC", "02:00:00:00:00:0A", 1);
  setenv("INA_LOCAL_PORT", "40000", 1);
  setenv("INA_DPDK_ARGS", "  --no-huge   -m 256\t--vdev=net_memif0,role=client ", 1);
  setenv("INA_DPDK_PORT", "net_memif0", 1);
  setenv("INA_XDP_IFACE", "veth1", 1);
  setenv("INA_XDP_QUEUE", "3", 1);
  setenv("INA_XDP_COPY", "1", 1);
  c = parse_ok();
  EXPECT_EQ(c.local_ip, 0x0A010204u);
  ASSERT_TRUE(c.local_mac.has_value());
  EXPECT_EQ((*c.local_mac)[5], 0x0B);
  ASSERT_TRUE(c.aggregator_mac.has_value());
  EXPECT_EQ((*c.aggregator_mac)[5], 0x0A);
  EXPECT_EQ(c.local_port, 40000);
  EXPECT_EQ(c.dpdk_args,
            (std::vector<std::string>{"--no-huge", "-m", "256", "--vdev=net_memif0,role=client"}));
  EXPECT_EQ(c.dpdk_port, "net_memif0");
  EXPECT_EQ(c.xdp_iface, "veth1");
  EXPECT_EQ(c.xdp_queue, 3u);
  EXPECT_TRUE(c.xdp_copy);
  setenv("INA_XDP_COPY", "0", 1);
  EXPECT_FALSE(parse_ok().xdp_copy);
  for (const char* v : kInaConfigEnvVars) unsetenv(v);

  // Malformed: rejected by from_env even when INA_TRANSPORT does not use them.
  expect_rejected("INA_LOCAL_IP", "10.1.2");
  expect_rejected("INA_LOCAL_IP", "0.0.0.0");
  expect_rejected("INA_LOCAL_MAC", "zz:00:00:00:00:01");
  expect_rejected("INA_LOCAL_MAC", "02:00:00:00:00");
  expect_rejected("INA_AGGREGATOR_MAC", "02:00:00:00:00:0a:0b");
  expect_rejected("INA_LOCAL_PORT", "0");
  expect_rejected("INA_LOCAL_PORT", "70000");
  expect_rejected("INA_LOCAL_PORT", "4x");
  expect_rejected("INA_DPDK_ARGS", "--vdev 'net_memif0'");
  expect_rejected("INA_DPDK_ARGS", "--vdev \"net_memif0\"");
  expect_rejected("INA_DPDK_ARGS", "   ");
  expect_rejected("INA_XDP_QUEUE", "x1");
  expect_rejected("INA_XDP_QUEUE", "-1");
  expect_rejected("INA_XDP_QUEUE", "4294967296");
  expect_rejected("INA_XDP_COPY", "yes");
  setenv("INA_TRANSPORT", "xdp", 1);
  expect_rejected("INA_LOCAL_MAC", "02-00-00-00-00-01");
  unsetenv("INA_TRANSPORT");

  // Required for the chosen transport: validate names the variable.
  setenv("INA_RANK", "1", 1);
  setenv("INA_WORLD_SIZE", "4", 1);
  setenv("INA_TRANSPORT", "xdp", 1);
  setenv("INA_XDP_IFACE", "veth1", 1);
  c = parse_ok();  // from_env parses; what is missing is validate's
  Status s = c.validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("INA_LOCAL_IP"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("INA_TRANSPORT=xdp"), std::string::npos) << s.message();
  unsetenv("INA_XDP_IFACE");
  setenv("INA_LOCAL_IP", "10.1.2.4", 1);
  s = parse_ok().validate();
  EXPECT_NE(s.message().find("INA_XDP_IFACE"), std::string::npos) << s.message();
  setenv("INA_XDP_IFACE", "veth1", 1);
  EXPECT_TRUE(parse_ok().validate().ok()) << parse_ok().validate().to_string();
  setenv("INA_TRANSPORT", "dpdk", 1);
  s = parse_ok().validate();
  EXPECT_NE(s.message().find("INA_DPDK_ARGS"), std::string::npos) << s.message();
  setenv("INA_DPDK_ARGS", "--no-huge --vdev=net_null0", 1);
  EXPECT_TRUE(parse_ok().validate().ok()) << parse_ok().validate().to_string();
  setenv("INA_LOCAL_PORT", "65535", 1);  // + rank 1
  s = parse_ok().validate();
  EXPECT_NE(s.message().find("INA_LOCAL_PORT"), std::string::npos) << s.message();
  setenv("INA_LOCAL_PORT", "65534", 1);
  EXPECT_TRUE(parse_ok().validate().ok()) << parse_ok().validate().to_string();
  // Not needed by the other transports, nor when the job runs on the host mesh only.
  unsetenv("INA_LOCAL_IP");
  unsetenv("INA_DPDK_ARGS");
  setenv("INA_TRANSPORT", "udp", 1);
  EXPECT_TRUE(parse_ok().validate().ok()) << parse_ok().validate().to_string();
  setenv("INA_TRANSPORT", "dpdk", 1);
  setenv("INA_STORE", "127.0.0.1:29500", 1);  // no aggregator named: host only
  c = parse_ok();
  EXPECT_TRUE(c.host_only);
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();

  // The same fields set in code (a Config with transport kDpdk or kXdp) are checked alike.
  Config v;
  v.rank = 0;
  v.world_size = 1;
  v.transport = AggregatorTransport::kDpdk;
  EXPECT_NE(v.validate().message().find("INA_DPDK_ARGS"), std::string::npos);
  v.dpdk_args = {"--no-huge"};
  EXPECT_NE(v.validate().message().find("INA_LOCAL_IP"), std::string::npos);
  v.local_ip = 0x0A000001;
  EXPECT_TRUE(v.validate().ok()) << v.validate().to_string();
  v.local_port = 0;
  EXPECT_NE(v.validate().message().find("local_port"), std::string::npos);
}

// from_env_with_store: the application's store (PyTorch's, the MPI shim's) counts as a store for
// the host-only rule, and host_only_reason says what chose the host mesh.
TEST_F(ConfigEnvTest, ApplicationStoreFollowsTheSameRules) {
  auto with_store = [] {
    Result<Config> r = Config::from_env_with_store();
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r.value() : Config{};
  };
  // Nothing names an aggregator: the host mesh, with the reason.
  Config c = with_store();
  EXPECT_TRUE(c.host_only);
  EXPECT_NE(host_only_reason(c).find("neither INA_AGGREGATOR nor INA_CONTROLLER"),
            std::string::npos)
      << host_only_reason(c);
  EXPECT_FALSE(parse_ok().host_only);  // no store at all: the default aggregator, no fallback
  // INA_CONTROLLER alone: admission decides (not host only).
  setenv("INA_CONTROLLER", "127.0.0.1:47480", 1);
  c = with_store();
  EXPECT_FALSE(c.host_only);
  EXPECT_EQ(host_only_reason(c), "");
  EXPECT_EQ(c.controller_host, "127.0.0.1");
  unsetenv("INA_CONTROLLER");
  setenv("INA_AGGREGATOR", "10.0.0.9:5000", 1);
  c = with_store();
  EXPECT_FALSE(c.host_only);
  EXPECT_EQ(c.aggregator_host, "10.0.0.9");
  setenv("INA_TRANSPORT", "host", 1);
  c = with_store();
  EXPECT_TRUE(c.host_only);
  EXPECT_EQ(host_only_reason(c), "INA_TRANSPORT=host");
  unsetenv("INA_TRANSPORT");
  c = with_store();
  c.host_only = true;
  EXPECT_NE(host_only_reason(c).find("application"), std::string::npos) << host_only_reason(c);
}

TEST(ConfigValidateTest, HostOnlyNeedsAStore) {
  Config c;
  c.rank = 0;
  c.world_size = 1;
  c.host_only = true;
  const Status s = c.validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("INA_STORE"), std::string::npos) << s.message();
  c.store = "127.0.0.1:29500";
  EXPECT_TRUE(c.validate().ok());
}

TEST(ConfigValidateTest, CostModelIsParsed) {
  Config c;
  c.rank = 0;
  c.world_size = 1;
  c.cost_model = "20,0.4,0.1";
  EXPECT_TRUE(c.validate().ok());
  c.cost_model = "20;0.4";
  const Status s = c.validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("INA_COST_MODEL"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("alpha_us,beta_ns_per_byte"), std::string::npos) << s.message();
}

TEST_F(ConfigEnvTest, JobKeyIs32HexDigits) {
  setenv("INA_JOB_KEY", "ffffffffffffffffffffffffffffffff", 1);
  EXPECT_EQ(parse_ok().job_key, (Key128{UINT64_MAX, UINT64_MAX}));
  setenv("INA_JOB_KEY", "00000000000000000000000000000010", 1);
  EXPECT_EQ(parse_ok().job_key, (Key128{16, 0}));
  unsetenv("INA_JOB_KEY");
  EXPECT_TRUE(parse_ok().job_key.is_zero());  // none: the zero key
  // Anything else is refused, naming the variable and the form, without echoing the value.
  for (const char* bad : {"0x10", "16", "18446744073709551615",
                          "0x0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdeg",
                          "0123456789abcdef0123456789abcde", "0123456789abcdef0123456789abcdef0"}) {
    setenv("INA_JOB_KEY", bad, 1);
    Result<Config> r = Config::from_env();
    ASSERT_FALSE(r.ok()) << bad << " was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    const std::string m = r.status().message();
    EXPECT_NE(m.find("INA_JOB_KEY"), std::string::npos) << m;
    EXPECT_NE(m.find("expected 32 hexadecimal digits"), std::string::npos) << m;
    EXPECT_EQ(m.find(bad), std::string::npos) << "the key was echoed: " << m;
  }
  unsetenv("INA_JOB_KEY");
}

TEST_F(ConfigEnvTest, EmptyVariableKeepsDefault) {
  setenv("INA_WINDOW", "", 1);
  EXPECT_EQ(parse_ok().window, 128u);
}

TEST_F(ConfigEnvTest, AggregatorForms) {
  struct Case {
    const char* value;
    const char* host;
    uint16_t port;
  } cases[] = {
      {"10.0.0.7", "10.0.0.7", 47474},         {"10.0.0.7:1", "10.0.0.7", 1},
      {"localhost:65535", "localhost", 65535}, {"[::1]", "::1", 47474},
      {"[fe80::1]:9000", "fe80::1", 9000},     {"::1", "::1", 47474},
  };
  for (const Case& k : cases) {
    setenv("INA_AGGREGATOR", k.value, 1);
    const Config c = parse_ok();
    EXPECT_EQ(c.aggregator_host, k.host) << k.value;
    EXPECT_EQ(c.aggregator_port, k.port) << k.value;
  }
}

// INA_AGGREGATOR=h1:p1,h2:p2,...: the job sharded over those aggregators, in that order.
TEST_F(ConfigEnvTest, AggregatorListShardsTheJob) {
  setenv("INA_AGGREGATOR", "10.0.0.1:5000,agg-b,[fe80::2]:6000", 1);
  Config c = parse_ok();
  ASSERT_EQ(c.aggregators.size(), 3u);
  EXPECT_EQ(c.aggregators[0].host, "10.0.0.1");
  EXPECT_EQ(c.aggregators[0].port, 5000);
  EXPECT_EQ(c.aggregators[1].host, "agg-b");
  EXPECT_EQ(c.aggregators[1].port, 47474);
  EXPECT_EQ(c.aggregators[2].host, "fe80::2");
  EXPECT_EQ(c.aggregators[2].port, 6000);
  // Shard 0 is also the aggregator_host/port (what messages and single-aggregator code read).
  EXPECT_EQ(c.aggregator_host, "10.0.0.1");
  EXPECT_EQ(c.aggregator_port, 5000);
  EXPECT_EQ(worker::aggregator_list(c).size(), 3u);
  c.rank = 0;
  c.world_size = 2;
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
  // One element: an ordinary single-aggregator job.
  setenv("INA_AGGREGATOR", "10.0.0.1:5000", 1);
  c = parse_ok();
  EXPECT_TRUE(c.aggregators.empty());
  ASSERT_EQ(worker::aggregator_list(c).size(), 1u);
  EXPECT_EQ(worker::aggregator_list(c)[0].port, 5000);
}

// Each malformed list names the variable, the element's position and its text.
TEST_F(ConfigEnvTest, AggregatorListErrorsNameTheElement) {
  struct Bad {
    const char* value;
    const char* names;  // expected in the message
  } cases[] = {
      {"a:1,b:0", "INA_AGGREGATOR element 2 of 2=\"b:0\""},
      {"a:1,,b:2", "INA_AGGREGATOR element 2 of 3=\"\""},
      {"a:1,b:2,", "INA_AGGREGATOR element 3 of 3=\"\""},
      {",a:1", "INA_AGGREGATOR element 1 of 2"},
      {"a:1,b:x", "INA_AGGREGATOR element 2 of 2=\"b:x\""},
      {"a:1,b:2,a:1", "repeats element 1"},
      {"a:1, b:2", "INA_AGGREGATOR element 2 of 2=\" b:2\""},  // no stray spaces
      {"10.0.0.1,10.0.0.1:47474", "repeats element 1"},        // the same address spelled twice
  };
  for (const Bad& b : cases) {
    setenv("INA_AGGREGATOR", b.value, 1);
    Result<Config> r = Config::from_env();
    ASSERT_FALSE(r.ok()) << b.value << " was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(b.names), std::string::npos)
        << b.value << ": " << r.status().message();
    EXPECT_NE(r.status().message().find("expected"), std::string::npos) << r.status().message();
  }
  std::string many;
  for (int i = 0; i < 65; ++i) many += (i ? ",h" : "h") + std::to_string(i);
  setenv("INA_AGGREGATOR", many.c_str(), 1);
  Result<Config> r = Config::from_env();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at most 64"), std::string::npos) << r.status().message();
}

TEST(ConfigValidateTest, AggregatorListEntriesAreChecked) {
  Config c;
  c.rank = 0;
  c.world_size = 2;
  c.aggregators = {{"a", 1}, {"", 2}};
  Status s = c.validate();
  EXPECT_NE(s.message().find("aggregators[1].host"), std::string::npos) << s.to_string();
  c.aggregators = {{"a", 1}, {"b", 0}};
  s = c.validate();
  EXPECT_NE(s.message().find("aggregators[1].port"), std::string::npos) << s.to_string();
  c.aggregators = {{"a", 1}, {"a", 1}};
  s = c.validate();
  EXPECT_NE(s.message().find("the same aggregator as aggregators[0]"), std::string::npos)
      << s.to_string();
  c.aggregators = {{"a", 1}, {"b", 1}};
  EXPECT_TRUE(c.validate().ok());
}

TEST_F(ConfigEnvTest, RejectsMalformedValues) {
  expect_rejected("INA_RANK", "abc");
  expect_rejected("INA_RANK", "1x");
  expect_rejected("INA_RANK", "-1");
  expect_rejected("INA_RANK", " 1");
  expect_rejected("INA_RANK", "+1");
  expect_rejected("INA_RANK", "65535");
  expect_rejected("INA_WORLD_SIZE", "0");
  expect_rejected("INA_WORLD_SIZE", "65536");
  expect_rejected("INA_WORLD_SIZE", "4.0");
  expect_rejected("INA_AGGREGATOR", "host:");
  expect_rejected("INA_AGGREGATOR", "host:0");
  expect_rejected("INA_AGGREGATOR", "host:65536");
  expect_rejected("INA_AGGREGATOR", "host:port");
  expect_rejected("INA_AGGREGATOR", ":47474");
  expect_rejected("INA_AGGREGATOR", "[::1");
  expect_rejected("INA_AGGREGATOR", "[::1]47474");
  expect_rejected("INA_AGGREGATOR", "[]:1");
  expect_rejected("INA_JOB", "4294967296");
  expect_rejected("INA_JOB", "0x10");  // (INA_JOB_KEY: JobKeyIs32HexDigits)
  expect_rejected("INA_BLOCK_ELEMS", "0");
  expect_rejected("INA_BLOCK_ELEMS", "16385");
  expect_rejected("INA_WINDOW", "0");
  expect_rejected("INA_WINDOW", "32769");
  expect_rejected("INA_TIMEOUT_MS", "0");
  expect_rejected("INA_TIMEOUT_MS", "10s");
  expect_rejected("INA_RETRANSMIT_US", "0");
  expect_rejected("INA_RETRANSMIT_US", "1e3");
  expect_rejected("INA_TEST_DROP_PERCENT", "101");
  expect_rejected("INA_TEST_DROP_PERCENT", "-1");
  expect_rejected("INA_TEST_DROP_PERCENT", "nan");
  expect_rejected("INA_TEST_DROP_PERCENT", "5%");
  expect_rejected("INA_TEST_DUP_PERCENT", "inf");
  expect_rejected("INA_TEST_DELAY_US", "-5");
  expect_rejected("INA_TEST_DELAY_US", "4294967296");
  expect_rejected("INA_TEST_SEED", "seed");
  expect_rejected("INA_DEVICE_CHUNK_ELEMS", "0");
  expect_rejected("INA_DEVICE_CHUNK_ELEMS", "1M");
  expect_rejected("INA_DEVICE_BUFFERS", "0");
  expect_rejected("INA_DEVICE_BUFFERS", "17");
  for (const char* bad : {"10", "10:", ":5000", "101:5000", "-1:5", "10:-5", "10:4294967296",
                          "10:5ms", "nan:5", "10:5:5", "10%:5000"}) {
    expect_rejected("INA_TEST_STRAGGLE", bad);
    unsetenv("INA_TEST_STRAGGLE");
  }
}

TEST_F(ConfigEnvTest, StraggleIsParsed) {
  Config c = parse_ok();
  EXPECT_EQ(c.fault.straggle_percent, 0.0);
  EXPECT_EQ(c.fault.straggle_delay_us, 0u);
  setenv("INA_TEST_STRAGGLE", "12.5:5000", 1);
  c = parse_ok();
  EXPECT_EQ(c.fault.straggle_percent, 12.5);
  EXPECT_EQ(c.fault.straggle_delay_us, 5000u);
  setenv("INA_TEST_STRAGGLE", "0:0", 1);
  c = parse_ok();
  EXPECT_EQ(c.fault.straggle_percent, 0.0);
  setenv("INA_TEST_STRAGGLE", "x:1", 1);
  Result<Config> r = Config::from_env();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("INA_TEST_STRAGGLE"), std::string::npos);
  EXPECT_NE(r.status().message().find("prob_percent:delay_us"), std::string::npos)
      << r.status().message();
}

// Launcher bootstrap: torchrun, Open MPI and Slurm give rank and world size when INA_* do not.
TEST_F(ConfigEnvTest, RankFromEachLauncher) {
  struct Case {
    const char* rank_var;
    const char* size_var;
  };
  for (const Case& k :
       {Case{"RANK", "WORLD_SIZE"}, Case{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        Case{"SLURM_PROCID", "SLURM_NTASKS"}}) {
    SCOPED_TRACE(k.rank_var);
    setenv(k.rank_var, "5", 1);
    setenv(k.size_var, "16", 1);
    const Config c = parse_ok();
    EXPECT_EQ(c.rank, 5);
    EXPECT_EQ(c.world_size, 16);
    unsetenv(k.rank_var);
    unsetenv(k.size_var);
  }
}

TEST_F(ConfigEnvTest, LauncherPrecedence) {
  // torchrun inside an srun allocation: torchrun's pair wins over Slurm's and Open MPI's.
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "2", 1);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("RANK", "6", 1);
  setenv("WORLD_SIZE", "8", 1);
  Config c = parse_ok();
  EXPECT_EQ(c.rank, 6);
  EXPECT_EQ(c.world_size, 8);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  c = parse_ok();
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.world_size, 4);
  // INA_* override each half on its own.
  setenv("INA_RANK", "3", 1);
  c = parse_ok();
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.world_size, 4);
  setenv("INA_WORLD_SIZE", "9", 1);
  c = parse_ok();
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.world_size, 9);
}

TEST_F(ConfigEnvTest, LauncherStrictParsing) {
  setenv("WORLD_SIZE", "8", 1);
  expect_rejected("RANK", "1x");
  expect_rejected("RANK", "-1");
  expect_rejected("RANK", "65535");
  setenv("RANK", "1", 1);
  expect_rejected("WORLD_SIZE", "0");
  expect_rejected("WORLD_SIZE", "eight");
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  setenv("SLURM_NTASKS", "4", 1);
  expect_rejected("SLURM_PROCID", " 2");
  // Half a pair names both variables.
  unsetenv("SLURM_PROCID");
  Result<Config> r = Config::from_env();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("SLURM_NTASKS is set but SLURM_PROCID is not"),
            std::string::npos)
      << r.status().message();
  // A rank beyond the launcher's world is caught by validate(), naming the field.
  setenv("SLURM_PROCID", "4", 1);
  Config c = parse_ok();
  c.aggregator_host = "127.0.0.1";
  const Status st = c.validate();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rank"), std::string::npos);
}

TEST_F(ConfigEnvTest, ControllerAndJobName) {
  setenv("INA_CONTROLLER", "ctl.example", 1);
  Config c = parse_ok();
  EXPECT_EQ(c.controller_host, "ctl.example");
  EXPECT_EQ(c.controller_port, worker::kDefaultControllerPort);
  setenv("INA_CONTROLLER", "10.1.1.1:9000", 1);
  setenv("INA_JOB_NAME", "resnet-42.a:b", 1);
  setenv("INA_STORE", "10.1.1.2:2000", 1);
  c = parse_ok();
  EXPECT_EQ(c.controller_port, 9000);
  EXPECT_EQ(c.job_name, "resnet-42.a:b");
  EXPECT_FALSE(c.host_only);  // a store without INA_AGGREGATOR, but the controller places it
  EXPECT_TRUE(c.controllers.empty());  // one replica: controller_host:port alone
  // Replicas: a list, each with the controller's default port unless given; the first is
  // controller_host:port.
  setenv("INA_CONTROLLER", "h1:9001,h2,[::1]:9003", 1);
  c = parse_ok();
  ASSERT_EQ(c.controllers.size(), 3u);
  EXPECT_EQ(c.controller_host, "h1");
  EXPECT_EQ(c.controller_port, 9001);
  EXPECT_EQ(c.controllers[1].host, "h2");
  EXPECT_EQ(c.controllers[1].port, worker::kDefaultControllerPort);
  EXPECT_EQ(c.controllers[2].host, "::1");
  EXPECT_EQ(c.controllers[2].port, 9003);
  expect_rejected("INA_CONTROLLER", "h1:9001,");
  expect_rejected("INA_CONTROLLER", "h1:9001,h2:0");
  expect_rejected("INA_CONTROLLER", "host:");
  expect_rejected("INA_JOB_NAME", "a b");
  expect_rejected("INA_JOB_NAME", "x/y");
}

TEST_F(ConfigEnvTest, ErrorStopsAtTheBadVariableOnly) {
  setenv("INA_RANK", "1", 1);
  setenv("INA_WINDOW", "many", 1);
  Result<Config> r = Config::from_env();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("INA_WINDOW"), std::string::npos);
  EXPECT_EQ(r.status().message().find("INA_RANK"), std::string::npos);
}

Config valid_config() {
  Config c;
  c.rank = 1;
  c.world_size = 4;
  return c;
}

// validate() must reject the config and name `field` in its message.
void expect_invalid(const Config& c, const std::string& field) {
  const Status s = c.validate();
  ASSERT_FALSE(s.ok()) << "accepted; expected a complaint about " << field;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
}

TEST(ConfigValidateTest, AcceptsValidAndBoundaryValues) {
  Config c = valid_config();
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
  c.rank = 0;
  c.world_size = 1;
  c.block_elems = 1;
  c.window = 1;
  c.timeout = std::chrono::milliseconds(1);
  c.retransmit = std::chrono::microseconds(1);
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
  c.world_size = 65535;
  c.rank = 65534;
  c.block_elems = 16384;
  c.window = 32768;
  c.fault.drop_send_percent = 100;
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
}

TEST(ConfigValidateTest, NamesTheBadField) {
  Config c = valid_config();
  c.rank = -1;
  expect_invalid(c, "rank");
  c.rank = 4;
  expect_invalid(c, "rank");
  c = valid_config();
  c.world_size = 0;
  expect_invalid(c, "world_size");
  c.world_size = 65536;
  expect_invalid(c, "world_size");
  c = valid_config();
  c.aggregator_host.clear();
  expect_invalid(c, "aggregator_host");
  c = valid_config();
  c.aggregator_port = 0;
  expect_invalid(c, "aggregator_port");
  c = valid_config();
  c.block_elems = 0;
  expect_invalid(c, "block_elems");
  c.block_elems = 16385;
  expect_invalid(c, "block_elems");
  c = valid_config();
  c.window = 0;
  expect_invalid(c, "window");
  c.window = 32769;
  expect_invalid(c, "window");
  c = valid_config();
  c.timeout = std::chrono::milliseconds(0);
  expect_invalid(c, "timeout");
  c = valid_config();
  c.retransmit = std::chrono::microseconds(-1);
  expect_invalid(c, "retransmit");
  c = valid_config();
  c.fault.drop_recv_percent = 150;
  expect_invalid(c, "drop_recv_percent");
  c = valid_config();
  c.fault.dup_send_percent = -1;
  expect_invalid(c, "dup_send_percent");
  c = valid_config();
  c.device_buffers = 0;
  expect_invalid(c, "device_buffers");
  c.device_buffers = 17;
  expect_invalid(c, "device_buffers");
}

TEST(ConfigValidateTest, NamesTheFirstBadField) {
  Config c;  // rank -1 and world_size 0: world_size is checked first (rank's range needs it)
  c.window = 0;
  expect_invalid(c, "world_size");
}

TEST(ParseHostPortTest, NamesTheSourceInErrors) {
  std::string host;
  uint16_t port = 0;
  const Status bad = worker::parse_host_port(":1", "config.aggregator", &host, &port);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("config.aggregator"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("\":1\""), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace ina
