// Layer normalisation over the last dimension, as torch.nn.LayerNorm (biased variance):
//
//   mean = sum_j x_j / C,  rstd = 1 / sqrt(sum_j (x_j - mean)^2 / C + eps)
//   xhat = (x - mean) * rstd,  y = gamma * xhat + beta
//
// Backward, with g = dy * gamma:
//   dx     = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))
//   dgamma = sum over rows of dy * xhat,  dbeta = sum over rows of dy
// dgamma/dbeta are optional: a frozen LayerNorm needs only dx.
//
// Shapes: x, y, dy, dx [rows, cols]; gamma, beta, dgamma, dbeta [cols]; mean, rstd [rows] fp32,
// saved by the forward for the backward. Statistics are accumulated in fp32 with a two-pass
// (mean, then centred sum of squares) row computation, which is what PyTorch's CPU kernel gets to
// within rounding. Passes: forward reads x twice (the row stays in L1/L2), writes y once;
// backward reads x and dy once per row for dx and once more per column block for dgamma/dbeta
// (no workspace, and sums that do not depend on the thread count).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

struct LayerNormForwardArgs {
  int64_t rows = 0, cols = 0;
  float eps = 1e-12f;            // BERT's layer_norm_eps
  const float* x = nullptr;      // [rows, cols]
  const float* gamma = nullptr;  // [cols]
  const float* beta = nullptr;   // [cols] or null (no shift)
  float* y = nullptr;            // [rows, cols]; may alias x
  float* mean = nullptr;         // [rows] or null (inference)
  float* rstd = nullptr;         // [rows] or null (inference)
};

struct LayerNormBackwardArgs {
  int64_t rows = 0, cols = 0;
  const float* x = nullptr;      // [rows, cols] the forward's input
  const float* gamma = nullptr;  // [cols]
  const float* mean = nullptr;   // [rows] saved
  const float* rstd = nullptr;   // [rows] saved
  const float* dy = nullptr;     // [rows, cols]
  float* dx = nullptr;           // [rows, cols]; may alias dy
  bool accumulate_dx = false;
  float* dgamma = nullptr;  // [cols] or null
  float* dbeta = nullptr;   // [cols] or null
  bool accumulate_params = false;
};

absl::Status CanRun(const ExecContext& ctx, const LayerNormForwardArgs& args);
absl::Status CanRun(const ExecContext& ctx, const LayerNormBackwardArgs& args);
absl::Status LayerNormForward(const ExecContext& ctx, const LayerNormForwardArgs& args);
absl::Status LayerNormBackward(const ExecContext& ctx, const LayerNormBackwardArgs& args);

namespace internal {
absl::Status LayerNormForwardCuda(const ExecContext& ctx, const LayerNormForwardArgs& args);
absl::Status LayerNormBackwardCuda(const ExecContext& ctx, const LayerNormBackwardArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
