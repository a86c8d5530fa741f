// Pointwise activations, forward and backward side by side.
//
// GELU, exact erf form (Hugging Face "gelu", torch.nn.functional.gelu default):
//   y  = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))
//   dx = dy * (Phi(x) + x * phi(x)),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
// tanh (BERT pooler):
//   y  = tanh(x),  dx = dy * (1 - y^2)      (the backward takes the saved output y)
//
// Shapes: flat arrays of n floats. Forward out may alias x; backward dx may alias dy. Each op is
// one read and one write pass (memory-bound: 8 bytes per element, or 12 for the backward).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

enum class Activation { kGelu, kTanh };

struct ActivationForwardArgs {
  Activation kind = Activation::kGelu;
  int64_t n = 0;
  const float* x = nullptr;  // [n]
  float* y = nullptr;        // [n]
};

struct ActivationBackwardArgs {
  Activation kind = Activation::kGelu;
  int64_t n = 0;
  // The saved tensor the derivative needs: the input x for kGelu, the output y for kTanh.
  const float* saved = nullptr;  // [n]
  const float* dy = nullptr;     // [n]
  float* dx = nullptr;           // [n]
  bool accumulate_dx = false;
};

absl::Status CanRun(const ExecContext& ctx, const ActivationForwardArgs& args);
absl::Status CanRun(const ExecContext& ctx, const ActivationBackwardArgs& args);
absl::Status ActivationForward(const ExecContext& ctx, const ActivationForwardArgs& args);
absl::Status ActivationBackward(const ExecContext& ctx, const ActivationBackwardArgs& args);

namespace internal {
absl::Status ActivationForwardCuda(const ExecContext& ctx, const ActivationForwardArgs& args);
absl::Status ActivationBackwardCuda(const ExecContext& ctx, const ActivationBackwardArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
