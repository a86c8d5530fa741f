// One decoding step's attention: validation, workspace size, dispatch, CPU backend.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/base/kernel_util.h"
#include "kernels/decode_attention.h"

namespace fedlora::kernels {
namespace {
constexpr std::string_view kOp = "DecodeAttention";
}  // namespace

size_t DecodeAttentionWorkspaceBytes(const DecodeAttentionArgs& a) {
  if (a.heads <= 0 || a.head_dim <= 0 || a.len <= 0) return 0;
  const int64_t chunks = (a.len + kDecodeAttentionChunk - 1) / kDecodeAttentionChunk;
  return internal::AlignUp(static_cast<size_t>(a.heads * chunks * (a.head_dim + 2)) *
                           sizeof(float));
}

absl::Status CanRun(const ExecContext& ctx, const DecodeAttentionArgs& a) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, kOp));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.heads, a.head_dim}));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(kOp, {a.len, a.kv_heads, a.head_dim}));
  if (a.kv_heads < 1 || a.heads % a.kv_heads != 0) {
    return internal::InvalidArg(
        kOp, absl::StrCat("kv_heads ", a.kv_heads, " does not divide heads ", a.heads));
  }
  if (a.heads * a.head_dim == 0) return absl::OkStatus();
  if (a.len < 1)
    return internal::InvalidArg(kOp,
                                absl::StrCat("len ", a.len, " is below 1 (nothing to attend to)"));
  for (auto [p, name] : {std::pair<const void*, const char*>{a.q, "q"},
                         {a.k_cache, "k_cache"},
                         {a.v_cache, "v_cache"},
                         {a.out, "out"}}) {
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kOp, p, name));
  }
  const size_t need = DecodeAttentionWorkspaceBytes(a);
  if (a.workspace == nullptr || a.workspace_bytes < need) {
    return internal::InvalidArg(
        kOp, absl::StrCat("workspace_bytes ", a.workspace_bytes, " (or a null workspace): needs ",
                          need, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status DecodeAttention(const ExecContext& ctx, const DecodeAttentionArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  if (a.heads * a.head_dim == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::DecodeAttentionCuda(ctx, a));
  const int64_t D = a.head_dim, kvd = a.kv_heads * D, group = a.heads / a.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Heads are independent: the result does not depend on the pool's width.
  ctx.Pool().ParallelFor(0, a.heads,
                         std::max<int64_t>(1, internal::kElementwiseGrain / (a.len * D)),
                         [&](int64_t h0, int64_t h1) {
                           std::vector<float> scores(static_cast<size_t>(a.len));
                           for (int64_t hq = h0; hq < h1; ++hq) {
                             const float* q = a.q + hq * D;
                             const int64_t kvh = hq / group;
                             float m = -INFINITY;
                             for (int64_t j = 0; j < a.len; ++j) {
                               const float* k = a.k_cache + j * kvd + kvh * D;
                               float dot = 0.0f;
                               for (int64_t e = 0; e < D; ++e) dot += q[e] * k[e];
                               scores[j] = dot * scale;
                               m = std::max(m, scores[j]);
                             }
                             float sum = 0.0f;
                             for (int64_t j = 0; j < a.len; ++j)
                               sum += (scores[j] = std::exp(scores[j] - m));
                             float* o = a.out + hq * D;
                             std::fill(o, o + D, 0.0f);
                             for (int64_t j = 0; j < a.len; ++j) {
                               const float w = scores[j] / sum;
                               const float* v = a.v_cache + j * kvd + kvh * D;
                               for (int64_t e = 0; e < D; ++e) o[e] += w * v[e];
                             }
                           }
                         });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
