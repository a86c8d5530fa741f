// Dropout: validation, dispatch, CPU backend.
#include "core/rng.h"
#include "kernels/base/kernel_util.h"
#include "kernels/dropout.h"

namespace fedlora::kernels {

absl::Status CanRun(const ExecContext& ctx, const DropoutArgs& a) {
  constexpr std::string_view kOp = "Dropout";
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.n}));
  if (!(a.spec.p >= 0.0f && a.spec.p < 1.0f))
    return internal::InvalidArg(kOp, absl::StrCat("p ", a.spec.p, " not in [0, 1)"));
  if (a.n == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.x, "x"));
  return internal::CheckPtr(kOp, a.out, "out");
}

absl::Status Dropout(const ExecContext& ctx, const DropoutArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.n == 0 || (!a.spec.active() && a.out == a.x)) return absl::OkStatus();
  if (ctx.device == Device::kCuda) return FEDLORA_KERNELS_CUDA(internal::DropoutCuda(ctx, a));
  const float p = a.spec.p, keep_scale = 1.0f / (1.0f - p);
  const uint64_t seed = a.spec.seed, offset = a.spec.offset, stream = a.spec.stream;
  const bool active = a.spec.active();
  ctx.Pool().ParallelFor(0, a.n, internal::kElementwiseGrain, [&](int64_t i0, int64_t i1) {
    if (!active) {
      for (int64_t i = i0; i < i1; ++i) a.out[i] = a.x[i];
      return;
    }
    // Element idx is word idx % 4 of Philox block idx / 4 (core/rng.h's UniformAt), so one
    // Philox call serves four consecutive elements.
    Philox4x32Block r{};
    for (int64_t i = i0; i < i1; ++i) {
      const uint64_t idx = offset + static_cast<uint64_t>(i);
      if (i == i0 || (idx & 3) == 0) r = Philox4x32(seed, idx >> 2, stream);
      const bool keep = U32ToUniformFloat(r.v[idx & 3]) >= p;
      a.out[i] = keep ? a.x[i] * keep_scale : 0.0f;
    }
  });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
