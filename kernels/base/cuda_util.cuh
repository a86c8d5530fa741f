// Internal helpers for the kernels' .cu files: the stream, launch geometry, stream-ordered scratch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/cuda_status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels::internal {

inline cudaStream_t Stream(const ExecContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

// Grid size for a grid-stride loop over n items with `block` threads, capped so that huge
// tensors do not launch millions of blocks (each thread loops instead).
inline unsigned GridFor(int64_t n, int block, int64_t max_blocks = 65535 * 4) {
  int64_t g = (n + block - 1) / block;
  if (g < 1) g = 1;
  if (g > max_blocks) g = max_blocks;
  return static_cast<unsigned>(g);
}

// Runs body(scratch) -> absl::Status with `bytes` of stream-ordered scratch (cudaMallocAsync from
// the stream's pool), freed on the stream afterwards whatever body returns.
template <class Body>
absl::Status WithStreamScratch(cudaStream_t stream, size_t bytes, Body&& body) {
  void* scratch = nullptr;
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&scratch, bytes, stream));
  const absl::Status status = body(scratch);
  const cudaError_t freed = cudaFreeAsync(scratch, stream);
  if (status.ok() && freed != cudaSuccess) FEDLORA_CUDA_RETURN_IF_ERROR(freed);
  return status;
}

// Returns the launch error, if any, as a Status (kernel launches report errors asynchronously).
#define FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR() FEDLORA_CUDA_RETURN_IF_ERROR(cudaGetLastError())

}  // namespace fedlora::kernels::internal
