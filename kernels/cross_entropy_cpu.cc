// Softmax cross-entropy: validation, dispatch, CPU backend.
#include <algorithm>
#include <cmath>

#include "kernels/base/kernel_util.h"
#include "kernels/cross_entropy.h"

namespace fedlora::kernels {
namespace {
constexpr std::string_view kOp = "SoftmaxCrossEntropy";
constexpr int64_t kRanges = 64;  // fixed split of the rows: the loss sum does not depend on threads
}  // namespace

absl::Status CanRun(const ExecContext& ctx, const CrossEntropyArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.batch, a.classes}));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.loss, "loss"));
  if (a.batch == 0) return absl::OkStatus();
  if (a.classes == 0) return internal::InvalidArg(kOp, "classes must be > 0");
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.logits, "logits"));
  return internal::CheckPtr(kOp, a.labels, "labels");
}

absl::Status SoftmaxCrossEntropy(const ExecContext& ctx, const CrossEntropyArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::SoftmaxCrossEntropyCuda(ctx, a));
  const int64_t B = a.batch, C = a.classes;
  int64_t count = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t y = a.labels[b];
    if (y == a.ignore_index) continue;
    if (y < 0 || y >= C) {
      return internal::InvalidArg(kOp,
                                  absl::StrCat("labels[", b, "] = ", y, " outside [0, ", C, ")"));
    }
    ++count;
  }
  // dlogits = (loss_scale / N) * (softmax - onehot); N == 0 gives zero gradients.
  const float grad_scale = count > 0 ? a.loss_scale / static_cast<float>(count) : 0.0f;
  double partial[kRanges] = {};
  ctx.Pool().ParallelFor(
      0, kRanges, std::max<int64_t>(1, kRanges * 1024 / std::max<int64_t>(1, B * C)),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          double s = 0.0;
          for (int64_t b = r * B / kRanges; b < (r + 1) * B / kRanges; ++b) {
            const float* z = a.logits + b * C;
            const int32_t y = a.labels[b];
            const bool ignored = y == a.ignore_index;
            float m = z[0];
            for (int64_t j = 1; j < C; ++j) m = std::max(m, z[j]);
            float sum = 0.0f;
            for (int64_t j = 0; j < C; ++j) sum += std::exp(z[j] - m);
            const float lse = m + std::log(sum);
            if (!ignored)
              s += static_cast<double>(lse) - z[y];  // read z[y] before dlogits may overwrite it
            if (a.dlogits != nullptr) {
              float* dz = a.dlogits + b * C;
              const float scale = ignored ? 0.0f : grad_scale;
              const float inv_sum = 1.0f / sum;
              for (int64_t j = 0; j < C; ++j) dz[j] = scale * (std::exp(z[j] - m) * inv_sum);
              if (!ignored) dz[y] -= scale;
            }
          }
          partial[r] = s;
        }
      });
  double total = 0.0;
  for (double p : partial) total += p;
  *a.loss = count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.0f;
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
