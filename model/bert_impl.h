// BertClassifier::Impl, shared by model/bert.cc (structure, planning, the public API) and
// model/bert_step.cc (the forward and backward computation). Not an API.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/base/backend.h"
#include "kernels/base/context.h"
#include "kernels/dropout.h"
#include "kernels/fused_attention.h"
#include "kernels/mirror.h"
#include "model/bert.h"
#include "model/bert_internal.h"
#include "model/device_params.h"
#include "model/frozen.h"

namespace fedlora {
namespace bert_internal {

// Every dropout site of a step draws from its own core/rng.h stream (seed = the step's dropout
// seed), so no two sites share a mask and the backward recomputes each forward mask exactly.
inline kernels::DropoutSpec Spec(float p, uint64_t seed, uint64_t site) {
  return kernels::DropoutSpec{.p = p, .seed = seed, .offset = 0, .stream = site};
}
enum Site : uint64_t {
  kSiteEmbedding = 0,
  kSiteClassifier = 1,
  kSiteHeadInput = 2,   // RoBERTa's head: dropout on the <s> vector before its dense layer
  kSiteLayerBase = 16,  // + layer * kSitesPerLayer + one of the below
  kSitesPerLayer = 16,
  kSiteAttnProbs = 0,
  kSiteAttnOut = 1,
  kSiteFfnOut = 2,
  kSiteLora = 8,  // + target index
};
inline uint64_t LayerSite(int layer, uint64_t site) {
  return kSiteLayerBase + layer * kSitesPerLayer + site;
}

}  // namespace bert_internal

// --- Impl ----------------------------------------------------------------------------------------

struct BertClassifier::Impl {
  Impl(const BertConfig& c, const ModelOptions& o, std::vector<Param>& p,
       const BertBase::Weights& w)
      : config(c),
        options(o),
        params(p),
        word_emb(w.word_emb),
        pos_emb(w.pos_emb),
        type_emb(w.type_emb),
        emb_ln_gamma(w.emb_ln_gamma),
        emb_ln_beta(w.emb_ln_beta),
        layers(w.layers),
        pooler(w.pooler) {}

  const BertConfig& config;
  const ModelOptions& options;
  std::vector<Param>& params;
  // The device this classifier computes on, and its context (its stream; on the CPU, the kernels'
  // default pool unless SetThreadPool gave one). Declared before every array it allocates.
  std::shared_ptr<kernels::Backend> backend;
  kernels::ExecContext ctx;

  bool use_target[kNumLoraTargets] = {};
  float lora_scaling = 1.0f;  // alpha / rank
  float hidden_p = 0.0f, attention_p = 0.0f, classifier_p = 0.0f, lora_p = 0.0f;

  // Frozen base weights: read-only views into the shared BertBase, which outlives this Impl (the
  // classifier holds it by shared_ptr) and is never written after it was built.
  const FrozenMatrix& word_emb;
  const FrozenMatrix& pos_emb;
  const FrozenMatrix& type_emb;
  const std::vector<float>& emb_ln_gamma;
  const std::vector<float>& emb_ln_beta;
  const std::vector<bert_internal::LayerWeights>& layers;
  const FrozenLinear& pooler;  // BERT: frozen dense + tanh on [CLS]; unused for RoBERTa
  // The same weights where the kernels read them: the host arrays above on the CPU, the base's
  // device copies on a GPU (BertBase::WeightsOn). Set by BindWeights.
  struct DevLinear {
    kernels::WeightPtr w;
    const float* bias = nullptr;
  };
  struct DevLayer {
    DevLinear lin[kNumLoraTargets];
    const float *ln1_gamma = nullptr, *ln1_beta = nullptr, *ln2_gamma = nullptr,
                *ln2_beta = nullptr;
  };
  std::shared_ptr<const kernels::DeviceMirror> mirror;
  kernels::WeightPtr dev_word, dev_pos, dev_type;
  const float *dev_emb_gamma = nullptr, *dev_emb_beta = nullptr;
  std::vector<DevLayer> dev_layers;
  DevLinear dev_pooler;
  // Where the kernels read and write the trainable params (model/device_params.h).
  DeviceParams dev_params{params};
  // [layer][LoraTarget]: index of lora_A in params (lora_B follows), -1 without LoRA.
  std::vector<std::array<int, kNumLoraTargets>> lora_param;
  int head_dense_param =
      -1;  // RoBERTa: trainable classifier.dense (weight, bias next); -1 for BERT
  int classifier_param = -1;  // the final linear: weight at params[classifier_param], bias next
  // The rows a call computes. A padding token never changes a real token's value (its key gets
  // the mask's -1e30, so its attention weight is exactly 0) and the head reads only each
  // sequence's first position, so when every sequence starts with a real token the padding is
  // left out: the real tokens are packed into `rows` rows, sequence s's at [start[s], start[s] +
  // len[s]), and attention runs per sequence over its own tokens. Otherwise (no padding at all,
  // or a sequence starting with padding, whose state the head reads) every position is a row,
  // attention runs once for the batch, and the mask applies where there is padding.
  struct Layout {
    int64_t rows = 0;
    bool packed = false;
    bool masked = false;  // some row is padding: attention needs mask_host
    std::vector<int64_t> start, len;
  };
  Layout layout;
  // Per row: token, token type and position ids (BERT: the index in its sequence; RoBERTa: HF's
  // create_position_ids_from_input_ids), and the attention mask (0, or -1e30 for padding).
  std::vector<int32_t> row_ids, row_types, row_positions;
  // The batch's inputs on the device (GPU only: the CPU reads the host vectors).
  kernels::DeviceArray<int32_t> dev_ids, dev_types, dev_positions, dev_labels;

  // Saved activations per layer, sized for max_batch * max_seq tokens (T) by Plan().
  using Array = kernels::DeviceArray<float>;
  struct LayerActs {
    Array q, k, v;                  // [T, H] projections (bias and LoRA included)
    Array lora_h[kNumLoraTargets];  // [T, r] dropout(x) A^T, for the LoRA backward
    Array probs;                    // [B, heads, S, S] softmax before dropout (not fused)
    Array lse;                      // [T, heads] rows' log-sum-exp (fused attention)
    Array ctx;                      // [T, H] attention output
    Array z1, mean1, rstd1;         // LN1 input [T, H] and statistics [T]
    Array h1;                       // [T, H] LN1 output
    Array u, g;                     // [T, I] intermediate before / after GELU
    Array z2, mean2, rstd2;         // LN2 input and statistics
  };
  std::vector<LayerActs> acts;
  std::vector<Array> x;          // [L + 1][T, H]: x[0] embeddings output, x[l+1] layer l's output
  std::vector<float> mask_host;  // [rows] additive attention mask: 0 keep, -1e30 padding
  Array mask_add;                // mask_host on the device (GPU only)
  // Fused attention (ModelOptions::fused_attention): the sequences' first rows and the row count.
  bool fused_attention = false;
  std::vector<int32_t> seq_start_host;
  kernels::DeviceArray<int32_t> dev_seq_start;
  const int32_t* seq_start_ptr = nullptr;
  const float* fused_mask = nullptr;    // the staged mask_host when the layout is masked, else null
  Array cls, pooled, cls_drop, logits;  // [B, H] x3, [B, labels]
  Array loss_value;                     // [1]
  // Training loss only: per-class offsets added to the logits before the cross-entropy (logit
  // adjustment), and the head bias with them added; empty when unset.
  std::vector<float> loss_logit_offsets, adjusted_bias_host;
  Array adjusted_bias;  // [labels]
  // Backward scratch.
  Array dx, dh, dz, dctx, dq, dk, dv, dg;  // [T, H] ..., dg [T, I]
  Array dlogits, dcls, dpooled;            // [B, labels], [B, H], [B, H]
  kernels::DeviceArray<uint8_t> workspace_storage;
  void* workspace = nullptr;  // workspace_storage.data() (256-byte aligned)
  size_t workspace_bytes = 0;

  int64_t H() const { return config.hidden_size; }
  int64_t I() const { return config.intermediate_size; }
  int64_t L() const { return config.num_hidden_layers; }
  int64_t r() const { return options.lora.rank; }

  absl::Status InitStructure(std::vector<LoraTarget>* targets);
  // The backend for options.device, and the frozen weights' pointers in `weights` (the base's
  // arrays on that device).
  absl::Status BindWeights(std::shared_ptr<const kernels::DeviceMirror> weights);
  absl::Status Plan();
  bool on_host() const { return backend->device() == Device::kCpu; }
  float* Val(int i) { return dev_params.Value(i); }
  float* Grad(int i) { return dev_params.Grad(i); }
  template <class T>
  absl::StatusOr<const T*> Stage(const std::vector<T>& host, size_t count,
                                 kernels::DeviceArray<T>& dev) {
    return fedlora::Stage(*backend, host, count, dev);
  }
  absl::Status CheckBatch(const Batch& batch, bool need_labels) const;
  // The layout and the per-row ids and mask of a checked batch.
  void Arrange(const Batch& batch);
  absl::Status Encode(const Batch& batch, bool training, uint64_t seed);
  // The head's logits; with_loss: the cross-entropy into loss_value (on the device) and dlogits.
  absl::Status Head(const Batch& batch, bool training, uint64_t seed, bool with_loss);
  absl::Status Backward(const Batch& batch, uint64_t seed);

  kernels::DropoutSpec HiddenDropout(bool training, uint64_t seed, uint64_t site) const {
    return bert_internal::Spec(training ? hidden_p : 0.0f, seed, site);
  }
  absl::Status LinearForward(int layer, LoraTarget t, const float* in, int64_t rows, float* y,
                             bool training, uint64_t seed);
  // Layer l's self-attention over the layout's rows: a.ctx and a.probs from a.q, a.k, a.v; one
  // call for the whole batch (masked), or one per sequence (packed). Fused: a.ctx and a.lse, one
  // call either way.
  absl::Status Attention(int l, int64_t bsz, int64_t seq, const float* mask, bool training,
                         uint64_t seed, LayerActs& a);
  // Packed layout: run(n, row, prob) for each sequence, with its n tokens from row `row` and its
  // [heads, n, n] probabilities from element `prob` (they follow one another).
  absl::Status PerSequence(
      const std::function<absl::Status(int64_t n, int64_t row, int64_t prob)>& run) const;
  // Its backward: dq, dk, dv from dctx.
  absl::Status AttentionBackward(int l, int64_t bsz, int64_t seq, uint64_t seed, LayerActs& a);
  // The fused attention's dims for the current layout: one sequence per layout range.
  kernels::FusedAttentionDims FusedDims(int64_t bsz) const;
  // A residual sublayer's backward through its LayerNorm (input z, statistics mean/rstd) into
  // dz_norm, then through its output dropout (dropout site `site` of layer l): returns the
  // gradient of the sublayer's output dense, dz_norm itself without dropout, else dz.
  absl::StatusOr<const float*> SublayerBackward(int l, uint64_t site, int64_t tokens,
                                                const float* z, const float* gamma,
                                                const float* mean, const float* rstd,
                                                const float* dy, float* dz_norm, uint64_t seed);
  absl::Status LinearBackward(int layer, LoraTarget t, const float* in, const float* dy,
                              int64_t rows, float* dx, bool accumulate_dx, uint64_t seed);
};

}  // namespace fedlora
