#include "kernels/base/backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/base/device.h"
#include "kernels/base/kernel_util.h"

namespace fedlora::kernels {

#if defined(FEDLORA_HAVE_CUDA)
namespace internal {  // kernels/base/backend.cu
absl::StatusOr<void*> CudaStreamCreate();
void CudaStreamDestroy(void* stream);
absl::StatusOr<void*> CudaAllocate(size_t bytes, void* stream);
void CudaFree(void* ptr);
absl::Status CudaCopyAsync(void* dst, const void* src, size_t bytes, void* stream);
absl::Status CudaCopyToHost(void* host_dst, const void* src, size_t bytes, void* stream);
absl::Status CudaCopy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                             size_t row_bytes, size_t rows, void* stream);
absl::Status CudaZeroAsync(void* dst, size_t bytes, void* stream);
}  // namespace internal
#endif

namespace {
constexpr size_t kAlign = 256;
}  // namespace

Backend::Backend(Device device) { ctx_.device = device; }

Backend::~Backend() {
#if defined(FEDLORA_HAVE_CUDA)
  if (ctx_.device == Device::kCuda) internal::CudaStreamDestroy(ctx_.stream);
#endif
}

absl::StatusOr<std::shared_ptr<Backend>> Backend::Create(Device device) {
  std::shared_ptr<Backend> b(new Backend(device));
  if (device == Device::kCuda) {
    FEDLORA_RETURN_IF_ERROR(CheckCudaAvailable());
#if defined(FEDLORA_HAVE_CUDA)
    FEDLORA_ASSIGN_OR_RETURN(b->ctx_.stream, internal::CudaStreamCreate());
#endif
  }
  return b;
}

absl::StatusOr<void*> Backend::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (ctx_.device == Device::kCpu) {
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    p = std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("out of host memory: ", bytes,
                                                       " bytes asked for, ", allocated_,
                                                       " held by this backend"));
    }
    std::memset(p, 0, bytes);
  } else {
#if defined(FEDLORA_HAVE_CUDA)
    FEDLORA_ASSIGN_OR_RETURN(p, internal::CudaAllocate(bytes, ctx_.stream));
#endif
  }
  sizes_[p] = bytes;
  allocated_ += bytes;
  return p;
}

void Backend::Free(void* ptr) {
  if (ptr == nullptr) return;
  auto it = sizes_.find(ptr);
  if (it != sizes_.end()) {
    allocated_ -= it->second;
    sizes_.erase(it);
  }
  if (ctx_.device == Device::kCpu) {
    std::free(ptr);
  } else {
#if defined(FEDLORA_HAVE_CUDA)
    internal::CudaFree(ptr);
#endif
  }
}

absl::Status Backend::Upload(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (ctx_.device == Device::kCpu) {
    if (dst != host_src) std::memcpy(dst, host_src, bytes);
    return absl::OkStatus();
  }
  return FEDLORA_KERNELS_CUDA(internal::CudaCopyAsync(dst, host_src, bytes, ctx_.stream));
}

absl::Status Backend::Download(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (ctx_.device == Device::kCpu) {
    if (host_dst != src) std::memcpy(host_dst, src, bytes);
    return absl::OkStatus();
  }
  return FEDLORA_KERNELS_CUDA(internal::CudaCopyToHost(host_dst, src, bytes, ctx_.stream));
}

absl::Status Backend::CopyRows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                               size_t row_bytes, size_t rows) {
  if (rows == 0 || row_bytes == 0) return absl::OkStatus();
  if (row_bytes > dst_pitch || row_bytes > src_pitch) {
    return absl::InvalidArgumentError(absl::StrCat("Backend::CopyRows: rows of ", row_bytes,
                                                   " bytes do not fit pitches ", src_pitch, " and ",
                                                   dst_pitch));
  }
  if (ctx_.device == Device::kCpu) {
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                  static_cast<const char*>(src) + r * src_pitch, row_bytes);
    }
    return absl::OkStatus();
  }
  return FEDLORA_KERNELS_CUDA(
      internal::CudaCopy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, ctx_.stream));
}

absl::Status Backend::Zero(void* dst, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (ctx_.device == Device::kCpu) {
    std::memset(dst, 0, bytes);
    return absl::OkStatus();
  }
  return FEDLORA_KERNELS_CUDA(internal::CudaZeroAsync(dst, bytes, ctx_.stream));
}

absl::Status Backend::Synchronize() { return kernels::Synchronize(ctx_); }

}  // namespace fedlora::kernels
