// SwiGLU, CUDA backend (the formulas of swiglu_cpu.cc with CUDA's expf).
#include "kernels/base/cuda_util.cuh"
#include "kernels/swiglu.h"

namespace fedlora::kernels::internal {
namespace {

__global__ void SwiGluForwardKernel(int64_t n, const float* gate, const float* up, float* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    y[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void SwiGluBackwardKernel(int64_t n, const float* gate, const float* up, const float* dy,
                                     float* dgate, float* dup) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i], u = up[i], d = dy[i];
    const float s = 1.0f / (1.0f + expf(-g));
    dgate[i] = d * u * (s * (1.0f + g * (1.0f - s)));
    dup[i] = d * g * s;
  }
}

}  // namespace

absl::Status SwiGluForwardCuda(const ExecContext& ctx, const SwiGluForwardArgs& a) {
  SwiGluForwardKernel<<<GridFor(a.n, 256), 256, 0, Stream(ctx)>>>(a.n, a.gate, a.up, a.y);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status SwiGluBackwardCuda(const ExecContext& ctx, const SwiGluBackwardArgs& a) {
  SwiGluBackwardKernel<<<GridFor(a.n, 256), 256, 0, Stream(ctx)>>>(a.n, a.gate, a.up, a.dy, a.dgate,
                                                                   a.dup);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
