// The fused attention softmax (forward and backward): validation, dispatch, CPU backend.
#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/base/kernel_util.h"
#include "kernels/cpu_math.h"

namespace fedlora::kernels {
namespace {

constexpr std::string_view kFwd = "AttentionSoftmaxForward";
constexpr std::string_view kBwd = "AttentionSoftmaxBackward";

// The keep decision and scale for element `idx` of the probabilities (see dropout.h).
inline bool Keep(const DropoutSpec& d, uint64_t idx) {
  return UniformAt(d.seed, d.stream, d.offset + idx) >= d.p;
}

}  // namespace

absl::Status CanRun(const ExecContext& ctx, const SoftmaxForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kFwd));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kFwd, {a.batch, a.heads, a.seq, a.seq}));
  if (!(a.dropout.p >= 0.0f && a.dropout.p < 1.0f))
    return internal::InvalidArg(kFwd, "dropout p not in [0, 1)");
  if (a.batch * a.heads * a.seq == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.scores, "scores"));
  if (a.dropout.active())
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, a.dropped, "dropped (dropout is active)"));
  return absl::OkStatus();
}

absl::Status CanRun(const ExecContext& ctx, const SoftmaxBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kBwd));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kBwd, {a.batch, a.heads, a.seq, a.seq}));
  if (!(a.dropout.p >= 0.0f && a.dropout.p < 1.0f))
    return internal::InvalidArg(kBwd, "dropout p not in [0, 1)");
  if (a.batch * a.heads * a.seq == 0) return absl::OkStatus();
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, a.probs, "probs"));
  return internal::CheckPtr(kBwd, a.grad, "grad");
}

absl::Status AttentionSoftmaxForward(const ExecContext& ctx, const SoftmaxForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  const int64_t S = a.seq, rows = a.batch * a.heads * a.seq, rows_per_batch = a.heads * a.seq;
  if (rows == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::AttentionSoftmaxForwardCuda(ctx, a));
  const float keep_scale = 1.0f / (1.0f - a.dropout.p);
  ctx.Pool().ParallelFor(0, rows, std::max<int64_t>(1, internal::kElementwiseGrain / (4 * S)),
                         [&](int64_t r0, int64_t r1) {
                           for (int64_t r = r0; r < r1; ++r) {
                             float* s = a.scores + r * S;
                             const float* mask =
                                 a.mask != nullptr ? a.mask + (r / rows_per_batch) * S : nullptr;
                             // p_j = exp(s_j + mask_j - max) / sum over the live columns j < n; causal: n = i + 1
                             const int64_t n = a.causal ? r % S + 1 : S;
                             if (mask != nullptr) {
                               for (int64_t j = 0; j < n; ++j) s[j] += mask[j];
                             }
                             const float m = internal::Max8(s, n);
                             for (int64_t j = 0; j < n; ++j) s[j] = internal::FastExp(s[j] - m);
                             const float sum = internal::Sum8(n, [&](int64_t j) { return s[j]; });
                             const float inv = 1.0f / sum;
                             for (int64_t j = 0; j < n; ++j) s[j] *= inv;
                             for (int64_t j = n; j < S; ++j) s[j] = 0.0f;
                             if (a.dropout.active()) {
                               float* d = a.dropped + r * S;
                               const uint64_t base = static_cast<uint64_t>(r * S);
                               for (int64_t j = 0; j < S; ++j)
                                 d[j] = Keep(a.dropout, base + j) ? s[j] * keep_scale : 0.0f;
                             }
                           }
                         });
  return absl::OkStatus();
}

absl::Status AttentionSoftmaxBackward(const ExecContext& ctx, const SoftmaxBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  const int64_t S = a.seq, rows = a.batch * a.heads * a.seq;
  if (rows == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::AttentionSoftmaxBackwardCuda(ctx, a));
  const float keep_scale = 1.0f / (1.0f - a.dropout.p);
  ctx.Pool().ParallelFor(0, rows, std::max<int64_t>(1, internal::kElementwiseGrain / (4 * S)),
                         [&](int64_t r0, int64_t r1) {
                           for (int64_t r = r0; r < r1; ++r) {
                             const float* p = a.probs + r * S;
                             float* g = a.grad + r * S;
                             if (a.dropout.active()) {  // dP = dropout'(dPd)
                               const uint64_t base = static_cast<uint64_t>(r * S);
                               for (int64_t j = 0; j < S; ++j)
                                 g[j] = Keep(a.dropout, base + j) ? g[j] * keep_scale : 0.0f;
                             }
                             // dS_j = P_j * (dP_j - sum_k dP_k P_k)
                             const float dot =
                                 internal::Sum8(S, [&](int64_t j) { return g[j] * p[j]; });
                             for (int64_t j = 0; j < S; ++j) g[j] = p[j] * (g[j] - dot);
                           }
                         });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
