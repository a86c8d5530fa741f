// BlockQuantize: validation, dispatch, CPU backend (the reference: one pass in value order, the
// random draws read sequentially from one Rng).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "kernels/base/block_quant.h"
#include "kernels/base/kernel_util.h"

namespace fedlora::kernels {

absl::StatusOr<size_t> BlockQuantizeWorkspaceBytes(const ExecContext& ctx,
                                                   const BlockQuantizeArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, "BlockQuantize"));
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::BlockQuantizeWorkspaceBytesCuda(ctx, a));
  return size_t{0};
}

absl::Status CanRun(const ExecContext& ctx, const BlockQuantizeArgs& a) {
  constexpr std::string_view kOp = "BlockQuantize";
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.n}));
  if (a.bits != 1 && a.bits != 2 && a.bits != 4 && a.bits != 8) {
    return internal::InvalidArg(kOp, absl::StrCat("bits ", a.bits, " is not 1, 2, 4 or 8"));
  }
  if (a.block_size < 8 || a.block_size > kMaxQuantBlockSize || a.block_size % 8 != 0) {
    return internal::InvalidArg(
        kOp, absl::StrCat("block_size ", a.block_size, " is not a multiple of 8 in [8, ",
                          kMaxQuantBlockSize, "]"));
  }
  if (a.n == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.x, "x"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.out, "out"));
  FEDLORA_ASSIGN_OR_RETURN(const size_t need, BlockQuantizeWorkspaceBytes(ctx, a));
  if (a.workspace_bytes < need) {
    return internal::InvalidArg(kOp,
                                absl::StrCat("workspace_bytes ", a.workspace_bytes, " < ", need));
  }
  return internal::CheckPtr(kOp, a.workspace, "workspace", need > 0);
}

absl::Status BlockQuantize(const ExecContext& ctx, const BlockQuantizeArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.n == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda) return FEDLORA_KERNELS_CUDA(internal::BlockQuantizeCuda(ctx, a));
  const uint32_t top = (1u << a.bits) - 1;  // highest code
  const bool sign_mode = QuantSignMode(a.bits, a.stochastic);
  Rng rng(a.seed, a.stream);
  uint8_t* out = a.out;
  for (int64_t b = 0; b < a.n; b += a.block_size) {
    const int64_t m = std::min<int64_t>(a.block_size, a.n - b);
    const float* v = a.x + b;
    float s = 0.0f;
    if (sign_mode) {
      s = QuantMeanAbs(v, m);
    } else {
      for (int64_t i = 0; i < m; ++i) s = std::max(s, std::fabs(v[i]));
    }
    std::memcpy(out, &s, 4);
    out += 4;
    const double inv_step = QuantInvStep(s, top);
    uint32_t acc = 0;
    int filled = 0;
    for (int64_t i = 0; i < m; ++i) {
      const bool draws = a.stochastic && QuantDraws(v[i], s, inv_step, top);
      const float u = draws ? rng.UniformFloat() : 0.0f;
      acc |= QuantCode(v[i], s, inv_step, top, sign_mode, a.stochastic, u) << filled;
      filled += a.bits;
      if (filled == 8) {
        *out++ = static_cast<uint8_t>(acc);
        acc = 0;
        filled = 0;
      }
    }
    if (filled > 0) *out++ = static_cast<uint8_t>(acc);
  }
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
