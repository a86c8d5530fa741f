// Reductions and in-place scaling for gradient handling.
//
//   SumSquares:  result[0] = (accumulate ? result[0] : 0) + sum_i x[i]^2   (grad-norm clipping:
//                call once per tensor with accumulate, then sqrt on the host)
//   SumSquaresMany: SumSquares of each of several tensors in turn, accumulating from the second
//                on (the same bits as those calls on the CPU), in one call: on CUDA, one launch
//                for all the tensors' ranges and one to add them up, instead of a launch per tensor
//   Scale:       x[i] *= alpha                                          (apply the clip factor)
//   ColumnSum:   out[c] = (accumulate ? out[c] : 0) + sum_r x[r, c]     (bias gradients)
//
// SumSquares accumulates in double on both backends, over a fixed split of the array (64 ranges
// on the CPU, one block's threads on CUDA; SumSquaresMany: 64 ranges per tensor on both, a block
// each on CUDA), so the result does not depend on the thread count; it is rounded to fp32 once
// per tensor. ColumnSum adds each column in row order on the CPU; on CUDA as 8 interleaved
// partial sums (rows r = y mod 8) added in fixed order, so both are deterministic but may differ
// in the last bits.
// `result` lives on ctx.device (device memory for CUDA), like every other pointer.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

struct SumSquaresArgs {
  int64_t n = 0;
  const float* x = nullptr;  // [n]
  float* result = nullptr;   // [1]
  bool accumulate = false;
};

struct SumSquaresManyArgs {
  int64_t tensors = 0;
  const float* const* x = nullptr;  // host array [tensors] of pointers to ctx.device memory
  const int64_t* n = nullptr;       // host array [tensors]: each tensor's length
  float* result = nullptr;          // [1]
  bool accumulate = false;          // for the first tensor; the others always accumulate
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
absl::Status CanRun(const ExecContext& ctx, const SumSquaresManyArgs& args);
absl::Status CanRun(const ExecContext& ctx, const ScaleArgs& args);
absl::Status CanRun(const ExecContext& ctx, const ColumnSumArgs& args);
absl::Status SumSquares(const ExecContext& ctx, const SumSquaresArgs& args);
absl::Status SumSquaresMany(const ExecContext& ctx, const SumSquaresManyArgs& args);
absl::Status Scale(const ExecContext& ctx, const ScaleArgs& args);
absl::Status ColumnSum(const ExecContext& ctx, const ColumnSumArgs& args);

namespace internal {
absl::Status SumSquaresCuda(const ExecContext& ctx, const SumSquaresArgs& args);
absl::Status SumSquaresManyCuda(const ExecContext& ctx, const SumSquaresManyArgs& args);
absl::Status ScaleCuda(const ExecContext& ctx, const ScaleArgs& args);
absl::Status ColumnSumCuda(const ExecContext& ctx, const ColumnSumArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
