// What the kernel benchmarks share: seeded inputs, exiting on a failed kernel call, and timing.
#ifndef FEDLORA_BENCH_KERNELS_BENCH_UTIL_H_
#define FEDLORA_BENCH_KERNELS_BENCH_UTIL_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace fedlora::bench {

// n floats uniform in [-1, 1), the same for the same seed.
inline std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Exits with status 1, naming `what`, unless s is OK.
inline void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  }
}

// The median wall time of `iters` calls of f, after one untimed warm-up call.
template <typename F>
double MedianSeconds(int iters, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace fedlora::bench

#endif  // FEDLORA_BENCH_KERNELS_BENCH_UTIL_H_
