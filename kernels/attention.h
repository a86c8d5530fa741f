// Multi-head scaled dot-product self-attention with a padding mask, as BertSelfAttention, and
// optionally causal with grouped-query heads, as LlamaAttention:
//
//   S = scale * Q K^T + mask            mask[b, j] added to every row of sequence b (HF passes
//                                       0 for real tokens and the dtype minimum for padding)
//                                       causal: S[i, j] = -inf for j > i (key after the query)
//   P = softmax_rows(S)                 saved for the backward          [batch, heads, seq, seq]
//   Pd = dropout(P)                     attention_probs_dropout (identity when p == 0)
//   O = Pd V
//
// Backward, with dO given:
//   dV = Pd^T dO,  dPd = dO V^T,  dP = dropout'(dPd)
//   dS = P * (dP - rowsum(dP * P))      (softmax backward; the mask is constant)
//   dQ = scale * dS K,  dK = scale * dS^T Q
//
// The products run through Gemm (strided over heads; the scale rides on the GEMM's alpha); the
// softmax is one fused pass per row (mask, max, exp, sum, normalise, dropout), and so is its
// backward.
//
// Grouped-query attention (Ainslie et al. 2023): kv_heads divides heads, and query head h reads
// K/V head h / (heads / kv_heads); K, V, dK and dV have kv_heads heads, dK and dV summing over
// the query heads of their group. kv_heads = 0 means kv_heads = heads.
//
// Layouts (Q, K, V, O and their gradients all use args.layout):
//   kBHSD: [batch, heads, seq, head_dim] contiguous.
//   kBSHD: [batch, seq, heads, head_dim] = the [tokens, hidden] output of the Q/K/V linears, so
//          no transpose is needed on either side.
//
// FLOPs: forward 4 * batch * heads * seq^2 * head_dim (two GEMMs); backward twice that.
// Workspace (AttentionWorkspaceBytes): forward 4 * batch*heads*seq^2 bytes when dropout is active
// and O is wanted (Pd), else 0; backward 4 * batch*heads*seq^2 for dP, plus as much again for Pd with dropout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"
#include "kernels/dropout.h"

namespace fedlora::kernels {

enum class AttentionLayout { kBHSD, kBSHD };

struct AttentionDims {
  int64_t batch = 0, heads = 0, seq = 0, head_dim = 0;
  AttentionLayout layout = AttentionLayout::kBSHD;
  float scale = 0.0f;    // 0 means 1 / sqrt(head_dim)
  int64_t kv_heads = 0;  // 0: heads (multi-head); else divides heads (grouped-query)
  bool causal = false;   // each query attends to keys at or before its position only
};

struct AttentionForwardArgs {
  AttentionDims dims{};
  const float* q = nullptr;  // layout-shaped
  const float* k = nullptr;
  const float* v = nullptr;
  const float* mask = nullptr;  // [batch, seq] additive, or null (no padding)
  DropoutSpec dropout{};        // on P; element index = flat index in [batch, heads, seq, seq]
  float* probs = nullptr;       // [batch, heads, seq, seq] saved P (before dropout)
  float* out = nullptr;         // layout-shaped O; null computes P alone (v unused), for a
                                // backward that recomputes P instead of keeping it
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

struct AttentionBackwardArgs {
  AttentionDims dims{};
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* probs = nullptr;  // saved P
  DropoutSpec dropout{};         // the forward's, unchanged
  const float* dout = nullptr;   // layout-shaped dO
  float* dq = nullptr;           // layout-shaped
  float* dk = nullptr;
  float* dv = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

size_t AttentionWorkspaceBytes(const AttentionForwardArgs& args);
size_t AttentionWorkspaceBytes(const AttentionBackwardArgs& args);
absl::Status CanRun(const ExecContext& ctx, const AttentionForwardArgs& args);
absl::Status CanRun(const ExecContext& ctx, const AttentionBackwardArgs& args);
absl::Status AttentionForward(const ExecContext& ctx, const AttentionForwardArgs& args);
absl::Status AttentionBackward(const ExecContext& ctx, const AttentionBackwardArgs& args);

// The fused row-wise pieces, exposed for tests. Rows are the batch*heads*seq rows of P.
//   forward:  scores (already scaled) -> P = softmax(scores + mask) in place (causal: over
//             j <= i, zeros after); dropped = dropout(P)
//   backward: dscores = P * (dP' - rowsum(dP' * P)),  dP' = dropout'(dprobs), in place on dprobs
struct SoftmaxForwardArgs {
  int64_t batch = 0, heads = 0, seq = 0;
  const float* mask = nullptr;  // [batch, seq] or null
  bool causal = false;          // row i keeps columns j <= i; the rest of P is exactly 0
  float* scores = nullptr;      // [batch, heads, seq, seq] in: scaled scores, out: P
  DropoutSpec dropout{};
  float* dropped = nullptr;  // [batch, heads, seq, seq] Pd, required when dropout is active
};
struct SoftmaxBackwardArgs {
  int64_t batch = 0, heads = 0, seq = 0;
  const float* probs = nullptr;  // P
  DropoutSpec dropout{};
  float* grad = nullptr;  // in: dPd, out: dS (in place)
};
absl::Status CanRun(const ExecContext& ctx, const SoftmaxForwardArgs& args);
absl::Status CanRun(const ExecContext& ctx, const SoftmaxBackwardArgs& args);
absl::Status AttentionSoftmaxForward(const ExecContext& ctx, const SoftmaxForwardArgs& args);
absl::Status AttentionSoftmaxBackward(const ExecContext& ctx, const SoftmaxBackwardArgs& args);

namespace internal {
absl::Status AttentionSoftmaxForwardCuda(const ExecContext& ctx, const SoftmaxForwardArgs& args);
absl::Status AttentionSoftmaxBackwardCuda(const ExecContext& ctx, const SoftmaxBackwardArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
