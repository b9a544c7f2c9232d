// plugin::load: finds, loads and checks a transport plugin (plugin_loader.h).
#include "worker/plugin/plugin_loader.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "ina_config.h"

namespace ina::worker::plugin {
namespace {

const PluginHost kHost{sizeof(PluginHost), &log::level, &log::write};

// The directory of the module holding this code ("" when unknown).
std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&own_directory), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  const std::string path(info.dli_fname);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::string dl_error() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown dlopen error";
}

// dlopen of `file`; on failure `why` gets dlerror()'s reason, behind the file's name when the
// reason is about another one (a library the plugin needs: "librte_eal.so.23: cannot open ...").
void* open(const std::string& file, std::string* why) {
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    *why = dl_error();
    if (why->find(file) == std::string::npos) *why = file + ": " + *why;
  }
  return h;
}

struct Loaded {
  const PluginHeader* header = nullptr;
  std::string path;
};

std::mutex g_mu;
std::map<std::string, Loaded>& loaded() {
  static auto* m = new std::map<std::string, Loaded>;  // never destroyed: plugins stay loaded
  return *m;
}

}  // namespace

std::string library_name(const char* name) { return std::string("libina-") + name + ".so"; }

Status check_header(const PluginHeader* h, const char* name, const std::string& path) {
  if (h == nullptr) return failed_precondition(path + ": ina_plugin_entry returned null");
  if (h->magic != kPluginMagic) {
    return failed_precondition(path + ": not a libina plugin (bad magic in ina_plugin_entry)");
  }
  const bool version_ok = h->version != nullptr && std::strcmp(h->version, INA_VERSION) == 0;
  if (h->abi != kPluginAbi || !version_ok || h->layout != kLayout) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "plugin ABI %" PRIu32 ", layout %016" PRIx64, h->abi, h->layout);
    char mine[160];
    std::snprintf(mine, sizeof mine, "plugin ABI %" PRIu32 ", layout %016" PRIx64, kPluginAbi,
                  kLayout);
    return failed_precondition(path + " is from libina " +
                               (h->version != nullptr ? h->version : "?") + " (" + buf +
                               "), this libina is " + INA_VERSION + " (" + mine +
                               "): install the plugins built with this libina beside it");
  }
  if (h->name == nullptr || std::strcmp(h->name, name) != 0 || h->attach == nullptr ||
      h->api == nullptr) {
    return failed_precondition(path + ": not the " + name + " plugin (it says \"" +
                               (h->name != nullptr ? h->name : "?") + "\")");
  }
  return ok_status();
}

Result<const PluginHeader*> load(const char* name, const std::string& what,
                                 const char* description) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto it = loaded().find(name); it != loaded().end()) return it->second.header;

  const std::string file = library_name(name);
  const std::string prefix =
      (what.empty() ? "" : what + ": ") + "cannot load " + description + " " + file + ": ";
  void* handle = nullptr;
  std::string path;
  std::string why;
  if (const char* dir = std::getenv("INA_PLUGIN_DIR"); dir != nullptr && *dir != '\0') {
    path = std::string(dir) + "/" + file;
    handle = open(path, &why);
    if (handle == nullptr)
      return failed_precondition(prefix + why + " (INA_PLUGIN_DIR=" + dir + ")");
  } else {
    const std::string own = own_directory();
    std::string beside_why;
    if (!own.empty()) {
      path = own + "/" + file;
      handle = open(path, &beside_why);
      // Found beside libina but broken (a missing dependency): that is the answer.
      if (handle == nullptr && access(path.c_str(), F_OK) == 0) {
        return failed_precondition(prefix + beside_why);
      }
    }
    if (handle == nullptr) {
      path = file;
      handle = open(file, &why);
      if (handle == nullptr) {
        return failed_precondition(prefix + (beside_why.empty() ? "" : beside_why + "; by name: ") +
                                   why + " (install it beside libina.so, or set INA_PLUGIN_DIR)");
      }
    }
  }
  // Found by name: the path the dynamic linker chose, for the messages.
  if (link_map* lm = nullptr; path == file && dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 &&
                              lm != nullptr && lm->l_name != nullptr && *lm->l_name != '\0') {
    path = lm->l_name;
  }
  using Entry = const PluginHeader* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "ina_plugin_entry"));
  if (entry == nullptr) {
    const std::string e = dl_error();
    dlclose(handle);
    return failed_precondition(prefix + path + " has no ina_plugin_entry (" + e + ")");
  }
  const PluginHeader* h = entry();
  if (Status s = check_header(h, name, path); !s.ok()) {
    dlclose(handle);
    return failed_precondition(prefix + s.message());
  }
  h->attach(&kHost);
  loaded()[name] = Loaded{h, path};
  INA_DEBUG("worker", "loaded %s %s", description, path.c_str());
  return h;
}

}  // namespace ina::worker::plugin
