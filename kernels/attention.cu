// The fused attention softmax, CUDA backend: one warp per row of P (seq <= 512 in the encoders
// we serve: <= 16 elements per lane), three passes over the row in L1.
#include <cfloat>

#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/base/cuda_util.cuh"
#include "kernels/base/warp_reduce.cuh"

namespace fedlora::kernels::internal {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void SoftmaxForwardKernel(int64_t rows, int64_t S, int64_t rows_per_batch,
                                     const float* mask_all, bool causal, float* scores,
                                     float p_drop, uint64_t seed, uint64_t stream, uint64_t offset,
                                     float* dropped) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x;
  float* s = scores + r * S;
  const float* mask = mask_all != nullptr ? mask_all + (r / rows_per_batch) * S : nullptr;
  const int64_t n = causal ? r % S + 1 : S;  // live columns; the rest of the row becomes 0
  float m = -INFINITY;
  for (int64_t j = lane; j < n; j += 32) {
    float v = s[j];
    if (mask != nullptr) v += mask[j];
    s[j] = v;
    m = fmaxf(m, v);
  }
  m = WarpMax(m);
  float sum = 0.0f;
  for (int64_t j = lane; j < n; j += 32) {
    const float e = expf(s[j] - m);
    s[j] = e;
    sum += e;
  }
  const float inv = 1.0f / WarpSum(sum);
  const float keep_scale = 1.0f / (1.0f - p_drop);
  for (int64_t j = lane; j < S; j += 32) {
    const float pj = j < n ? s[j] * inv : 0.0f;
    s[j] = pj;
    if (dropped != nullptr) {
      const uint64_t idx = static_cast<uint64_t>(r * S + j);
      dropped[r * S + j] = UniformAt(seed, stream, offset + idx) >= p_drop ? pj * keep_scale : 0.0f;
    }
  }
}

__global__ void SoftmaxBackwardKernel(int64_t rows, int64_t S, const float* probs, float* grad,
                                      float p_drop, uint64_t seed, uint64_t stream, uint64_t offset,
                                      bool dropout) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x;
  const float* p = probs + r * S;
  float* g = grad + r * S;
  const float keep_scale = 1.0f / (1.0f - p_drop);
  float dot = 0.0f;
  for (int64_t j = lane; j < S; j += 32) {
    float gj = g[j];
    if (dropout) {
      const uint64_t idx = static_cast<uint64_t>(r * S + j);
      gj = UniformAt(seed, stream, offset + idx) >= p_drop ? gj * keep_scale : 0.0f;
      g[j] = gj;
    }
    dot += gj * p[j];
  }
  dot = WarpSum(dot);
  for (int64_t j = lane; j < S; j += 32) g[j] = p[j] * (g[j] - dot);
}

}  // namespace

absl::Status AttentionSoftmaxForwardCuda(const ExecContext& ctx, const SoftmaxForwardArgs& a) {
  const int64_t rows = a.batch * a.heads * a.seq;
  const unsigned grid = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  SoftmaxForwardKernel<<<grid, dim3(32, kWarpsPerBlock), 0, Stream(ctx)>>>(
      rows, a.seq, a.heads * a.seq, a.mask, a.causal, a.scores, a.dropout.p, a.dropout.seed,
      a.dropout.stream, a.dropout.offset, a.dropout.active() ? a.dropped : nullptr);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status AttentionSoftmaxBackwardCuda(const ExecContext& ctx, const SoftmaxBackwardArgs& a) {
  const int64_t rows = a.batch * a.heads * a.seq;
  const unsigned grid = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  SoftmaxBackwardKernel<<<grid, dim3(32, kWarpsPerBlock), 0, Stream(ctx)>>>(
      rows, a.seq, a.probs, a.grad, a.dropout.p, a.dropout.seed, a.dropout.stream, a.dropout.offset,
      a.dropout.active());
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
