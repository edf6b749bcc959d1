// A minimal assertion helper for the C++ unit tests: counts failures, prints where they happened.
#pragma once

#include <cstdio>
#include <cstdlib>

inline int& check_failures() {
  static int failures = 0;
  return failures;
}

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++check_failures();                                                  \
    }                                                                      \
  } while (0)

inline int finish(const char* name) {
  if (check_failures() == 0) {
    std::printf("%s: all checks passed\n", name);
    return 0;
  }
  std::printf("%s: %d checks failed\n", name, check_failures());
  return 1;
}
