// Shared helpers for the kernel tests: seeded inputs, guarded output buffers, closeness checks,
// central-difference gradient checks, and device mirrors for the CUDA-vs-CPU comparisons.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/ggml_quant.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/base/context.h"
#include "kernels/base/device.h"
#include "kernels/mirror.h"

namespace fedlora::kernels::testing {

// Uniform floats in [lo, hi) from a fixed seed.
inline std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A random [rows, cols] matrix in a ggml 32-element block format (Q8_0, Q4_0 or Q4_1), and in
// `values` the elements it stands for, decoded here from the format's definition (ggml's
// ggml-common.h: Q8_0 = d, 32 x int8, q * d; Q4_0 = d, 16 nibble bytes, (q - 8) * d; Q4_1 = d, m,
// 16 nibble bytes, q * d + m; byte j holds element j low, j + 16 high), independently of
// core/ggml_quant.cc. Scales are exact fp16 values.
inline std::vector<uint8_t> RandomQuantMatrix(GgmlType type, int64_t rows, int64_t cols,
                                              uint32_t seed, std::vector<float>* values) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), scale(1, 63);
  auto half = [](float v) {  // v = k / 1024 or -k / 1024 for small k: exact in fp16
    const uint16_t bits = F32ToF16(v);
    return std::pair<uint8_t, uint8_t>(static_cast<uint8_t>(bits & 0xff),
                                       static_cast<uint8_t>(bits >> 8));
  };
  const int block_bytes = type == GgmlType::kQ8_0 ? 34 : type == GgmlType::kQ4_0 ? 18 : 20;
  std::vector<uint8_t> out;
  values->assign(static_cast<size_t>(rows * cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      std::vector<uint8_t> blk(block_bytes);
      const float d = static_cast<float>(scale(rng)) / 1024.0f;
      const float m = -static_cast<float>(scale(rng)) / 256.0f;
      std::tie(blk[0], blk[1]) = half(d);
      if (type == GgmlType::kQ4_1) std::tie(blk[2], blk[3]) = half(m);
      const int q0 = type == GgmlType::kQ4_1 ? 4 : 2;
      for (int j = q0; j < block_bytes; ++j) blk[j] = static_cast<uint8_t>(byte(rng));
      float* v = values->data() + r * cols + b * 32;
      for (int j = 0; j < 32; ++j) {
        if (type == GgmlType::kQ8_0) {
          v[j] = static_cast<float>(static_cast<int8_t>(blk[2 + j])) * d;
        } else {
          const int q = j < 16 ? blk[q0 + j] & 0x0f : blk[q0 + j - 16] >> 4;
          v[j] = type == GgmlType::kQ4_0 ? static_cast<float>(q - 8) * d
                                         : static_cast<float>(q) * d + m;
        }
      }
      out.insert(out.end(), blk.begin(), blk.end());
    }
  }
  return out;
}

// Guard values after each output buffer catch a kernel that writes past its end. The value is an
// unlikely finite pattern compared bit for bit.
inline constexpr size_t kGuard = 64;
inline constexpr uint32_t kGuardBits = 0x7b2dbeefu;
inline float GuardValue() {
  float f;
  std::memcpy(&f, &kGuardBits, sizeof(f));
  return f;
}

// A host output buffer of n floats followed by kGuard guard floats.
class Guarded {
 public:
  explicit Guarded(size_t n, float fill = 0.0f) : n_(n), v_(n + kGuard, GuardValue()) {
    std::fill(v_.begin(), v_.begin() + n, fill);
  }
  Guarded(const std::vector<float>& init) : Guarded(init.size()) {
    std::copy(init.begin(), init.end(), v_.begin());
  }
  float* data() { return v_.data(); }
  const float* data() const { return v_.data(); }
  size_t size() const { return n_; }
  float& operator[](size_t i) { return v_[i]; }
  float operator[](size_t i) const { return v_[i]; }
  std::vector<float> values() const { return std::vector<float>(v_.begin(), v_.begin() + n_); }
  std::vector<float>& raw() { return v_; }  // n + kGuard floats
  bool GuardsIntact() const {
    for (size_t i = n_; i < v_.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &v_[i], sizeof(bits));
      if (bits != kGuardBits) return false;
    }
    return true;
  }

 private:
  size_t n_;
  std::vector<float> v_;
};

// |got - want| <= atol + rtol * |want| elementwise; reports the worst element.
inline ::testing::AssertionResult AllClose(const float* got, const float* want, size_t n,
                                           double atol, double rtol) {
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(g) != std::isnan(w))
      return ::testing::AssertionFailure() << "NaN mismatch at " << i;
    const double excess = std::abs(g - w) - (atol + rtol * std::abs(w));
    if (excess > worst) {
      worst = excess;
      worst_i = i;
    }
  }
  if (worst > 0.0) {
    return ::testing::AssertionFailure()
           << "element " << worst_i << ": got " << got[worst_i] << ", want " << want[worst_i]
           << " (atol " << atol << ", rtol " << rtol << ")";
  }
  return ::testing::AssertionSuccess();
}
inline ::testing::AssertionResult AllClose(const std::vector<float>& got,
                                           const std::vector<float>& want, double atol,
                                           double rtol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  return AllClose(got.data(), want.data(), got.size(), atol, rtol);
}

// Loss L = sum_i w_i * out_i, accumulated in double from the fp32 outputs.
inline double Project(const std::vector<float>& out, const std::vector<float>& w) {
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
  return s;
}

// Central-difference check of dL/dx for L = Project(forward(), w): `x` is perturbed in place
// (forward reads it), `analytic` is the backward's gradient for dy = w.
//
// Tolerance: with eps = 1e-3 the truncation error is O(eps^2 * f''') ~ 1e-6. The fp32 forward
// rounds each output at ~6e-8 relative; summed over the few dozen outputs of these small cases
// that is ~1e-6 absolute in L, i.e. ~5e-4 in the difference quotient after dividing by 2 eps.
// atol 1e-3 + rtol 2e-3 sits above both, and a 1% error in a gradient (a wrong scale, a missing
// term) exceeds it.
inline void ExpectGradient(const std::function<std::vector<float>()>& forward,
                           std::vector<float>& x, const std::vector<float>& w,
                           const std::vector<float>& analytic, const std::string& what,
                           double eps = 1e-3, double atol = 1e-3, double rtol = 2e-3) {
  ASSERT_EQ(analytic.size(), x.size()) << what;
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + static_cast<float>(eps);
    const double lp = Project(forward(), w);
    x[i] = saved - static_cast<float>(eps);
    const double lm = Project(forward(), w);
    x[i] = saved;
    const double numeric = (lp - lm) / (2.0 * eps);
    EXPECT_NEAR(analytic[i], numeric, atol + rtol * std::abs(numeric)) << what << "[" << i << "]";
  }
}

// Device copies of host tensors for the CUDA-vs-CPU tests; everything is freed on destruction.
// Outputs get kGuard guard floats after them, checked on download.
class DeviceMirror {
 public:
  DeviceMirror() = default;
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;
  ~DeviceMirror() {
    for (void* p : ptrs_) (void)DeviceFree(p);
  }
  template <class T>
  T* Upload(const std::vector<T>& host) {
    auto p = DeviceAlloc(std::max<size_t>(1, host.size()) * sizeof(T));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    ptrs_.push_back(*p);
    EXPECT_TRUE(CopyToDevice(*p, host.data(), host.size() * sizeof(T)).ok());
    return static_cast<T*>(*p);
  }
  // Uploads a Guarded buffer including its guards (initial output contents matter for accumulate).
  float* Upload(const Guarded& g) {
    std::vector<float> all(g.data(), g.data() + g.size() + kGuard);
    return Upload(all);
  }
  void* Workspace(size_t bytes) {
    auto p = DeviceAlloc(std::max<size_t>(bytes, 1));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    ptrs_.push_back(*p);
    return *p;
  }
  // Downloads n + kGuard floats into a Guarded buffer.
  static Guarded Download(const float* dev, size_t n) {
    Guarded g(n);
    EXPECT_TRUE(CopyToHost(g.raw().data(), dev, (n + kGuard) * sizeof(float)).ok());
    return g;
  }

 private:
  std::vector<void*> ptrs_;
};

inline ExecContext Cpu() { return ExecContext{}; }
inline ExecContext Gpu() { return ExecContext{Device::kCuda, nullptr, nullptr}; }

#define FEDLORA_SKIP_WITHOUT_GPU()          \
  if (!::fedlora::kernels::CudaAvailable()) \
  GTEST_SKIP() << "no CUDA device: " << ::fedlora::kernels::CudaDeviceDescription()

}  // namespace fedlora::kernels::testing
