// Rotary position embeddings (Su et al. 2021) in Hugging Face LLaMA's rotate-half layout, applied
// in place to Q or K:
//
//   for each token t (position p_t), head h, i < D/2:
//     x'[i]       = x[i] cos(p theta_i) - x[i + D/2] sin(p theta_i)
//     x'[i + D/2] = x[i + D/2] cos(p theta_i) + x[i] sin(p theta_i)
//   theta_i = base^(-2i / D)
//
// The backward is the inverse rotation (inverse = true) applied to the gradient. The angles come
// from a table of cos and sin [max_positions, D/2] built once by RopeTable, computed in fp32 as
// Hugging Face computes them (inv_freq = 1 / base^(2i/D), angle = p * inv_freq).
//
// Shapes: x [tokens, heads, head_dim] (the [tokens, hidden] output of a Q or K projection);
// positions [tokens] in [0, max_positions); head_dim even. One read and one write pass.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

// cos and sin tables, [max_positions, head_dim / 2] each, on the CPU (copy them to the device for
// CUDA).
struct RopeTables {
  int64_t max_positions = 0, half = 0;
  std::vector<float> cos, sin;
};
RopeTables MakeRopeTables(double base, int64_t head_dim, int64_t max_positions);

struct RopeArgs {
  int64_t tokens = 0, heads = 0, head_dim = 0, max_positions = 0;
  const int32_t* positions = nullptr;  // [tokens]
  const float* cos = nullptr;          // [max_positions, head_dim / 2]
  const float* sin = nullptr;
  float* x = nullptr;    // [tokens, heads, head_dim], rotated in place
  bool inverse = false;  // rotate by -angle (the backward)
};

absl::Status CanRun(const ExecContext& ctx, const RopeArgs& args);
// Positions must lie in [0, max_positions): the CPU backend refuses others with InvalidArgument;
// the CUDA one cannot report from the device and leaves such a token unrotated (callers validate
// positions, as the decoder does).
absl::Status Rope(const ExecContext& ctx, const RopeArgs& args);

namespace internal {
absl::Status RopeCuda(const ExecContext& ctx, const RopeArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
