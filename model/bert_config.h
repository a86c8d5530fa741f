// The architecture of a BERT-family encoder, read from a Hugging Face config.json.
//
//   FEDLORA_ASSIGN_OR_RETURN(BertConfig cfg,
//                            ReadBertConfig("models/all-MiniLM-L6-v2/config.json"));
//   cfg.head_dim();  // hidden_size / num_attention_heads
//
// Supported: model_type "bert" (BERT, MiniLM and other BertModel checkpoints) and "roberta" /
// "xlm-roberta" (same encoder; positions counted from pad_token_id + 1, no token types, a
// classification head of its own), with absolute position embeddings and exact (erf) GELU.
// Anything else is rejected with a message naming the field, rather than loaded and computed
// wrongly.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fedlora {

struct BertConfig {
  std::string model_type = "bert";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t intermediate_size = 0;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  int64_t pad_token_id = 0;
  double layer_norm_eps = 1e-12;
  // Dropout probabilities in [0, 1): after the embeddings, the attention output and the FFN
  // output (and before the classifier, as HF does when classifier_dropout is null); on the
  // attention probabilities.
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  // config.json "classifier_dropout"; negative when absent or null (then hidden_dropout_prob is
  // used before the classifier, as in HF BertForSequenceClassification).
  double classifier_dropout = -1.0;
  std::string hidden_act = "gelu";

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // RoBERTa / XLM-R: position of token j is pad_token_id + (number of non-pad tokens up to j),
  // pads get pad_token_id; the checkpoint's names start with "roberta." instead of "bert.".
  bool is_roberta() const { return model_type == "roberta" || model_type == "xlm-roberta"; }
  // Longest sequence the position table allows: max_position_embeddings for BERT, that minus
  // pad_token_id + 1 for RoBERTa (514 - 2 = 512 for roberta-base).
  int64_t max_sequence_length() const {
    return is_roberta() ? max_position_embeddings - pad_token_id - 1 : max_position_embeddings;
  }
  // Checks ranges and consistency (positive sizes, hidden divisible by heads, dropout in [0, 1),
  // eps > 0). InvalidArgument naming the field.
  absl::Status Validate() const;
};

// Parses a config.json object. `what` names the source in error messages.
// InvalidArgument for a missing or mistyped field, an unsupported model_type, hidden_act or
// position_embedding_type, and anything Validate() rejects.
absl::StatusOr<BertConfig> ParseBertConfig(const nlohmann::json& json, std::string_view what);
// ReadJsonFile + ParseBertConfig. NotFound when the file does not exist.
absl::StatusOr<BertConfig> ReadBertConfig(const std::string& path);

}  // namespace fedlora
