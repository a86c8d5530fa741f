// The frozen weights of a decoder (internal to model/: the decoder and model/gguf_lora.cc): shapes follow Hugging Face's
// LlamaForCausalLM, [out, in] for every projection.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "model/decoder.h"
#include "model/frozen.h"

namespace fedlora {

struct DecoderLayerWeights {
  std::vector<float> input_norm;           // [hidden]
  FrozenLinear proj[kNumDecoderTargets];   // indexed by DecoderTarget; q/k/v biases for Qwen2
  std::vector<float> post_attention_norm;  // [hidden]
};

struct DecoderBase::Weights {
  FrozenMatrix embed;  // [vocab, hidden]
  std::vector<DecoderLayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  FrozenMatrix lm_head;           // [vocab, hidden]; empty when tied to embed

  const FrozenMatrix& head() const { return lm_head.empty() ? embed : lm_head; }
  // [out, in] of a projection.
  static void Shape(const DecoderConfig& c, DecoderTarget t, int64_t* out, int64_t* in);
  // Every matrix and vector has its config shape (the loaders' last check).
  absl::Status Check(const DecoderConfig& c) const;
  // Adds every array to `mirror` (DecoderBase::WeightsOn).
  absl::Status AddTo(kernels::DeviceMirror& mirror) const;
};

// Builds the base once the weights are filled (Check passes); bf16_math (DecoderOptions) marks the
// projections and the head, which must then be held as bf16; int8_math marks those held as Q8_0
// (at least one must be).
absl::StatusOr<std::shared_ptr<const DecoderBase>> MakeDecoderBase(
    DecoderConfig config, std::unique_ptr<DecoderBase::Weights> weights, bool bf16_math,
    bool int8_math);
// The loaders (model/decoder_load.cc): DecoderOptions::weights, bf16_math and int8_math.
absl::StatusOr<std::shared_ptr<const DecoderBase>> LoadDecoderSafetensors(
    const std::string& dir, const DecoderOptions& options);
absl::StatusOr<std::shared_ptr<const DecoderBase>> LoadDecoderGguf(const std::string& path,
                                                                   const DecoderOptions& options);

}  // namespace fedlora
