// SumSquares, SumSquaresMany, Scale, ColumnSum: validation, dispatch, CPU backend.
#include <algorithm>

#include "kernels/base/kernel_util.h"
#include "kernels/reduce.h"

namespace fedlora::kernels {
namespace {

// Number of fixed ranges SumSquares splits the array into; partial sums land in a stack array.
constexpr int64_t kSumSquaresRanges = 64;
// Columns per ColumnSum task: the accumulators of one task stay in registers / L1.
constexpr int64_t kColumnBlock = 256;

}  // namespace

absl::Status CanRun(const ExecContext& ctx, const SumSquaresArgs& a) {
  constexpr std::string_view kOp = "SumSquares";
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.n}));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.result, "result"));
  return internal::CheckPtr(kOp, a.x, "x", a.n > 0);
}

absl::Status CanRun(const ExecContext& ctx, const SumSquaresManyArgs& a) {
  constexpr std::string_view kOp = "SumSquaresMany";
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.tensors}));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.result, "result"));
  if (a.tensors == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.x, "x"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.n, "n"));
  for (int64_t t = 0; t < a.tensors; ++t) {
    if (a.n[t] < 0)
      return internal::InvalidArg(kOp, absl::StrCat("n[", t, "] = ", a.n[t], " is negative"));
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.x[t], "x[t]", a.n[t] > 0));
  }
  return absl::OkStatus();
}

absl::Status CanRun(const ExecContext& ctx, const ScaleArgs& a) {
  constexpr std::string_view kOp = "Scale";
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.n}));
  return internal::CheckPtr(kOp, a.x, "x", a.n > 0);
}

absl::Status CanRun(const ExecContext& ctx, const ColumnSumArgs& a) {
  constexpr std::string_view kOp = "ColumnSum";
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.rows, a.cols}));
  if (a.cols == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.out, "out"));
  return internal::CheckPtr(kOp, a.x, "x", a.rows > 0);
}

absl::Status SumSquares(const ExecContext& ctx, const SumSquaresArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (ctx.device == Device::kCuda) return FEDLORA_KERNELS_CUDA(internal::SumSquaresCuda(ctx, a));
  double partial[kSumSquaresRanges] = {};
  ctx.Pool().ParallelFor(0, kSumSquaresRanges,
                         std::max<int64_t>(1, internal::kElementwiseGrain * kSumSquaresRanges /
                                                  std::max<int64_t>(a.n, 1)),
                         [&](int64_t r0, int64_t r1) {
                           for (int64_t r = r0; r < r1; ++r) {
                             const int64_t b = r * a.n / kSumSquaresRanges,
                                           e = (r + 1) * a.n / kSumSquaresRanges;
                             // Squares and sums in double: a float square of a float is exact
                             // in double, so only the additions round, at 2^-53.
                             double s = 0.0;
                             for (int64_t i = b; i < e; ++i) {
                               const double v = a.x[i];
                               s += v * v;
                             }
                             partial[r] = s;
                           }
                         });
  double total = a.accumulate ? static_cast<double>(*a.result) : 0.0;
  for (double p : partial) total += p;
  *a.result = static_cast<float>(total);
  return absl::OkStatus();
}

absl::Status SumSquaresMany(const ExecContext& ctx, const SumSquaresManyArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::SumSquaresManyCuda(ctx, a));
  if (a.tensors == 0 && !a.accumulate) *a.result = 0.0f;
  for (int64_t t = 0; t < a.tensors; ++t) {
    FEDLORA_RETURN_IF_ERROR(SumSquares(
        ctx, {.n = a.n[t], .x = a.x[t], .result = a.result, .accumulate = t > 0 || a.accumulate}));
  }
  return absl::OkStatus();
}

absl::Status Scale(const ExecContext& ctx, const ScaleArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.n == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda) return FEDLORA_KERNELS_CUDA(internal::ScaleCuda(ctx, a));
  ctx.Pool().ParallelFor(0, a.n, internal::kElementwiseGrain, [&](int64_t i0, int64_t i1) {
    float* __restrict__ x = a.x;
    for (int64_t i = i0; i < i1; ++i) x[i] *= a.alpha;
  });
  return absl::OkStatus();
}

absl::Status ColumnSum(const ExecContext& ctx, const ColumnSumArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.cols == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda) return FEDLORA_KERNELS_CUDA(internal::ColumnSumCuda(ctx, a));
  const int64_t blocks = (a.cols + kColumnBlock - 1) / kColumnBlock;
  ctx.Pool().ParallelFor(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t c0 = blk * kColumnBlock, w = std::min(kColumnBlock, a.cols - c0);
      float acc[kColumnBlock];
      for (int64_t j = 0; j < w; ++j) acc[j] = a.accumulate ? a.out[c0 + j] : 0.0f;
      for (int64_t r = 0; r < a.rows; ++r) {
        const float* __restrict__ row = a.x + r * a.cols + c0;
        for (int64_t j = 0; j < w; ++j) acc[j] += row[j];
      }
      for (int64_t j = 0; j < w; ++j) a.out[c0 + j] = acc[j];
    }
  });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
