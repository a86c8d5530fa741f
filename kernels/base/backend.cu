// kernels/base/backend.h's CUDA primitives: a stream per backend, stream-ordered memory and copies.
#include <cuda_runtime.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/cuda_status.h"

namespace fedlora::kernels::internal {

absl::StatusOr<void*> CudaStreamCreate() {
  cudaStream_t s = nullptr;
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return static_cast<void*>(s);
}

void CudaStreamDestroy(void* stream) {
  if (stream != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

absl::StatusOr<void*> CudaAllocate(size_t bytes, void* stream) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    return absl::ResourceExhaustedError(absl::StrCat("out of GPU memory: cudaMalloc of ", bytes,
                                                     " bytes failed (", free_bytes, " of ",
                                                     total_bytes, " bytes free)"));
  }
  FEDLORA_CUDA_RETURN_IF_ERROR(err);
  // Zero-filled, like the CPU backend's memory; ordered before any later work on the stream.
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p, 0, bytes, static_cast<cudaStream_t>(stream)));
  return p;
}

void CudaFree(void* ptr) { (void)cudaFree(ptr); }

absl::Status CudaCopyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  FEDLORA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::Status CudaCopyToHost(void* host_dst, const void* src, size_t bytes, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, s));
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

absl::Status CudaCopy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                             size_t row_bytes, size_t rows, void* stream) {
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                                 cudaMemcpyDeviceToDevice,
                                                 static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::Status CudaZeroAsync(void* dst, size_t bytes, void* stream) {
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
