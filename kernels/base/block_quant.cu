// BlockQuantize, CUDA backend: the scales (one warp per block), for stochastic rounding each
// value's draw index by a device-wide exclusive scan (CUB), then one thread per code byte. The
// per-value arithmetic is kernels/base/block_quant.h's, shared with the CPU.
#include <cub/device/device_scan.cuh>

#include "core/rng.h"
#include "kernels/base/block_quant.h"
#include "kernels/base/cuda_util.cuh"
#include "kernels/base/kernel_util.h"
#include "kernels/base/warp_reduce.cuh"

namespace fedlora::kernels::internal {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

struct QuantLayout {
  size_t scales = 0, draws = 0, temp = 0, total = 0;
  size_t temp_bytes = 0;
};

absl::StatusOr<QuantLayout> Layout(cudaStream_t stream, const BlockQuantizeArgs& a) {
  QuantLayout l;
  const int64_t blocks = (a.n + a.block_size - 1) / a.block_size;
  if (a.stochastic) {
    FEDLORA_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(
        nullptr, l.temp_bytes, static_cast<uint64_t*>(nullptr), a.n, stream));
  }
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t start = at;
    at += AlignUp(bytes);
    return start;
  };
  l.scales = take(static_cast<size_t>(blocks) * sizeof(float));
  l.draws = take(a.stochastic ? static_cast<size_t>(a.n) * sizeof(uint64_t) : 0);
  l.temp = take(l.temp_bytes);
  l.total = at;
  return l;
}

// One warp per block: the scale, into `scales` and as the block's first 4 bytes of `out`.
__global__ void ScaleKernel(int64_t n, const float* __restrict__ x, int64_t block_size,
                            int64_t blocks, uint64_t block_bytes, bool sign_mode,
                            float* __restrict__ scales, uint8_t* __restrict__ out) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
       b < blocks; b += warps) {
    const int64_t first = b * block_size;
    const int64_t m = n - first < block_size ? n - first : block_size;
    float s = 0.0f;
    if (sign_mode) {
      if (lane == 0) s = QuantMeanAbs(x + first, m);  // in index order, as the CPU rounds it
    } else {
      for (int64_t i = lane; i < m; i += kWarp) s = fmaxf(s, fabsf(x[first + i]));
      s = WarpMax(s);
    }
    if (lane == 0) {
      scales[b] = s;
      const uint32_t bits = __float_as_uint(s);
      uint8_t* dst = out + static_cast<uint64_t>(b) * block_bytes;
      for (int j = 0; j < 4; ++j) dst[j] = static_cast<uint8_t>(bits >> (8 * j));
    }
  }
}

// draws[i] = 1 when value i takes a random draw (the scan turns these into draw indices).
__global__ void DrawFlagKernel(int64_t n, const float* __restrict__ x, int64_t block_size,
                               uint32_t top, const float* __restrict__ scales,
                               uint64_t* __restrict__ draws) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float s = scales[i / block_size];
    draws[i] = QuantDraws(x[i], s, QuantInvStep(s, top), top) ? 1 : 0;
  }
}

// One thread per code byte: byte j of the codes (all blocks' codes numbered in order).
__global__ void CodesKernel(int64_t n, const float* __restrict__ x, int bits, int64_t block_size,
                            int64_t blocks, int64_t code_bytes, bool sign_mode, bool stochastic,
                            uint64_t seed, uint64_t stream, const float* __restrict__ scales,
                            const uint64_t* __restrict__ draws, uint8_t* __restrict__ out) {
  const uint32_t top = (1u << bits) - 1;
  const int per_byte = 8 / bits;
  const int64_t full_codes = block_size * bits / 8;  // code bytes of a full block
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < code_bytes;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = j / full_codes < blocks - 1 ? j / full_codes : blocks - 1;
    const int64_t local = j - b * full_codes;
    const float s = scales[b];
    const double inv_step = QuantInvStep(s, top);
    const int64_t end = (b + 1) * block_size < n ? (b + 1) * block_size : n;
    uint32_t acc = 0;
    for (int u = 0; u < per_byte; ++u) {
      const int64_t i = b * block_size + local * per_byte + u;
      if (i >= end) break;
      const float v = x[i];
      float uniform = 0.0f;
      if (stochastic && QuantDraws(v, s, inv_step, top))
        uniform = UniformAt(seed, stream, draws[i]);
      acc |= QuantCode(v, s, inv_step, top, sign_mode, stochastic, uniform) << (u * bits);
    }
    out[static_cast<uint64_t>(b) * (4 + full_codes) + 4 + local] = static_cast<uint8_t>(acc);
  }
}

}  // namespace

absl::StatusOr<size_t> BlockQuantizeWorkspaceBytesCuda(const ExecContext& ctx,
                                                       const BlockQuantizeArgs& a) {
  FEDLORA_ASSIGN_OR_RETURN(const QuantLayout l, Layout(Stream(ctx), a));
  return l.total;
}

absl::Status BlockQuantizeCuda(const ExecContext& ctx, const BlockQuantizeArgs& a) {
  cudaStream_t stream = Stream(ctx);
  FEDLORA_ASSIGN_OR_RETURN(const QuantLayout l, Layout(stream, a));
  char* ws = static_cast<char*>(a.workspace);
  auto* scales = reinterpret_cast<float*>(ws + l.scales);
  auto* draws = a.stochastic ? reinterpret_cast<uint64_t*>(ws + l.draws) : nullptr;
  const int64_t blocks = (a.n + a.block_size - 1) / a.block_size;
  const bool sign_mode = QuantSignMode(a.bits, a.stochastic);
  const uint64_t block_bytes = QuantBlockBytes(static_cast<uint64_t>(a.block_size), a.bits);
  ScaleKernel<<<GridFor(blocks * kWarp, kThreads), kThreads, 0, stream>>>(
      a.n, a.x, a.block_size, blocks, block_bytes, sign_mode, scales, a.out);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  if (a.stochastic) {
    const uint32_t top = (1u << a.bits) - 1;
    DrawFlagKernel<<<GridFor(a.n, kThreads), kThreads, 0, stream>>>(a.n, a.x, a.block_size, top,
                                                                    scales, draws);
    FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
    size_t temp_bytes = l.temp_bytes;
    FEDLORA_CUDA_RETURN_IF_ERROR(
        cub::DeviceScan::ExclusiveSum(ws + l.temp, temp_bytes, draws, a.n, stream));
  }
  const int64_t code_bytes =
      static_cast<int64_t>(BlockQuantizedBytes(static_cast<uint64_t>(a.n), a.bits, a.block_size)) -
      4 * blocks;
  CodesKernel<<<GridFor(code_bytes, kThreads), kThreads, 0, stream>>>(
      a.n, a.x, a.bits, a.block_size, blocks, code_bytes, sign_mode, a.stochastic, a.seed, a.stream,
      scales, draws, a.out);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
