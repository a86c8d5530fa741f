// SumSquares, Scale, ColumnSum: CUDA backend. Both reductions are deterministic (fixed
// assignment of elements to threads, fixed tree order), like the CPU's.
#include "kernels/cuda_util.cuh"
#include "kernels/reduce.h"

namespace fedlora::kernels::internal {
namespace {

constexpr int kSumSquaresThreads = 1024;

// One block: each thread strides over the array in double, then a shared-memory tree.
// A single SM streams the few million adapter gradients in tens of microseconds, which is not
// worth a workspace and a second kernel.
__global__ void SumSquaresKernel(int64_t n, const float* __restrict__ x, float* result, bool accumulate) {
  __shared__ double sh[kSumSquaresThreads];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double v = x[i];
    s += v * v;
  }
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) sh[threadIdx.x] += sh[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double base = accumulate ? static_cast<double>(*result) : 0.0;
    *result = static_cast<float>(base + sh[0]);
  }
}

__global__ void ScaleKernel(int64_t n, float alpha, float* x) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] *= alpha;
  }
}

// Block (32, 8): threadIdx.x walks 32 adjacent columns (coalesced), threadIdx.y takes every 8th
// row; the 8 partial sums per column are added in fixed order.
__global__ void ColumnSumKernel(int64_t rows, int64_t cols, const float* __restrict__ x, float* out, bool accumulate) {
  __shared__ float sh[8][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += 8) s += x[r * cols + c];
  }
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = accumulate ? out[c] : 0.0f;
    for (int k = 0; k < 8; ++k) t += sh[k][threadIdx.x];
    out[c] = t;
  }
}

}  // namespace

absl::Status SumSquaresCuda(const ExecContext& ctx, const SumSquaresArgs& a) {
  SumSquaresKernel<<<1, kSumSquaresThreads, 0, Stream(ctx)>>>(a.n, a.x, a.result, a.accumulate);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status ScaleCuda(const ExecContext& ctx, const ScaleArgs& a) {
  ScaleKernel<<<GridFor(a.n, 256), 256, 0, Stream(ctx)>>>(a.n, a.alpha, a.x);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status ColumnSumCuda(const ExecContext& ctx, const ColumnSumArgs& a) {
  const unsigned grid = static_cast<unsigned>((a.cols + 31) / 32);
  ColumnSumKernel<<<grid, dim3(32, 8), 0, Stream(ctx)>>>(a.rows, a.cols, a.x, a.out, a.accumulate);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
