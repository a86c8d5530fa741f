// Memory-efficient attention over packed sequences: validation, dispatch, CPU backend.
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/rng.h"
#include "kernels/base/kernel_util.h"
#include "kernels/fused_attention.h"

namespace fedlora::kernels {
namespace {

constexpr std::string_view kFwd = "FusedAttentionForward";
constexpr std::string_view kBwd = "FusedAttentionBackward";

int64_t KvHeads(const FusedAttentionDims& d) { return d.kv_heads == 0 ? d.heads : d.kv_heads; }
float ScaleOf(const FusedAttentionDims& d) {
  return d.scale != 0.0f ? d.scale : 1.0f / std::sqrt(static_cast<float>(d.head_dim));
}

absl::Status CheckFused(const ExecContext& ctx, std::string_view op, const FusedAttentionDims& d,
                        const DropoutSpec& drop) {
  FEDLORA_RETURN_IF_ERROR(internal::CheckBackend(ctx, op));
  FEDLORA_RETURN_IF_ERROR(internal::CheckDims(op, {d.tokens, d.heads, d.head_dim}));
  if (d.num_seqs < 0 || d.kv_heads < 0)
    return internal::InvalidArg(op, "num_seqs and kv_heads must be >= 0");
  if (d.heads == 0 || d.head_dim == 0)
    return internal::InvalidArg(op, "heads and head_dim must be positive");
  if (d.head_dim > kFusedAttentionMaxHeadDim) {
    return internal::InvalidArg(
        op, absl::StrCat("head_dim ", d.head_dim, " above ", kFusedAttentionMaxHeadDim));
  }
  if (d.heads % KvHeads(d) != 0) return internal::InvalidArg(op, "kv_heads must divide heads");
  if (!std::isfinite(d.scale) || d.scale < 0.0f)
    return internal::InvalidArg(op, "scale must be finite and >= 0");
  if (!(drop.p >= 0.0f && drop.p < 1.0f))
    return internal::InvalidArg(op, "dropout p not in [0, 1)");
  if (d.tokens > 0 && d.num_seqs == 0) return internal::InvalidArg(op, "tokens without sequences");
  FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(op, d.seq_start, "seq_start"));
  if (ctx.device != Device::kCpu) return absl::OkStatus();  // seq_start is device memory there
  if (d.seq_start[0] != 0 || d.seq_start[d.num_seqs] != d.tokens) {
    return internal::InvalidArg(
        op, absl::StrCat("seq_start must run from 0 to tokens (", d.tokens, ")"));
  }
  for (int64_t s = 0; s < d.num_seqs; ++s) {
    if (d.seq_start[s + 1] < d.seq_start[s])
      return internal::InvalidArg(op, "seq_start must not decrease");
  }
  return absl::OkStatus();
}

// The dropout index of element (0, 0, 0, 0) of each sequence: offset + sum of heads n^2 before it.
std::vector<uint64_t> SequenceOffsets(const FusedAttentionDims& d, const DropoutSpec& drop) {
  std::vector<uint64_t> off(d.num_seqs);
  uint64_t o = drop.offset;
  for (int64_t s = 0; s < d.num_seqs; ++s) {
    off[s] = o;
    const uint64_t n = static_cast<uint64_t>(d.seq_start[s + 1] - d.seq_start[s]);
    o += static_cast<uint64_t>(d.heads) * n * n;
  }
  return off;
}

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t e = 0; e < n; ++e) s += a[e] * b[e];
  return s;
}

// Runs fn(s, g) for every (sequence, kv head) pair on the pool.
template <class Fn>
void ForEachSequenceGroup(const ExecContext& ctx, const FusedAttentionDims& d, Fn fn) {
  const int64_t kvh = KvHeads(d);
  ctx.Pool().ParallelFor(0, d.num_seqs * kvh, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) fn(t / kvh, t % kvh);
  });
}

}  // namespace

size_t FusedAttentionBackwardWorkspaceBytes(const FusedAttentionDims& d) {
  return static_cast<size_t>(std::max<int64_t>(d.tokens * d.heads, 0)) * sizeof(float);
}

absl::Status CanRun(const ExecContext& ctx, const FusedAttentionForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CheckFused(ctx, kFwd, a.dims, a.dropout));
  if (a.dims.tokens == 0) return absl::OkStatus();
  for (auto [p, name] : {std::pair<const void*, const char*>{a.q, "q"},
                         {a.k, "k"},
                         {a.v, "v"},
                         {a.out, "out"},
                         {a.lse, "lse"}}) {
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kFwd, p, name));
  }
  return absl::OkStatus();
}

absl::Status CanRun(const ExecContext& ctx, const FusedAttentionBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CheckFused(ctx, kBwd, a.dims, a.dropout));
  if (a.dims.tokens == 0) return absl::OkStatus();
  for (auto [p, name] : {std::pair<const void*, const char*>{a.q, "q"},
                         {a.k, "k"},
                         {a.v, "v"},
                         {a.out, "out"},
                         {a.lse, "lse"},
                         {a.dout, "dout"},
                         {a.dq, "dq"},
                         {a.dk, "dk"},
                         {a.dv, "dv"}}) {
    FEDLORA_RETURN_IF_ERROR(internal::CheckPtr(kBwd, p, name));
  }
  const size_t need = FusedAttentionBackwardWorkspaceBytes(a.dims);
  if (a.workspace_bytes < need || a.workspace == nullptr) {
    return internal::InvalidArg(
        kBwd, absl::StrCat("workspace of ", a.workspace_bytes, " bytes, ", need, " needed"));
  }
  return absl::OkStatus();
}

absl::Status FusedAttentionForward(const ExecContext& ctx, const FusedAttentionForwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  const FusedAttentionDims& d = a.dims;
  if (d.tokens == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::FusedAttentionForwardCuda(ctx, a));
  const int64_t H = d.heads, D = d.head_dim, kvh = KvHeads(d), group = H / kvh;
  const float scale = ScaleOf(d), keep_scale = 1.0f / (1.0f - a.dropout.p);
  const std::vector<uint64_t> offsets = SequenceOffsets(d, a.dropout);
  ForEachSequenceGroup(ctx, d, [&](int64_t s, int64_t g) {
    const int64_t begin = d.seq_start[s], n = d.seq_start[s + 1] - begin;
    std::vector<float> w(n);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = begin + i, lim = d.causal ? i + 1 : n;
        const float* q = a.q + (t * H + h) * D;
        float m = -INFINITY;
        for (int64_t j = 0; j < lim; ++j) {
          w[j] = scale * Dot(q, a.k + ((begin + j) * kvh + g) * D, D) +
                 (d.mask != nullptr ? d.mask[begin + j] : 0.0f);
          m = std::max(m, w[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < lim; ++j) sum += std::exp(w[j] - m);
        const float lse = m + std::log(sum);
        a.lse[t * H + h] = lse;
        float* o = a.out + (t * H + h) * D;
        std::fill(o, o + D, 0.0f);
        const uint64_t row = offsets[s] + static_cast<uint64_t>((h * n + i) * n);
        for (int64_t j = 0; j < lim; ++j) {
          float p = std::exp(w[j] - lse);
          if (a.dropout.active()) {
            p = UniformAt(a.dropout.seed, a.dropout.stream, row + j) >= a.dropout.p ? p * keep_scale
                                                                                    : 0.0f;
          }
          const float* v = a.v + ((begin + j) * kvh + g) * D;
          for (int64_t e = 0; e < D; ++e) o[e] += p * v[e];
        }
      }
    }
  });
  return absl::OkStatus();
}

absl::Status FusedAttentionBackward(const ExecContext& ctx, const FusedAttentionBackwardArgs& a) {
  FEDLORA_RETURN_IF_ERROR(CanRun(ctx, a));
  const FusedAttentionDims& d = a.dims;
  if (d.tokens == 0) return absl::OkStatus();
  if (ctx.device == Device::kCuda)
    return FEDLORA_KERNELS_CUDA(internal::FusedAttentionBackwardCuda(ctx, a));
  const int64_t H = d.heads, D = d.head_dim, kvh = KvHeads(d), group = H / kvh;
  const float scale = ScaleOf(d), keep_scale = 1.0f / (1.0f - a.dropout.p);
  const std::vector<uint64_t> offsets = SequenceOffsets(d, a.dropout);
  ForEachSequenceGroup(ctx, d, [&](int64_t s, int64_t g) {
    const int64_t begin = d.seq_start[s], n = d.seq_start[s + 1] - begin;
    // This task owns dK and dV of head g and dQ of g's query heads, over this sequence's tokens.
    for (int64_t t = begin; t < begin + n; ++t) {
      std::fill(a.dk + (t * kvh + g) * D, a.dk + (t * kvh + g + 1) * D, 0.0f);
      std::fill(a.dv + (t * kvh + g) * D, a.dv + (t * kvh + g + 1) * D, 0.0f);
    }
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = begin + i, lim = d.causal ? i + 1 : n;
        const float* q = a.q + (t * H + h) * D;
        const float* dout = a.dout + (t * H + h) * D;
        const float rowdot = Dot(dout, a.out + (t * H + h) * D, D);  // D[t]
        const float lse = a.lse[t * H + h];
        float* dq = a.dq + (t * H + h) * D;
        std::fill(dq, dq + D, 0.0f);
        const uint64_t row = offsets[s] + static_cast<uint64_t>((h * n + i) * n);
        for (int64_t j = 0; j < lim; ++j) {
          const float* k = a.k + ((begin + j) * kvh + g) * D;
          const float* v = a.v + ((begin + j) * kvh + g) * D;
          const float mask = d.mask != nullptr ? d.mask[begin + j] : 0.0f;
          const float p = std::exp(scale * Dot(q, k, D) + mask - lse);
          float keep = 1.0f;
          if (a.dropout.active()) {
            keep = UniformAt(a.dropout.seed, a.dropout.stream, row + j) >= a.dropout.p ? keep_scale
                                                                                       : 0.0f;
          }
          const float dp = keep * Dot(dout, v, D);
          const float ds = p * (dp - rowdot);
          float* dk = a.dk + ((begin + j) * kvh + g) * D;
          float* dv = a.dv + ((begin + j) * kvh + g) * D;
          for (int64_t e = 0; e < D; ++e) {
            dq[e] += scale * ds * k[e];
            dk[e] += scale * ds * q[e];
            dv[e] += keep * p * dout[e];
          }
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace fedlora::kernels
