// TopK: validation, dispatch, CPU backend.
#include <algorithm>
#include <cmath>
#include <functional>

#include "kernels/base/kernel_util.h"
#include "kernels/base/topk.h"

namespace fedlora::kernels {

absl::StatusOr<size_t> TopKWorkspaceBytes(const ExecContext& ctx, const TopKArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, "TopK"));
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::TopKWorkspaceBytesCuda(ctx, a.n, a.k));
  return static_cast<size_t>(std::max<int64_t>(a.n, 0)) * sizeof(float);
}

absl::Status CanRun(const ExecContext& ctx, const TopKArgs& a) {
  constexpr std::string_view kOp = "TopK";
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.n}));
  if (a.n > kTopKMaxN) return internal::InvalidArg(kOp, absl::StrCat("n ", a.n, " exceeds 2^32"));
  if (a.k < 0 || a.k > a.n)
    return internal::InvalidArg(kOp, absl::StrCat("k ", a.k, " is not in [0, n = ", a.n, "]"));
  if (a.k == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.x, "x"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.indices, "indices"));
  FEDLORA_ASSIGN_OR_RETURN(const size_t need, TopKWorkspaceBytes(ctx, a));
  if (a.workspace_bytes < need) {
    return internal::InvalidArg(kOp,
                                absl::StrCat("workspace_bytes ", a.workspace_bytes, " < ", need));
  }
  return internal::CheckPtr(kOp, a.workspace, "workspace", need > 0);
}

absl::Status TopK(const ExecContext& ctx, const TopKArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.k == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda) return FEDLORA_KERNELS_CUDA(internal::TopKCuda(ctx, a));
  // Select on the magnitudes alone (4 bytes each, no indirection), then one pass in index order:
  // everything above the k-th largest, and entries equal to it while places are left.
  float* mags = static_cast<float*>(a.workspace);
  for (int64_t i = 0; i < a.n; ++i) mags[i] = std::fabs(a.x[i]);
  std::nth_element(mags, mags + (a.k - 1), mags + a.n, std::greater<float>());
  const float threshold = mags[a.k - 1];
  int64_t above = 0;
  for (int64_t i = 0; i < a.n; ++i) above += std::fabs(a.x[i]) > threshold;
  int64_t ties_left = a.k - above, out = 0;
  for (int64_t i = 0; i < a.n && out < a.k; ++i) {
    const float m = std::fabs(a.x[i]);
    if (m > threshold || (m == threshold && ties_left-- > 0)) a.indices[out++] = i;
  }
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
