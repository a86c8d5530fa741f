// Warp-wide reductions shared by the kernels' .cu files: a butterfly over the 32 lanes with
// __shfl_xor_sync, after which every lane holds the result. Each step combines the same pairs in
// the same order in every kernel, so a row reduced here sums the same way wherever it is reduced.
#pragma once

#include <cuda_runtime.h>

namespace fedlora::kernels::internal {

// Max (kMax) or sum over the warp's 32 lanes.
template <bool kMax>
__device__ __forceinline__ float WarpReduce(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  return v;
}

__device__ __forceinline__ float WarpSum(float v) { return WarpReduce<false>(v); }
__device__ __forceinline__ float WarpMax(float v) { return WarpReduce<true>(v); }

}  // namespace fedlora::kernels::internal
