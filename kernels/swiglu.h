// The gated feed-forward activation of LLaMA-family MLPs (Shazeer 2020):
//
//   y = silu(gate) * up,  silu(x) = x * sigmoid(x)
//
// Backward, with s = sigmoid(gate):
//   dgate = dy * up * s * (1 + gate * (1 - s)),  dup = dy * silu(gate)
//
// Shapes: flat arrays of n floats (gate and up are the [tokens, intermediate] outputs of the
// gate_proj and up_proj linears). The backward reads the saved gate and up; dgate and dup may
// alias gate and up (each index is read before it is written). One pass each way.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

struct SwiGluForwardArgs {
  int64_t n = 0;
  const float* gate = nullptr;  // [n]
  const float* up = nullptr;    // [n]
  float* y = nullptr;           // [n]
};

struct SwiGluBackwardArgs {
  int64_t n = 0;
  const float* gate = nullptr;  // [n] saved
  const float* up = nullptr;    // [n] saved
  const float* dy = nullptr;    // [n]
  float* dgate = nullptr;       // [n]
  float* dup = nullptr;         // [n]
};

absl::Status CanRun(const ExecContext& ctx, const SwiGluForwardArgs& args);
absl::Status CanRun(const ExecContext& ctx, const SwiGluBackwardArgs& args);
absl::Status SwiGluForward(const ExecContext& ctx, const SwiGluForwardArgs& args);
absl::Status SwiGluBackward(const ExecContext& ctx, const SwiGluBackwardArgs& args);

namespace internal {
absl::Status SwiGluForwardCuda(const ExecContext& ctx, const SwiGluForwardArgs& args);
absl::Status SwiGluBackwardCuda(const ExecContext& ctx, const SwiGluBackwardArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
