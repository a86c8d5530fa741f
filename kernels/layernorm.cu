// LayerNorm, CUDA backend. One warp per row (rows are 384..1024 wide in the encoders we serve:
// 12..32 elements per lane, re-read from L1 for the second pass); dgamma/dbeta by column tiles.
#include "kernels/base/cuda_util.cuh"
#include "kernels/base/warp_reduce.cuh"
#include "kernels/layernorm.h"

namespace fedlora::kernels::internal {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void LayerNormForwardKernel(int64_t rows, int64_t C, float eps, const float* x_all,
                                       const float* __restrict__ gamma,
                                       const float* __restrict__ beta, float* y_all,
                                       float* mean_out, float* rstd_out) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x;
  const float* x = x_all + r * C;
  float* y = y_all + r * C;
  float s = 0.0f;
  for (int64_t j = lane; j < C; j += 32) s += x[j];
  const float mean = WarpSum(s) / static_cast<float>(C);
  float sq = 0.0f;
  for (int64_t j = lane; j < C; j += 32) {
    const float d = x[j] - mean;
    sq += d * d;
  }
  const float rstd = rsqrtf(WarpSum(sq) / static_cast<float>(C) + eps);
  for (int64_t j = lane; j < C; j += 32) {
    const float xhat = (x[j] - mean) * rstd;
    y[j] = beta != nullptr ? gamma[j] * xhat + beta[j] : gamma[j] * xhat;
  }
  if (lane == 0 && mean_out != nullptr) {
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

__global__ void LayerNormBackwardDxKernel(int64_t rows, int64_t C, const float* x_all,
                                          const float* __restrict__ gamma,
                                          const float* __restrict__ mean_in,
                                          const float* __restrict__ rstd_in, const float* dy_all,
                                          float* dx_all, bool accumulate) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x;
  const float* x = x_all + r * C;
  const float* dy = dy_all + r * C;
  float* dx = dx_all + r * C;
  const float mean = mean_in[r], rstd = rstd_in[r];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = lane; j < C; j += 32) {
    const float g = dy[j] * gamma[j];
    sg += g;
    sgx += g * ((x[j] - mean) * rstd);
  }
  const float mg = WarpSum(sg) / static_cast<float>(C), mgx = WarpSum(sgx) / static_cast<float>(C);
  for (int64_t j = lane; j < C; j += 32) {
    const float xhat = (x[j] - mean) * rstd;
    const float v = rstd * (dy[j] * gamma[j] - mg - xhat * mgx);
    dx[j] = accumulate ? dx[j] + v : v;
  }
}

// Block (32, 8): 32 adjacent columns, 8 row groups; partials added in fixed order.
__global__ void LayerNormBackwardParamsKernel(int64_t rows, int64_t C, const float* __restrict__ x,
                                              const float* __restrict__ mean,
                                              const float* __restrict__ rstd,
                                              const float* __restrict__ dy, float* dgamma,
                                              float* dbeta, bool accumulate) {
  __shared__ float sg[8][33], sb[8][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float g = 0.0f, b = 0.0f;
  if (c < C) {
    for (int64_t r = threadIdx.y; r < rows; r += 8) {
      const float d = dy[r * C + c];
      if (dgamma != nullptr) g += d * ((x[r * C + c] - mean[r]) * rstd[r]);
      b += d;
    }
  }
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tg = (accumulate && dgamma != nullptr) ? dgamma[c] : 0.0f;
    float tb = (accumulate && dbeta != nullptr) ? dbeta[c] : 0.0f;
    for (int k = 0; k < 8; ++k) {
      tg += sg[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    if (dgamma != nullptr) dgamma[c] = tg;
    if (dbeta != nullptr) dbeta[c] = tb;
  }
}

}  // namespace

absl::Status LayerNormForwardCuda(const ExecContext& ctx, const LayerNormForwardArgs& a) {
  const unsigned grid = static_cast<unsigned>((a.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  LayerNormForwardKernel<<<grid, dim3(32, kWarpsPerBlock), 0, Stream(ctx)>>>(
      a.rows, a.cols, a.eps, a.x, a.gamma, a.beta, a.y, a.mean, a.rstd);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status LayerNormBackwardCuda(const ExecContext& ctx, const LayerNormBackwardArgs& a) {
  // Parameters first: dx may overwrite dy. With no rows they are zeros (or left as they are when
  // accumulating), as on the CPU.
  if ((a.dgamma != nullptr || a.dbeta != nullptr) && a.cols > 0) {
    const unsigned grid = static_cast<unsigned>((a.cols + 31) / 32);
    LayerNormBackwardParamsKernel<<<grid, dim3(32, 8), 0, Stream(ctx)>>>(
        a.rows, a.cols, a.x, a.mean, a.rstd, a.dy, a.dgamma, a.dbeta, a.accumulate_params);
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  if (a.dx != nullptr && a.rows > 0) {
    const unsigned grid = static_cast<unsigned>((a.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    LayerNormBackwardDxKernel<<<grid, dim3(32, kWarpsPerBlock), 0, Stream(ctx)>>>(
        a.rows, a.cols, a.x, a.gamma, a.mean, a.rstd, a.dy, a.dx, a.accumulate_dx);
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
