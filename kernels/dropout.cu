// Dropout, CUDA backend: one thread per Philox block of 4 elements, the same stream as the CPU.
#include "core/rng.h"
#include "kernels/base/cuda_util.cuh"
#include "kernels/dropout.h"

namespace fedlora::kernels::internal {
namespace {

__global__ void DropoutKernel(int64_t n, float p, uint64_t seed, uint64_t stream, uint64_t offset,
                              const float* x, float* out) {
  const float keep_scale = 1.0f / (1.0f - p);
  const uint64_t first = offset >> 2, last = (offset + n - 1) >> 2;
  for (uint64_t blk = first + blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
       blk <= last; blk += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const Philox4x32Block r = Philox4x32(seed, blk, stream);
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t idx = blk * 4 + lane;
      if (idx < offset || idx >= offset + n) continue;
      const int64_t i = static_cast<int64_t>(idx - offset);
      out[i] = U32ToUniformFloat(r.v[lane]) >= p ? x[i] * keep_scale : 0.0f;
    }
  }
}

__global__ void CopyKernel(int64_t n, const float* x, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = x[i];
  }
}

}  // namespace

absl::Status DropoutCuda(const ExecContext& ctx, const DropoutArgs& a) {
  if (!a.spec.active()) {
    CopyKernel<<<GridFor(a.n, 256), 256, 0, Stream(ctx)>>>(a.n, a.x, a.out);
  } else {
    const int64_t blocks =
        static_cast<int64_t>(((a.spec.offset + a.n - 1) >> 2) - (a.spec.offset >> 2) + 1);
    DropoutKernel<<<GridFor(blocks, 256), 256, 0, Stream(ctx)>>>(
        a.n, a.spec.p, a.spec.seed, a.spec.stream, a.spec.offset, a.x, a.out);
  }
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
