// Reads the checked-in wire test vectors (protocol/testdata/*.hex, format in its README.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ina::testing {

// The folder of the test vectors: $INA_TESTDATA (set by meson test), or "" when unset.
std::string testdata_dir();

// Parses the hex text of one vector. Returns false (with a reason in *error) on a character that
// is neither a hex digit, whitespace nor part of a comment, or on an odd number of digits.
bool parse_hex(const std::string& text, std::vector<uint8_t>* out, std::string* error);

// Reads and parses testdata_dir()/name; fails the calling test (gtest ADD_FAILURE) and returns
// an empty vector on any error.
std::vector<uint8_t> load_vector(const std::string& name);

}  // namespace ina::testing
