// One decoding step's attention: a single new query row per head attends to a KV cache of `len`
// positions (the token's own key and value included), as greedy decoding with a KV cache needs:
//
//   s_j = scale * q_h . k[j, h / group]        j < len, scale = 1 / sqrt(head_dim)
//   o_h = sum_j softmax(s)_j v[j, h / group]    group = heads / kv_heads (grouped-query heads)
//
// No mask and no causal cut: every cached position precedes the query. Shapes, row-major:
// q and out [heads, head_dim]; k_cache and v_cache [len, kv_heads, head_dim] (the rows of a
// cache of the K/V projections' [tokens, kv_dim] outputs; only the first len rows are read).
//
// The CPU backend is the plain loop per head (scores, max, exp, sum, weighted sum of V). The CUDA
// backend splits the positions into chunks of kDecodeAttentionChunk, one block per (chunk, head),
// each writing its chunk's max, sum of exponentials and unnormalised output to the workspace; a
// second pass combines the chunks per head (flash-decoding, Dao et al. 2023). The results differ
// from the CPU's only in summation order.
//
// Workspace (DecodeAttentionWorkspaceBytes): heads * chunks * (head_dim + 2) floats, chunks =
// ceil(len / kDecodeAttentionChunk); required by both backends (the CPU leaves it unused), so a
// caller sizes it once for the longest cache.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"

namespace fedlora::kernels {

// Cache positions per chunk of the CUDA backend's split.
inline constexpr int64_t kDecodeAttentionChunk = 256;

struct DecodeAttentionArgs {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // kv_heads divides heads
  int64_t len = 0;                                // cached positions to attend to, >= 1
  const float* q = nullptr;                       // [heads, head_dim]
  const float* k_cache = nullptr;                 // [len, kv_heads, head_dim]
  const float* v_cache = nullptr;                 // [len, kv_heads, head_dim]
  float* out = nullptr;                           // [heads, head_dim]
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

size_t DecodeAttentionWorkspaceBytes(const DecodeAttentionArgs& args);
absl::Status CanRun(const ExecContext& ctx, const DecodeAttentionArgs& args);
absl::Status DecodeAttention(const ExecContext& ctx, const DecodeAttentionArgs& args);

namespace internal {
absl::Status DecodeAttentionCuda(const ExecContext& ctx, const DecodeAttentionArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
