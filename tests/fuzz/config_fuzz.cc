// libFuzzer harness: the worker's configuration parsers. The input is text read two ways:
//   - as environment lines "NAME=value": every variable Config::from_env reads (and only those:
//     the harness never sets anything else, such as the sanitizers' own variables) is cleared,
//     those named are set, then Config::from_env, from_env_with_store and validate run;
//   - as the controller's admission answer (worker/admission.h parse_admission), which is then
//     applied to a valid configuration.
//
// Invariants: a configuration from_env accepts has its numbers inside their documented ranges and
// between 1 and kMaxShards aggregators with non-empty hosts; an accepted admission names its
// first aggregator as aggregator_host:port, at most kMaxShards of them, and applying it leaves the
// configuration with exactly those aggregators, the job and the key, and valid.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "../worker/config_env_vars.h"
#include "fuzz_check.h"
#include "ina/base/log.h"
#include "ina/ina.hpp"
#include "ina/protocol/wire.h"
#include "worker/admission.h"
#include "worker/config_internal.h"

using namespace ina;

namespace {

bool known(std::string_view name) {
  for (const char* v : kInaConfigEnvVars) {
    if (name == v) return true;
  }
  return false;
}

void check_config(const Config& c) {
  FUZZ_CHECK(c.world_size >= 0 && c.world_size <= 65535);
  FUZZ_CHECK(c.rank >= -1 && c.rank < 65535);
  FUZZ_CHECK(c.block_elems >= 1 && c.block_elems <= 16384);
  FUZZ_CHECK(c.window >= 1 && c.window <= wire::kMaxSlot + 1u);
  const auto list = worker::aggregator_list(c);
  FUZZ_CHECK(!list.empty() && list.size() <= worker::kMaxShards);
  for (const AggregatorAddress& a : list) FUZZ_CHECK(!a.host.empty());
  (void)c.validate();
}

void env_mode(std::string_view text) {
  for (const char* v : kInaConfigEnvVars) ::unsetenv(v);
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string name(line.substr(0, eq));
    const std::string value(line.substr(eq + 1));
    if (!known(name) || value.find('\0') != std::string::npos) continue;
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  if (Result<Config> c = Config::from_env(); c.ok()) check_config(c.value());
  if (Result<Config> c = Config::from_env_with_store(); c.ok()) check_config(c.value());
}

void admission_mode(std::string_view text) {
  Result<worker::Admission> r = worker::parse_admission(text);
  if (!r.ok()) return;
  const worker::Admission& a = r.value();
  if (!a.admitted) return;
  FUZZ_CHECK(!a.aggregators.empty() && a.aggregators.size() <= worker::kMaxShards);
  FUZZ_CHECK(a.aggregators[0].host == a.aggregator_host);
  FUZZ_CHECK(a.aggregators[0].port == a.aggregator_port);
  Config c;
  c.rank = 0;
  c.world_size = 2;
  worker::apply_admission(a, &c);
  const auto list = worker::aggregator_list(c);
  FUZZ_CHECK(list.size() == a.aggregators.size());
  for (size_t i = 0; i < list.size(); ++i) {
    FUZZ_CHECK(list[i].host == a.aggregators[i].host && list[i].port == a.aggregators[i].port);
  }
  FUZZ_CHECK(c.job == a.job && c.job_key == a.key);
  // An answer the parser accepts leaves a configuration the communicator accepts.
  FUZZ_CHECK(c.validate().ok());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  log::set_level(log::Level::kError);  // apply_admission logs at info level
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  admission_mode(text);
  env_mode(text);
  return 0;
}
