// Top-k selection by magnitude, the top-k stage of the update wire format (compression/sparsify.h):
// the k indices of x[0, n) with the largest |x|, ties broken towards the lower index, written in
// ascending order. The set is exactly that of ordering the entries by the key
//
//   TopKKey(x[i], i) = (0x7FFFFFFF - bits(|x[i]|)) << 32 | i      (smaller key = kept first)
//
// and keeping the k smallest keys: for finite floats the bits of |x| order like |x|, and the index
// in the low word breaks ties towards the lower index. x must be finite (a NaN has no place in
// the order); -0 and +0 are equal.
//
// CPU: nth_element on the magnitudes for the k-th largest, then one pass in index order (every
// entry above it, and entries equal to it while places are left). CUDA: CUB's device radix sort
// of the 63-bit keys, then the k smallest keys' indices sorted ascending by a second radix sort;
// no single-block reduction over n.
//
// Workspace (TopKWorkspaceBytes): CPU n floats; CUDA the keys twice, the indices twice and CUB's
// scratch. n <= kTopKMaxN (the key's low word holds the index).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/host_device.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

inline constexpr int64_t kTopKMaxN = int64_t{1} << 32;

// The sort key of entry `index` whose value has bit pattern `bits` (see above).
FEDLORA_HOST_DEVICE inline uint64_t TopKKey(uint32_t bits, uint32_t index) {
  return (static_cast<uint64_t>(0x7FFFFFFFu - (bits & 0x7FFFFFFFu)) << 32) | index;
}

struct TopKArgs {
  int64_t n = 0;
  int64_t k = 0;               // 0 <= k <= n
  const float* x = nullptr;    // [n], finite
  int64_t* indices = nullptr;  // [k]: ascending
  void* workspace = nullptr;   // TopKWorkspaceBytes(ctx, args) bytes on ctx.device
  size_t workspace_bytes = 0;
};

// Workspace TopK needs for (n, k) on ctx.device. CUDA asks CUB (errors as a CUDA failure).
absl::StatusOr<size_t> TopKWorkspaceBytes(const ExecContext& ctx, const TopKArgs& args);

absl::Status CanRun(const ExecContext& ctx, const TopKArgs& args);
absl::Status TopK(const ExecContext& ctx, const TopKArgs& args);

namespace internal {
absl::StatusOr<size_t> TopKWorkspaceBytesCuda(const ExecContext& ctx, int64_t n, int64_t k);
absl::Status TopKCuda(const ExecContext& ctx, const TopKArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
