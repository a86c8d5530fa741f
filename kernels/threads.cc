#include "kernels/threads.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iterator>

namespace fedlora::kernels {

void SetNumThreads(int n) {
  SetDefaultPoolThreads(n);
  openblas_set_num_threads(NumThreads());
}

std::string OpenBlasCoreName() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

void RestartForFasterOpenBlas(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  // OpenBLAS's names for kernel sets older than AVX2 (its fallbacks for an unknown model).
  static const char* const kOld[] = {"prescott",   "core2",     "penryn",      "dunnington",
                                     "nehalem",    "atom",      "sandybridge", "katmai",
                                     "coppermine", "northwood", "banias"};
  std::string core = OpenBlasCoreName();
  for (char& ch : core) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (std::find(std::begin(kOld), std::end(kOld), core) == std::end(kOld)) return;
  const char* better = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    better = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    better = "Haswell";
  }
  if (better == nullptr) return;
  setenv("OPENBLAS_CORETYPE", better, 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // the exec failed: go on with the kernels there are
}

}  // namespace fedlora::kernels
