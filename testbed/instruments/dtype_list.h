// The --dtype list of the testbed's per-dtype benches (ina-codec-bench, ina-accuracy-bench).
#pragma once

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "ina/protocol/types.h"

namespace ina::bench {

// A comma-separated list of dtypes (`--dtype a,b`). False, with a message on stderr naming the
// option and the expected forms, for an unknown name, or for int32 when `floats_only`.
inline bool parse_dtype_list(const std::string& list, bool floats_only, std::vector<DType>* out) {
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto t = parse_dtype(item);
    if (!t || (floats_only && *t == DType::kInt32)) {
      std::fprintf(stderr,
                   "--dtype: '%s' is not %s (expected %sfloat32, float16, bfloat16, "
                   "float8_e4m3 or float8_e5m2)\n",
                   item.c_str(), floats_only ? "a float type" : "a type",
                   floats_only ? "" : "int32, ");
      return false;
    }
    out->push_back(*t);
  }
  return true;
}

}  // namespace ina::bench
