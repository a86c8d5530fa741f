// CausalLm's internals, shared by model/decoder_step.cc (training and evaluation) and
// model/decoder_generate.cc (greedy decoding with a KV cache). Not an API.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/attention.h"
#include "kernels/base/backend.h"
#include "kernels/base/context.h"
#include "kernels/dropout.h"
#include "kernels/fused_attention.h"
#include "kernels/mirror.h"
#include "kernels/rope.h"
#include "model/decoder.h"
#include "model/decoder_weights.h"
#include "model/device_params.h"

namespace fedlora {

// What one layer's forward keeps for its backward. [tokens, width] row-major. The norms' outputs,
// SwiGLU's product and the attention probabilities are not kept: the backward recomputes them
// (Impl::norm, act, probs), which costs elementwise work and one Q K^T per layer.
struct DecoderLayerActs {
  kernels::DeviceArray<float> q, k, v, ctx, z, gate, up;
  kernels::DeviceArray<float> lse;  // [tokens, heads], with fused attention
  std::array<kernels::DeviceArray<float>, kNumDecoderTargets>
      lora_h;  // [tokens, rank] per used target
};

struct CausalLm::Impl {
  Impl(const DecoderConfig& c, const DecoderBase::Weights& w, const DecoderOptions& o,
       std::vector<Param>& p)
      : config(c), weights(w), options(o), params(p) {}

  const DecoderConfig& config;
  const DecoderBase::Weights& weights;
  const DecoderOptions& options;
  std::vector<Param>& params;
  // The device this model computes on and its context (kernels/base/backend.h); declared before every
  // array it allocates.
  std::shared_ptr<kernels::Backend> backend;
  kernels::ExecContext ctx;
  // The frozen weights where the kernels read them (the base's arrays on the CPU, its device copy
  // on a GPU: DecoderBase::WeightsOn), set by BindWeights.
  struct DevLinear {
    kernels::WeightPtr w;
    const float* bias = nullptr;
  };
  struct DevLayer {
    DevLinear proj[kNumDecoderTargets];
    const float* input_norm = nullptr;
    const float* post_attention_norm = nullptr;
  };
  std::shared_ptr<const kernels::DeviceMirror> mirror;
  std::vector<DevLayer> dev_layers;
  const float* dev_final_norm = nullptr;
  kernels::WeightPtr dev_head;
  DeviceParams dev_params{params};

  bool use_target[kNumDecoderTargets] = {};
  std::vector<std::array<int, kNumDecoderTargets>>
      lora_param;  // [layer][target]: index of A, or -1
  float lora_scaling = 1.0f;
  float lora_p = 0.0f;
  float attention_p = 0.0f;

  using Array = kernels::DeviceArray<float>;
  kernels::RopeTables rope;  // host tables
  Array rope_cos, rope_sin;  // their device copies (GPU only)
  const float *rope_cos_ptr = nullptr,
              *rope_sin_ptr = nullptr;  // where the kernels read the tables
  std::vector<DecoderLayerActs> acts;   // one per layer, or one in all with recompute_activations
  std::vector<Array> x;                 // layer inputs, x[L] the last layer's output
  Array nf, rstd_f;                     // final norm
  // The batch's attention mask ([tokens] 0 or -1e30) and positions, on the host and where the
  // kernels read them (mask_ptr, positions_ptr: set by Embed); the embeddings' host staging (GPU
  // only).
  std::vector<float> mask_host;
  std::vector<int32_t> positions_host;
  Array dev_mask;
  kernels::DeviceArray<int32_t> dev_positions;
  // Fused attention (DecoderOptions::fused_attention): every sequence's token range, b * seq_len.
  bool fused_attention = false;
  std::vector<int32_t> seq_start_host;
  kernels::DeviceArray<int32_t> dev_seq_start;
  const int32_t* seq_start_ptr = nullptr;
  const float* mask_ptr = nullptr;
  const int32_t* positions_ptr = nullptr;
  std::vector<float> embed_host;
  Array tmp;  // [tokens, hidden] a projection's output before the residual add
  // One layer's recomputable values, shared by all layers: an RMSNorm's output and 1 / rms,
  // silu(gate) * up, and the attention probabilities [batch, heads, seq, seq].
  Array norm, rstd, act, probs;
  // Backward scratch.
  Array dx, dn, dq, dk, dv, dctx, dgate, dup, dact;
  // The output head, kLmHeadChunkRows rows at a time: its input rows, logits, input gradient,
  // labels, and each chunk's mean loss.
  Array head_in, head_logits, dhead_in, head_loss;
  std::vector<int32_t> head_labels_host;
  kernels::DeviceArray<int32_t> head_labels;
  // Generate's KV cache: per layer the rotated keys and the values, [max_seq, kv_dim], allocated
  // by the first cached Generate.
  std::vector<Array> cache_k, cache_v;
  kernels::DeviceArray<uint8_t> workspace_storage;
  void* workspace = nullptr;  // workspace_storage.data() (256-byte aligned)
  size_t workspace_bytes = 0;

  int64_t L() const { return config.num_hidden_layers; }
  int64_t H() const { return config.hidden_size; }
  int64_t r() const { return options.lora.rank; }
  DecoderLayerActs& ActsFor(int64_t layer) {
    return acts[options.recompute_activations ? 0 : layer];
  }

  // The backend for options.device and the frozen weights' pointers in `weights`.
  absl::Status BindWeights(std::shared_ptr<const kernels::DeviceMirror> weights);
  absl::Status Plan();
  bool on_host() const { return backend->device() == Device::kCpu; }
  absl::Status CheckBatch(const Batch& b, bool need_labels) const;
  // Embeddings of `tokens` token ids into x[0]'s first rows (gathered on the host, then uploaded).
  absl::Status GatherEmbeddings(const int32_t* ids, int64_t tokens);
  // Embeddings of b's tokens into x[0]; mask and positions for the batch.
  absl::Status Embed(const Batch& b);
  // One layer: x[layer] -> x[layer + 1], keeping what the backward needs in `a`.
  absl::Status LayerForward(int64_t layer, int64_t batch, int64_t seq, bool training, uint64_t seed,
                            DecoderLayerActs& a);
  // dx holds d(loss)/d(x[layer + 1]) on entry and d(loss)/d(x[layer]) on return (layer > 0).
  absl::Status LayerBackward(int64_t layer, int64_t batch, int64_t seq, uint64_t seed,
                             DecoderLayerActs& a);
  absl::Status Forward(const Batch& b, bool training, uint64_t seed);
  // norm, rstd = RMSNorm of layer l's input x[l] (AttentionNorm) or of a.z (MlpNorm).
  absl::Status AttentionNorm(int64_t l, int64_t tokens);
  absl::Status MlpNorm(int64_t l, int64_t tokens, const DecoderLayerActs& a);
  // Layer l's attention over a.q, a.k, a.v: probs (fused: a.lse), and the output into `out`
  // unless it is null (not fused only: the backward's recomputation of probs).
  absl::Status Attention(int64_t l, int64_t batch, int64_t seq, bool training, uint64_t seed,
                         DecoderLayerActs& a, float* out);
  kernels::AttentionDims AttentionDimsFor(int64_t batch, int64_t seq) const;
  kernels::FusedAttentionDims FusedDimsFor(int64_t batch, int64_t seq) const;
  // The output head over the target rows: summed NLL and count; with `backward`, d(loss)/d(x[L])
  // into dx (the loss being the mean over the targets).
  absl::Status Head(const Batch& b, bool backward, LossSum* sum);

  absl::Status Linear(int64_t layer, DecoderTarget t, const float* in, int64_t rows, float* y,
                      bool training, uint64_t seed, DecoderLayerActs& a);
  absl::Status LinearBackward(int64_t layer, DecoderTarget t, const float* in, const float* dy,
                              int64_t rows, float* dx_out, bool accumulate_dx, uint64_t seed,
                              DecoderLayerActs& a);
  kernels::DropoutSpec LoraSpec(bool training, uint64_t seed, int64_t layer, DecoderTarget t) const;
};

}  // namespace fedlora
