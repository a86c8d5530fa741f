// Loading Hugging Face checkpoints: name prefixes, dtypes, a missing pooler, and every error the
// loader reports (each must name the offending tensor or file).
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/bert.h"
#include "tests/model/tiny_checkpoint.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;
using testing_util::MakeTempDir;
using testing_util::TinyCheckpointOptions;
using testing_util::TinyConfig;
using testing_util::WriteTinyCheckpoint;

ModelOptions Options() {
  ModelOptions o;
  o.num_labels = 3;
  o.max_batch = 2;
  o.max_seq = 8;
  o.seed = 5;
  return o;
}

BertClassifier::Batch TwoSentences() {
  return BertClassifier::Batch{
      2,     6, {2, 14, 15, 16, 3, 0, 2, 40, 41, 3, 0, 0}, {}, {1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0},
      {0, 2}};
}

std::string Written(const TinyCheckpointOptions& o, const BertConfig& c = TinyConfig()) {
  std::string dir = MakeTempDir("bert_load");
  EXPECT_FALSE(dir.empty());
  absl::Status s = WriteTinyCheckpoint(dir, c, o);
  EXPECT_TRUE(s.ok()) << s;
  return dir;
}

absl::Status LoadError(const TinyCheckpointOptions& o) {
  return BertClassifier::Load(Written(o), Options()).status();
}

std::vector<float> LogitsOf(const std::string& dir, ModelOptions o = Options()) {
  auto model = BertClassifier::Load(dir, o);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  auto logits = (*model)->Logits(TwoSentences());
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : std::vector<float>{};
}

TEST(BertLoadTest, PrefixedAndBareNamesLoadTheSameWeights) {
  TinyCheckpointOptions bare;
  bare.prefix = "";
  const std::vector<float> a = LogitsOf(Written({}));
  const std::vector<float> b = LogitsOf(Written(bare));
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);  // same values, same arithmetic: bit-identical
  for (float v : a) EXPECT_TRUE(std::isfinite(v));
}

TEST(BertLoadTest, HalfPrecisionCheckpointsLoad) {
  // A BF16 checkpoint widened to fp32 and the same one kept in bf16 hold identical values; the
  // bf16 path widens GEMM panels into fp32, so the logits agree to fp32 rounding (different
  // blocking may reorder sums: 1e-5 relative).
  TinyCheckpointOptions bf16;
  bf16.dtype = DType::kBF16;
  const std::string dir = Written(bf16);
  const std::vector<float> wide = LogitsOf(dir);
  ModelOptions o = Options();
  o.bf16_weights = true;
  const std::vector<float> narrow = LogitsOf(dir, o);
  ASSERT_EQ(wide.size(), narrow.size());
  for (size_t i = 0; i < wide.size(); ++i)
    EXPECT_NEAR(wide[i], narrow[i], 1e-5f * (1.0f + std::fabs(wide[i])));
  TinyCheckpointOptions f16;
  f16.dtype = DType::kF16;
  EXPECT_EQ(LogitsOf(Written(f16)).size(), 6u);
}

TEST(BertLoadTest, MissingPoolerIsInitialisedFromTheSeed) {
  TinyCheckpointOptions no_pooler;
  no_pooler.pooler = false;
  const std::string dir = Written(no_pooler);
  const std::vector<float> a = LogitsOf(dir);
  const std::vector<float> b = LogitsOf(dir);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);  // deterministic
  ModelOptions other = Options();
  other.seed = 6;
  EXPECT_NE(a, LogitsOf(dir, other));
}

TEST(BertLoadTest, RobertaLoadsWithItsOwnHead) {
  TinyCheckpointOptions o;
  o.prefix = "roberta.";
  o.pooler = false;
  const std::string dir = Written(o, testing_util::TinyRobertaConfig());
  auto model = BertClassifier::Load(dir, Options());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<Param>& p = (*model)->trainable_params();
  ASSERT_EQ(p.size(), 2u * 2 * 2 + 4);
  EXPECT_EQ(p[0].name,
            "base_model.model.roberta.encoder.layer.0.attention.self.query.lora_A.weight");
  EXPECT_EQ(p[8].name, "base_model.model.classifier.dense.weight");
  EXPECT_EQ(p[8].shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(p[10].name, "base_model.model.classifier.out_proj.weight");
  EXPECT_EQ(p[10].shape, (std::vector<int64_t>{3, 32}));
  // Pad id 1, one segment; 8 planned tokens fit the 64 positions after the offset of 2.
  BertClassifier::Batch batch{
      2,     6, {0, 14, 15, 16, 2, 1, 0, 40, 41, 2, 1, 1}, {}, {1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0},
      {0, 2}};
  auto logits = (*model)->Logits(batch);
  ASSERT_TRUE(logits.ok()) << logits.status();
  // A second token type does not exist in RoBERTa.
  batch.token_type_ids.assign(12, 0);
  batch.token_type_ids[3] = 1;
  EXPECT_EQ((*model)->Logits(batch).status().code(), absl::StatusCode::kInvalidArgument);
  // max_seq counts positions after the pad offset: 64 fit, 65 do not.
  ModelOptions too_long = Options();
  too_long.max_seq = 65;
  EXPECT_EQ(BertClassifier::Load(dir, too_long).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BertLoadTest, MissingTensorIsNamed) {
  TinyCheckpointOptions o;
  o.drop = "encoder.layer.1.attention.self.key.weight";
  absl::Status s = LoadError(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("missing 1 tensor"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("bert.encoder.layer.1.attention.self.key.weight"));
}

TEST(BertLoadTest, HalfAPoolerIsAnError) {
  TinyCheckpointOptions o;
  o.drop = "pooler.dense.bias";
  absl::Status s = LoadError(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("bert.pooler.dense.bias"));
}

TEST(BertLoadTest, WrongShapeIsNamed) {
  TinyCheckpointOptions o;
  o.transpose = "encoder.layer.0.intermediate.dense.weight";
  absl::Status s = LoadError(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("bert.encoder.layer.0.intermediate.dense.weight"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("has shape [32, 64], expected [64, 32]"));
}

TEST(BertLoadTest, WrongDtypeIsNamed) {
  TinyCheckpointOptions o;
  o.as_int32 = "embeddings.LayerNorm.weight";
  absl::Status s = LoadError(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("bert.embeddings.LayerNorm.weight"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("dtype I32"));
}

TEST(BertLoadTest, ConfigThatDisagreesWithWeightsIsReported) {
  // Weights of a 2-layer model under a 3-layer config: every layer-2 tensor is missing.
  const std::string dir = Written({});
  BertConfig three = TinyConfig();
  three.num_hidden_layers = 3;
  ASSERT_TRUE(
      WriteFileAtomically(dir + "/config.json", testing_util::ConfigJson(three).dump()).ok());
  absl::Status s = BertClassifier::Load(dir, Options()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("missing 16 tensor"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("bert.encoder.layer.2.attention.self.query.weight"));
}

TEST(BertLoadTest, UnknownArchitectureIsNamed) {
  const std::string dir = Written({});
  nlohmann::json j = testing_util::ConfigJson(TinyConfig());
  j["model_type"] = "t5";
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", j.dump()).ok());
  absl::Status s = BertClassifier::Load(dir, Options()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("t5"));
}

TEST(BertLoadTest, MissingFilesAreNotFoundAndNamed) {
  const std::string empty = MakeTempDir("bert_empty");
  absl::Status s = BertClassifier::Load(empty, Options()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("config.json"));
  ASSERT_TRUE(
      WriteFileAtomically(empty + "/config.json", testing_util::ConfigJson(TinyConfig()).dump())
          .ok());
  s = BertClassifier::Load(empty, Options()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("model.safetensors"));
}

TEST(BertLoadTest, BadOptionsAreRejected) {
  const std::string dir = Written({});
  ModelOptions o = Options();
  o.lora.target_modules = {"query", "dense_h_to_4h"};
  absl::Status s = BertClassifier::Load(dir, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("dense_h_to_4h"));
  o = Options();
  o.lora.rank = 0;
  EXPECT_EQ(BertClassifier::Load(dir, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options();
  o.max_seq = 65;  // the tiny model has 64 positions
  EXPECT_THAT(std::string(BertClassifier::Load(dir, o).status().message()),
              HasSubstr("max_position_embeddings"));
  o = Options();
  o.num_labels = 0;
  EXPECT_EQ(BertClassifier::Load(dir, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options();
  o.hidden_dropout = 1.0f;
  EXPECT_EQ(BertClassifier::Load(dir, o).status().code(), absl::StatusCode::kInvalidArgument);
}

// all-MiniLM-L6-v2 as fetched by scripts/setup.sh: bare names, a pooler, an I64 position_ids
// buffer that must be ignored. (Its embeddings are compared with PyTorch in bert_reference_test.)
TEST(BertLoadTest, RealMiniLmLoads) {
  const char* src = std::getenv("FEDLORA_SOURCE_DIR");
  const std::string dir = std::string(src != nullptr ? src : "../..") + "/models/all-MiniLM-L6-v2";
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    GTEST_SKIP() << dir << " absent (scripts/setup.sh --all fetches it)";
  }
  ModelOptions o;
  o.max_batch = 1;
  o.max_seq = 16;
  auto model = BertClassifier::Load(dir, o);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().hidden_size, 384);
  EXPECT_EQ((*model)->config().num_hidden_layers, 6);
  // LoRA on query and value of 6 layers (A and B each) plus the classifier weight and bias.
  const std::vector<Param>& params = (*model)->trainable_params();
  ASSERT_EQ(params.size(), 6u * 2 * 2 + 2);
  EXPECT_EQ(params[0].name,
            "base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight");
  EXPECT_EQ(params[0].shape, (std::vector<int64_t>{8, 384}));
  EXPECT_EQ(params[3].name,
            "base_model.model.bert.encoder.layer.0.attention.self.value.lora_B.weight");
  EXPECT_EQ(params[3].shape, (std::vector<int64_t>{384, 8}));
  // [CLS] hello world [SEP] with the model's own vocabulary ids.
  BertClassifier::Batch batch{1, 4, {101, 7592, 2088, 102}, {}, {}, {}};
  auto emb = (*model)->PooledEmbeddings(batch, Pooling::kMean);
  ASSERT_TRUE(emb.ok()) << emb.status();
  ASSERT_EQ(emb->size(), 384u);
  double norm = 0;
  for (float v : *emb) norm += static_cast<double>(v) * v;
  EXPECT_TRUE(std::isfinite(norm));
  EXPECT_GT(norm, 0.0);
}

}  // namespace
}  // namespace fedlora
