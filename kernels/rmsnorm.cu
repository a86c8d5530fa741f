// RMSNorm, CUDA backend: one warp per row; dgamma by column tiles with partials added in fixed
// order, as layernorm.cu.
#include "kernels/base/cuda_util.cuh"
#include "kernels/base/warp_reduce.cuh"
#include "kernels/rmsnorm.h"

namespace fedlora::kernels::internal {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void RmsNormForwardKernel(int64_t rows, int64_t C, float eps, const float* x_all,
                                     const float* __restrict__ gamma, float* y_all,
                                     float* rstd_out) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x;
  const float* x = x_all + r * C;
  float* y = y_all + r * C;
  float sq = 0.0f;
  for (int64_t j = lane; j < C; j += 32) sq += x[j] * x[j];
  const float rstd = rsqrtf(WarpSum(sq) / static_cast<float>(C) + eps);
  for (int64_t j = lane; j < C; j += 32) y[j] = gamma[j] * (x[j] * rstd);
  if (lane == 0 && rstd_out != nullptr) rstd_out[r] = rstd;
}

__global__ void RmsNormBackwardDxKernel(int64_t rows, int64_t C, const float* x_all,
                                        const float* __restrict__ gamma,
                                        const float* __restrict__ rstd_in, const float* dy_all,
                                        float* dx_all, bool accumulate) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x;
  const float* x = x_all + r * C;
  const float* dy = dy_all + r * C;
  float* dx = dx_all + r * C;
  const float rstd = rstd_in[r];
  float sgx = 0.0f;
  for (int64_t j = lane; j < C; j += 32) sgx += dy[j] * gamma[j] * (x[j] * rstd);
  const float mgx = WarpSum(sgx) / static_cast<float>(C);
  for (int64_t j = lane; j < C; j += 32) {
    const float v = rstd * (dy[j] * gamma[j] - (x[j] * rstd) * mgx);
    dx[j] = accumulate ? dx[j] + v : v;
  }
}

__global__ void RmsNormBackwardParamsKernel(int64_t rows, int64_t C, const float* __restrict__ x,
                                            const float* __restrict__ rstd,
                                            const float* __restrict__ dy, float* dgamma,
                                            bool accumulate) {
  __shared__ float sg[8][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float g = 0.0f;
  if (c < C) {
    for (int64_t r = threadIdx.y; r < rows; r += 8) g += dy[r * C + c] * (x[r * C + c] * rstd[r]);
  }
  sg[threadIdx.y][threadIdx.x] = g;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = accumulate ? dgamma[c] : 0.0f;
    for (int k = 0; k < 8; ++k) t += sg[k][threadIdx.x];
    dgamma[c] = t;
  }
}

}  // namespace

absl::Status RmsNormForwardCuda(const ExecContext& ctx, const RmsNormForwardArgs& a) {
  const unsigned grid = static_cast<unsigned>((a.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  RmsNormForwardKernel<<<grid, dim3(32, kWarpsPerBlock), 0, Stream(ctx)>>>(
      a.rows, a.cols, a.eps, a.x, a.gamma, a.y, a.rstd);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status RmsNormBackwardCuda(const ExecContext& ctx, const RmsNormBackwardArgs& a) {
  if (a.dgamma != nullptr) {  // first: dx may overwrite dy
    const unsigned grid = static_cast<unsigned>((a.cols + 31) / 32);
    RmsNormBackwardParamsKernel<<<grid, dim3(32, 8), 0, Stream(ctx)>>>(
        a.rows, a.cols, a.x, a.rstd, a.dy, a.dgamma, a.accumulate_params);
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  if (a.dx != nullptr) {
    const unsigned grid = static_cast<unsigned>((a.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    RmsNormBackwardDxKernel<<<grid, dim3(32, kWarpsPerBlock), 0, Stream(ctx)>>>(
        a.rows, a.cols, a.x, a.gamma, a.rstd, a.dy, a.dx, a.accumulate_dx);
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
