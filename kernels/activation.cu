// GELU and tanh, CUDA backend (the same formulas as activation_cpu.cc, with CUDA's erff/expf/tanhf).
#include "kernels/activation.h"
#include "kernels/base/cuda_util.cuh"

namespace fedlora::kernels::internal {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

__global__ void ActivationForwardKernel(int64_t n, bool gelu, const float* x, float* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    y[i] = gelu ? 0.5f * v * (1.0f + erff(v * kInvSqrt2)) : tanhf(v);
  }
}

__global__ void ActivationBackwardKernel(int64_t n, bool gelu, const float* saved, const float* dy,
                                         float* dx, bool accumulate) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float s = saved[i];
    float d;
    if (gelu) {
      const float cdf = 0.5f * (1.0f + erff(s * kInvSqrt2));
      d = cdf + s * kInvSqrt2Pi * expf(-0.5f * s * s);
    } else {
      d = 1.0f - s * s;
    }
    const float v = dy[i] * d;
    dx[i] = accumulate ? dx[i] + v : v;
  }
}

}  // namespace

absl::Status ActivationForwardCuda(const ExecContext& ctx, const ActivationForwardArgs& a) {
  ActivationForwardKernel<<<GridFor(a.n, 256), 256, 0, Stream(ctx)>>>(
      a.n, a.kind == Activation::kGelu, a.x, a.y);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status ActivationBackwardCuda(const ExecContext& ctx, const ActivationBackwardArgs& a) {
  ActivationBackwardKernel<<<GridFor(a.n, 256), 256, 0, Stream(ctx)>>>(
      a.n, a.kind == Activation::kGelu, a.saved, a.dy, a.dx, a.accumulate_dx);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
