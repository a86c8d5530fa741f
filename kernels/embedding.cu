// Embedding lookup sum, CUDA backend: one block per token, threads over the hidden dimension.
// An out-of-range id gives a zero row (see embedding.h): never an out-of-bounds read.
#include "kernels/base/cuda_util.cuh"
#include "kernels/embedding.h"

namespace fedlora::kernels::internal {
namespace {

__device__ __forceinline__ float Load(const float* f32, const uint16_t* bf16, int64_t i) {
  return bf16 != nullptr ? Bf16BitsToF32(bf16[i]) : f32[i];
}

__global__ void EmbeddingKernel(int64_t tokens, int64_t H, int64_t seq_len, int64_t vocab,
                                int64_t max_pos, int64_t type_vocab, const int32_t* ids,
                                const int32_t* pos_ids, const int32_t* type_ids, WeightPtr word,
                                WeightPtr pos, WeightPtr type, bool has_types, float* out) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int64_t w = ids[t];
    const int64_t p = pos_ids != nullptr ? pos_ids[t] : t % seq_len;
    const int64_t ty = type_ids != nullptr ? type_ids[t] : 0;
    const bool ok = w >= 0 && w < vocab && p >= 0 && p < max_pos &&
                    (!has_types || (ty >= 0 && ty < type_vocab));
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
      float v = 0.0f;
      if (ok) {
        v = Load(word.f32, word.bf16, w * H + j) + Load(pos.f32, pos.bf16, p * H + j);
        if (has_types) v += Load(type.f32, type.bf16, ty * H + j);
      }
      out[t * H + j] = v;
    }
  }
}

}  // namespace

absl::Status EmbeddingForwardCuda(const ExecContext& ctx, const EmbeddingForwardArgs& a) {
  const bool has_types = a.token_type.f32 != nullptr || a.token_type.bf16 != nullptr;
  const unsigned grid = static_cast<unsigned>(a.tokens < 65535 ? a.tokens : 65535);
  EmbeddingKernel<<<grid, 256, 0, Stream(ctx)>>>(
      a.tokens, a.hidden, a.seq_len, a.vocab, a.max_positions, a.type_vocab, a.input_ids,
      a.position_ids, a.token_type_ids, a.word, a.position, a.token_type, has_types, a.out);
  FEDLORA_CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace fedlora::kernels::internal
