// Internal to compression/codec.cc: the encoder's value-dependent stages (top-k selection and
// quantization) on the host or on a kernels::Backend's device. Both give the same indices and
// bytes: the CPU path is compression/sparsify.h and quantize.h, which run the kernels' CPU
// backends, and the device path runs the same kernels' CUDA backends (kernels/base/topk.h,
// kernels/base/block_quant.h) on copies of the values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "compression/quantize.h"

namespace fedlora::compression_internal {

class EncodeStages {
 public:
  // Null or a CPU backend: the host.
  explicit EncodeStages(kernels::Backend* backend);

  bool on_device() const { return backend_ != nullptr; }
  // TopKIndices(x, n, k).
  absl::StatusOr<std::vector<int64_t>> TopK(const float* x, int64_t n, int64_t k);
  // GlobalTopKIndices over the tensors' values.
  absl::StatusOr<std::vector<std::vector<int64_t>>> GlobalTopK(
      const std::vector<UpdateTensor>& tensors, double fraction);
  // QuantizeAppend(x, n, spec, out).
  absl::Status QuantizeAppend(const float* x, int64_t n, const QuantSpec& spec, std::string& out);

 private:
  kernels::Backend* backend_;  // null for the host
};

}  // namespace fedlora::compression_internal
