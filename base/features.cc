#include "ina/base/features.h"

namespace ina::features {

std::string describe(const char* name, const Probe& p) {
  std::string s(name);
  s += p.built ? ": built, " : ": not built";
  if (p.built) s += p.usable ? "usable" : "not usable";
  if (!p.detail.empty()) s += " (" + p.detail + ")";
  return s;
}

}  // namespace ina::features
