// AdamW: validation, dispatch, CPU backend.
#include <cmath>

#include "kernels/adamw.h"
#include "kernels/base/kernel_util.h"

namespace fedlora::kernels {
namespace {
constexpr std::string_view kOp = "AdamWStep";

struct AdamWScalars {
  float step_size, bc2_sqrt, decay, b1, b2, eps, grad_scale;
};

// A plain function over restrict pointers and scalars by value, so that GCC vectorises it (inside
// the ParallelFor lambda the scalars would be loads through the closure).
void AdamWRange(float* __restrict__ p, const float* __restrict__ gr, float* __restrict__ m,
                float* __restrict__ v, int64_t n, const AdamWScalars k) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = k.grad_scale * gr[i];
    const float mi = k.b1 * m[i] + (1.0f - k.b1) * g;
    const float vi = k.b2 * v[i] + (1.0f - k.b2) * g * g;
    p[i] = p[i] * k.decay - k.step_size * mi / (std::sqrt(vi) / k.bc2_sqrt + k.eps);
    m[i] = mi;
    v[i] = vi;
  }
}
}  // namespace

absl::Status CanRun(const ExecContext& ctx, const AdamWArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.n}));
  if (a.step < 1)
    return internal::InvalidArg(kOp, absl::StrCat("step ", a.step, " < 1 (steps are 1-based)"));
  if (!(a.beta1 >= 0.0f && a.beta1 < 1.0f) || !(a.beta2 >= 0.0f && a.beta2 < 1.0f)) {
    return internal::InvalidArg(kOp, "betas must be in [0, 1)");
  }
  if (!(a.lr >= 0.0f) || !(a.eps > 0.0f) || !(a.weight_decay >= 0.0f) ||
      !std::isfinite(a.grad_scale)) {
    return internal::InvalidArg(kOp, "lr, weight_decay must be >= 0, eps > 0, grad_scale finite");
  }
  if (a.n == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.param, "param"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.grad, "grad"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.m, "m"));
  return internal::CheckPtr(kOp, a.v, "v");
}

absl::Status AdamWStep(const ExecContext& ctx, const AdamWArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.n == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda) return FEDLORA_KERNELS_CUDA(internal::AdamWStepCuda(ctx, a));
  // Scalars in double, as PyTorch computes them in Python, then rounded once.
  const double t = static_cast<double>(a.step);
  AdamWScalars k;
  k.step_size = static_cast<float>(a.lr / (1.0 - std::pow(static_cast<double>(a.beta1), t)));
  k.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(a.beta2), t)));
  k.decay = 1.0f - a.lr * a.weight_decay;
  k.b1 = a.beta1;
  k.b2 = a.beta2;
  k.eps = a.eps;
  k.grad_scale = a.grad_scale;
  ctx.Pool().ParallelFor(0, a.n, internal::kElementwiseGrain, [&](int64_t i0, int64_t i1) {
    AdamWRange(a.param + i0, a.grad + i0, a.m + i0, a.v + i0, i1 - i0, k);
  });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
