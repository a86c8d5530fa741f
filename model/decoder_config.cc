#include "model/decoder_config.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "core/status.h"

namespace fedlora {
namespace {

absl::Status Positive(int64_t value, std::string_view field) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("decoder config: ", std::string(field), " must be positive, got ", value));
}

absl::Status Refuse(std::string_view what, std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": ", std::string(field), " ",
                                                 std::string(why),
                                                 " is not supported by fedlora's decoder"));
}

}  // namespace

absl::Status DecoderConfig::Validate() const {
  FEDLORA_RETURN_IF_ERROR(Positive(vocab_size, "vocab_size"));
  FEDLORA_RETURN_IF_ERROR(Positive(hidden_size, "hidden_size"));
  FEDLORA_RETURN_IF_ERROR(Positive(intermediate_size, "intermediate_size"));
  FEDLORA_RETURN_IF_ERROR(Positive(num_hidden_layers, "num_hidden_layers"));
  FEDLORA_RETURN_IF_ERROR(Positive(num_attention_heads, "num_attention_heads"));
  FEDLORA_RETURN_IF_ERROR(Positive(num_key_value_heads, "num_key_value_heads"));
  FEDLORA_RETURN_IF_ERROR(Positive(head_dim, "head_dim"));
  FEDLORA_RETURN_IF_ERROR(Positive(max_position_embeddings, "max_position_embeddings"));
  // Beyond these it is a corrupt or hostile file, not a model: they would overflow int32 token ids
  // and the int64 activation arithmetic long before being useful.
  constexpr int64_t kMaxDim = 1 << 20;
  if (hidden_size > kMaxDim || intermediate_size > kMaxDim || vocab_size > (int64_t{1} << 24) ||
      max_position_embeddings > (int64_t{1} << 24) || num_hidden_layers > 1024 || head_dim > 4096 ||
      num_attention_heads > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("decoder config: implausibly large dimensions (hidden_size ", hidden_size,
                     ", intermediate_size ", intermediate_size, ", vocab_size ", vocab_size,
                     ", num_hidden_layers ", num_hidden_layers, ", heads ", num_attention_heads,
                     " x ", head_dim, ", max_position_embeddings ", max_position_embeddings, ")"));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("decoder config: num_attention_heads ", num_attention_heads,
                     " is not a multiple of num_key_value_heads ", num_key_value_heads));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("decoder config: head_dim ", head_dim,
                                                   " is odd (rotary embeddings rotate pairs)"));
  }
  if (!(rms_norm_eps > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("decoder config: rms_norm_eps must be > 0, got ", rms_norm_eps));
  }
  if (!(rope_theta > 1.0) || rope_theta > 1e12) {
    return absl::InvalidArgumentError(
        absl::StrCat("decoder config: rope_theta must be in (1, 1e12], got ", rope_theta));
  }
  if (!(attention_dropout >= 0.0 && attention_dropout < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decoder config: attention_dropout must be in [0, 1), got ", attention_dropout));
  }
  if (model_type != "llama" && model_type != "qwen2") {
    return absl::InvalidArgumentError(absl::StrCat("decoder config: unsupported model_type \"",
                                                   model_type,
                                                   "\" (supported: \"llama\", \"qwen2\")"));
  }
  auto id_ok = [&](int64_t id) { return id >= -1 && id < vocab_size; };
  if (!id_ok(bos_token_id) || !id_ok(pad_token_id)) {
    return absl::InvalidArgumentError(absl::StrCat("decoder config: bos_token_id ", bos_token_id,
                                                   " or pad_token_id ", pad_token_id,
                                                   " outside the vocabulary of ", vocab_size));
  }
  for (int64_t e : eos_token_ids) {
    if (e < 0 || e >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("decoder config: eos_token_id ", e,
                                                     " outside the vocabulary of ", vocab_size));
    }
  }
  return absl::OkStatus();
}

bool IsDecoderConfig(const nlohmann::json& json) {
  if (!json.is_object() || !json.contains("model_type") || !json["model_type"].is_string())
    return false;
  const std::string t = json["model_type"].get<std::string>();
  return t == "llama" || t == "qwen2";
}

absl::StatusOr<DecoderConfig> ParseDecoderConfig(const nlohmann::json& json,
                                                 std::string_view what) {
  const std::string w(what);
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(w, ": expected a JSON object, found ", std::string(JsonTypeName(json))));
  }
  DecoderConfig c;
  FEDLORA_ASSIGN_OR_RETURN(c.model_type, GetString(json, "model_type", what));
  if (c.model_type != "llama" && c.model_type != "qwen2") {
    return absl::InvalidArgumentError(
        absl::StrCat(w, ": unknown decoder architecture: model_type \"", c.model_type,
                     "\" (supported: \"llama\", \"qwen2\")"));
  }
  c.qkv_bias = c.model_type == "qwen2";
  FEDLORA_ASSIGN_OR_RETURN(c.vocab_size, GetInt(json, "vocab_size", what));
  FEDLORA_ASSIGN_OR_RETURN(c.hidden_size, GetInt(json, "hidden_size", what));
  FEDLORA_ASSIGN_OR_RETURN(c.intermediate_size, GetInt(json, "intermediate_size", what));
  FEDLORA_ASSIGN_OR_RETURN(c.num_hidden_layers, GetInt(json, "num_hidden_layers", what));
  FEDLORA_ASSIGN_OR_RETURN(c.num_attention_heads, GetInt(json, "num_attention_heads", what));
  // Defaults are transformers' LlamaConfig / Qwen2Config ones.
  FEDLORA_ASSIGN_OR_RETURN(c.num_key_value_heads,
                           GetIntOr(json, "num_key_value_heads", c.num_attention_heads, what));
  if (c.num_attention_heads > 0) {
    FEDLORA_ASSIGN_OR_RETURN(
        c.head_dim, GetIntOr(json, "head_dim", c.hidden_size / c.num_attention_heads, what));
  }
  FEDLORA_ASSIGN_OR_RETURN(
      c.max_position_embeddings,
      GetIntOr(json, "max_position_embeddings", c.model_type == "qwen2" ? 32768 : 2048, what));
  FEDLORA_ASSIGN_OR_RETURN(c.rms_norm_eps, GetDoubleOr(json, "rms_norm_eps", 1e-6, what));
  FEDLORA_ASSIGN_OR_RETURN(c.rope_theta, GetDoubleOr(json, "rope_theta", 10000.0, what));
  FEDLORA_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                           GetBoolOr(json, "tie_word_embeddings", false, what));
  FEDLORA_ASSIGN_OR_RETURN(c.attention_dropout, GetDoubleOr(json, "attention_dropout", 0.0, what));
  FEDLORA_ASSIGN_OR_RETURN(c.bos_token_id, GetIntOr(json, "bos_token_id", -1, what));
  FEDLORA_ASSIGN_OR_RETURN(c.pad_token_id, GetIntOr(json, "pad_token_id", -1, what));
  if (json.contains("eos_token_id") && !json["eos_token_id"].is_null()) {
    if (json["eos_token_id"].is_array()) {
      FEDLORA_ASSIGN_OR_RETURN(c.eos_token_ids, GetIntArray(json, "eos_token_id", what));
    } else {
      FEDLORA_ASSIGN_OR_RETURN(int64_t eos, GetInt(json, "eos_token_id", what));
      c.eos_token_ids = {eos};
    }
  }
  FEDLORA_ASSIGN_OR_RETURN(std::string act, GetStringOr(json, "hidden_act", "silu", what));
  if (act != "silu") return Refuse(w, "hidden_act", absl::StrCat("\"", act, "\" (only \"silu\")"));
  if (json.contains("rope_scaling") && !json["rope_scaling"].is_null()) {
    return Refuse(w, "rope_scaling",
                  "(position interpolation: linear, dynamic, llama3, yarn, ...)");
  }
  FEDLORA_ASSIGN_OR_RETURN(int64_t tp, GetIntOr(json, "pretraining_tp", 1, what));
  if (tp != 1) return Refuse(w, "pretraining_tp", absl::StrCat(tp, " (only 1)"));
  FEDLORA_ASSIGN_OR_RETURN(bool mlp_bias, GetBoolOr(json, "mlp_bias", false, what));
  if (mlp_bias) return Refuse(w, "mlp_bias", "true");
  if (c.model_type == "llama") {
    FEDLORA_ASSIGN_OR_RETURN(bool attention_bias, GetBoolOr(json, "attention_bias", false, what));
    if (attention_bias) return Refuse(w, "attention_bias", "true");
  } else {
    FEDLORA_ASSIGN_OR_RETURN(bool sliding, GetBoolOr(json, "use_sliding_window", false, what));
    if (sliding) return Refuse(w, "use_sliding_window", "true");
  }
  FEDLORA_ASSIGN_OR_RETURN(double partial, GetDoubleOr(json, "partial_rotary_factor", 1.0, what));
  if (partial != 1.0) return Refuse(w, "partial_rotary_factor", absl::StrCat(partial, " (only 1)"));
  FEDLORA_RETURN_IF_ERROR_CTX(c.Validate(), w);
  return c;
}

absl::StatusOr<DecoderConfig> ReadDecoderConfig(const std::string& path) {
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json json, ReadJsonFile(path));
  return ParseDecoderConfig(json, path);
}

}  // namespace fedlora
