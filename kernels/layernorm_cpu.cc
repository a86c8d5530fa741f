// LayerNorm: validation, dispatch, CPU backend. Forward and backward side by side.
#include <algorithm>
#include <cmath>

#include "kernels/base/kernel_util.h"
#include "kernels/cpu_math.h"
#include "kernels/layernorm.h"

namespace fedlora::kernels {
namespace {
constexpr std::string_view kFwd = "LayerNormForward";
constexpr std::string_view kBwd = "LayerNormBackward";
constexpr int64_t kColumnBlock = 256;  // dgamma/dbeta columns per task (accumulators in L1)
}  // namespace

absl::Status CanRun(const ExecContext& ctx, const LayerNormForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kFwd));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kFwd, {a.rows, a.cols}));
  if (!(a.eps >= 0.0f)) return internal::InvalidArg(kFwd, "eps must be >= 0");
  if (a.rows == 0) return absl::OkStatus();
  if (a.cols == 0) return internal::InvalidArg(kFwd, "cols must be > 0");
  if ((a.mean == nullptr) != (a.rstd == nullptr))
    return internal::InvalidArg(kFwd, "set both mean and rstd, or neither");
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.x, "x"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.gamma, "gamma"));
  return internal::CheckPtr(kFwd, a.y, "y");
}

absl::Status CanRun(const ExecContext& ctx, const LayerNormBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kBwd));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kBwd, {a.rows, a.cols}));
  if (a.cols == 0 && a.rows > 0) return internal::InvalidArg(kBwd, "cols must be > 0");
  const bool need_params = a.dgamma != nullptr || a.dbeta != nullptr;
  if (a.dx == nullptr && !need_params)
    return internal::InvalidArg(kBwd, "nothing requested (dx, dgamma, dbeta all null)");
  if (a.rows == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.dy, "dy"));
  const bool need_xhat = a.dx != nullptr || a.dgamma != nullptr;
  if (need_xhat) {
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.x, "x"));
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.mean, "mean"));
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.rstd, "rstd"));
  }
  if (a.dx != nullptr) FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.gamma, "gamma"));
  return absl::OkStatus();
}

absl::Status LayerNormForward(const ExecContext& ctx, const LayerNormForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.rows == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::LayerNormForwardCuda(ctx, a));
  const int64_t C = a.cols;
  ctx.Pool().ParallelFor(0, a.rows, std::max<int64_t>(1, internal::kElementwiseGrain / C),
                         [&](int64_t r0, int64_t r1) {
                           for (int64_t r = r0; r < r1; ++r) {
                             const float* x = a.x + r * C;
                             float* y = a.y + r * C;
                             // mean = sum x / C;  var = sum (x - mean)^2 / C  (two passes over a row that sits in cache)
                             const float mean = internal::Sum8(C, [&](int64_t j) { return x[j]; }) /
                                                static_cast<float>(C);
                             const float sq = internal::Sum8(C, [&](int64_t j) {
                               const float d = x[j] - mean;
                               return d * d;
                             });
                             const float rstd =
                                 1.0f / std::sqrt(sq / static_cast<float>(C) + a.eps);
                             // y = gamma * (x - mean) * rstd + beta   (y may alias x: same index read then written)
                             if (a.beta != nullptr) {
                               for (int64_t j = 0; j < C; ++j)
                                 y[j] = a.gamma[j] * ((x[j] - mean) * rstd) + a.beta[j];
                             } else {
                               for (int64_t j = 0; j < C; ++j)
                                 y[j] = a.gamma[j] * ((x[j] - mean) * rstd);
                             }
                             if (a.mean != nullptr) {
                               a.mean[r] = mean;
                               a.rstd[r] = rstd;
                             }
                           }
                         });
  return absl::OkStatus();
}

absl::Status LayerNormBackward(const ExecContext& ctx, const LayerNormBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::LayerNormBackwardCuda(ctx, a));
  const int64_t C = a.cols, R = a.rows;
  ThreadPool& pool = ctx.Pool();
  // dgamma = sum_r dy * xhat, dbeta = sum_r dy: by column blocks, rows in order (deterministic).
  // Runs before dx because dx may overwrite dy.
  if (a.dgamma != nullptr || a.dbeta != nullptr) {
    const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
    pool.ParallelFor(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t c0 = blk * kColumnBlock, w = std::min(kColumnBlock, C - c0);
        float dg[kColumnBlock], db[kColumnBlock];
        for (int64_t j = 0; j < w; ++j) {
          dg[j] = (a.accumulate_params && a.dgamma != nullptr) ? a.dgamma[c0 + j] : 0.0f;
          db[j] = (a.accumulate_params && a.dbeta != nullptr) ? a.dbeta[c0 + j] : 0.0f;
        }
        for (int64_t r = 0; r < R; ++r) {
          const float* dy = a.dy + r * C + c0;
          if (a.dgamma != nullptr) {
            const float* x = a.x + r * C + c0;
            const float mean = a.mean[r], rstd = a.rstd[r];
            for (int64_t j = 0; j < w; ++j) dg[j] += dy[j] * ((x[j] - mean) * rstd);
          }
          for (int64_t j = 0; j < w; ++j) db[j] += dy[j];
        }
        for (int64_t j = 0; j < w; ++j) {
          if (a.dgamma != nullptr) a.dgamma[c0 + j] = dg[j];
          if (a.dbeta != nullptr) a.dbeta[c0 + j] = db[j];
        }
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
          const float mean = a.mean[r], rstd = a.rstd[r];
          // mg = mean(g), mgx = mean(g * xhat), g = dy * gamma
          const float sg = internal::Sum8(C, [&](int64_t j) { return dy[j] * a.gamma[j]; });
          const float sgx = internal::Sum8(
              C, [&](int64_t j) { return dy[j] * a.gamma[j] * ((x[j] - mean) * rstd); });
          const float mg = sg / static_cast<float>(C), mgx = sgx / static_cast<float>(C);
          // dx = rstd * (g - mg - xhat * mgx)
          for (int64_t j = 0; j < C; ++j) {
            const float xhat = (x[j] - mean) * rstd;
            const float v = rstd * (dy[j] * a.gamma[j] - mg - xhat * mgx);
            dx[j] = a.accumulate_dx ? dx[j] + v : v;
          }
        }
      });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
