// CUDA, cuBLAS and NCCL check macros that return an absl::Status instead of exiting. Only
// included from .cu files and CUDA-aware sources (guarded by FEDLORA_HAVE_CUDA).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/status.h"

namespace fedlora {
inline absl::Status CudaError(cudaError_t err, const char* expr, const char* file, int line) {
  // Reported here: reset the runtime's last error, so that the next launch check (which reads it
  // with cudaGetLastError) does not blame an unrelated kernel for a failed allocation.
  (void)cudaGetLastError();
  // Out of memory is a resource problem, not a bug; everything else is an internal failure.
  const auto code = err == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted
                                                     : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(file, ":", line, ": ", expr, ": ", cudaGetErrorName(err),
                                         " (", cudaGetErrorString(err), ")"));
}
inline absl::Status CublasError(cublasStatus_t err, const char* expr, const char* file, int line) {
  const auto code = err == CUBLAS_STATUS_ALLOC_FAILED ? absl::StatusCode::kResourceExhausted
                                                      : absl::StatusCode::kInternal;
  return absl::Status(
      code, absl::StrCat(file, ":", line, ": ", expr, ": cuBLAS status ", static_cast<int>(err)));
}
}  // namespace fedlora

#define FEDLORA_CUDA_RETURN_IF_ERROR(expr)                                       \
  do {                                                                           \
    cudaError_t _fedlora_cuda_err = (expr);                                      \
    if (_fedlora_cuda_err != cudaSuccess)                                        \
      return ::fedlora::CudaError(_fedlora_cuda_err, #expr, __FILE__, __LINE__); \
  } while (0)

#define FEDLORA_CUBLAS_RETURN_IF_ERROR(expr)                                         \
  do {                                                                               \
    cublasStatus_t _fedlora_cublas_err = (expr);                                     \
    if (_fedlora_cublas_err != CUBLAS_STATUS_SUCCESS)                                \
      return ::fedlora::CublasError(_fedlora_cublas_err, #expr, __FILE__, __LINE__); \
  } while (0)

#if defined(FEDLORA_HAVE_NCCL)
#include <nccl.h>
#define FEDLORA_NCCL_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                       \
    ncclResult_t _fedlora_nccl_err = (expr);                                                 \
    if (_fedlora_nccl_err != ncclSuccess)                                                    \
      return absl::UnavailableError(absl::StrCat(__FILE__, ":", __LINE__, ": ", #expr, ": ", \
                                                 ncclGetErrorString(_fedlora_nccl_err)));    \
  } while (0)
#endif
