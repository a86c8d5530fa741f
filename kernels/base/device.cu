// device.h with the CUDA backend built in. A missing driver or device is an answer, not a crash:
// cudaGetDeviceCount returns an error code, which CudaAvailable() turns into `false`.
#include <cuda_runtime.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "core/cuda_status.h"
#include "kernels/base/device.h"

namespace fedlora::kernels {
namespace {

struct Probe {
  bool available = false;
  std::string reason;       // why not, when !available
  std::string description;  // the device, when available
};

const Probe& GetProbe() {
  static const Probe probe = [] {
    Probe p;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
      p.reason = absl::StrCat("no usable CUDA driver or device (", cudaGetErrorName(err), ")");
      return p;
    }
    if (count == 0) {
      p.reason = "no CUDA device";
      return p;
    }
    int dev = 0;
    cudaDeviceProp prop{};
    err = cudaGetDeviceProperties(&prop, dev);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      p.reason = absl::StrCat("cudaGetDeviceProperties failed (", cudaGetErrorName(err), ")");
      return p;
    }
    p.available = true;
    p.description = absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", ",
                                 prop.totalGlobalMem >> 30, " GiB)");
    return p;
  }();
  return probe;
}

absl::Status Unavailable() {
  return absl::FailedPreconditionError(absl::StrCat("CUDA is not available: ", GetProbe().reason));
}

}  // namespace

bool CudaAvailable() { return GetProbe().available; }

absl::Status CheckCudaAvailable() { return CudaAvailable() ? absl::OkStatus() : Unavailable(); }

std::string CudaDeviceDescription() {
  const Probe& p = GetProbe();
  return p.available ? p.description : absl::StrCat("none: ", p.reason);
}

absl::StatusOr<void*> DeviceAlloc(size_t bytes) {
  if (!CudaAvailable()) return Unavailable();
  void* ptr = nullptr;
  if (bytes == 0) return ptr;
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, bytes));
  return ptr;
}

absl::Status DeviceFree(void* ptr) {
  if (ptr == nullptr) return absl::OkStatus();
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaFree(ptr));
  return absl::OkStatus();
}

absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes) {
  if (!CudaAvailable()) return Unavailable();
  if (bytes == 0) return absl::OkStatus();
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes) {
  if (!CudaAvailable()) return Unavailable();
  if (bytes == 0) return absl::OkStatus();
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status DeviceMemset(void* device_dst, int byte_value, size_t bytes) {
  if (!CudaAvailable()) return Unavailable();
  if (bytes == 0) return absl::OkStatus();
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaMemset(device_dst, byte_value, bytes));
  return absl::OkStatus();
}

absl::Status Synchronize(const ExecContext& ctx) {
  if (ctx.device == Device::kCpu) return absl::OkStatus();
  if (!CudaAvailable()) return Unavailable();
  FEDLORA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream)));
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
