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

// parse_hex() of a text whose first line is line `line` of its file (for the error messages).
bool parse_hex_from(const std::string& text, int line, std::vector<uint8_t>* out,
                    std::string* error) {
  out->clear();
  int pending = -1;  // high nibble of a byte whose low nibble is still to come
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '#') {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (pending >= 0) {
        *error = "line " + std::to_string(line) + ": whitespace inside a byte";
        return false;
      }
      if (c == '\n') ++line;
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

bool valid_name(const std::string& name) {
  if (name.empty()) return false;
  for (const char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

}  // namespace

bool parse_hex(const std::string& text, std::vector<uint8_t>* out, std::string* error) {
  return parse_hex_from(text, 1, out, error);
}

bool parse_vectors(const std::string& text, std::map<std::string, std::vector<uint8_t>>* out,
                   std::string* error) {
  out->clear();
  std::string name;  // the section being read; "" before the first
  std::string body;
  int body_line = 1;  // the file's line number of body's first line
  // Parses the body read so far into the section `name` (or checks that the text before the
  // first section holds no bytes).
  const auto finish = [&]() {
    std::vector<uint8_t> bytes;
    std::string why;
    if (!parse_hex_from(body, body_line, &bytes, &why)) {
      *error =
          (name.empty() ? std::string("before the first section") : "section " + name) + ": " + why;
      return false;
    }
    if (name.empty()) {
      if (!bytes.empty()) {
        *error =
            "line " + std::to_string(body_line) + ": bytes before the first `=== NAME` section";
        return false;
      }
      return true;
    }
    if (bytes.empty()) {
      *error = "section " + name + ": no bytes";
      return false;
    }
    (*out)[name] = std::move(bytes);
    return true;
  };
  int line = 1;
  for (size_t pos = 0; pos < text.size(); ++line) {
    size_t end = text.find('\n', pos);
    end = end == std::string::npos ? text.size() : end + 1;
    const std::string l = text.substr(pos, end - pos);
    pos = end;
    if (l.rfind("===", 0) != 0) {
      body += l;
      continue;
    }
    if (!finish()) return false;
    std::string next = l.substr(3);
    while (!next.empty() && (next.back() == '\n' || next.back() == '\r')) next.pop_back();
    if (next.size() < 2 || next[0] != ' ' || !valid_name(next.substr(1))) {
      *error = "line " + std::to_string(line) +
               ": a section starts with `=== NAME`, NAME of a-z, 0-9 and _";
      return false;
    }
    name = next.substr(1);
    if (out->count(name) != 0) {
      *error = "line " + std::to_string(line) + ": section " + name + " appears twice";
      return false;
    }
    body.clear();
    body_line = line + 1;
  }
  if (!finish()) return false;
  if (out->empty()) {
    *error = "no `=== NAME` section";
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
  const std::string path = dir + "/" + kVectorsFile;
  std::ifstream f(path);
  if (!f) {
    ADD_FAILURE() << "cannot open " << path;
    return {};
  }
  std::stringstream ss;
  ss << f.rdbuf();
  std::map<std::string, std::vector<uint8_t>> vectors;
  std::string error;
  if (!parse_vectors(ss.str(), &vectors, &error)) {
    ADD_FAILURE() << path << ": " << error;
    return {};
  }
  const auto it = vectors.find(name);
  if (it == vectors.end()) {
    ADD_FAILURE() << path << " has no vector " << name;
    return {};
  }
  return it->second;
}

}  // namespace ina::testing
