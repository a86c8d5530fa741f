// device.h for builds without the CUDA backend: nothing is available, nothing crashes.
#include "kernels/base/device.h"

#if !defined(FEDLORA_HAVE_CUDA)

namespace fedlora::kernels {
namespace {
absl::Status NotBuilt() { return absl::FailedPreconditionError("fedlora was built without CUDA"); }
}  // namespace

bool CudaAvailable() { return false; }
absl::Status CheckCudaAvailable() { return NotBuilt(); }
std::string CudaDeviceDescription() { return "none: built without CUDA"; }
absl::StatusOr<void*> DeviceAlloc(size_t) { return NotBuilt(); }
absl::Status DeviceFree(void* ptr) { return ptr == nullptr ? absl::OkStatus() : NotBuilt(); }
absl::Status CopyToDevice(void*, const void*, size_t) { return NotBuilt(); }
absl::Status CopyToHost(void*, const void*, size_t) { return NotBuilt(); }
absl::Status DeviceMemset(void*, int, size_t) { return NotBuilt(); }
absl::Status Synchronize(const ExecContext& ctx) {
  return ctx.device == Device::kCpu ? absl::OkStatus() : NotBuilt();
}

}  // namespace fedlora::kernels

#endif  // !FEDLORA_HAVE_CUDA
