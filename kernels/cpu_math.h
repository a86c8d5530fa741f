// Branch-free float exp and erf for the CPU kernels, written so that GCC vectorises the loops
// that call them (no libm calls, no branches, bit casts through memcpy). Internal.
//
// Exp: 2^n * e^r with n = round(x / ln 2), |r| <= ln2 / 2, e^r by a degree-6 Taylor polynomial
// (remainder r^7/7! < 2.4e-8 relative on that range), 2^n built in the exponent bits. Inputs are
// clamped to [-87, 88] so that 2^n stays a normal float, and results below e^-87 = 1.6e-38 are
// flushed to 0 (libm would return subnormals there): a masked attention score gets exactly 0.
// Erf: Abramowitz & Stegun 7.1.26, erf(x) = 1 - t (a1 + t (a2 + ... a5 t)) e^{-x^2},
// t = 1 / (1 + p |x|), with |error| <= 1.5e-7 in exact arithmetic and ~5e-7 once evaluated in
// fp32 (tests/kernels/context_test.cc), the same formula PyTorch's vectorised CPU erf uses; the
// sign is restored with copysign.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace fedlora::kernels::internal {

// sum_{i < n} f(i) with 8 independent partial sums, combined pairwise at the end. Plain
// `s += f(i)` is one serial dependency chain that GCC may not reorder (no -ffast-math); eight
// chains let it use SIMD lanes and hide the add latency. Results do not depend on threads.
template <class F>
inline float Sum8(int64_t n, F&& f) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += f(i + k);
  }
  for (int k = 0; i < n; ++i, ++k) acc[k] += f(i);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// max_{i < n} x[i] (n >= 1), eight lanes as in Sum8.
inline float Max8(const float* x, int64_t n) {
  float acc[8];
  for (int k = 0; k < 8; ++k) acc[k] = x[0];
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] = acc[k] < x[i + k] ? x[i + k] : acc[k];
  }
  for (int k = 0; i < n; ++i, ++k) acc[k] = acc[k] < x[i] ? x[i] : acc[k];
  float m = acc[0];
  for (int k = 1; k < 8; ++k) m = m < acc[k] ? acc[k] : m;
  return m;
}

inline float FastExp(float x) {
  // Ternaries, not std::fmin/fmax: those have NaN rules that block vectorisation.
  const bool underflow = x < -87.0f;
  x = underflow ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * kLog2e + kRound) - kRound;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return underflow ? 0.0f : p * scale;
}

inline float FastErf(float x) {
  constexpr float kP = 0.3275911f;
  constexpr float kA1 = 0.254829592f, kA2 = -0.284496736f, kA3 = 1.421413741f, kA4 = -1.453152027f,
                  kA5 = 1.061405429f;
  const float ax = std::fabs(x);
  const float t = 1.0f / (1.0f + kP * ax);
  const float poly = t * (kA1 + t * (kA2 + t * (kA3 + t * (kA4 + t * kA5))));
  const float y = 1.0f - poly * FastExp(-ax * ax);
  return std::copysign(y, x);
}

}  // namespace fedlora::kernels::internal
