// Root-mean-square normalisation over the last dimension, as LLaMA's LlamaRMSNorm (Zhang and
// Sennrich 2019):
//
//   rstd = 1 / sqrt(sum_j x_j^2 / C + eps),  y = gamma * (x * rstd)
//
// Backward, with g = dy * gamma and xhat = x * rstd:
//   dx     = rstd * (g - xhat * mean_j(g * xhat))
//   dgamma = sum over rows of dy * xhat                    (optional: a frozen norm needs only dx)
//
// Shapes: x, y, dy, dx [rows, cols]; gamma, dgamma [cols]; rstd [rows], saved by the forward for
// the backward (null at inference). Statistics in fp32, as Hugging Face computes them.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

struct RmsNormForwardArgs {
  int64_t rows = 0, cols = 0;
  float eps = 1e-6f;
  const float* x = nullptr;      // [rows, cols]
  const float* gamma = nullptr;  // [cols]
  float* y = nullptr;            // [rows, cols]; may alias x
  float* rstd = nullptr;         // [rows] or null
};

struct RmsNormBackwardArgs {
  int64_t rows = 0, cols = 0;
  const float* x = nullptr;      // [rows, cols] the forward's input
  const float* gamma = nullptr;  // [cols]
  const float* rstd = nullptr;   // [rows] saved
  const float* dy = nullptr;     // [rows, cols]
  float* dx = nullptr;           // [rows, cols] or null; may alias dy
  bool accumulate_dx = false;
  float* dgamma = nullptr;  // [cols] or null
  bool accumulate_params = false;
};

absl::Status CanRun(const ExecContext& ctx, const RmsNormForwardArgs& args);
absl::Status CanRun(const ExecContext& ctx, const RmsNormBackwardArgs& args);
absl::Status RmsNormForward(const ExecContext& ctx, const RmsNormForwardArgs& args);
absl::Status RmsNormBackward(const ExecContext& ctx, const RmsNormBackwardArgs& args);

namespace internal {
absl::Status RmsNormForwardCuda(const ExecContext& ctx, const RmsNormForwardArgs& args);
absl::Status RmsNormBackwardCuda(const ExecContext& ctx, const RmsNormBackwardArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
