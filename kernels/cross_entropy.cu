// Softmax cross-entropy, CUDA backend. One block walks all rows (classification heads have a
// handful of classes; an LLM vocabulary of 32 K over 1 K tokens is ~128 MB, a few ms on one SM),
// which keeps the mean deterministic without a workspace or atomics.
#include <cfloat>

#include "kernels/cross_entropy.h"
#include "kernels/cuda_util.cuh"

namespace fedlora::kernels::internal {
namespace {

constexpr int kThreads = 256;

// Block-wide reduction; op is max or sum. All threads get the result.
template <bool kMax>
__device__ float BlockReduce(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? sh[lane] : (kMax ? -FLT_MAX : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, v, o);
      v = kMax ? fmaxf(v, other) : v + other;
    }
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  v = sh[0];
  __syncthreads();
  return v;
}

__global__ void CrossEntropyKernel(int64_t B, int64_t C, const float* logits, const int32_t* labels, int32_t ignore,
                                   float loss_scale, float* loss, float* dlogits) {
  __shared__ float sh[kThreads / 32];
  __shared__ int64_t count_sh;
  // Count valid labels first (the gradient scale needs N).
  if (threadIdx.x == 0) {
    int64_t n = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int32_t y = labels[b];
      if (y != ignore && y >= 0 && y < C) ++n;
    }
    count_sh = n;
  }
  __syncthreads();
  const int64_t count = count_sh;
  const float grad_scale = count > 0 ? loss_scale / static_cast<float>(count) : 0.0f;
  double total = 0.0;  // meaningful in thread 0
  for (int64_t b = 0; b < B; ++b) {
    const float* z = logits + b * C;
    const int32_t y = labels[b];
    const bool ignored = !(y != ignore && y >= 0 && y < C);
    float m = -FLT_MAX;
    for (int64_t j = threadIdx.x; j < C; j += kThreads) m = fmaxf(m, z[j]);
    m = BlockReduce<true>(m, sh);
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < C; j += kThreads) s += expf(z[j] - m);
    s = BlockReduce<false>(s, sh);
    const float lse = m + logf(s);
    const float zy = ignored ? 0.0f : z[y];
    __syncthreads();  // every thread has read z[y] before dlogits (which may alias) is written
    if (threadIdx.x == 0 && !ignored) total += static_cast<double>(lse) - zy;
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
  if (threadIdx.x == 0) *loss = count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.0f;
}

}  // namespace

absl::Status SoftmaxCrossEntropyCuda(const ExecContext& ctx, const CrossEntropyArgs& a) {
  CrossEntropyKernel<<<1, kThreads, 0, Stream(ctx)>>>(a.batch, a.classes, a.logits, a.labels, a.ignore_index,
                                                       a.loss_scale, a.loss, a.dlogits);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
