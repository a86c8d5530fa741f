// FixedPointAccumulate: CUDA backend. One thread per element (grid-stride): each sum is touched
// by one thread (indices are distinct), so no atomics are needed on the sums; integer adds make
// the bits the CPU's.
#include "kernels/base/cuda_util.cuh"
#include "kernels/base/fixed_point.h"

namespace fedlora::kernels::internal {
namespace {

constexpr int kThreads = 256;

__global__ void FixedPointAccumulateKernel(int64_t n, const float* __restrict__ x,
                                           const int64_t* __restrict__ index, uint64_t w, int sign,
                                           u128* __restrict__ sums, unsigned long long* first_bad) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    u128 term;
    if (!FixedPointTerm(__float_as_uint(x[i]), w, &term)) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
      continue;
    }
    sums[index != nullptr ? index[i] : i] += sign > 0 ? term : -term;
  }
}

}  // namespace

absl::Status FixedPointAccumulateCuda(const ExecContext& ctx, const FixedPointAccumulateArgs& a) {
  if (a.n == 0) {
    *a.first_bad = -1;
    return absl::OkStatus();
  }
  cudaStream_t stream = Stream(ctx);
  const unsigned long long none = static_cast<unsigned long long>(a.n);
  // Scratch: the smallest bad index.
  return WithStreamScratch(stream, sizeof(unsigned long long), [&](void* scratch) -> absl::Status {
    auto* bad = static_cast<unsigned long long*>(scratch);
    FEDLORA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(bad, &none, sizeof(none), cudaMemcpyHostToDevice, stream));
    FixedPointAccumulateKernel<<<GridFor(a.n, kThreads), kThreads, 0, stream>>>(
        a.n, a.x, a.index, a.weight, a.sign, a.sums, bad);
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
    unsigned long long host = none;
    FEDLORA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(&host, bad, sizeof(host), cudaMemcpyDeviceToHost, stream));
    FEDLORA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    *a.first_bad = host == none ? -1 : static_cast<int64_t>(host);
    return absl::OkStatus();
  });
}

}  // namespace fedlora::kernels::internal
