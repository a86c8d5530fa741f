// SumSquares, SumSquaresMany, Scale, ColumnSum: CUDA backend. The reductions are deterministic (fixed
// assignment of elements to threads, fixed tree order), like the CPU's.
#include <algorithm>
#include <vector>

#include "kernels/base/cuda_util.cuh"
#include "kernels/reduce.h"

namespace fedlora::kernels::internal {
namespace {

constexpr int kSumSquaresThreads = 1024;

// The sum of x[b, e)^2 in double over the block's threads, added in a fixed tree; every thread
// gets it. `sh` holds blockDim.x doubles.
__device__ double BlockSumSquares(const float* __restrict__ x, int64_t b, int64_t e, double* sh) {
  double s = 0.0;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
    const double v = x[i];
    s += v * v;
  }
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) sh[threadIdx.x] += sh[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = sh[0];
  __syncthreads();  // sh may be reused once every thread has read it
  return total;
}

// SumSquares: one block, which streams one adapter tensor in microseconds (SumSquaresMany takes
// many tensors at once).
__global__ void SumSquaresKernel(int64_t n, const float* __restrict__ x, float* result,
                                 bool accumulate) {
  __shared__ double sh[kSumSquaresThreads];
  const double total = BlockSumSquares(x, 0, n, sh);
  if (threadIdx.x == 0) {
    const double base = accumulate ? static_cast<double>(*result) : 0.0;
    *result = static_cast<float>(base + total);
  }
}

// SumSquaresMany: block (r, t) sums range r of 64 of tensor t (the CPU's split) in double.
constexpr int kManyRanges = 64;
constexpr int kManyThreads = 256;

struct TensorRef {
  const float* x;
  int64_t n;
};

__global__ void RangeSumSquaresKernel(int64_t tensors, const TensorRef* refs, double* partial) {
  __shared__ double sh[kManyThreads];
  for (int64_t t = blockIdx.y; t < tensors; t += gridDim.y) {
    const TensorRef ref = refs[t];
    const int64_t r = blockIdx.x;
    const double total =
        BlockSumSquares(ref.x, r * ref.n / kManyRanges, (r + 1) * ref.n / kManyRanges, sh);
    if (threadIdx.x == 0) partial[t * kManyRanges + r] = total;
  }
}

// One thread: per tensor, the running total plus its 64 partials in order, rounded to fp32, as
// SumSquares with accumulate does on the CPU.
__global__ void AddRangeSumsKernel(int64_t tensors, const double* partial, float* result,
                                   bool accumulate) {
  float total = accumulate ? *result : 0.0f;
  for (int64_t t = 0; t < tensors; ++t) {
    double s = total;
    for (int r = 0; r < kManyRanges; ++r) s += partial[t * kManyRanges + r];
    total = static_cast<float>(s);
  }
  *result = total;
}

__global__ void ScaleKernel(int64_t n, float alpha, float* x) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] *= alpha;
  }
}

// Block (32, 8): threadIdx.x walks 32 adjacent columns (coalesced), threadIdx.y takes every 8th
// row; the 8 partial sums per column are added in fixed order.
__global__ void ColumnSumKernel(int64_t rows, int64_t cols, const float* __restrict__ x, float* out,
                                bool accumulate) {
  __shared__ float sh[8][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
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

absl::Status SumSquaresManyCuda(const ExecContext& ctx, const SumSquaresManyArgs& a) {
  cudaStream_t stream = Stream(ctx);
  if (a.tensors == 0) {
    if (!a.accumulate)
      FEDLORA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.result, 0, sizeof(float), stream));
    return absl::OkStatus();
  }
  std::vector<TensorRef> refs(static_cast<size_t>(a.tensors));
  for (int64_t t = 0; t < a.tensors; ++t) refs[t] = {a.x[t], a.n[t]};
  // Scratch: the tensor table, then 64 partial sums per tensor.
  const size_t table_bytes = refs.size() * sizeof(TensorRef);
  const size_t bytes = table_bytes + refs.size() * kManyRanges * sizeof(double);
  return WithStreamScratch(stream, bytes, [&](void* scratch) -> absl::Status {
    TensorRef* dev_refs = static_cast<TensorRef*>(scratch);
    double* partial = reinterpret_cast<double*>(static_cast<char*>(scratch) + table_bytes);
    // From pageable memory: returns once `refs` is staged, so it may go out of scope after.
    FEDLORA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dev_refs, refs.data(), table_bytes, cudaMemcpyHostToDevice, stream));
    const dim3 grid(kManyRanges, static_cast<unsigned>(std::min<int64_t>(a.tensors, 65535)));
    RangeSumSquaresKernel<<<grid, kManyThreads, 0, stream>>>(a.tensors, dev_refs, partial);
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
    AddRangeSumsKernel<<<1, 1, 0, stream>>>(a.tensors, partial, a.result, a.accumulate);
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  });
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
