// Helpers shared by fedlora's libFuzzer harnesses.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "absl/status/status.h"

// An invariant the code under test promises (not an input check): prints and aborts, which
// libFuzzer reports as a crash and saves the input for.
#define FUZZ_CHECK(cond, ...)                                                               \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, \
                   ::fedlora::fuzz::Describe(__VA_ARGS__).c_str());                         \
      std::abort();                                                                         \
    }                                                                                       \
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
#define FUZZ_TRACE(...)                                                \
  do {                                                                 \
    if (::fedlora::fuzz::Tracing()) std::fprintf(stderr, __VA_ARGS__); \
  } while (0)

inline std::string Describe() { return ""; }
inline std::string Describe(const std::string& s) { return s; }
inline std::string Describe(const absl::Status& s) { return s.ToString(); }
inline std::string Describe(const absl::Status& a, const absl::Status& b) {
  return a.ToString() + " vs " + b.ToString();
}

// Where harnesses keep scratch files: FEDLORA_FUZZ_TMP (scripts/fuzz.sh sets it and removes it),
// else tmpfs when there is one (fsync is then free), else TMPDIR, else /tmp.
inline std::string ScratchBase() {
  if (const char* t = std::getenv("FEDLORA_FUZZ_TMP"); t != nullptr && *t != '\0') return t;
  if (std::filesystem::is_directory("/dev/shm")) return "/dev/shm";
  if (const char* t = std::getenv("TMPDIR"); t != nullptr && *t != '\0') return t;
  return "/tmp";
}

// This process's scratch directory, <base>/fedlora_fuzz_<name>_<pid> (libFuzzer's -jobs run
// several processes), made on the first call and removed at exit. One name per process.
inline const std::string& ScratchDir(const char* name) {
  static const std::string* dir = [name] {
    auto* d =
        new std::string(ScratchBase() + "/fedlora_fuzz_" + name + "_" + std::to_string(getpid()));
    std::filesystem::create_directories(*d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(""), ec);
    });
    return d;
  }();
  return *dir;
}

// Writes `bytes` to `path`; false when it cannot.
inline bool WriteFile(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace fedlora::fuzz
