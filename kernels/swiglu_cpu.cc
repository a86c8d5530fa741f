// SwiGLU: validation, dispatch, CPU backend.
#include <utility>

#include "kernels/base/kernel_util.h"
#include "kernels/cpu_math.h"
#include "kernels/swiglu.h"

namespace fedlora::kernels {
namespace {

constexpr std::string_view kFwd = "SwiGluForward";
constexpr std::string_view kBwd = "SwiGluBackward";

inline float Sigmoid(float x) { return 1.0f / (1.0f + internal::FastExp(-x)); }

// Compiled for AVX2 as well as the baseline (the polynomial exp makes these compute-bound).
__attribute__((target_clones("avx2", "default"))) void ForwardRange(const float* gate,
                                                                    const float* up, float* y,
                                                                    int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    y[i] = g * Sigmoid(g) * up[i];
  }
}
__attribute__((target_clones("avx2", "default"))) void BackwardRange(const float* gate,
                                                                     const float* up,
                                                                     const float* dy, float* dgate,
                                                                     float* dup, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], u = up[i], d = dy[i];
    const float s = Sigmoid(g);
    const float silu = g * s;
    dgate[i] = d * u * (s * (1.0f + g * (1.0f - s)));
    dup[i] = d * silu;
  }
}

}  // namespace

absl::Status CanRun(const ExecContext& ctx, const SwiGluForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kFwd));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kFwd, {a.n}));
  if (a.n == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.gate, "gate"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.up, "up"));
  return internal::CheckPtr(kFwd, a.y, "y");
}

absl::Status CanRun(const ExecContext& ctx, const SwiGluBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kBwd));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kBwd, {a.n}));
  if (a.n == 0) return absl::OkStatus();
  for (auto [p, name] : {std::pair<const void*, const char*>{a.gate, "gate"},
                         {a.up, "up"},
                         {a.dy, "dy"},
                         {a.dgate, "dgate"},
                         {a.dup, "dup"}}) {
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, p, name));
  }
  return absl::OkStatus();
}

absl::Status SwiGluForward(const ExecContext& ctx, const SwiGluForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.n == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda) return FEDLORA_KERNELS_CUDA(internal::SwiGluForwardCuda(ctx, a));
  ctx.Pool().ParallelFor(0, a.n, internal::kElementwiseGrain / 4, [&](int64_t i0, int64_t i1) {
    ForwardRange(a.gate + i0, a.up + i0, a.y + i0, i1 - i0);
  });
  return absl::OkStatus();
}

absl::Status SwiGluBackward(const ExecContext& ctx, const SwiGluBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.n == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::SwiGluBackwardCuda(ctx, a));
  ctx.Pool().ParallelFor(0, a.n, internal::kElementwiseGrain / 4, [&](int64_t i0, int64_t i1) {
    BackwardRange(a.gate + i0, a.up + i0, a.dy + i0, a.dgate + i0, a.dup + i0, i1 - i0);
  });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
