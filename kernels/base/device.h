// Run-time CUDA availability and small device-memory helpers (used by tests and benchmarks; the
// engine proper gets its memory from an arena).
//
//   if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
//   FEDLORA_ASSIGN_OR_RETURN(void* d, kernels::DeviceAlloc(bytes));
//   FEDLORA_RETURN_IF_ERROR(kernels::CopyToDevice(d, host, bytes));
//
// Every function here works in a build without CUDA (returning FailedPrecondition where memory is
// involved) and on a machine without a driver or device (CudaAvailable() is false, no crash).
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

// True only when the binary was built with the CUDA backend AND a CUDA device is usable now.
// The answer is computed once and cached; thread-safe.
bool CudaAvailable();
// FailedPrecondition naming the reason (not built with CUDA / no driver / no device) when
// CudaAvailable() is false; OkStatus otherwise.
absl::Status CheckCudaAvailable();
// "H200 (sm_90, 139 GiB)" or "none: <reason>".
std::string CudaDeviceDescription();

// Device memory. DeviceFree(nullptr) is a no-op. Copies are synchronous (cudaMemcpy).
absl::StatusOr<void*> DeviceAlloc(size_t bytes);
absl::Status DeviceFree(void* ptr);
absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes);
absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes);
absl::Status DeviceMemset(void* device_dst, int byte_value, size_t bytes);
// Waits for the work queued on ctx.stream; OkStatus at once on the CPU. Reports asynchronous
// kernel errors (a CUDA kernel fault surfaces here, as Internal).
absl::Status Synchronize(const ExecContext& ctx);

// Typed RAII buffer of `count` elements on the device, freed on destruction (errors ignored there).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Create(size_t count) {
    DeviceBuffer b;
    auto p = DeviceAlloc(count * sizeof(T));
    if (!p.ok()) return p.status();
    b.ptr_ = static_cast<T*>(*p);
    b.count_ = count;
    return b;
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), count_(o.count_) {
    o.ptr_ = nullptr;
    o.count_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      (void)DeviceFree(ptr_);
      ptr_ = o.ptr_;
      count_ = o.count_;
      o.ptr_ = nullptr;
      o.count_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { (void)DeviceFree(ptr_); }

  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  absl::Status CopyFrom(const T* host, size_t count) {
    return CopyToDevice(ptr_, host, count * sizeof(T));
  }
  absl::Status CopyTo(T* host, size_t count) const {
    return CopyToHost(host, ptr_, count * sizeof(T));
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

}  // namespace fedlora::kernels
