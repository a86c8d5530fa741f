// GELU and tanh: validation, dispatch, CPU backend. Forward and backward side by side.
#include <cmath>

#include "kernels/activation.h"
#include "kernels/base/kernel_util.h"
#include "kernels/cpu_math.h"

namespace fedlora::kernels {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;    // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1 / sqrt(2 pi)

// y = x * Phi(x), Phi(x) = 0.5 * (1 + erf(x / sqrt(2)))
inline float Gelu(float x) { return 0.5f * x * (1.0f + internal::FastErf(x * kInvSqrt2)); }
// dy/dx = Phi(x) + x * phi(x)
inline float GeluGrad(float x) {
  const float cdf = 0.5f * (1.0f + internal::FastErf(x * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * internal::FastExp(-0.5f * x * x);
  return cdf + x * pdf;
}

// The loops below are compiled for AVX2 as well as the baseline, chosen at load time: the
// polynomial exp/erf make them compute-bound, so 8 lanes instead of 4 halve their time.
__attribute__((target_clones("avx2", "default"))) void GeluForwardRange(const float* x, float* y,
                                                                        int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Gelu(x[i]);
}
__attribute__((target_clones("avx2", "default"))) void GeluBackwardRange(const float* x,
                                                                         const float* dy, float* dx,
                                                                         int64_t n,
                                                                         bool accumulate) {
  if (accumulate) {
    for (int64_t i = 0; i < n; ++i) dx[i] += dy[i] * GeluGrad(x[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * GeluGrad(x[i]);
  }
}

}  // namespace

absl::Status CanRun(const ExecContext& ctx, const ActivationForwardArgs& a) {
  constexpr std::string_view kOp = "ActivationForward";
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.n}));
  if (a.kind != Activation::kGelu && a.kind != Activation::kTanh)
    return internal::InvalidArg(kOp, "unknown activation");
  if (a.n == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.x, "x"));
  return internal::CheckPtr(kOp, a.y, "y");
}

absl::Status CanRun(const ExecContext& ctx, const ActivationBackwardArgs& a) {
  constexpr std::string_view kOp = "ActivationBackward";
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.n}));
  if (a.kind != Activation::kGelu && a.kind != Activation::kTanh)
    return internal::InvalidArg(kOp, "unknown activation");
  if (a.n == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.saved, "saved"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.dy, "dy"));
  return internal::CheckPtr(kOp, a.dx, "dx");
}

absl::Status ActivationForward(const ExecContext& ctx, const ActivationForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.n == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::ActivationForwardCuda(ctx, a));
  // erf costs ~20 flops: a smaller grain than the pure copy passes.
  ctx.Pool().ParallelFor(0, a.n, internal::kElementwiseGrain / 4, [&](int64_t i0, int64_t i1) {
    if (a.kind == Activation::kGelu) {
      GeluForwardRange(a.x + i0, a.y + i0, i1 - i0);
    } else {
      for (int64_t i = i0; i < i1; ++i) a.y[i] = std::tanh(a.x[i]);
    }
  });
  return absl::OkStatus();
}

absl::Status ActivationBackward(const ExecContext& ctx, const ActivationBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.n == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::ActivationBackwardCuda(ctx, a));
  ctx.Pool().ParallelFor(0, a.n, internal::kElementwiseGrain / 4, [&](int64_t i0, int64_t i1) {
    if (a.kind == Activation::kGelu) {
      GeluBackwardRange(a.saved + i0, a.dy + i0, a.dx + i0, i1 - i0, a.accumulate_dx);
      return;
    }
    for (int64_t i = i0; i < i1; ++i) {
      const float y = a.saved[i];  // tanh: the saved tensor is the output
      const float v = a.dy[i] * (1.0f - y * y);
      a.dx[i] = a.accumulate_dx ? a.dx[i] + v : v;
    }
  });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
