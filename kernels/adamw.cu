// AdamW, CUDA backend: the same per-element formula as adamw_cpu.cc; scalars from the host.
#include <cmath>

#include "kernels/adamw.h"
#include "kernels/base/cuda_util.cuh"

namespace fedlora::kernels::internal {
namespace {

__global__ void AdamWKernel(int64_t n, float* __restrict__ p, const float* __restrict__ gr,
                            float* __restrict__ m, float* __restrict__ v, float b1, float b2,
                            float eps, float decay, float step_size, float bc2_sqrt,
                            float grad_scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = grad_scale * gr[i];
    float pi = p[i] * decay;
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    pi -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
  }
}

}  // namespace

absl::Status AdamWStepCuda(const ExecContext& ctx, const AdamWArgs& a) {
  const double t = static_cast<double>(a.step);
  const float step_size =
      static_cast<float>(a.lr / (1.0 - std::pow(static_cast<double>(a.beta1), t)));
  const float bc2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(a.beta2), t)));
  AdamWKernel<<<GridFor(a.n, 256), 256, 0, Stream(ctx)>>>(
      a.n, a.param, a.grad, a.m, a.v, a.beta1, a.beta2, a.eps, 1.0f - a.lr * a.weight_decay,
      step_size, bc2_sqrt, a.grad_scale);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
