// RMSNorm: validation, dispatch, CPU backend.
#include <algorithm>
#include <cmath>

#include "kernels/base/kernel_util.h"
#include "kernels/cpu_math.h"
#include "kernels/rmsnorm.h"

namespace fedlora::kernels {
namespace {
constexpr std::string_view kFwd = "RmsNormForward";
constexpr std::string_view kBwd = "RmsNormBackward";
constexpr int64_t kColumnBlock = 256;  // dgamma columns per task
}  // namespace

absl::Status CanRun(const ExecContext& ctx, const RmsNormForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kFwd));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kFwd, {a.rows, a.cols}));
  if (!(a.eps >= 0.0f)) return internal::InvalidArg(kFwd, "eps must be >= 0");
  if (a.rows == 0) return absl::OkStatus();
  if (a.cols == 0) return internal::InvalidArg(kFwd, "cols must be > 0");
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.x, "x"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.gamma, "gamma"));
  return internal::CheckPtr(kFwd, a.y, "y");
}

absl::Status CanRun(const ExecContext& ctx, const RmsNormBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kBwd));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kBwd, {a.rows, a.cols}));
  if (a.dx == nullptr && a.dgamma == nullptr)
    return internal::InvalidArg(kBwd, "nothing requested (dx and dgamma null)");
  if (a.rows == 0) return absl::OkStatus();
  if (a.cols == 0) return internal::InvalidArg(kBwd, "cols must be > 0");
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.dy, "dy"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.x, "x"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.rstd, "rstd"));
  if (a.dx != nullptr) FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.gamma, "gamma"));
  return absl::OkStatus();
}

absl::Status RmsNormForward(const ExecContext& ctx, const RmsNormForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.rows == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::RmsNormForwardCuda(ctx, a));
  const int64_t C = a.cols;
  ctx.Pool().ParallelFor(
      0, a.rows, std::max<int64_t>(1, internal::kElementwiseGrain / C),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* x = a.x + r * C;
          float* y = a.y + r * C;
          const float sq = internal::Sum8(C, [&](int64_t j) { return x[j] * x[j]; });
          const float rstd = 1.0f / std::sqrt(sq / static_cast<float>(C) + a.eps);
          for (int64_t j = 0; j < C; ++j) y[j] = a.gamma[j] * (x[j] * rstd);
          if (a.rstd != nullptr) a.rstd[r] = rstd;
        }
      });
  return absl::OkStatus();
}

absl::Status RmsNormBackward(const ExecContext& ctx, const RmsNormBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.rows == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::RmsNormBackwardCuda(ctx, a));
  const int64_t C = a.cols, R = a.rows;
  ThreadPool& pool = ctx.Pool();
  // dgamma first (dx may overwrite dy): by column blocks, rows in order (deterministic).
  if (a.dgamma != nullptr) {
    const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
    pool.ParallelFor(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t c0 = blk * kColumnBlock, w = std::min(kColumnBlock, C - c0);
        float dg[kColumnBlock];
        for (int64_t j = 0; j < w; ++j) dg[j] = a.accumulate_params ? a.dgamma[c0 + j] : 0.0f;
        for (int64_t r = 0; r < R; ++r) {
          const float* dy = a.dy + r * C + c0;
          const float* x = a.x + r * C + c0;
          const float rstd = a.rstd[r];
          for (int64_t j = 0; j < w; ++j) dg[j] += dy[j] * (x[j] * rstd);
        }
        for (int64_t j = 0; j < w; ++j) a.dgamma[c0 + j] = dg[j];
      }
    });
  }
  if (a.dx == nullptr) return absl::OkStatus();
  pool.ParallelFor(
      0, R, std::max<int64_t>(1, internal::kElementwiseGrain / C), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* x = a.x + r * C;
          const float* dy = a.dy + r * C;
          float* dx = a.dx + r * C;
          const float rstd = a.rstd[r];
          // mgx = mean(g * xhat), g = dy * gamma;  dx = rstd * (g - xhat * mgx)
          const float sgx =
              internal::Sum8(C, [&](int64_t j) { return dy[j] * a.gamma[j] * (x[j] * rstd); });
          const float mgx = sgx / static_cast<float>(C);
          for (int64_t j = 0; j < C; ++j) {
            const float v = rstd * (dy[j] * a.gamma[j] - (x[j] * rstd) * mgx);
            dx[j] = a.accumulate_dx ? dx[j] + v : v;
          }
        }
      });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
