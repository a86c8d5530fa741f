// BertClassifier's and BertBase's shared internals (model/bert.cc, model/bert_base.cc): the frozen
// weights' layout, initialisation streams and layer geometry. Not an API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/bert.h"
#include "model/frozen.h"

namespace fedlora {
namespace bert_internal {

inline constexpr LoraTarget kAllTargets[kNumLoraTargets] = {
    LoraTarget::kQuery,   LoraTarget::kKey,          LoraTarget::kValue,
    LoraTarget::kAttnOut, LoraTarget::kIntermediate, LoraTarget::kOutput};

struct LayerWeights {
  FrozenLinear lin[kNumLoraTargets];  // indexed by LoraTarget
  std::vector<float> ln1_gamma, ln1_beta, ln2_gamma, ln2_beta;
};

// Stream ids for initialisation.
inline constexpr uint64_t kStreamClassifier = 1;
inline constexpr uint64_t kStreamPooler = 2;
inline constexpr uint64_t kStreamRandomBase = 3;      // FromRandom's base weights: + tensor index
inline constexpr uint64_t kStreamLoraBase = 1 << 20;  // + layer * kNumLoraTargets + target

// Input and output features of one encoder-layer linear.
inline void InOut(const BertConfig& c, LoraTarget t, int64_t* in, int64_t* out) {
  *in = t == LoraTarget::kOutput ? c.intermediate_size : c.hidden_size;
  *out = t == LoraTarget::kIntermediate ? c.intermediate_size : c.hidden_size;
}

}  // namespace bert_internal

// The frozen weights. Written only by BertBase::Make, before the base is shared; read-only after.
struct BertBase::Weights {
  FrozenMatrix word_emb, pos_emb, type_emb;
  std::vector<float> emb_ln_gamma, emb_ln_beta;
  std::vector<bert_internal::LayerWeights> layers;
  FrozenLinear pooler;  // BERT: dense + tanh on [CLS]; left empty for RoBERTa, whose head has none

  // Sets every shape from the config, LayerNorm gains to 1 and biases to 0 (HF's initialisation).
  void Shape(const BertConfig& config);
  // Fills every tensor from the safetensors file at `path`; sets *used_seed when the pooler was
  // missing and had to be drawn from `seed`.
  absl::Status Load(const std::string& path, const BertConfig& config, bool bf16, uint64_t seed,
                    bool* used_seed);
  // N(0, 0.02) matrices from `seed`, one stream per tensor.
  void Random(const BertConfig& config, bool bf16, uint64_t seed);
  int64_t Bytes() const;
  // Adds every array to `mirror` (BertBase::WeightsOn).
  absl::Status AddTo(kernels::DeviceMirror& mirror) const;
};

}  // namespace fedlora
