// Internal helpers shared by the kernels' validation and dispatch code. Not part of the API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels::internal {

// OkStatus for the CPU; for CUDA, FailedPrecondition unless the backend is built and a device is
// present. `op` names the kernel in the message.
absl::Status CheckBackend(const ExecContext& ctx, std::string_view op);

inline absl::Status InvalidArg(std::string_view op, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(absl::string_view(op.data(), op.size()), ": ",
                                                 absl::string_view(what.data(), what.size())));
}

// InvalidArgument unless every dimension is >= 0 and their product fits comfortably in int64
// (below 2^62 elements, so that byte counts fit too).
absl::Status CheckDims(std::string_view op, std::initializer_list<int64_t> dims);

// InvalidArgument naming `name` when `ptr` is null (and the tensor is not empty).
inline absl::Status CheckPtr(std::string_view op, const void* ptr, std::string_view name,
                             bool required = true) {
  if (required && ptr == nullptr) {
    return InvalidArg(op, absl::StrCat(absl::string_view(name.data(), name.size()), " is null"));
  }
  return absl::OkStatus();
}

inline constexpr size_t kWorkspaceAlign = 256;
inline size_t AlignUp(size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// Elements per ParallelFor chunk for a memory-bound pass: below this, threading costs more than it
// saves (a chunk of 16 K floats is 64 KiB, ~5 us of DRAM bandwidth on one core).
inline constexpr int64_t kElementwiseGrain = 16384;

}  // namespace fedlora::kernels::internal

// Calls a CUDA backend when it is compiled in; CheckBackend has already refused kCuda otherwise.
#if defined(FEDLORA_HAVE_CUDA)
#define FEDLORA_KERNELS_CUDA(expr) (expr)
#else
#define FEDLORA_KERNELS_CUDA(expr) ::absl::FailedPreconditionError("fedlora was built without CUDA")
#endif
