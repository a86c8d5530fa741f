// BiasAdd and Add: validation, dispatch, CPU backend.
#include <algorithm>

#include "kernels/base/kernel_util.h"
#include "kernels/elementwise.h"

namespace fedlora::kernels {

absl::Status CanRun(const ExecContext& ctx, const BiasAddArgs& a) {
  constexpr std::string_view kOp = "BiasAdd";
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.rows, a.cols}));
  if (a.rows == 0 || a.cols == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.bias, "bias"));
  return internal::CheckPtr(kOp, a.y, "y");
}

absl::Status CanRun(const ExecContext& ctx, const AddArgs& a) {
  constexpr std::string_view kOp = "Add";
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.n}));
  if (a.n == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.a, "a"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.b, "b"));
  return internal::CheckPtr(kOp, a.out, "out");
}

absl::Status BiasAdd(const ExecContext& ctx, const BiasAddArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.rows == 0 || a.cols == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda) return FEDLORA_KERNELS_CUDA(internal::BiasAddCuda(ctx, a));
  const int64_t grain = std::max<int64_t>(1, internal::kElementwiseGrain / a.cols);
  ctx.Pool().ParallelFor(0, a.rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* __restrict__ y = a.y + r * a.cols;
      const float* __restrict__ b = a.bias;
      if (a.accumulate) {
        for (int64_t c = 0; c < a.cols; ++c) y[c] += b[c];
      } else {
        for (int64_t c = 0; c < a.cols; ++c) y[c] = b[c];
      }
    }
  });
  return absl::OkStatus();
}

absl::Status Add(const ExecContext& ctx, const AddArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.n == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda) return FEDLORA_KERNELS_CUDA(internal::AddCuda(ctx, a));
  ctx.Pool().ParallelFor(0, a.n, internal::kElementwiseGrain, [&](int64_t i0, int64_t i1) {
    // out may alias a or b, so no __restrict__ here; the loop still vectorises (same index).
    const float* x = a.a;
    const float* y = a.b;
    float* o = a.out;
    const float alpha = a.alpha;
    for (int64_t i = i0; i < i1; ++i) o[i] = x[i] + alpha * y[i];
  });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
