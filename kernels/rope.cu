// Rotary embeddings, CUDA backend: one thread per (token, head, i < D/2) pair of elements.
#include "kernels/base/cuda_util.cuh"
#include "kernels/rope.h"

namespace fedlora::kernels::internal {
namespace {

__global__ void RopeKernel(int64_t tokens, int64_t heads, int64_t D, int64_t max_positions,
                           const int32_t* __restrict__ positions,
                           const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                           float* x_all, float sign) {
  const int64_t half = D / 2;
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= tokens * heads * half) return;
  const int64_t i = idx % half, th = idx / half, t = th / heads;
  const int32_t p = positions[t];
  if (p < 0 || p >= max_positions) return;
  float* x = x_all + th * D;
  const float c = cos_table[p * half + i], s = sign * sin_table[p * half + i];
  const float x1 = x[i], x2 = x[i + half];
  x[i] = x1 * c - x2 * s;
  x[i + half] = x2 * c + x1 * s;
}

}  // namespace

absl::Status RopeCuda(const ExecContext& ctx, const RopeArgs& a) {
  const int64_t n = a.tokens * a.heads * (a.head_dim / 2);
  constexpr int kThreads = 256;
  const unsigned grid = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  RopeKernel<<<grid, kThreads, 0, Stream(ctx)>>>(a.tokens, a.heads, a.head_dim, a.max_positions,
                                                 a.positions, a.cos, a.sin, a.x,
                                                 a.inverse ? -1.0f : 1.0f);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
