#include "train/train_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/sha256.h"
#include "core/status.h"
#include "model/bert_config.h"

namespace fedlora {

const char* OptimizerName(v1::TrainingConfig::Optimizer optimizer) {
  switch (optimizer) {
    case v1::TrainingConfig::LAMB:
      return "lamb";
    case v1::TrainingConfig::SGD:
      return "sgd";
    default:
      return "adamw";
  }
}

const char* ScheduleName(v1::TrainingConfig::Schedule schedule) {
  switch (schedule) {
    case v1::TrainingConfig::LINEAR:
      return "linear";
    case v1::TrainingConfig::COSINE:
      return "cosine";
    default:
      return "constant";
  }
}

TrainOptions TrainOptionsFromConfig(const v1::TrainingConfig& t, int max_seq_len) {
  TrainOptions o;
  o.batch_size = static_cast<int>(t.has_batch_size() ? t.batch_size() : 16);
  o.max_seq_len = max_seq_len;
  o.lr = static_cast<float>(t.has_learning_rate() ? t.learning_rate() : 5e-4);
  o.optimizer = OptimizerName(t.optimizer());
  o.weight_decay = static_cast<float>(t.weight_decay());
  o.warmup_steps = t.warmup_steps();
  o.schedule = ScheduleName(t.schedule());
  o.grad_clip = static_cast<float>(t.has_grad_clip_norm() ? t.grad_clip_norm() : 1.0);
  o.grad_accumulation = static_cast<int>(t.has_grad_accumulation() ? t.grad_accumulation() : 1);
  o.logit_adjustment = static_cast<float>(t.logit_adjustment());
  if (t.has_adam_beta1()) o.adam_beta1 = static_cast<float>(t.adam_beta1());
  if (t.has_adam_beta2()) o.adam_beta2 = static_cast<float>(t.adam_beta2());
  if (t.has_adam_epsilon()) o.adam_epsilon = static_cast<float>(t.adam_epsilon());
  o.momentum = static_cast<float>(t.momentum());
  o.progress = false;
  return o;
}

int ConfiguredMaxSeqLen(const v1::ModelConfig& model) {
  return static_cast<int>(model.has_max_seq_len() ? model.max_seq_len() : 128);
}

int ConfiguredEvalBatchSize(const v1::DataConfig& data) {
  return static_cast<int>(data.has_eval_batch_size() ? data.eval_batch_size() : 64);
}

ModelOptions ModelOptionsFromConfig(const v1::RunConfig& config, int max_seq_len, ModelRole role) {
  ModelOptions o;
  o.num_labels = std::max(2, config.task().labels_size());
  const v1::LoraConfig& lora = config.lora();
  o.lora.rank = static_cast<int>(lora.has_rank() ? lora.rank() : 8);
  o.lora.alpha = static_cast<float>(lora.has_alpha() ? lora.alpha() : 16.0);
  o.lora.dropout = static_cast<float>(lora.dropout());
  // Unset keeps LoraOptions' default, which is config.proto's ["query", "value"].
  if (lora.target_modules_size() > 0) {
    o.lora.target_modules.assign(lora.target_modules().begin(), lora.target_modules().end());
  }
  o.seed = config.seed();
  const int train_batch =
      static_cast<int>(config.training().has_batch_size() ? config.training().batch_size() : 16);
  const int eval_batch = ConfiguredEvalBatchSize(config.data());
  switch (role) {
    case ModelRole::kTrain:
      o.max_batch = train_batch;
      break;
    case ModelRole::kEvaluate:
      o.max_batch = eval_batch;
      break;
    case ModelRole::kTrainAndEvaluate:
      o.max_batch = std::max(train_batch, eval_batch);
      break;
  }
  o.max_seq = max_seq_len;
  o.base_model_name = config.model().id().empty() ? config.model().path() : config.model().id();
  return o;
}

DatasetOptions DatasetOptionsFromConfig(const v1::TaskConfig& task) {
  DatasetOptions options;
  if (!task.text_field().empty()) options.text_field = task.text_field();
  if (!task.label_field().empty()) options.label_field = task.label_field();
  if (!task.pair_field().empty()) options.pair_field = task.pair_field();
  options.label_names.assign(task.labels().begin(), task.labels().end());
  return options;
}

}  // namespace fedlora

namespace fedlora {

absl::Status VerifyModelCheckpoint(const std::string& model_dir, const v1::ModelConfig& model) {
  if (!model.architecture().empty()) {
    FEDLORA_ASSIGN_OR_RETURN(BertConfig config, ReadBertConfig(model_dir + "/config.json"));
    if (config.model_type != model.architecture()) {
      return absl::FailedPreconditionError(absl::StrCat(model_dir, "/config.json has model_type \"", config.model_type,
                                                        "\" but the run's model.architecture is \"",
                                                        model.architecture(), "\""));
    }
  }
  if (!model.sha256().empty()) {
    const std::string weights = model_dir + "/model.safetensors";
    FEDLORA_ASSIGN_OR_RETURN(std::string actual, Sha256FileHex(weights));
    if (actual != model.sha256()) {
      return absl::FailedPreconditionError(absl::StrCat(weights, " has SHA-256 ", actual, " but the run's model.sha256 is ",
                                                        model.sha256(), ": not the run's model"));
    }
  }
  return absl::OkStatus();
}

}  // namespace fedlora
