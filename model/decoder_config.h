// The architecture of a decoder-only transformer (LLaMA family), read from a Hugging Face
// config.json or from GGUF metadata.
//
//   FEDLORA_ASSIGN_OR_RETURN(DecoderConfig cfg, ReadDecoderConfig(dir + "/config.json"));
//   cfg.kv_dim();  // num_key_value_heads * head_dim
//
// Supported: model_type "llama" (LLaMA, SmolLM, TinyLlama: RMSNorm, rotary embeddings in the
// rotate-half layout without scaling, grouped-query attention, SwiGLU MLP, no biases) and "qwen2"
// (the same with biases on q_proj, k_proj and v_proj, no sliding window), with tied or separate
// output heads. Anything else (rope_scaling, attention_bias on LLaMA, mlp_bias, a sliding window,
// another hidden_act, pretraining_tp > 1, partial rotary) is rejected with a message naming the
// field, rather than loaded and computed wrongly.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fedlora {

struct DecoderConfig {
  std::string model_type = "llama";  // "llama" or "qwen2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // divides num_attention_heads
  int64_t head_dim = 0;             // hidden_size / num_attention_heads unless the config says
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: biases on q_proj, k_proj, v_proj
  double attention_dropout = 0.0;
  int64_t bos_token_id = -1;  // -1: none
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = -1;  // -1: none

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  // Checks ranges and consistency. InvalidArgument naming the field.
  absl::Status Validate() const;
};

// Parses a config.json object. `what` names the source in error messages.
absl::StatusOr<DecoderConfig> ParseDecoderConfig(const nlohmann::json& json, std::string_view what);
// ReadJsonFile + ParseDecoderConfig.
absl::StatusOr<DecoderConfig> ReadDecoderConfig(const std::string& path);
// True when a config.json object describes a decoder fedlora reads ("llama", "qwen2").
bool IsDecoderConfig(const nlohmann::json& json);

}  // namespace fedlora
