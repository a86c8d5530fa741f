// BERT input embeddings, the sum of three lookups (frozen: there is no backward):
//
//   out[t, :] = word[input_ids[t], :] + position[position_ids[t], :] + token_type[type_ids[t], :]
//
// position_ids null means t % seq_len (BERT's default: positions restart for every sequence of
// a [batch, seq_len] batch); token_type_ids null means type 0 (the common single-segment case).
// The LayerNorm that follows in BERT is a separate op (layernorm.h). Tables may be fp32 or bf16.
//
// Shapes: ids [tokens] int32; word [vocab, hidden]; position [max_positions, hidden];
// token_type [type_vocab, hidden] (may be absent, as in DistilBERT: a null WeightPtr);
// out [tokens, hidden].
//
// Bad ids: the CPU returns InvalidArgument naming the first out-of-range id (and writes nothing
// useful). The CUDA kernel cannot report without a sync, so it writes a zero row for such a
// token and never reads out of bounds; validate ids on the host (the tokenizer's ids are).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/base/context.h"
#include "kernels/weight.h"

namespace fedlora::kernels {

struct EmbeddingForwardArgs {
  int64_t tokens = 0, hidden = 0;
  int64_t seq_len = 0;  // for default positions; tokens % seq_len == 0
  int64_t vocab = 0, max_positions = 0, type_vocab = 0;
  const int32_t* input_ids = nullptr;       // [tokens]
  const int32_t* position_ids = nullptr;    // [tokens] or null
  const int32_t* token_type_ids = nullptr;  // [tokens] or null (type 0)
  WeightPtr word{};                         // [vocab, hidden]
  WeightPtr position{};                     // [max_positions, hidden]
  WeightPtr token_type{};  // [type_vocab, hidden], or both pointers null: no token types
  float* out = nullptr;    // [tokens, hidden]
};

absl::Status CanRun(const ExecContext& ctx, const EmbeddingForwardArgs& args);
absl::Status EmbeddingForward(const ExecContext& ctx, const EmbeddingForwardArgs& args);

namespace internal {
absl::Status EmbeddingForwardCuda(const ExecContext& ctx, const EmbeddingForwardArgs& args);
}  // namespace internal

}  // namespace fedlora::kernels
