// Memory-efficient attention over packed sequences of different lengths: the math of
// kernels/attention.h (softmax(scale Q K^T) V, causal or not, grouped-query heads, dropout on the
// probabilities) without the [heads, seq, seq] score matrix. The forward keeps one value per query
// row, the log-sum-exp of its scores, and the backward recomputes each probability from it
// (FlashAttention's scheme, Dao et al. 2022), so memory grows with tokens, not with seq^2, and one
// call covers a whole packed batch instead of one call per sequence.
//
//   sequence s holds tokens [seq_start[s], seq_start[s+1]); a query attends to the keys of its own
//   sequence (causal: at or before its position)
//   S[t, j]   = scale q_t . k_j + mask[j]               (kv head of h: h / (heads / kv_heads);
//                                                      mask: 0, or -1e30 for a padding key)
//   lse[t, h] = log sum_j exp(S[t, j]);  P[t, j] = exp(S[t, j] - lse[t, h])
//   O[t]      = sum_j dropout(P[t, j]) v_j
//   A query must see at least one unmasked key: for a row whose keys are all masked lse rounds to
//   -1e30 and the two backends' outputs differ (the models never build one: every sequence keeps
//   its first token).
//
// Backward, with dO given (dQ, dK, dV overwritten; dK and dV sum over the heads of their group):
//   D[t] = dO[t] . O[t];  dP = dropout'(dO[t] . v_j);  dS = P (dP - D[t])
//   dQ[t] = scale sum_j dS k_j;  dK_j = scale sum_t dS q_t;  dV_j = sum_t dropout(P) dO[t]
//
// Dropout element (s, h, i, j) (i, j positions within sequence s of n tokens) has index
// offset + sum_{s' < s} heads n_{s'}^2 + h n^2 + i n + j: the index the per-sequence calls of
// AttentionForward give it, so either op drops the same probabilities.
//
// Layouts: q, out, dout, dq [tokens, heads, head_dim]; k, v, dk, dv [tokens, kv_heads, head_dim];
// lse [tokens, heads]; mask [tokens] or null; seq_start [num_seqs + 1] int32 with seq_start[0] = 0 and
// seq_start[num_seqs] = tokens, in ctx.device memory like every other pointer. head_dim <= 256.
//
// CPU: one task per (sequence, kv head), each row's scores in a buffer of one row. CUDA: one warp
// per (token, head) for the forward and dQ, one warp per (token, kv head) for dK and dV, each
// looping over its sequence's keys (or queries) with an online softmax; no atomics, so results
// do not depend on scheduling. Workspace: FusedAttentionBackwardWorkspaceBytes (D, tokens * heads
// floats); the forward needs none.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"
#include "kernels/dropout.h"

namespace fedlora::kernels {

inline constexpr int64_t kFusedAttentionMaxHeadDim = 256;

struct FusedAttentionDims {
  int64_t tokens = 0, num_seqs = 0, heads = 0, head_dim = 0;
  int64_t kv_heads = 0;  // 0: heads; else divides heads
  float scale = 0.0f;    // 0: 1 / sqrt(head_dim)
  bool causal = false;
  const int32_t* seq_start = nullptr;  // [num_seqs + 1]
  const float* mask = nullptr;         // [tokens] additive, by key; null: none
};

struct FusedAttentionForwardArgs {
  FusedAttentionDims dims{};
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  DropoutSpec dropout{};
  float* out = nullptr;  // [tokens, heads, head_dim]
  float* lse = nullptr;  // [tokens, heads], for the backward
};

struct FusedAttentionBackwardArgs {
  FusedAttentionDims dims{};
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* out = nullptr;  // the forward's O
  const float* lse = nullptr;  // the forward's lse
  DropoutSpec dropout{};       // the forward's, unchanged
  const float* dout = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

size_t FusedAttentionBackwardWorkspaceBytes(const FusedAttentionDims& dims);
absl::Status CanRun(const ExecContext& ctx, const FusedAttentionForwardArgs& args);
absl::Status CanRun(const ExecContext& ctx, const FusedAttentionBackwardArgs& args);
absl::Status FusedAttentionForward(const ExecContext& ctx, const FusedAttentionForwardArgs& args);
absl::Status FusedAttentionBackward(const ExecContext& ctx, const FusedAttentionBackwardArgs& args);

namespace internal {
absl::Status FusedAttentionForwardCuda(const ExecContext& ctx,
                                       const FusedAttentionForwardArgs& args);
absl::Status FusedAttentionBackwardCuda(const ExecContext& ctx,
                                        const FusedAttentionBackwardArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
