// CHECK(cond, printf format, ...) for the tests that are plain programs rather than GoogleTest
// (they fork, exec peers and exit 77 on their own terms): a failed check prints
// "FAIL file:line: message" and counts in ina::testing::g_failures, which main() turns into its
// exit status. Checks go on after a failure, so one run reports every difference.
#pragma once

#include <cstdio>

namespace ina::testing {
inline int g_failures = 0;
}  // namespace ina::testing

#define CHECK(cond, ...)                               \
  do {                                                 \
    if (!(cond)) {                                     \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      std::printf(__VA_ARGS__);                        \
      std::printf("\n");                               \
      ++::ina::testing::g_failures;                    \
    }                                                  \
  } while (0)
