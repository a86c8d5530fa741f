// CausalLm's internals, shared by model/decoder_step.cc (training and evaluation) and
// model/decoder_generate.cc (greedy decoding with a KV cache). Not an API.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/attention.h"
#include "kernels/context.h"
#include "kernels/dropout.h"
#include "kernels/rope.h"
#include "model/decoder.h"
#include "model/decoder_weights.h"

namespace fedlora {

// What one layer's forward keeps for its backward. [tokens, width] row-major. The norms' outputs,
// SwiGLU's product and the attention probabilities are not kept: the backward recomputes them
// (Impl::norm, act, probs), which costs elementwise work and one Q K^T per layer.
struct DecoderLayerActs {
  std::vector<float> q, k, v, ctx, z, gate, up;
  std::array<std::vector<float>, kNumDecoderTargets> lora_h;  // [tokens, rank] per used target
};

struct CausalLm::Impl {
  Impl(const DecoderConfig& c, const DecoderBase::Weights& w, const DecoderOptions& o, std::vector<Param>& p)
      : config(c), weights(w), options(o), params(p) {}

  const DecoderConfig& config;
  const DecoderBase::Weights& weights;
  const DecoderOptions& options;
  std::vector<Param>& params;
  kernels::ExecContext ctx;

  bool use_target[kNumDecoderTargets] = {};
  std::vector<std::array<int, kNumDecoderTargets>> lora_param;  // [layer][target]: index of A, or -1
  float lora_scaling = 1.0f;
  float lora_p = 0.0f;
  float attention_p = 0.0f;

  kernels::RopeTables rope;
  std::vector<DecoderLayerActs> acts;  // one per layer, or one in all with recompute_activations
  std::vector<std::vector<float>> x;   // layer inputs, x[L] the last layer's output
  std::vector<float> nf, rstd_f;       // final norm
  std::vector<float> mask_add;         // [tokens] 0 or -1e30
  std::vector<int32_t> positions;      // [tokens]
  std::vector<float> tmp;              // [tokens, hidden] a projection's output before the residual add
  // One layer's recomputable values, shared by all layers: an RMSNorm's output and 1 / rms,
  // silu(gate) * up, and the attention probabilities [batch, heads, seq, seq].
  std::vector<float> norm, rstd, act, probs;
  // Backward scratch.
  std::vector<float> dx, dn, dq, dk, dv, dctx, dgate, dup, dact;
  // The output head, kLmHeadChunkRows rows at a time.
  std::vector<float> head_in, head_logits, dhead_in;
  std::vector<int32_t> head_labels;
  std::vector<float> workspace_storage;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  int64_t L() const { return config.num_hidden_layers; }
  int64_t H() const { return config.hidden_size; }
  int64_t r() const { return options.lora.rank; }
  DecoderLayerActs& ActsFor(int64_t layer) { return acts[options.recompute_activations ? 0 : layer]; }

  absl::Status Plan();
  absl::Status CheckBatch(const Batch& b, bool need_labels) const;
  // Embeddings of b's tokens into x[0]; mask and positions for the batch.
  void Embed(const Batch& b);
  // One layer: x[layer] -> x[layer + 1], keeping what the backward needs in `a`.
  absl::Status LayerForward(int64_t layer, int64_t batch, int64_t seq, bool training, uint64_t seed,
                            DecoderLayerActs& a);
  // dx holds d(loss)/d(x[layer + 1]) on entry and d(loss)/d(x[layer]) on return (layer > 0).
  absl::Status LayerBackward(int64_t layer, int64_t batch, int64_t seq, uint64_t seed, DecoderLayerActs& a);
  absl::Status Forward(const Batch& b, bool training, uint64_t seed);
  // norm, rstd = RMSNorm of layer l's input x[l] (AttentionNorm) or of a.z (MlpNorm).
  absl::Status AttentionNorm(int64_t l, int64_t tokens);
  absl::Status MlpNorm(int64_t l, int64_t tokens, const DecoderLayerActs& a);
  // Layer l's attention over a.q, a.k, a.v: probs, and the output into `out` unless it is null.
  absl::Status Attention(int64_t l, int64_t batch, int64_t seq, bool training, uint64_t seed,
                         const DecoderLayerActs& a, float* out);
  kernels::AttentionDims AttentionDimsFor(int64_t batch, int64_t seq) const;
  // The output head over the target rows: summed NLL and count; with `backward`, d(loss)/d(x[L])
  // into dx (the loss being the mean over the targets).
  absl::Status Head(const Batch& b, bool backward, LossSum* sum);

  absl::Status Linear(int64_t layer, DecoderTarget t, const float* in, int64_t rows, float* y, bool training,
                      uint64_t seed, DecoderLayerActs& a);
  absl::Status LinearBackward(int64_t layer, DecoderTarget t, const float* in, const float* dy, int64_t rows,
                              float* dx_out, bool accumulate_dx, uint64_t seed, DecoderLayerActs& a);
  kernels::DropoutSpec LoraSpec(bool training, uint64_t seed, int64_t layer, DecoderTarget t) const;
};

}  // namespace fedlora
