// ina-aggregator's --port-file and --http-port-file (both backends).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ina::agg {

// Writes `port` and a newline to `path`: to a temporary name first, then renamed, so a reader
// never sees a partial file. False when any step failed.
inline bool write_port_file(const std::string& path, uint16_t port) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return false;
  const bool ok = std::fprintf(f, "%u\n", unsigned{port}) > 0;
  if (std::fclose(f) != 0 || !ok) return false;
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace ina::agg
