// Reductions and in-place scaling for gradient handling.
//
//   SumSquares:  result[0] = (accumulate ? result[0] : 0) + sum_i x[i]^2   (grad-norm clipping:
//                call once per tensor with accumulate, then sqrt on the host)
//   Scale:       x[i] *= alpha                                          (apply the clip factor)
//   ColumnSum:   out[c] = (accumulate ? out[c] : 0) + sum_r x[r, c]     (bias gradients)
//
// SumSquares accumulates in double on both backends, over a fixed split of the array (64 ranges
// on the CPU, one block's threads on CUDA), so the result does not depend on the thread count;
// it is rounded to fp32 once. ColumnSum adds each column in row order on both backends.
// `result` lives on ctx.device (device memory for CUDA), like every other pointer.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/context.h"

namespace fedlora::kernels {

struct SumSquaresArgs {
  int64_t n = 0;
  const float* x = nullptr;  // [n]
  float* result = nullptr;   // [1]
  bool accumulate = false;
};

struct ScaleArgs {
  int64_t n = 0;
  float alpha = 1.0f;
  float* x = nullptr;  // [n], scaled in place
};

struct ColumnSumArgs {
  int64_t rows = 0, cols = 0;
  const float* x = nullptr;  // [rows, cols]
  float* out = nullptr;      // [cols]
  bool accumulate = false;
};

absl::Status CanRun(const ExecContext& ctx, const SumSquaresArgs& args);
absl::Status CanRun(const ExecContext& ctx, const ScaleArgs& args);
absl::Status CanRun(const ExecContext& ctx, const ColumnSumArgs& args);
absl::Status SumSquares(const ExecContext& ctx, const SumSquaresArgs& args);
absl::Status Scale(const ExecContext& ctx, const ScaleArgs& args);
absl::Status ColumnSum(const ExecContext& ctx, const ColumnSumArgs& args);

namespace internal {
absl::Status SumSquaresCuda(const ExecContext& ctx, const SumSquaresArgs& args);
absl::Status ScaleCuda(const ExecContext& ctx, const ScaleArgs& args);
absl::Status ColumnSumCuda(const ExecContext& ctx, const ColumnSumArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
