// TopK, CUDA backend: radix sort of the 63-bit keys of kernels/base/topk.h with CUB, then the k smallest
// keys' indices radix-sorted ascending. Every pass is device-wide (CUB's multi-block sorts).
#include <cub/device/device_radix_sort.cuh>

#include "kernels/base/cuda_util.cuh"
#include "kernels/base/kernel_util.h"
#include "kernels/base/topk.h"

namespace fedlora::kernels::internal {
namespace {

constexpr int kThreads = 256;
constexpr int kKeyBits = 63;  // 31 magnitude bits above 32 index bits

// Bits needed for an index below n (at least 1).
int IndexBits(int64_t n) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) < n) ++bits;
  return bits;
}

struct TopKLayout {
  size_t keys = 0, sorted = 0, idx = 0, idx_sorted = 0, temp = 0, total = 0;
  size_t temp_bytes = 0;
};

absl::StatusOr<TopKLayout> Layout(cudaStream_t stream, int64_t n, int64_t k) {
  TopKLayout l;
  size_t sort_keys = 0, sort_idx = 0;
  FEDLORA_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortKeys(nullptr, sort_keys, static_cast<const uint64_t*>(nullptr),
                                     static_cast<uint64_t*>(nullptr), n, 0, kKeyBits, stream));
  FEDLORA_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortKeys(nullptr, sort_idx, static_cast<const uint32_t*>(nullptr),
                                     static_cast<uint32_t*>(nullptr), k, 0, IndexBits(n), stream));
  l.temp_bytes = std::max(sort_keys, sort_idx);
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t start = at;
    at += AlignUp(bytes);
    return start;
  };
  l.keys = take(static_cast<size_t>(n) * 8);
  l.sorted = take(static_cast<size_t>(n) * 8);
  l.idx = take(static_cast<size_t>(k) * 4);
  l.idx_sorted = take(static_cast<size_t>(k) * 4);
  l.temp = take(l.temp_bytes);
  l.total = at;
  return l;
}

__global__ void MakeKeysKernel(int64_t n, const float* __restrict__ x,
                               uint64_t* __restrict__ keys) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    keys[i] = TopKKey(__float_as_uint(x[i]), static_cast<uint32_t>(i));
  }
}

__global__ void LowWordsKernel(int64_t k, const uint64_t* __restrict__ sorted,
                               uint32_t* __restrict__ idx) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < k;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    idx[j] = static_cast<uint32_t>(sorted[j]);
  }
}

__global__ void WidenKernel(int64_t k, const uint32_t* __restrict__ idx,
                            int64_t* __restrict__ out) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < k;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[j] = idx[j];
  }
}

}  // namespace

absl::StatusOr<size_t> TopKWorkspaceBytesCuda(const ExecContext& ctx, int64_t n, int64_t k) {
  FEDLORA_ASSIGN_OR_RETURN(const TopKLayout l, Layout(Stream(ctx), n, k));
  return l.total;
}

absl::Status TopKCuda(const ExecContext& ctx, const TopKArgs& a) {
  cudaStream_t stream = Stream(ctx);
  FEDLORA_ASSIGN_OR_RETURN(const TopKLayout l, Layout(stream, a.n, a.k));
  char* ws = static_cast<char*>(a.workspace);
  auto* keys = reinterpret_cast<uint64_t*>(ws + l.keys);
  auto* sorted = reinterpret_cast<uint64_t*>(ws + l.sorted);
  auto* idx = reinterpret_cast<uint32_t*>(ws + l.idx);
  auto* idx_sorted = reinterpret_cast<uint32_t*>(ws + l.idx_sorted);
  void* temp = ws + l.temp;
  MakeKeysKernel<<<GridFor(a.n, kThreads), kThreads, 0, stream>>>(a.n, a.x, keys);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  size_t temp_bytes = l.temp_bytes;
  FEDLORA_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortKeys(temp, temp_bytes, keys, sorted, a.n, 0, kKeyBits, stream));
  LowWordsKernel<<<GridFor(a.k, kThreads), kThreads, 0, stream>>>(a.k, sorted, idx);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  temp_bytes = l.temp_bytes;
  FEDLORA_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeys(temp, temp_bytes, idx, idx_sorted,
                                                              a.k, 0, IndexBits(a.n), stream));
  WidenKernel<<<GridFor(a.k, kThreads), kThreads, 0, stream>>>(a.k, idx_sorted, a.indices);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
