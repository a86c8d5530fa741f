// One AdamW step (Loshchilov & Hutter; torch.optim.AdamW, amsgrad=False) on flat fp32 arrays,
// with bias correction and decoupled weight decay, in the same order of operations as PyTorch's
// single-tensor implementation:
//
//   g  = grad_scale * grad                      (grad_scale: the clip factor, saves a pass)
//   p  = p * (1 - lr * weight_decay)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g^2
//   p  = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// t = step is 1-based (the step being taken). Shapes: param, grad, m, v [n]; m and v start at 0.
// Memory-bound: reads 4 arrays and writes 3 (28 bytes per element).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

struct AdamWArgs {
  int64_t n = 0;
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;  // first moment
  float* v = nullptr;  // second moment
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;  // torch.optim.AdamW's default
  int64_t step = 1;            // >= 1
  float grad_scale = 1.0f;
};

absl::Status CanRun(const ExecContext& ctx, const AdamWArgs& args);
absl::Status AdamWStep(const ExecContext& ctx, const AdamWArgs& args);

namespace internal {
absl::Status AdamWStepCuda(const ExecContext& ctx, const AdamWArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
