// The LoRA workload seam (workload/): the factory on a tiny random BERT checkpoint with a
// vocabulary and JSONL data, the held-out evaluators against train/'s own Evaluate and EvaluateLm
// (the figures the server and `fedlora eval` printed before the seam), LoraModel::Train against
// TrainLocally, and the refusals (wrong task kind, no tokenizer, no model).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/config_io.h"
#include "core/file.h"
#include "core/json.h"
#include "gtest/gtest.h"
#include "tests/model/tiny_checkpoint.h"
#include "tests/model/tiny_classifier_run.h"
#include "tests/model/tiny_decoder.h"
#include "train/lm_trainer.h"
#include "train/trainer.h"
#include "workload/evaluator.h"
#include "workload/factory.h"
#include "workload/lora_model.h"
#include "workload/tokenizer.h"

namespace fedlora {
namespace {

constexpr int kTrain = 30, kEval = 21;

// A model dir (config.json, model.safetensors, vocab.txt) and train/eval JSONL with three labels.
std::string MakeFixture() {
  auto dir = testing_util::WriteTinyClassifierRun(
      "workload", {.train = kTrain, .eval = kEval, .min_words = 3, .word_cycle = 5});
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.value_or("");
}

v1::RunConfig Config(const std::string& dir, const std::string& kind = "SEQUENCE_CLASSIFICATION") {
  // CAUSAL_LM takes no labels.
  const std::string task =
      kind == "CAUSAL_LM" ? R"({"kind": "CAUSAL_LM"})"
                          : R"({"kind": ")" + kind + R"(", "labels": ["blue", "green", "red"]})";
  auto config = ParseRunConfigJson(absl::StrCat(R"({"run_id": "w", "seed": 5,
    "model": {"path": ")",
                                                dir, R"(/model", "max_seq_len": 200},
    "lora": {"rank": 4, "alpha": 8},
    "task": )",
                                                task, R"(,
    "training": {"batch_size": 4, "learning_rate": 0.01},
    "data": {"eval_batch_size": 4}})"));
  EXPECT_TRUE(config.ok()) << config.status();
  return config.value_or(v1::RunConfig{});
}

WorkloadRequest Request(const std::string& dir, int models) {
  WorkloadRequest r;
  r.model_path = dir + "/model";
  r.train_path = dir + "/train.jsonl";
  r.eval_path = dir + "/eval.jsonl";
  r.role = ModelRole::kTrainAndEvaluate;
  r.num_models = models;
  return r;
}

// What LoadAdapter reads: any struct with a name, a shape and values.
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(Workload, FactoryBuildsModelsDataAndEvaluatorOfAClassificationRun) {
  const std::string dir = MakeFixture();
  auto w = LoadWorkload(Config(dir), Request(dir, 3));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->kind, v1::TaskConfig::SEQUENCE_CLASSIFICATION);
  ASSERT_EQ(w->models.size(), 3u);
  // max_seq_len 200 clamped to the tiny checkpoint's 64 positions.
  EXPECT_EQ(w->max_seq_len, testing_util::TinyConfig().max_position_embeddings);
  EXPECT_EQ(w->train.size(), kTrain);
  EXPECT_EQ(w->train_labels.size(), static_cast<size_t>(kTrain));
  // The config's label order, not the data's order of appearance.
  EXPECT_EQ(w->label_names, (std::vector<std::string>{"blue", "green", "red"}));
  ASSERT_NE(w->evaluator, nullptr);
  EXPECT_EQ(w->evaluator->size(), kEval);
  EXPECT_EQ(w->chat_template_name(), "");
  // Every model starts from the run's seeded initial adapter.
  for (const auto& m : w->models) {
    EXPECT_EQ(m->kind(), v1::TaskConfig::SEQUENCE_CLASSIFICATION);
    ASSERT_EQ(m->trainable_params().size(), w->models[0]->trainable_params().size());
    for (size_t i = 0; i < m->trainable_params().size(); ++i)
      EXPECT_EQ(m->trainable_params()[i].value, w->models[0]->trainable_params()[i].value);
  }
  // Without data paths: the model only (the server of a run without data.eval_path).
  WorkloadRequest bare = Request(dir, 1);
  bare.train_path.clear();
  bare.eval_path.clear();
  auto model_only = LoadWorkload(Config(dir), bare);
  ASSERT_TRUE(model_only.ok()) << model_only.status();
  EXPECT_EQ(model_only->models.size(), 1u);
  EXPECT_TRUE(model_only->train.empty());
  EXPECT_EQ(model_only->evaluator, nullptr);
}

// What `fedlora train` and `fedlora eval` load: without task.labels a classifier takes the
// training data's, reads the held-out data with them and hands it over beside the evaluator; an
// adapter directory gives a later load its LoRA shape, its labels and its weights. `fedlora
// embed`'s frozen base takes data of any labels.
TEST(Workload, LabelsFromTheTrainingDataAndAnAdapterDirectory) {
  const std::string dir = MakeFixture();
  v1::RunConfig config = Config(dir);
  config.mutable_task()->clear_labels();
  auto w = LoadWorkload(config, Request(dir, 1));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->label_names, (std::vector<std::string>{"blue", "green", "red"}));
  EXPECT_EQ(w->eval.size(), kEval);
  ASSERT_NE(w->evaluator, nullptr);
  ASSERT_TRUE(
      w->models[0]
          ->Train(w->train, nullptr, TrainOptionsFromConfig(config.training(), w->max_seq_len), {})
          .ok());
  const std::string adapter = dir + "/adapter";
  ASSERT_TRUE(w->models[0]
                  ->SaveAdapter({.base_model = dir + "/model",
                                 .label_names = w->label_names,
                                 .max_seq_len = w->max_seq_len},
                                adapter)
                  .ok());

  // No LoRA settings and no labels in the config: the adapter's rank 4 and labels.
  v1::RunConfig bare = config;
  bare.clear_lora();
  WorkloadRequest eval = Request(dir, 2);
  eval.train_path.clear();
  eval.role = ModelRole::kEvaluate;
  eval.adapter_path = adapter;
  auto e = LoadWorkload(bare, eval);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->label_names, w->label_names);
  for (const auto& m : e->models) {
    ASSERT_EQ(m->trainable_params().size(), w->models[0]->trainable_params().size());
    for (size_t i = 0; i < m->trainable_params().size(); ++i)
      EXPECT_EQ(m->trainable_params()[i].value, w->models[0]->trainable_params()[i].value);
  }
  // An adapter without its label order, or with target_modules as a regular expression, is
  // refused in words that name no command: every command loads its adapter here.
  namespace fs = std::filesystem;
  const std::string unlabelled = dir + "/unlabelled", pattern = dir + "/pattern";
  for (const std::string& copy : {unlabelled, pattern}) fs::copy(adapter, copy);
  fs::remove(unlabelled + "/labels.json");
  auto peft_config = ReadJsonFile(pattern + "/adapter_config.json");
  ASSERT_TRUE(peft_config.ok()) << peft_config.status();
  (*peft_config)["target_modules"] = ".*(query|value)";
  ASSERT_TRUE(WriteFileAtomically(pattern + "/adapter_config.json", peft_config->dump()).ok());
  eval.adapter_path = unlabelled;
  auto no_labels = LoadWorkload(bare, eval);
  EXPECT_EQ(no_labels.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(no_labels.status().message().find("has no labels.json"), std::string::npos);
  EXPECT_NE(no_labels.status().message().find("is not guessed from the data"), std::string::npos);
  eval.adapter_path = pattern;
  auto regex = LoadWorkload(bare, eval);
  EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(regex.status().message().find("a regular expression is not supported)"),
            std::string::npos);
  for (const absl::Status& s : {no_labels.status(), regex.status()})
    EXPECT_EQ(s.message().find("fedlora eval"), std::string::npos) << s;

  // Training data of one label cannot train a classifier.
  ASSERT_TRUE(WriteFileAtomically(dir + "/one.jsonl",
                                  "{\"text\": \"w1\", \"label\": \"red\"}\n"
                                  "{\"text\": \"w2\", \"label\": \"red\"}\n")
                  .ok());
  WorkloadRequest one = Request(dir, 1);
  one.train_path = dir + "/one.jsonl";
  one.eval_path.clear();
  auto refused = LoadWorkload(config, one);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("classification needs >= 2"), std::string::npos)
      << refused.status();
  // The frozen base alone (`fedlora embed`) reads it: the head, which nothing reads, keeps 2 rows.
  one.frozen_base = true;
  one.role = ModelRole::kEvaluate;
  auto frozen = LoadWorkload(config, one);
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  EXPECT_EQ(frozen->label_names, std::vector<std::string>{"red"});
  EXPECT_EQ(frozen->train.size(), 2);
  EXPECT_EQ(static_cast<ClassifierModel&>(*frozen->models[0]).model().options().num_labels, 2);
  // It takes no adapter.
  one.adapter_path = adapter;
  EXPECT_EQ(LoadWorkload(config, one).status().code(), absl::StatusCode::kInvalidArgument);
}

// The held-out evaluator gives train/'s Evaluate figures bit for bit on one model (what `fedlora
// server` and `fedlora eval` computed before), and the same on a pool of three (the simulator).
TEST(Workload, ClassificationEvaluatorMatchesTrainEvaluateOnAnyPoolSize) {
  const std::string dir = MakeFixture();
  auto w = LoadWorkload(Config(dir), Request(dir, 3));
  ASSERT_TRUE(w.ok()) << w.status();
  // A trained adapter, not the initial one (whose LoRA B is zero), in every model.
  ASSERT_TRUE(w->models[0]
                  ->Train(w->train, nullptr, TrainOptionsFromConfig(Config(dir).training(), 64), {})
                  .ok());
  std::vector<Tensor> adapter;
  for (const Param& p : w->models[0]->trainable_params())
    adapter.push_back({p.name, p.shape, p.value});
  std::vector<LoraModel*> all;
  for (auto& m : w->models) {
    ASSERT_TRUE(LoadAdapter(adapter, *m).ok());
    all.push_back(m.get());
  }
  auto one = w->evaluator->Evaluate(std::span<LoraModel* const>(all.data(), 1));
  auto three = w->evaluator->Evaluate(all);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(three.ok()) << three.status();

  // train/'s Evaluate on the same model and the same tokenized set.
  auto tokenizer = LoadTokenizer(dir + "/model");
  ASSERT_TRUE(tokenizer.ok());
  auto raw = LoadDataset(dir + "/eval.jsonl", DatasetOptionsFromConfig(Config(dir).task()));
  ASSERT_TRUE(raw.ok());
  auto eval = TokenizeDataset(*raw, **tokenizer, w->max_seq_len);
  ASSERT_TRUE(eval.ok());
  auto reference =
      Evaluate(static_cast<ClassifierModel*>(all[0])->model(), *eval, /*batch_size=*/4);
  ASSERT_TRUE(reference.ok()) << reference.status();
  // One model: train/'s figures bit for bit.
  EXPECT_EQ(one->count, kEval);
  EXPECT_TRUE(SameBits(one->loss, reference->loss)) << one->loss << " vs " << reference->loss;
  EXPECT_TRUE(SameBits(one->accuracy, reference->accuracy));
  EXPECT_TRUE(SameBits(one->macro_f1, reference->macro_f1));
  EXPECT_EQ(one->json, reference->ToJson());
  // Three: the same counts; the loss summed per slice, so equal up to rounding.
  EXPECT_EQ(three->count, kEval);
  EXPECT_NEAR(three->loss, reference->loss, 1e-12);
  EXPECT_TRUE(SameBits(three->accuracy, reference->accuracy));
  EXPECT_TRUE(SameBits(three->macro_f1, reference->macro_f1));
  const auto metrics = w->evaluator->Metrics(*one);
  EXPECT_EQ(metrics.size(), 3u);
  EXPECT_TRUE(metrics.contains("eval_macro_f1"));
  EXPECT_TRUE(SameBits(metrics.at("eval_loss"), reference->loss));

  // The server's stored metrics name the macro-F1 "macro_f1".
  WorkloadRequest server = Request(dir, 1);
  server.train_path.clear();
  server.role = ModelRole::kEvaluate;
  server.macro_f1_key = "macro_f1";
  auto s = LoadWorkload(Config(dir), server);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->evaluator->Metrics(*one).contains("macro_f1"));
}

// LoraModel::Train is TrainLocally: the same bits on the same model, options and data subset.
TEST(Workload, LoraModelTrainIsTrainLocally) {
  const std::string dir = MakeFixture();
  auto w = LoadWorkload(Config(dir), Request(dir, 2));
  ASSERT_TRUE(w.ok()) << w.status();
  TrainOptions o = TrainOptionsFromConfig(Config(dir).training(), w->max_seq_len);
  o.max_steps = 3;
  o.seed = 9;
  const std::vector<int64_t> subset = {1, 4, 7, 8, 12, 20, 29};
  auto via_interface = w->models[0]->Train(w->train, &subset, o, {});
  auto direct = TrainLocally(static_cast<ClassifierModel&>(*w->models[1]).model(),
                             *w->train.examples, subset, o);
  ASSERT_TRUE(via_interface.ok()) << via_interface.status();
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(via_interface->steps, 3);
  EXPECT_EQ(via_interface->num_examples, 7);
  EXPECT_TRUE(SameBits(via_interface->loss_mean, direct->loss_mean));
  for (size_t i = 0; i < w->models[0]->trainable_params().size(); ++i) {
    EXPECT_EQ(w->models[0]->trainable_params()[i].value, w->models[1]->trainable_params()[i].value);
  }
}

TEST(Workload, RefusesTheWrongKindMissingTokenizerAndNoModel) {
  const std::string dir = MakeFixture();
  // An encoder checkpoint for a CAUSAL_LM run (CheckModelFitsTask).
  auto lm_run = LoadWorkload(Config(dir, "CAUSAL_LM"), Request(dir, 1));
  EXPECT_EQ(lm_run.status().code(), absl::StatusCode::kFailedPrecondition) << lm_run.status();
  auto none = LoadWorkload(Config(dir), Request(dir, 0));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  // No tokenizer in a directory: NotFound naming both files.
  auto tok = LoadTokenizer(dir);
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(tok.status().message().find("tokenizer.json"), std::string::npos);
  EXPECT_NE(tok.status().message().find("vocab.txt"), std::string::npos);

  auto w = LoadWorkload(Config(dir), Request(dir, 1));
  ASSERT_TRUE(w.ok()) << w.status();
  // A classifier trains on labelled examples only.
  auto conversations = std::make_shared<const LmDataset>();
  EXPECT_EQ(w->models[0]->Train(conversations, nullptr, TrainOptions{}, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A decoder's evaluator refuses a classifier, and no model at all.
  LmDataset one;
  one.examples.resize(1);
  auto lm_eval = MakeHeldOutEvaluator(std::make_shared<const LmDataset>(one), HeldOutOptions{});
  ASSERT_TRUE(lm_eval.ok());
  LoraModel* models[] = {w->models[0].get()};
  EXPECT_EQ((*lm_eval)->Evaluate(models).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*lm_eval)->Evaluate({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeHeldOutEvaluator(TaskData{}, HeldOutOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The decoder's evaluator gives EvaluateLm's figures bit for bit on one model (the server's and
// `fedlora eval`'s before), and on two models merges per token to the same loss within rounding.
TEST(Workload, LmEvaluatorMatchesEvaluateLm) {
  DecoderOptions o;
  o.lora.rank = 2;
  o.max_batch = 4;
  o.max_seq = 16;
  o.seed = 5;
  auto base = DecoderBase::FromRandom(testing_util::TinyDecoderConfig(), o);
  ASSERT_TRUE(base.ok()) << base.status();
  auto a = CausalLm::Create(*base, o), b = CausalLm::Create(*base, o);
  ASSERT_TRUE(a.ok() && b.ok());
  LmDataset data;
  for (int i = 0; i < 9; ++i) {
    LmExample e;
    for (int j = 0; j < 3 + i % 4; ++j) e.input_ids.push_back(4 + (i * 5 + j * 3) % 40);
    e.prompt_ids = e.input_ids;
    e.labels.assign(e.input_ids.size(), -100);
    for (int k = 1; k <= 2; ++k) {
      e.input_ids.push_back(e.input_ids[0] + k);
      e.labels.push_back(e.input_ids.back());
    }
    data.examples.push_back(std::move(e));
  }
  LmEvalOptions lm_options;
  lm_options.batch_size = 4;
  auto reference = EvaluateLm(**a, data, lm_options);
  ASSERT_TRUE(reference.ok()) << reference.status();
  CausalLmModel ma(std::shared_ptr<CausalLm>(std::move(*a)));
  CausalLmModel mb(std::shared_ptr<CausalLm>(std::move(*b)));
  HeldOutOptions options;
  options.batch_size = 4;
  auto evaluator = MakeHeldOutEvaluator(std::make_shared<const LmDataset>(data), options);
  ASSERT_TRUE(evaluator.ok());
  LoraModel* one[] = {&ma};
  LoraModel* two[] = {&ma, &mb};
  auto f1 = (*evaluator)->Evaluate(one);
  auto f2 = (*evaluator)->Evaluate(two);
  ASSERT_TRUE(f1.ok()) << f1.status();
  ASSERT_TRUE(f2.ok()) << f2.status();
  EXPECT_TRUE(SameBits(f1->loss, reference->loss));
  EXPECT_TRUE(SameBits(f1->perplexity, reference->perplexity));
  EXPECT_EQ(f1->json, reference->ToJson());
  EXPECT_TRUE(std::isnan(f1->accuracy));  // no exact match asked for
  EXPECT_EQ(f2->count, 9);
  EXPECT_NEAR(f2->loss, reference->loss, 1e-6);
  const auto metrics = (*evaluator)->Metrics(*f1);
  EXPECT_EQ(metrics.size(), 2u);
  EXPECT_TRUE(metrics.contains("eval_perplexity"));
  EXPECT_FALSE(metrics.contains("eval_accuracy"));
}

}  // namespace
}  // namespace fedlora
