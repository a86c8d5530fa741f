// The run config (fedlora.v1.RunConfig) as train/'s TrainOptions and model/'s ModelOptions: the one
// place that maps the config's optimizer and schedule enums to Trainer's names, and the one place
// that sizes a BertClassifier for a run (`fedlora client`, `fedlora server`, `fedlora simulate`).
//
//   TrainOptions o = TrainOptionsFromConfig(config.training(), /*max_seq_len=*/128);
//   FEDLORA_RETURN_IF_ERROR(o.Validate());
//   ModelOptions m = ModelOptionsFromConfig(config, /*max_seq_len=*/128, ModelRole::kEvaluate);
#pragma once

#include "fedlora/v1/config.pb.h"
#include "model/adapter_dir.h"
#include "model/bert.h"
#include "model/decoder.h"
#include "train/lm_data.h"
#include "train/trainer.h"

namespace fedlora {

// "adamw" | "lamb" | "sgd"; OPTIMIZER_UNSPECIFIED is config.proto's default, ADAMW.
const char* OptimizerName(v1::TrainingConfig::Optimizer optimizer);
// "constant" | "linear" | "cosine"; SCHEDULE_UNSPECIFIED is config.proto's default, CONSTANT.
const char* ScheduleName(v1::TrainingConfig::Schedule schedule);

// The options of one local task before the task's own fields apply: batch size, learning rate,
// optimizer, weight decay, warmup, schedule, clipping and accumulation from `training` (unset
// optional fields take config.proto's defaults: batch 16, lr 5e-4, clip 1.0, accumulation 1),
// `max_seq_len` tokens per example, no progress display. Epochs, steps and seed are left at
// TrainOptions' defaults: each task sets them. Not validated: call Validate().
TrainOptions TrainOptionsFromConfig(const v1::TrainingConfig& training, int max_seq_len);

// Tokens per example the config asks for: model.max_seq_len, or config.proto's default 128. Not
// clamped to the checkpoint (workload/factory.h RunMaxSeqLen does that).
int ConfiguredMaxSeqLen(const v1::ModelConfig& model);
// Examples per evaluation batch: data.eval_batch_size, or config.proto's default 64.
int ConfiguredEvalBatchSize(const v1::DataConfig& data);
// How to read a data file for the run's task: its text / pair / label field names (the defaults
// "text", "text_pair" and "label" where the config leaves them empty) and its labels in order.
DatasetOptions DatasetOptionsFromConfig(const v1::TaskConfig& task);

// What a model built from the run config is used for; it decides ModelOptions::max_batch (the
// activations are planned for max_batch * max_seq tokens, so a too-small value fails the batch).
enum class ModelRole {
  kTrain,             // training.batch_size (default 16): a client's local model
  kEvaluate,          // data.eval_batch_size (default 64): the server's held-out evaluator
  kTrainAndEvaluate,  // the larger of the two: the simulator's pooled models do both
};

// The BertClassifier options of the run: num_labels from task.labels (at least 2, the validated
// minimum), LoRA rank / alpha / dropout / target modules (config.proto's defaults 8, 16, 0,
// ["query", "value"] when unset) and freeze_a, seed, base_model_name (model.id, else
// model.path), max_batch by `role`, and max_seq = `max_seq_len`: the tokens per example after
// clamping to the checkpoint's position table (BertClassifier::Load refuses a longer max_seq), and
// bf16_weights with bf16_math when model.precision is BF16. Dropout overrides are left at
// ModelOptions' defaults.
ModelOptions ModelOptionsFromConfig(const v1::RunConfig& config, int max_seq_len, ModelRole role);

// The CausalLm options of a CAUSAL_LM run: LoRA as ModelOptionsFromConfig (all seven projections
// when target_modules is unset), seed, base_model_name, max_seq = `max_seq_len` (already clamped
// to the checkpoint's context), and max_batch = training.batch_size whatever the model's role: a
// decoder's activations are planned for max_batch x max_seq tokens, so its evaluation runs in
// batches of at most the training batch (LmEvalBatchSize) rather than planning a second, larger
// buffer. The base stays as stored, or with model.precision BF16 is held as bf16 with bf16_math,
// or with INT8 as Q8_0 with int8_math.
DecoderOptions DecoderOptionsFromConfig(const v1::RunConfig& config, int max_seq_len);
// `configured` tokens per conversation, at most the decoder checkpoint's context length.
absl::StatusOr<int> DecoderMaxSeqLen(const std::string& path, int configured);
// Examples per CAUSAL_LM evaluation batch: data.eval_batch_size (default 64), at most
// training.batch_size (default 16).
int LmEvalBatchSize(const v1::RunConfig& config);
// How to read a CAUSAL_LM data file: task.prompt_field / response_field (defaults "prompt",
// "response"), task.system_prompt, and `max_seq_len` tokens per conversation.
LmDataOptions LmDataOptionsFromConfig(const v1::TaskConfig& task, int max_seq_len);

// What an adapter of this run records beside its weights (model/adapter_dir.h): the task,
// model.path as the base model, `label_names` (a classifier's rows in order: task.labels), the
// run's `max_seq_len` (already clamped to the checkpoint), and for CAUSAL_LM task.system_prompt
// and `chat_template`, the name of the template the run renders with (DecoderTokenizer::chat).
AdapterMetadata AdapterMetadataForRun(const v1::RunConfig& config, int max_seq_len,
                                      std::vector<std::string> label_names,
                                      const std::string& chat_template);

// What model.sha256 and model.architecture promise about the checkpoint in `model_dir`: the SHA-256
// of model.safetensors or of the .gguf file (when sha256 is set) and the model_type of config.json
// or the GGUF (when architecture is set). FailedPrecondition naming the file and both values when either differs. The server checks
// its copy at start, clients theirs before their first task.
absl::Status VerifyModelCheckpoint(const std::string& model_dir, const v1::ModelConfig& model);

// FailedPrecondition when the checkpoint at `path` does not fit the task: CAUSAL_LM needs a
// decoder (a .gguf file or a llama/qwen2 directory), SEQUENCE_CLASSIFICATION an encoder.
absl::Status CheckModelFitsTask(const std::string& path, const v1::TaskConfig& task);

}  // namespace fedlora
