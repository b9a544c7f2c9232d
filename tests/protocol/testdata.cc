#include "testdata.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ina::testing {

std::string testdata_dir() {
  const char* d = std::getenv("INA_TESTDATA");
  return d != nullptr ? d : "";
}

namespace {
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

bool parse_hex(const std::string& text, std::vector<uint8_t>* out, std::string* error) {
  out->clear();
  int pending = -1;  // high nibble of a byte whose low nibble is still to come
  int line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '#') {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    if (c == '\n') ++line;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (pending >= 0) {
        *error = "line " + std::to_string(line) + ": whitespace inside a byte";
        return false;
      }
      continue;
    }
    const int v = hex_value(c);
    if (v < 0) {
      *error = "line " + std::to_string(line) + ": unexpected character '" + c + "'";
      return false;
    }
    if (pending < 0) {
      pending = v;
    } else {
      out->push_back(static_cast<uint8_t>(pending << 4 | v));
      pending = -1;
    }
  }
  if (pending >= 0) {
    *error = "odd number of hex digits";
    return false;
  }
  return true;
}

std::vector<uint8_t> load_vector(const std::string& name) {
  const std::string dir = testdata_dir();
  if (dir.empty()) {
    ADD_FAILURE() << "INA_TESTDATA is not set (run through meson test)";
    return {};
  }
  std::ifstream f(dir + "/" + name);
  if (!f) {
    ADD_FAILURE() << "cannot open " << dir << "/" << name;
    return {};
  }
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<uint8_t> bytes;
  std::string error;
  if (!parse_hex(ss.str(), &bytes, &error)) {
    ADD_FAILURE() << name << ": " << error;
    return {};
  }
  return bytes;
}

}  // namespace ina::testing
