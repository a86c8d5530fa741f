// FixedPointAccumulate: validation, dispatch, CPU backend.
#include <atomic>
#include <bit>

#include "kernels/base/fixed_point.h"
#include "kernels/base/kernel_util.h"

namespace fedlora::kernels {

absl::Status CanRun(const ExecContext& ctx, const FixedPointAccumulateArgs& a) {
  constexpr std::string_view kOp = "FixedPointAccumulate";
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.n}));
  if (a.weight < 1 || a.weight > (uint64_t{1} << 32)) {
    return internal::InvalidArg(kOp, absl::StrCat("weight ", a.weight, " is not in [1, 2^32]"));
  }
  if (a.sign != 1 && a.sign != -1) {
    return internal::InvalidArg(kOp, absl::StrCat("sign ", a.sign, " is not +1 or -1"));
  }
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.first_bad, "first_bad"));
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, a.x, "x", a.n > 0));
  return internal::CheckPtr(kOp, a.sums, "sums", a.n > 0);
}

absl::Status FixedPointAccumulate(const ExecContext& ctx, const FixedPointAccumulateArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::FixedPointAccumulateCuda(ctx, a));
  std::atomic<int64_t> first_bad{a.n};
  ctx.Pool().ParallelFor(0, a.n, internal::kElementwiseGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      u128 term;
      if (!FixedPointTerm(std::bit_cast<uint32_t>(a.x[i]), a.weight, &term)) {
        int64_t seen = first_bad.load(std::memory_order_relaxed);
        while (i < seen && !first_bad.compare_exchange_weak(seen, i, std::memory_order_relaxed)) {
        }
        continue;
      }
      a.sums[a.index != nullptr ? a.index[i] : i] += a.sign > 0 ? term : -term;
    }
  });
  const int64_t bad = first_bad.load();
  *a.first_bad = bad == a.n ? -1 : bad;
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
