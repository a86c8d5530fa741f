// Rotary embeddings: tables, validation, dispatch, CPU backend.
#include <algorithm>
#include <cmath>

#include "kernels/base/kernel_util.h"
#include "kernels/rope.h"

namespace fedlora::kernels {
namespace {
constexpr std::string_view kOp = "Rope";
}  // namespace

RopeTables MakeRopeTables(double base, int64_t head_dim, int64_t max_positions) {
  RopeTables t;
  t.max_positions = max_positions;
  t.half = head_dim / 2;
  t.cos.resize(static_cast<size_t>(max_positions * t.half));
  t.sin.resize(t.cos.size());
  // As transformers' LlamaRotaryEmbedding, in fp32: inv_freq = 1 / base^(2i / D); angle = p * inv_freq.
  std::vector<float> inv_freq(static_cast<size_t>(t.half));
  for (int64_t i = 0; i < t.half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(base), e);
  }
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int64_t i = 0; i < t.half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[i];
      t.cos[p * t.half + i] = std::cos(angle);
      t.sin[p * t.half + i] = std::sin(angle);
    }
  }
  return t;
}

absl::Status CanRun(const ExecContext& ctx, const RopeArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.tokens, a.heads, a.head_dim}));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.max_positions, a.head_dim}));
  if (a.head_dim % 2 != 0)
    return internal::InvalidArg(kOp, absl::StrCat("head_dim ", a.head_dim, " is odd"));
  if (a.tokens * a.heads * a.head_dim == 0) return absl::OkStatus();
  if (a.max_positions < 1) return internal::InvalidArg(kOp, "max_positions must be >= 1");
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.positions, "positions"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.cos, "cos"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.sin, "sin"));
  return internal::CheckPtr(kOp, a.x, "x");
}

absl::Status Rope(const ExecContext& ctx, const RopeArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.tokens * a.heads * a.head_dim == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda) return FEDLORA_KERNELS_CUDA(internal::RopeCuda(ctx, a));
  for (int64_t t = 0; t < a.tokens; ++t) {
    if (a.positions[t] < 0 || a.positions[t] >= a.max_positions) {
      return internal::InvalidArg(kOp, absl::StrCat("positions[", t, "] = ", a.positions[t],
                                                    " outside [0, ", a.max_positions, ")"));
    }
  }
  const int64_t D = a.head_dim, half = D / 2, row = a.heads * D;
  const float sign = a.inverse ? -1.0f : 1.0f;
  ctx.Pool().ParallelFor(0, a.tokens, std::max<int64_t>(1, internal::kElementwiseGrain / row),
                         [&](int64_t t0, int64_t t1) {
                           for (int64_t t = t0; t < t1; ++t) {
                             const float* c = a.cos + static_cast<int64_t>(a.positions[t]) * half;
                             const float* s = a.sin + static_cast<int64_t>(a.positions[t]) * half;
                             for (int64_t h = 0; h < a.heads; ++h) {
                               float* x = a.x + t * row + h * D;
                               for (int64_t i = 0; i < half; ++i) {
                                 const float x1 = x[i], x2 = x[i + half], si = sign * s[i];
                                 x[i] = x1 * c[i] - x2 * si;
                                 x[i + half] = x2 * c[i] + x1 * si;
                               }
                             }
                           }
                         });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
