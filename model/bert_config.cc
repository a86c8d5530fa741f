#include "model/bert_config.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "core/status.h"

namespace fedlora {
namespace {

absl::Status Positive(int64_t value, std::string_view field, std::string_view what) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(what), ": ", std::string(field), " must be positive, got ", value));
}

absl::Status Probability(double value, std::string_view field, std::string_view what) {
  if (value >= 0.0 && value < 1.0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(what), ": ", std::string(field), " must be in [0, 1), got ", value));
}

}  // namespace

absl::Status BertConfig::Validate() const {
  constexpr const char* kWhat = "BERT config";
  FEDLORA_RETURN_IF_ERROR(Positive(vocab_size, "vocab_size", kWhat));
  FEDLORA_RETURN_IF_ERROR(Positive(hidden_size, "hidden_size", kWhat));
  FEDLORA_RETURN_IF_ERROR(Positive(num_hidden_layers, "num_hidden_layers", kWhat));
  FEDLORA_RETURN_IF_ERROR(Positive(num_attention_heads, "num_attention_heads", kWhat));
  FEDLORA_RETURN_IF_ERROR(Positive(intermediate_size, "intermediate_size", kWhat));
  FEDLORA_RETURN_IF_ERROR(Positive(max_position_embeddings, "max_position_embeddings", kWhat));
  FEDLORA_RETURN_IF_ERROR(Positive(type_vocab_size, "type_vocab_size", kWhat));
  // Sizes beyond these are not BERT-family encoders but a corrupt or hostile file; they would
  // overflow the int32 token ids and the int64 activation arithmetic long before being useful.
  constexpr int64_t kMaxDim = 1 << 20;
  if (hidden_size > kMaxDim || intermediate_size > kMaxDim || vocab_size > (int64_t{1} << 24) ||
      max_position_embeddings > kMaxDim || num_hidden_layers > 1024 || type_vocab_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": implausibly large dimensions (hidden_size ", hidden_size,
                     ", intermediate_size ", intermediate_size, ", vocab_size ", vocab_size,
                     ", max_position_embeddings ", max_position_embeddings, ", num_hidden_layers ",
                     num_hidden_layers, ", type_vocab_size ", type_vocab_size, ")"));
  }
  if (hidden_size % num_attention_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": hidden_size ", hidden_size,
                                                   " is not divisible by num_attention_heads ",
                                                   num_attention_heads));
  }
  if (pad_token_id < 0 || pad_token_id >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": pad_token_id ", pad_token_id,
                                                   " outside [0, vocab_size ", vocab_size, ")"));
  }
  if (!(layer_norm_eps > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": layer_norm_eps must be > 0, got ", layer_norm_eps));
  }
  FEDLORA_RETURN_IF_ERROR(Probability(hidden_dropout_prob, "hidden_dropout_prob", kWhat));
  FEDLORA_RETURN_IF_ERROR(
      Probability(attention_probs_dropout_prob, "attention_probs_dropout_prob", kWhat));
  if (classifier_dropout >= 0.0) {
    FEDLORA_RETURN_IF_ERROR(Probability(classifier_dropout, "classifier_dropout", kWhat));
  }
  if (model_type != "bert" && !is_roberta()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWhat, ": unsupported model_type \"", model_type,
        "\" (supported: encoders \"bert\", \"roberta\", \"xlm-roberta\"; decoders \"llama\", "
        "\"qwen2\"; GPT-2 is not implemented)"));
  }
  if (max_sequence_length() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": max_position_embeddings ", max_position_embeddings,
                     " leaves no room for positions after pad_token_id ", pad_token_id));
  }
  if (hidden_act != "gelu") {
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": unsupported hidden_act \"", hidden_act,
                                                   "\" (supported: \"gelu\", the exact erf form)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<BertConfig> ParseBertConfig(const nlohmann::json& json, std::string_view what) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(what), ": expected a JSON object, found ", std::string(JsonTypeName(json))));
  }
  BertConfig c;
  FEDLORA_ASSIGN_OR_RETURN(c.model_type, GetString(json, "model_type", what));
  if (c.model_type != "bert" && !c.is_roberta()) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(what), ": unknown architecture: model_type \"", c.model_type,
        "\" (supported: encoders \"bert\", \"roberta\", \"xlm-roberta\"; decoders \"llama\", "
        "\"qwen2\"; GPT-2 is not implemented)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(c.vocab_size, GetInt(json, "vocab_size", what));
  FEDLORA_ASSIGN_OR_RETURN(c.hidden_size, GetInt(json, "hidden_size", what));
  FEDLORA_ASSIGN_OR_RETURN(c.num_hidden_layers, GetInt(json, "num_hidden_layers", what));
  FEDLORA_ASSIGN_OR_RETURN(c.num_attention_heads, GetInt(json, "num_attention_heads", what));
  FEDLORA_ASSIGN_OR_RETURN(c.intermediate_size, GetInt(json, "intermediate_size", what));
  // Defaults below are those of transformers.BertConfig, so that minimal configs load.
  FEDLORA_ASSIGN_OR_RETURN(c.max_position_embeddings,
                           GetIntOr(json, "max_position_embeddings", 512, what));
  FEDLORA_ASSIGN_OR_RETURN(c.type_vocab_size, GetIntOr(json, "type_vocab_size", 2, what));
  FEDLORA_ASSIGN_OR_RETURN(c.pad_token_id,
                           GetIntOr(json, "pad_token_id", c.is_roberta() ? 1 : 0, what));
  FEDLORA_ASSIGN_OR_RETURN(c.layer_norm_eps, GetDoubleOr(json, "layer_norm_eps", 1e-12, what));
  FEDLORA_ASSIGN_OR_RETURN(c.hidden_dropout_prob,
                           GetDoubleOr(json, "hidden_dropout_prob", 0.1, what));
  FEDLORA_ASSIGN_OR_RETURN(c.attention_probs_dropout_prob,
                           GetDoubleOr(json, "attention_probs_dropout_prob", 0.1, what));
  FEDLORA_ASSIGN_OR_RETURN(c.classifier_dropout,
                           GetDoubleOr(json, "classifier_dropout", -1.0, what));
  FEDLORA_ASSIGN_OR_RETURN(c.hidden_act, GetStringOr(json, "hidden_act", "gelu", what));
  FEDLORA_ASSIGN_OR_RETURN(std::string position_type,
                           GetStringOr(json, "position_embedding_type", "absolute", what));
  if (position_type != "absolute") {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what),
                                                   ": unsupported position_embedding_type \"",
                                                   position_type, "\" (supported: \"absolute\")"));
  }
  FEDLORA_RETURN_IF_ERROR_CTX(c.Validate(), std::string(what));
  return c;
}

absl::StatusOr<BertConfig> ReadBertConfig(const std::string& path) {
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json json, ReadJsonFile(path));
  return ParseBertConfig(json, path);
}

}  // namespace fedlora
