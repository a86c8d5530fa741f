// Inverted dropout with a counter-based mask (Philox4x32-10 from core/rng.h): element i of a call
// is kept iff UniformAt(seed, stream, offset + i) >= p, and kept values are scaled by 1 / (1 - p).
// The mask is never stored: the backward, and the CPU and CUDA backends, recompute the same one
// from (seed, stream, offset). Give every dropout site of a step its own stream, e.g.
// MakeStream(step, site), or a disjoint offset range within one stream.
//
//   y = dropout(x):   y[i]  = keep(i) ? x[i] / (1 - p) : 0
//   dx:               dx[i] = keep(i) ? dy[i] / (1 - p) : 0      (the same linear map)
//
// p == 0 is the identity (no random numbers drawn). p must be in [0, 1).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

struct DropoutSpec {
  float p = 0.0f;  // drop probability in [0, 1)
  uint64_t seed = 0;
  uint64_t offset = 0;  // index of this tensor's element 0 in the stream
  uint64_t stream = 0;  // core/rng.h stream id, e.g. MakeStream(step, site)
  bool active() const { return p > 0.0f; }
};

// One function for forward and backward: out = mask(x) / (1 - p). In-place (out == x) allowed.
struct DropoutArgs {
  int64_t n = 0;
  DropoutSpec spec{};
  const float* x = nullptr;  // [n]: the input (forward) or dy (backward)
  float* out = nullptr;      // [n]
};

absl::Status CanRun(const ExecContext& ctx, const DropoutArgs& args);
absl::Status Dropout(const ExecContext& ctx, const DropoutArgs& args);
inline absl::Status DropoutForward(const ExecContext& ctx, const DropoutArgs& args) {
  return Dropout(ctx, args);
}
inline absl::Status DropoutBackward(const ExecContext& ctx, const DropoutArgs& args) {
  return Dropout(ctx, args);
}

namespace internal {
absl::Status DropoutCuda(const ExecContext& ctx, const DropoutArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
