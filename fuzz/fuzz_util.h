// Helpers shared by fedlora's libFuzzer harnesses.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"

// An invariant the code under test promises (not an input check): prints and aborts, which
// libFuzzer reports as a crash and saves the input for.
#define FUZZ_CHECK(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, \
                   ::fedlora::fuzz::Describe(__VA_ARGS__).c_str());                         \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

namespace fedlora::fuzz {

// FEDLORA_FUZZ_TRACE=1 makes a harness say what each input did (to check seeds and reproducers).
inline bool Tracing() {
  static const bool on = [] {
    const char* v = std::getenv("FEDLORA_FUZZ_TRACE");
    return v != nullptr && *v != '\0' && *v != '0';
  }();
  return on;
}
#define FUZZ_TRACE(...)                                        \
  do {                                                         \
    if (::fedlora::fuzz::Tracing()) std::fprintf(stderr, __VA_ARGS__); \
  } while (0)

inline std::string Describe() { return ""; }
inline std::string Describe(const std::string& s) { return s; }
inline std::string Describe(const absl::Status& s) { return s.ToString(); }
inline std::string Describe(const absl::Status& a, const absl::Status& b) {
  return a.ToString() + " vs " + b.ToString();
}

}  // namespace fedlora::fuzz
