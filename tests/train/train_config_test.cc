// TrainOptionsFromConfig / ModelOptionsFromConfig / DecoderOptionsFromConfig: every enum value's
// name, config.proto's defaults for unset fields, and exact pass-through of set ones; the checks a
// server and its clients make of their checkpoint.
#include "train/train_config.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "gtest/gtest.h"
#include "kernels/adamw.h"
#include "model/bert.h"
#include "model/decoder.h"
#include "tests/model/tiny_checkpoint.h"
#include "train/training_defaults.h"

namespace fedlora {
namespace {

TEST(OptimizerNameTest, EveryEnumValue) {
  EXPECT_STREQ(OptimizerName(v1::TrainingConfig::OPTIMIZER_UNSPECIFIED), "adamw");
  EXPECT_STREQ(OptimizerName(v1::TrainingConfig::ADAMW), "adamw");
  EXPECT_STREQ(OptimizerName(v1::TrainingConfig::LAMB), "lamb");
  EXPECT_STREQ(OptimizerName(v1::TrainingConfig::SGD), "sgd");
  // A value added to config.proto later must be named here too.
  EXPECT_EQ(v1::TrainingConfig::Optimizer_MAX, v1::TrainingConfig::SGD);
}

TEST(ScheduleNameTest, EveryEnumValue) {
  EXPECT_STREQ(ScheduleName(v1::TrainingConfig::SCHEDULE_UNSPECIFIED), "constant");
  EXPECT_STREQ(ScheduleName(v1::TrainingConfig::CONSTANT), "constant");
  EXPECT_STREQ(ScheduleName(v1::TrainingConfig::LINEAR), "linear");
  EXPECT_STREQ(ScheduleName(v1::TrainingConfig::COSINE), "cosine");
  EXPECT_EQ(v1::TrainingConfig::Schedule_MAX, v1::TrainingConfig::COSINE);
}

TEST(TrainOptionsFromConfigTest, UnsetFieldsTakeConfigProtoDefaults) {
  const TrainOptions o = TrainOptionsFromConfig(v1::TrainingConfig(), /*max_seq_len=*/96);
  EXPECT_EQ(o.batch_size, 16);
  EXPECT_EQ(o.lr, 5e-4f);
  EXPECT_EQ(o.optimizer, "adamw");
  // config.proto's defaults, which differ from TrainOptions' own (0.01 and "linear").
  EXPECT_EQ(o.weight_decay, 0.0f);
  EXPECT_EQ(o.schedule, "constant");
  EXPECT_EQ(o.warmup_steps, 0);
  EXPECT_EQ(o.grad_clip, 1.0f);
  EXPECT_EQ(o.grad_accumulation, 1);
  EXPECT_EQ(o.logit_adjustment, 0.0f);
  EXPECT_EQ(o.adam_beta1, 0.9f);
  EXPECT_EQ(o.adam_beta2, 0.999f);
  EXPECT_LT(o.adam_epsilon, 0.0f);  // each optimizer's own default
  EXPECT_EQ(o.momentum, 0.0f);
  EXPECT_EQ(o.max_seq_len, 96);
  EXPECT_FALSE(o.progress);
  // Left to each task.
  const TrainOptions plain;
  EXPECT_EQ(o.epochs, plain.epochs);
  EXPECT_EQ(o.max_steps, plain.max_steps);
  EXPECT_EQ(o.seed, plain.seed);
  EXPECT_TRUE(o.Validate().ok());
}

// model/ and kernels/ sit below train/ and keep their own defaults (PEFT's and PyTorch's usual
// ones): they must be the run config's, or a model built by hand would train differently.
TEST(DefaultsBelowTrainTest, AgreeWithTheRunConfigs) {
  EXPECT_EQ(LoraOptions{}.rank, static_cast<int>(kDefaultLoraRank));
  EXPECT_EQ(LoraOptions{}.alpha, static_cast<float>(kDefaultLoraAlpha));
  EXPECT_EQ(DecoderOptions{}.lora.rank, static_cast<int>(kDefaultLoraRank));
  EXPECT_EQ(DecoderOptions{}.lora.alpha, static_cast<float>(kDefaultLoraAlpha));
  EXPECT_EQ(DecoderOptions{}.lora.target_modules.size(), 7u);
  EXPECT_EQ(kernels::AdamWArgs{}.beta1, static_cast<float>(kDefaultAdamBeta1));
  EXPECT_EQ(kernels::AdamWArgs{}.beta2, static_cast<float>(kDefaultAdamBeta2));
  EXPECT_EQ(kernels::AdamWArgs{}.eps, static_cast<float>(kDefaultAdamEpsilon));
}

TEST(TrainOptionsFromConfigTest, SetFieldsPassThrough) {
  v1::TrainingConfig t;
  t.set_batch_size(7);
  t.set_learning_rate(0.125);  // exact in float
  t.set_optimizer(v1::TrainingConfig::LAMB);
  t.set_weight_decay(0.25);
  t.set_warmup_steps(13);
  t.set_schedule(v1::TrainingConfig::COSINE);
  t.set_grad_clip_norm(2.5);
  t.set_grad_accumulation(3);
  t.set_logit_adjustment(0.75);
  t.set_adam_beta1(0.5);
  t.set_adam_beta2(0.875);
  t.set_adam_epsilon(0.25);
  t.set_momentum(0.625);
  t.set_local_steps(99);  // not the options' business: each task sets its own work
  const TrainOptions o = TrainOptionsFromConfig(t, /*max_seq_len=*/40);
  EXPECT_EQ(o.batch_size, 7);
  EXPECT_EQ(o.lr, 0.125f);
  EXPECT_EQ(o.optimizer, "lamb");
  EXPECT_EQ(o.weight_decay, 0.25f);
  EXPECT_EQ(o.warmup_steps, 13);
  EXPECT_EQ(o.schedule, "cosine");
  EXPECT_EQ(o.grad_clip, 2.5f);
  EXPECT_EQ(o.grad_accumulation, 3);
  EXPECT_EQ(o.logit_adjustment, 0.75f);
  EXPECT_EQ(o.adam_beta1, 0.5f);
  EXPECT_EQ(o.adam_beta2, 0.875f);
  EXPECT_EQ(o.adam_epsilon, 0.25f);
  EXPECT_EQ(o.momentum, 0.625f);
  EXPECT_EQ(o.max_seq_len, 40);
  EXPECT_EQ(o.max_steps, TrainOptions().max_steps);
  EXPECT_TRUE(o.Validate().ok());
}

TEST(TrainOptionsFromConfigTest, ExplicitZeroClipDisablesClipping) {
  // has_grad_clip_norm distinguishes "0: no clipping" from "unset: 1.0".
  v1::TrainingConfig t;
  t.set_grad_clip_norm(0.0);
  EXPECT_EQ(TrainOptionsFromConfig(t, 128).grad_clip, 0.0f);
}

TEST(ConfiguredSizesTest, DefaultsAndSetValues) {
  v1::RunConfig c;
  EXPECT_EQ(ConfiguredMaxSeqLen(c.model()), 128);
  EXPECT_EQ(ConfiguredEvalBatchSize(c.data()), 64);
  c.mutable_model()->set_max_seq_len(48);
  c.mutable_data()->set_eval_batch_size(5);
  EXPECT_EQ(ConfiguredMaxSeqLen(c.model()), 48);
  EXPECT_EQ(ConfiguredEvalBatchSize(c.data()), 5);
}

TEST(ModelOptionsFromConfigTest, UnsetFieldsTakeConfigProtoDefaults) {
  v1::RunConfig c;
  c.mutable_task()->add_labels("neg");
  c.mutable_task()->add_labels("pos");
  c.mutable_task()->add_labels("mixed");
  c.mutable_model()->set_path("/models/tiny");
  const ModelOptions o = ModelOptionsFromConfig(c, /*max_seq_len=*/64, ModelRole::kTrain);
  EXPECT_EQ(o.num_labels, 3);
  EXPECT_EQ(o.lora.rank, 8);
  EXPECT_EQ(o.lora.alpha, 16.0f);
  EXPECT_EQ(o.lora.dropout, 0.0f);
  EXPECT_EQ(o.lora.target_modules, (std::vector<std::string>{"query", "value"}));
  EXPECT_EQ(o.seed, 0u);
  EXPECT_EQ(o.max_seq, 64);
  EXPECT_EQ(o.max_batch, 16);                    // training.batch_size's default
  EXPECT_EQ(o.base_model_name, "/models/tiny");  // no model.id
  EXPECT_FALSE(o.bf16_weights);
  EXPECT_EQ(ModelOptionsFromConfig(c, 64, ModelRole::kEvaluate).max_batch, 64);
  EXPECT_EQ(ModelOptionsFromConfig(c, 64, ModelRole::kTrainAndEvaluate).max_batch, 64);
}

TEST(ModelOptionsFromConfigTest, SetFieldsPassThrough) {
  v1::RunConfig c;
  c.set_seed(1234567890123ull);
  c.mutable_task()->add_labels("a");
  c.mutable_task()->add_labels("b");
  c.mutable_lora()->set_rank(4);
  c.mutable_lora()->set_alpha(8.5);
  c.mutable_lora()->set_dropout(0.125);
  c.mutable_lora()->add_target_modules("query");
  c.mutable_lora()->add_target_modules("key");
  c.mutable_lora()->add_target_modules("dense");
  c.mutable_model()->set_id("all-MiniLM-L6-v2");
  c.mutable_model()->set_path("/models/minilm");
  c.mutable_model()->set_max_seq_len(200);  // the caller's max_seq_len (clamped) wins
  c.mutable_training()->set_batch_size(24);
  c.mutable_data()->set_eval_batch_size(10);
  const ModelOptions o = ModelOptionsFromConfig(c, /*max_seq_len=*/32, ModelRole::kTrain);
  EXPECT_EQ(o.num_labels, 2);
  EXPECT_EQ(o.lora.rank, 4);
  EXPECT_EQ(o.lora.alpha, 8.5f);
  EXPECT_EQ(o.lora.dropout, 0.125f);
  EXPECT_EQ(o.lora.target_modules, (std::vector<std::string>{"query", "key", "dense"}));
  EXPECT_EQ(o.seed, 1234567890123ull);
  EXPECT_EQ(o.max_seq, 32);
  EXPECT_EQ(o.base_model_name, "all-MiniLM-L6-v2");
  EXPECT_EQ(o.max_batch, 24);
  EXPECT_EQ(ModelOptionsFromConfig(c, 32, ModelRole::kEvaluate).max_batch, 10);
  // The simulator's pooled models train with 24 and evaluate with 10: the larger.
  EXPECT_EQ(ModelOptionsFromConfig(c, 32, ModelRole::kTrainAndEvaluate).max_batch, 24);
  c.mutable_data()->set_eval_batch_size(100);
  EXPECT_EQ(ModelOptionsFromConfig(c, 32, ModelRole::kTrainAndEvaluate).max_batch, 100);
}

TEST(ModelOptionsFromConfigTest, FewerThanTwoLabelsStillPlansABinaryHead) {
  // A validated classification config has >= 2 labels; an unvalidated one must not yield a
  // 0-class head (BertClassifier::Load would plan empty logits).
  v1::RunConfig c;
  EXPECT_EQ(ModelOptionsFromConfig(c, 16, ModelRole::kTrain).num_labels, 2);
}

// model.precision: BF16 holds the base as bf16 and multiplies in bf16 (encoders and decoders);
// FP32 and unset keep fp32 weights and exact products.
TEST(ModelOptionsFromConfigTest, PrecisionBf16HoldsAndMultipliesTheBaseInBf16) {
  v1::RunConfig c;
  c.mutable_task()->add_labels("a");
  c.mutable_task()->add_labels("b");
  for (auto p : {v1::ModelConfig::PRECISION_UNSPECIFIED, v1::ModelConfig::FP32}) {
    c.mutable_model()->set_precision(p);
    const ModelOptions o = ModelOptionsFromConfig(c, 16, ModelRole::kTrain);
    EXPECT_FALSE(o.bf16_weights);
    EXPECT_FALSE(o.bf16_math);
    const DecoderOptions d = DecoderOptionsFromConfig(c, 16);
    EXPECT_EQ(d.weights, WeightStorage::kAsStored);
    EXPECT_FALSE(d.bf16_math);
  }
  c.mutable_model()->set_precision(v1::ModelConfig::BF16);
  const ModelOptions o = ModelOptionsFromConfig(c, 16, ModelRole::kTrain);
  EXPECT_TRUE(o.bf16_weights);
  EXPECT_TRUE(o.bf16_math);
  const DecoderOptions d = DecoderOptionsFromConfig(c, 16);
  EXPECT_EQ(d.weights, WeightStorage::kBF16);
  EXPECT_TRUE(d.bf16_math);
}

// model.precision: INT8 (decoders) holds the base as Q8_0 and multiplies the forward products in int8.
TEST(ModelOptionsFromConfigTest, PrecisionInt8HoldsTheDecoderBaseAsQ8_0WithInt8Math) {
  v1::RunConfig c;
  c.mutable_task()->set_kind(v1::TaskConfig::CAUSAL_LM);
  c.mutable_model()->set_precision(v1::ModelConfig::INT8);
  const DecoderOptions d = DecoderOptionsFromConfig(c, 16);
  EXPECT_EQ(d.weights, WeightStorage::kQ8_0);
  EXPECT_TRUE(d.int8_math);
  EXPECT_FALSE(d.bf16_math);
  c.mutable_model()->set_precision(v1::ModelConfig::BF16);
  EXPECT_FALSE(DecoderOptionsFromConfig(c, 16).int8_math);
}

TEST(DatasetOptionsFromConfigTest, FieldNamesAndLabelsComeFromTheTask) {
  v1::TaskConfig task;
  DatasetOptions d = DatasetOptionsFromConfig(task);  // nothing set: the documented defaults
  EXPECT_EQ(d.text_field, "text");
  EXPECT_EQ(d.label_field, "label");
  EXPECT_EQ(d.pair_field, "text_pair");
  EXPECT_TRUE(d.label_names.empty());
  task.set_text_field("sentence");
  task.set_label_field("topic");
  task.set_pair_field("hypothesis");
  task.add_labels("b");
  task.add_labels("a");
  d = DatasetOptionsFromConfig(task);
  EXPECT_EQ(d.text_field, "sentence");
  EXPECT_EQ(d.label_field, "topic");
  EXPECT_EQ(d.pair_field, "hypothesis");
  EXPECT_EQ(d.label_names, (std::vector<std::string>{"b", "a"}));  // index order kept
}

}  // namespace
}  // namespace fedlora

namespace fedlora {
namespace {

// model.sha256 and model.architecture, as the server and clients check them before loading.
TEST(VerifyModelCheckpointTest, ChecksTheWeightsHashAndTheModelType) {
  const std::string dir = testing_util::MakeTempDir("verify_model");
  ASSERT_FALSE(dir.empty());
  ASSERT_TRUE(testing_util::WriteTinyCheckpoint(dir, testing_util::TinyConfig()).ok());
  absl::StatusOr<std::string> actual = Sha256FileHex(dir + "/model.safetensors");
  ASSERT_TRUE(actual.ok());

  v1::ModelConfig model;
  EXPECT_TRUE(VerifyModelCheckpoint(dir, model).ok());  // nothing promised, nothing checked
  model.set_sha256(*actual);
  model.set_architecture("bert");
  EXPECT_TRUE(VerifyModelCheckpoint(dir, model).ok());

  v1::ModelConfig other_hash = model;
  other_hash.set_sha256(std::string(64, '0'));
  absl::Status s = VerifyModelCheckpoint(dir, other_hash);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find(*actual), absl::string_view::npos) << s;  // names the hash found

  v1::ModelConfig other_type = model;
  other_type.set_architecture("roberta");
  s = VerifyModelCheckpoint(dir, other_type);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("model_type \"bert\""), absl::string_view::npos) << s;

  EXPECT_FALSE(VerifyModelCheckpoint(dir + "/missing", model).ok());
  std::filesystem::remove_all(dir);
}

TEST(DecoderOptionsFromConfigTest, LoraSeedAndOneBatchPlan) {
  v1::RunConfig c;
  c.set_seed(9);
  c.mutable_model()->set_id("smol");
  EXPECT_EQ(DecoderOptionsFromConfig(c, 64).lora.target_modules.size(),
            7u);  // all seven by default
  c.mutable_lora()->set_rank(4);
  c.mutable_lora()->set_alpha(32);
  c.mutable_lora()->set_dropout(0.1);
  c.mutable_lora()->add_target_modules("q_proj");
  c.mutable_training()->set_batch_size(6);
  c.mutable_data()->set_eval_batch_size(32);
  const DecoderOptions o = DecoderOptionsFromConfig(c, 64);
  EXPECT_EQ(o.lora.rank, 4);
  EXPECT_EQ(o.lora.alpha, 32.0f);
  EXPECT_FLOAT_EQ(o.lora.dropout, 0.1f);
  EXPECT_EQ(o.lora.target_modules, std::vector<std::string>{"q_proj"});
  EXPECT_EQ(o.seed, 9u);
  EXPECT_EQ(o.max_seq, 64);
  EXPECT_EQ(o.max_batch, 6);  // the training batch, not the larger eval batch
  EXPECT_EQ(o.base_model_name, "smol");
  EXPECT_EQ(LmEvalBatchSize(c), 6);
  c.mutable_data()->set_eval_batch_size(2);
  EXPECT_EQ(LmEvalBatchSize(c), 2);
}

TEST(LmDataOptionsFromConfigTest, FieldsAndSystemPromptComeFromTheTask) {
  v1::TaskConfig t;
  LmDataOptions o = LmDataOptionsFromConfig(t, 100);
  EXPECT_EQ(o.prompt_field, "prompt");
  EXPECT_EQ(o.response_field, "response");
  EXPECT_EQ(o.system, "");
  EXPECT_EQ(o.max_seq_len, 100);
  t.set_prompt_field("q");
  t.set_response_field("a");
  t.set_system_prompt("Be brief.");
  o = LmDataOptionsFromConfig(t, 100);
  EXPECT_EQ(o.prompt_field, "q");
  EXPECT_EQ(o.response_field, "a");
  EXPECT_EQ(o.system, "Be brief.");
}

// The real SmolLM2 GGUF (scripts/setup.sh fetches it, its SHA-256 pinned there).
TEST(VerifyModelCheckpointTest, ADecoderGgufIsHashedWholeAndItsArchitectureRead) {
  const char* src = std::getenv("FEDLORA_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "run through ctest";
  const std::string gguf =
      std::string(src) + "/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(gguf))
    GTEST_SKIP() << gguf << " missing (scripts/setup.sh fetches it)";
  v1::ModelConfig model;
  model.set_sha256("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53");
  model.set_architecture("llama");
  EXPECT_TRUE(VerifyModelCheckpoint(gguf, model).ok());
  model.set_architecture("qwen2");
  absl::Status s = VerifyModelCheckpoint(gguf, model);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("model_type \"llama\""), absl::string_view::npos) << s;
  EXPECT_EQ(DecoderMaxSeqLen(gguf, 1 << 20).value_or(0), 8192);  // clamped to the context length
  EXPECT_EQ(DecoderMaxSeqLen(gguf, 200).value_or(0), 200);

  v1::TaskConfig lm, classify;
  lm.set_kind(v1::TaskConfig::CAUSAL_LM);
  classify.set_kind(v1::TaskConfig::SEQUENCE_CLASSIFICATION);
  EXPECT_TRUE(CheckModelFitsTask(gguf, lm).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckModelFitsTask(gguf, classify)));
  const std::string dir = testing_util::MakeTempDir("fits_task");
  ASSERT_TRUE(testing_util::WriteTinyCheckpoint(dir, testing_util::TinyConfig()).ok());
  EXPECT_TRUE(CheckModelFitsTask(dir, classify).ok());
  s = CheckModelFitsTask(dir, lm);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("not a decoder checkpoint"), absl::string_view::npos) << s;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fedlora
