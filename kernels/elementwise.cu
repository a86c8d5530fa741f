// BiasAdd and Add, CUDA backend: grid-stride loops (memory-bound; one pass each).
#include "kernels/base/cuda_util.cuh"
#include "kernels/elementwise.h"

namespace fedlora::kernels::internal {
namespace {

__global__ void BiasAddKernel(int64_t rows, int64_t cols, const float* __restrict__ bias,
                              float* __restrict__ y, bool accumulate) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float b = bias[i % cols];
    y[i] = accumulate ? y[i] + b : b;
  }
}

__global__ void AddKernel(int64_t n, const float* a, const float* b, float alpha, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = a[i] + alpha * b[i];
  }
}

}  // namespace

absl::Status BiasAddCuda(const ExecContext& ctx, const BiasAddArgs& a) {
  BiasAddKernel<<<GridFor(a.rows * a.cols, 256), 256, 0, Stream(ctx)>>>(a.rows, a.cols, a.bias, a.y,
                                                                        a.accumulate);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status AddCuda(const ExecContext& ctx, const AddArgs& a) {
  AddKernel<<<GridFor(a.n, 256), 256, 0, Stream(ctx)>>>(a.n, a.a, a.b, a.alpha, a.out);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
