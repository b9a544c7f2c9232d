/* CHECK(cond) for the plain C test programs (c_api_test.c, minimal_root_program.c): a failed
 * check prints "file:line: CHECK failed: cond" and counts in g_failures, which main() turns into
 * its exit status; checks go on after a failure. (tests/check.h is the C++ programs' twin.) */
#pragma once

#include <stdio.h>

static int g_failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                            \
    }                                                                          \
  } while (0)
