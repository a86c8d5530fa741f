#include "model/bert_config.h"

#include <string>

#include "core/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

// all-MiniLM-L6-v2's config.json, trimmed to the fields that matter.
constexpr char kMiniLm[] = R"({
  "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
  "hidden_dropout_prob": 0.1, "hidden_size": 384, "initializer_range": 0.02,
  "intermediate_size": 1536, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
  "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 6, "pad_token_id": 0,
  "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522})";

nlohmann::json MiniLm() { return nlohmann::json::parse(kMiniLm); }

absl::Status ParseWith(const char* key, nlohmann::json value) {
  nlohmann::json j = MiniLm();
  j[key] = std::move(value);
  return ParseBertConfig(j, "config.json").status();
}

TEST(BertConfigTest, ParsesMiniLm) {
  auto c = ParseBertConfig(MiniLm(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 30522);
  EXPECT_EQ(c->hidden_size, 384);
  EXPECT_EQ(c->num_hidden_layers, 6);
  EXPECT_EQ(c->num_attention_heads, 12);
  EXPECT_EQ(c->head_dim(), 32);
  EXPECT_EQ(c->intermediate_size, 1536);
  EXPECT_EQ(c->max_position_embeddings, 512);
  EXPECT_EQ(c->type_vocab_size, 2);
  EXPECT_EQ(c->pad_token_id, 0);
  EXPECT_DOUBLE_EQ(c->layer_norm_eps, 1e-12);
  EXPECT_DOUBLE_EQ(c->hidden_dropout_prob, 0.1);
  EXPECT_DOUBLE_EQ(c->attention_probs_dropout_prob, 0.1);
  EXPECT_LT(c->classifier_dropout, 0.0);  // absent
}

TEST(BertConfigTest, OptionalFieldsTakeTransformersDefaults) {
  auto c = ParseBertConfig(
      nlohmann::json::parse(R"({"model_type": "bert", "vocab_size": 10, "hidden_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16, "classifier_dropout": null})"),
      "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_position_embeddings, 512);
  EXPECT_EQ(c->type_vocab_size, 2);
  EXPECT_DOUBLE_EQ(c->layer_norm_eps, 1e-12);
  EXPECT_EQ(c->hidden_act, "gelu");
  EXPECT_LT(c->classifier_dropout, 0.0);
}

TEST(BertConfigTest, RejectsUnknownArchitecture) {
  absl::Status s = ParseWith("model_type", "gpt2");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown architecture"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("gpt2"));
}

TEST(BertConfigTest, ParsesRoberta) {
  // roberta-base's config.json, trimmed.
  auto c = ParseBertConfig(nlohmann::json::parse(R"({"model_type": "roberta", "vocab_size": 50265,
      "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
      "max_position_embeddings": 514, "type_vocab_size": 1, "layer_norm_eps": 1e-05, "hidden_act": "gelu"})"),
                           "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->is_roberta());
  EXPECT_EQ(c->pad_token_id, 1);             // RobertaConfig's default
  EXPECT_EQ(c->max_sequence_length(), 512);  // positions 2..513
  EXPECT_DOUBLE_EQ(c->layer_norm_eps, 1e-5);
  auto bert = ParseBertConfig(MiniLm(), "config.json");
  ASSERT_TRUE(bert.ok());
  EXPECT_FALSE(bert->is_roberta());
  EXPECT_EQ(bert->max_sequence_length(), 512);
}

TEST(BertConfigTest, RejectsOtherActivations) {
  absl::Status s = ParseWith("hidden_act", "relu");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("hidden_act"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("relu"));
  EXPECT_THAT(std::string(ParseWith("position_embedding_type", "relative_key").message()),
              HasSubstr("position_embedding_type"));
}

TEST(BertConfigTest, RejectsHiddenNotDivisibleByHeads) {
  absl::Status s = ParseWith("num_attention_heads", 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not divisible"));
}

TEST(BertConfigTest, RejectsBadValues) {
  EXPECT_THAT(std::string(ParseWith("hidden_size", 0).message()), HasSubstr("hidden_size"));
  EXPECT_THAT(std::string(ParseWith("num_hidden_layers", -1).message()),
              HasSubstr("num_hidden_layers"));
  EXPECT_THAT(std::string(ParseWith("hidden_dropout_prob", 1.0).message()),
              HasSubstr("hidden_dropout_prob"));
  EXPECT_THAT(std::string(ParseWith("layer_norm_eps", 0.0).message()), HasSubstr("layer_norm_eps"));
  EXPECT_THAT(std::string(ParseWith("pad_token_id", 30522).message()), HasSubstr("pad_token_id"));
  EXPECT_THAT(std::string(ParseWith("vocab_size", int64_t{1} << 40).message()),
              HasSubstr("implausibly large"));
  // Wrong JSON types are named by core/json.h's getters.
  EXPECT_THAT(std::string(ParseWith("hidden_size", "384").message()), HasSubstr("hidden_size"));
}

TEST(BertConfigTest, MissingRequiredFieldIsNamed) {
  nlohmann::json j = MiniLm();
  j.erase("intermediate_size");
  absl::Status s = ParseBertConfig(j, "config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("intermediate_size"));
}

TEST(BertConfigTest, MissingFileIsNotFound) {
  auto c = ReadBertConfig("/nonexistent/fedlora/config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("/nonexistent/fedlora/config.json"));
}

}  // namespace
}  // namespace fedlora
