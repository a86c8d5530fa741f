// The one way from a run config to what a LoRA workload computes with: the models (sharing one
// copy of the frozen base), the tokenized training data, the held-out evaluator. Used by
// `fedlora server` (the initial adapter and its evaluator), `fedlora client` (the built-in
// trainer's site), `fedlora simulate` (the model pool, the data partitioned across clients) and
// `fedlora train` / `eval` / `embed` / `generate` (their flags as a run config: tools/common.h
// CommandRunConfig).
// Adding a model family or a task kind touches model/ and this factory.
//
//   FEDLORA_ASSIGN_OR_RETURN(
//       Workload w, LoadWorkload(config, {.model_path = config.model().path(),
//                                         .eval_path = config.data().eval_path(),
//                                         .role = ModelRole::kEvaluate}));
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "fedlora/v1/config.pb.h"
#include "model/decoder_tokenizer.h"
#include "train/train_config.h"
#include "workload/evaluator.h"
#include "workload/lora_model.h"

namespace fedlora {

struct WorkloadRequest {
  std::string model_path{};            // the checkpoint: model.path, or a site's own copy of it
  std::string train_path{};            // "": no training data
  std::string eval_path{};             // "": no held-out evaluator
  Device device = Device::kCpu;        // where the models compute (the caller's device plan)
  ModelRole role = ModelRole::kTrain;  // sizes a classifier's batch (train/train_config.h)
  int num_models = 1;                  // models on one shared base (the simulator's pool)
  std::string macro_f1_key = "eval_macro_f1";  // HeldOutOptions::macro_f1_key
  // An adapter directory (model/peft.h) loaded into every model: its adapter_config.json gives the
  // LoRA shape over config.lora; a classifier's head rows and labels.json give the labels over
  // task.labels (FailedPrecondition without labels.json: the order is never guessed from data).
  // "": the run's freshly initialised adapter.
  std::string adapter_path{};
  bool bf16_weights = false;  // the frozen base held in bf16 even when model.precision is FP32
  bool recompute = false;     // CAUSAL_LM: DecoderOptions::recompute_activations
  // The frozen base alone, for its embeddings (`fedlora embed`): no adapter_path (the fresh
  // adapter's B is zero, so the model computes the frozen one), and a classifier's training data
  // may hold fewer than 2 labels (the head, which nothing reads, keeps 2 rows).
  bool frozen_base = false;
};

struct Workload {
  v1::TaskConfig::Kind kind = v1::TaskConfig::SEQUENCE_CLASSIFICATION;
  int max_seq_len = 0;  // tokens per example, clamped to the checkpoint's positions
  std::vector<std::unique_ptr<LoraModel>> models;  // request.num_models, freshly initialised
  TaskData train;                                  // empty without train_path
  TaskData eval;  // the evaluator's data, for a trainer that scores it itself (`fedlora train`)
  std::vector<int> train_labels;         // label of each training example (CAUSAL_LM: all 0)
  std::vector<std::string> label_names;  // classifiers: the labels of the training data or adapter
  std::shared_ptr<const DecoderTokenizer> chat_tokenizer;  // CAUSAL_LM with data
  std::unique_ptr<HeldOutEvaluator> evaluator;             // null without eval_path

  // The chat template the conversations were rendered with ("" for classifiers).
  std::string chat_template_name() const;
};

// An encoder checkpoint's tokens per example: min(requested, max_position_embeddings of
// model_dir/config.json). A model with 512 positions takes 128, a tiny test model with 64 cuts
// at 64.
absl::StatusOr<int> EncoderMaxSeqLen(const std::string& model_dir, int requested);
// The run's tokens per example: model.max_seq_len (default 128) clamped to the checkpoint at
// `model_path` (EncoderMaxSeqLen, or for CAUSAL_LM train_config.h DecoderMaxSeqLen).
absl::StatusOr<int> RunMaxSeqLen(const v1::RunConfig& config, const std::string& model_path);

// Checks that the checkpoint fits the task and model.sha256 / architecture (train_config.h
// CheckModelFitsTask, VerifyModelCheckpoint), then loads the data and then the models:
// SEQUENCE_CLASSIFICATION: the data with the task's fields and labels, tokenized with the model
// directory's tokenizer, and BertClassifiers (ModelOptionsFromConfig for request.role, max_seq
// clamped to the checkpoint's positions); CAUSAL_LM: conversations (LmDataOptionsFromConfig)
// tokenized with the checkpoint's chat tokenizer, and CausalLms (DecoderOptionsFromConfig, max_seq
// clamped to its context). The evaluator scores data.eval_batch_size examples per pass (CAUSAL_LM:
// LmEvalBatchSize) with task.exact_match. A classifier without task.labels (only the standalone
// commands: a run config must name them) takes the training data's labels (sorted, as
// train/dataset.h collects them) and reads the held-out data with them; InvalidArgument when they
// are fewer than 2 (unless request.frozen_base), or for frozen_base with an adapter_path.
absl::StatusOr<Workload> LoadWorkload(const v1::RunConfig& config, const WorkloadRequest& request);

}  // namespace fedlora
