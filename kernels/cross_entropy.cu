// Softmax cross-entropy, CUDA backend, in three launches so that an LLM's logits (16 K tokens x
// 49 K classes is 3.2 GB) spread over every SM: one block counts the valid labels (the gradient
// scale needs N); one block per row computes its log-sum-exp and gradient and writes the row's loss
// to a scratch array; one block sums the row losses as the CPU does (64 fixed ranges of rows, each
// in row order in double, then the ranges in order), so the mean is deterministic without atomics.
#include <algorithm>
#include <cfloat>

#include "kernels/base/cuda_util.cuh"
#include "kernels/base/warp_reduce.cuh"
#include "kernels/cross_entropy.h"

namespace fedlora::kernels::internal {
namespace {

constexpr int kThreads = 256;

// Block-wide reduction; op is max or sum. All threads get the result.
template <bool kMax>
__device__ float BlockReduce(float v, float* sh) {
  v = WarpReduce<kMax>(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? sh[lane] : (kMax ? -FLT_MAX : 0.0f);
    v = WarpReduce<kMax>(v);
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  v = sh[0];
  __syncthreads();
  return v;
}

__device__ bool Ignored(int32_t y, int32_t ignore, int64_t C) {
  return !(y != ignore && y >= 0 && y < C);
}

__global__ void CountLabelsKernel(int64_t B, int64_t C, const int32_t* labels, int32_t ignore,
                                  int64_t* count) {
  __shared__ unsigned long long total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  unsigned long long n = 0;
  for (int64_t b = threadIdx.x; b < B; b += kThreads) n += Ignored(labels[b], ignore, C) ? 0 : 1;
  atomicAdd(&total, n);  // integer adds: the same total in any order
  __syncthreads();
  if (threadIdx.x == 0) *count = static_cast<int64_t>(total);
}

__global__ void CrossEntropyRowsKernel(int64_t B, int64_t C, const float* logits,
                                       const int32_t* labels, int32_t ignore, float loss_scale,
                                       const int64_t* count, double* row_loss, float* dlogits) {
  __shared__ float sh[kThreads / 32];
  const int64_t n = *count;
  const float grad_scale = n > 0 ? loss_scale / static_cast<float>(n) : 0.0f;
  for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
    const float* z = logits + b * C;
    const int32_t y = labels[b];
    const bool ignored = Ignored(y, ignore, C);
    float m = -FLT_MAX;
    for (int64_t j = threadIdx.x; j < C; j += kThreads) m = fmaxf(m, z[j]);
    m = BlockReduce<true>(m, sh);
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < C; j += kThreads) s += expf(z[j] - m);
    s = BlockReduce<false>(s, sh);
    const float lse = m + logf(s);
    const float zy = ignored ? 0.0f : z[y];
    __syncthreads();  // every thread has read z[y] before dlogits (which may alias) is written
    if (threadIdx.x == 0) row_loss[b] = ignored ? 0.0 : static_cast<double>(lse) - zy;
    if (dlogits != nullptr) {
      float* dz = dlogits + b * C;
      const float scale = ignored ? 0.0f : grad_scale;
      const float inv = 1.0f / s;
      for (int64_t j = threadIdx.x; j < C; j += kThreads) {
        float v = scale * (expf(z[j] - m) * inv);
        if (j == y && !ignored) v -= scale;
        dz[j] = v;
      }
    }
    __syncthreads();
  }
}

constexpr int kRanges = 64;  // as the CPU backend's fixed split

__global__ void MeanLossKernel(int64_t B, const double* row_loss, const int64_t* count,
                               float* loss) {
  __shared__ double partial[kRanges];
  const int r = threadIdx.x;
  double s = 0.0;
  for (int64_t b = r * B / kRanges; b < (r + 1) * B / kRanges; ++b) s += row_loss[b];
  partial[r] = s;
  __syncthreads();
  if (r == 0) {
    double total = 0.0;
    for (int i = 0; i < kRanges; ++i) total += partial[i];
    const int64_t n = *count;
    *loss = n > 0 ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
  }
}

}  // namespace

absl::Status SoftmaxCrossEntropyCuda(const ExecContext& ctx, const CrossEntropyArgs& a) {
  cudaStream_t stream = Stream(ctx);
  if (a.batch == 0) {
    FEDLORA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.loss, 0, sizeof(float), stream));
    return absl::OkStatus();
  }
  // Scratch: the valid-label count, then one double per row.
  const size_t bytes = sizeof(int64_t) + static_cast<size_t>(a.batch) * sizeof(double);
  return WithStreamScratch(stream, bytes, [&](void* scratch) -> absl::Status {
    int64_t* count = static_cast<int64_t*>(scratch);
    double* row_loss = reinterpret_cast<double*>(count + 1);
    CountLabelsKernel<<<1, kThreads, 0, stream>>>(a.batch, a.classes, a.labels, a.ignore_index,
                                                  count);
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
    const int64_t grid = std::min<int64_t>(a.batch, int64_t{1} << 20);
    CrossEntropyRowsKernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
        a.batch, a.classes, a.logits, a.labels, a.ignore_index, a.loss_scale, count, row_loss,
        a.dlogits);
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
    MeanLossKernel<<<1, kRanges, 0, stream>>>(a.batch, row_loss, count, a.loss);
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  });
}

}  // namespace fedlora::kernels::internal
