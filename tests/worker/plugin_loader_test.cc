// plugin::load and check_header (worker/plugin/plugin_loader.h): the built plugins load from
// INA_PLUGIN_DIR; a missing one, a stale one (another plugin ABI) and a foreign header are errors
// naming the library and the reason; a plugin's INA_LOG goes through libina's level.
#include "worker/plugin/plugin_loader.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "ina/base/log.h"
#include "ina_config.h"
#include "worker/plugin/probes.h"

namespace ina::worker::plugin {
namespace {

std::string g_fake_dir;    // libina-fake.so, libina-stale.so
std::string g_plugin_dir;  // the built plugins

class PluginDir {
 public:
  explicit PluginDir(const std::string& dir) { setenv("INA_PLUGIN_DIR", dir.c_str(), 1); }
  ~PluginDir() { unsetenv("INA_PLUGIN_DIR"); }
};

void expect_contains(const std::string& text, const std::string& needle) {
  EXPECT_NE(text.find(needle), std::string::npos)
      << "\"" << text << "\" lacks \"" << needle << "\"";
}

TEST(PluginLoader, MissingPluginNamesWhatTheLibraryAndDlerror) {
  char tmpl[] = "/tmp/ina-empty-plugins-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  PluginDir d(tmpl);
  Result<const PluginHeader*> r = load("dpdk", "INA_TRANSPORT=dpdk", "the DPDK transport plugin");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  const std::string& m = r.status().message();
  expect_contains(m, "INA_TRANSPORT=dpdk: cannot load the DPDK transport plugin libina-dpdk.so");
  expect_contains(m, std::string(tmpl) + "/libina-dpdk.so: cannot open shared object file");
  expect_contains(m, std::string("INA_PLUGIN_DIR=") + tmpl);
  rmdir(tmpl);
}

TEST(PluginLoader, StalePluginIsRefusedNamingBothVersions) {
  PluginDir d(g_fake_dir);
  Result<const PluginHeader*> r = load("stale", "test", "the stale plugin");
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  expect_contains(m, g_fake_dir + "/libina-stale.so is from libina " INA_VERSION " (plugin ABI " +
                         std::to_string(kPluginAbi + 1));
  expect_contains(m, "this libina is " INA_VERSION " (plugin ABI " + std::to_string(kPluginAbi));
  expect_contains(m, "install the plugins built with this libina beside it");
}

TEST(PluginLoader, CheckHeaderRefusesForeignHeaders) {
  static const DpdkApi api{nullptr};
  PluginHeader h{kPluginMagic, kPluginAbi, INA_VERSION, kLayout, "dpdk", nullptr, &api};
  h.attach = [](const PluginHost*) {};
  EXPECT_TRUE(check_header(&h, "dpdk", "/x/libina-dpdk.so").ok());
  expect_contains(check_header(&h, "xdp", "/x/libina-xdp.so").message(),
                  "/x/libina-xdp.so: not the xdp plugin (it says \"dpdk\")");
  PluginHeader bad = h;
  bad.magic = 1;
  expect_contains(check_header(&bad, "dpdk", "p").message(), "not a libina plugin");
  bad = h;
  bad.version = "0.0.9";
  expect_contains(check_header(&bad, "dpdk", "p").message(), "p is from libina 0.0.9");
  bad = h;
  bad.layout ^= 1;
  expect_contains(check_header(&bad, "dpdk", "p").message(), "layout");
  expect_contains(check_header(nullptr, "dpdk", "p").message(), "returned null");
}

// The fake plugin logs at info through plugin_log.cc: shown at libina's level info, not at error.
TEST(PluginLoader, PluginLogsThroughLibinasLevel) {
  PluginDir d(g_fake_dir);
  Result<const DpdkApi*> api = plugin::api<DpdkApi>("fake", "test", "the fake plugin");
  ASSERT_TRUE(api.ok()) << api.status().to_string();
  DpdkTransportOptions o;
  o.local_port = 4242;
  const log::Level before = log::level();
  log::set_level(log::Level::kInfo);
  testing::internal::CaptureStderr();
  EXPECT_FALSE(api.value()->create(o).ok());
  std::string err = testing::internal::GetCapturedStderr();
  expect_contains(err, "[ina info fake] fake plugin create, local port 4242");
  log::set_level(log::Level::kError);
  testing::internal::CaptureStderr();
  EXPECT_FALSE(api.value()->create(o).ok());
  err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("fake plugin create"), std::string::npos) << err;
  log::set_level(before);
}

// Every plugin this build made loads and passes the checks; the probes answer through them.
TEST(PluginLoader, BuiltPluginsLoad) {
  PluginDir d(g_plugin_dir);
  for (const char* name : {"dpdk", "xdp", "verbs", "cuda"}) {
    const std::string file = g_plugin_dir + "/" + library_name(name);
    if (access(file.c_str(), F_OK) != 0) continue;  // feature off
    Result<const PluginHeader*> r = load(name, "test", name);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_STREQ(r.value()->name, name);
  }
#if INA_HAVE_XDP
  const features::Probe x = features::probe_xdp();
  EXPECT_TRUE(x.built);
  EXPECT_TRUE(x.usable) << x.detail;
  expect_contains(x.detail, "libbpf");
#endif
#if INA_HAVE_RDMA
  const features::Probe v = features::probe_rdma();
  EXPECT_TRUE(v.built);
  EXPECT_EQ(v.detail.find("cannot load"), std::string::npos) << v.detail;  // loaded; devices or not
#endif
}

}  // namespace
}  // namespace ina::worker::plugin

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const char* fake = std::getenv("INA_TEST_FAKE_PLUGIN_DIR");
  const char* built = std::getenv("INA_TEST_PLUGIN_DIR");
  if (fake == nullptr || built == nullptr) {
    std::fprintf(stderr, "INA_TEST_FAKE_PLUGIN_DIR and INA_TEST_PLUGIN_DIR must be set\n");
    return 2;
  }
  ina::worker::plugin::g_fake_dir = fake;
  ina::worker::plugin::g_plugin_dir = built;
  return RUN_ALL_TESTS();
}
