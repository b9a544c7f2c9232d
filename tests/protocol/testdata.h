// Reads the checked-in wire test vectors: the sections of protocol/testdata/vectors.hex, one
// packet each, `=== NAME` starting the packet NAME (format in protocol/testdata/README.md).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ina::testing {

// The folder of the test vectors: $INA_TESTDATA (set by meson test), or "" when unset.
std::string testdata_dir();

// The file of the test vectors, in testdata_dir().
inline constexpr const char* kVectorsFile = "vectors.hex";

// Parses the hex text of one vector. Returns false (with a reason in *error) on a character that
// is neither a hex digit, whitespace nor part of a comment, or on an odd number of digits.
bool parse_hex(const std::string& text, std::vector<uint8_t>* out, std::string* error);

// Parses a whole vectors file into its packets by name. Returns false (with a reason naming the
// line in *error) on a malformed or duplicated `=== NAME` line, bytes before the first section,
// or a section that parse_hex() rejects or that holds no bytes.
bool parse_vectors(const std::string& text, std::map<std::string, std::vector<uint8_t>>* out,
                   std::string* error);

// The bytes of the vector `name` (a section of testdata_dir()/vectors.hex); fails the calling
// test (gtest ADD_FAILURE) and returns an empty vector when the file cannot be read or parsed or
// has no section `name`.
std::vector<uint8_t> load_vector(const std::string& name);

}  // namespace ina::testing
