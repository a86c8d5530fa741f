#include "train/train_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/sha256.h"
#include "core/status.h"
#include "model/bert_config.h"
#include "train/training_defaults.h"

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
  o.batch_size = static_cast<int>(t.has_batch_size() ? t.batch_size() : kDefaultBatchSize);
  o.max_seq_len = max_seq_len;
  o.lr = static_cast<float>(t.has_learning_rate() ? t.learning_rate() : kDefaultLearningRate);
  o.optimizer = OptimizerName(t.optimizer());
  o.weight_decay = static_cast<float>(t.weight_decay());
  o.warmup_steps = t.warmup_steps();
  o.schedule = ScheduleName(t.schedule());
  o.grad_clip =
      static_cast<float>(t.has_grad_clip_norm() ? t.grad_clip_norm() : kDefaultGradClipNorm);
  o.grad_accumulation = static_cast<int>(t.has_grad_accumulation() ? t.grad_accumulation()
                                                                   : kDefaultGradAccumulation);
  o.logit_adjustment = static_cast<float>(t.logit_adjustment());
  if (t.has_adam_beta1()) o.adam_beta1 = static_cast<float>(t.adam_beta1());
  if (t.has_adam_beta2()) o.adam_beta2 = static_cast<float>(t.adam_beta2());
  if (t.has_adam_epsilon()) o.adam_epsilon = static_cast<float>(t.adam_epsilon());
  o.momentum = static_cast<float>(t.momentum());
  o.progress = false;
  return o;
}

int ConfiguredMaxSeqLen(const v1::ModelConfig& model) {
  return static_cast<int>(model.has_max_seq_len() ? model.max_seq_len() : kDefaultMaxSeqLen);
}

int ConfiguredEvalBatchSize(const v1::DataConfig& data) {
  return static_cast<int>(data.has_eval_batch_size() ? data.eval_batch_size()
                                                     : kDefaultEvalBatchSize);
}

namespace {

// The config's LoRA settings over `o`'s defaults (unset target_modules keeps o's).
void ApplyLoraConfig(const v1::LoraConfig& lora, LoraOptions& o) {
  o.rank = static_cast<int>(lora.has_rank() ? lora.rank() : kDefaultLoraRank);
  o.alpha = static_cast<float>(lora.has_alpha() ? lora.alpha() : kDefaultLoraAlpha);
  o.dropout = static_cast<float>(lora.dropout());
  if (lora.target_modules_size() > 0) {
    o.target_modules.assign(lora.target_modules().begin(), lora.target_modules().end());
  }
  o.freeze_a = lora.freeze_a();
}

int MaxBatchFor(const v1::RunConfig& config, ModelRole role) {
  const int train_batch = static_cast<int>(
      config.training().has_batch_size() ? config.training().batch_size() : kDefaultBatchSize);
  const int eval_batch = ConfiguredEvalBatchSize(config.data());
  switch (role) {
    case ModelRole::kTrain:
      return train_batch;
    case ModelRole::kEvaluate:
      return eval_batch;
    case ModelRole::kTrainAndEvaluate:
      break;
  }
  return std::max(train_batch, eval_batch);
}

std::string BaseModelName(const v1::ModelConfig& model) {
  return model.id().empty() ? model.path() : model.id();
}

}  // namespace

AdapterMetadata AdapterMetadataForRun(const v1::RunConfig& config, int max_seq_len,
                                      std::vector<std::string> label_names,
                                      const std::string& chat_template) {
  AdapterMetadata meta;
  meta.base_model = config.model().path();
  meta.max_seq_len = max_seq_len;
  meta.run_id = config.run_id();
  if (config.task().kind() == v1::TaskConfig::CAUSAL_LM) {
    meta.task = AdapterTask::kCausalLm;
    meta.system_prompt = config.task().system_prompt();
    meta.chat_template = chat_template;
  } else {
    meta.task = AdapterTask::kSequenceClassification;
    meta.label_names = std::move(label_names);
  }
  return meta;
}

ModelOptions ModelOptionsFromConfig(const v1::RunConfig& config, int max_seq_len, ModelRole role) {
  ModelOptions o;
  o.num_labels = std::max(2, config.task().labels_size());
  // Unset target_modules keeps LoraOptions' default, which is config.proto's ["query", "value"].
  ApplyLoraConfig(config.lora(), o.lora);
  o.seed = config.seed();
  o.max_batch = MaxBatchFor(config, role);
  o.max_seq = max_seq_len;
  o.base_model_name = BaseModelName(config.model());
  o.bf16_weights = o.bf16_math = config.model().precision() == v1::ModelConfig::BF16;
  return o;
}

DecoderOptions DecoderOptionsFromConfig(const v1::RunConfig& config, int max_seq_len) {
  DecoderOptions o;  // its default targets are config.proto's CAUSAL_LM default, all seven
  ApplyLoraConfig(config.lora(), o.lora);
  o.seed = config.seed();
  o.max_batch = MaxBatchFor(config, ModelRole::kTrain);
  o.max_seq = max_seq_len;
  o.base_model_name = BaseModelName(config.model());
  if (config.model().precision() == v1::ModelConfig::BF16) {
    o.weights = WeightStorage::kBF16;
    o.bf16_math = true;
  } else if (config.model().precision() == v1::ModelConfig::INT8) {
    o.weights = WeightStorage::kQ8_0;
    o.int8_math = true;
  }
  return o;
}

absl::StatusOr<int> DecoderMaxSeqLen(const std::string& path, int configured) {
  FEDLORA_ASSIGN_OR_RETURN(DecoderConfig config, ReadDecoderCheckpointConfig(path));
  return static_cast<int>(std::min<int64_t>(configured, config.max_position_embeddings));
}

int LmEvalBatchSize(const v1::RunConfig& config) {
  return std::min(ConfiguredEvalBatchSize(config.data()), MaxBatchFor(config, ModelRole::kTrain));
}

LmDataOptions LmDataOptionsFromConfig(const v1::TaskConfig& task, int max_seq_len) {
  LmDataOptions o;
  if (!task.prompt_field().empty()) o.prompt_field = task.prompt_field();
  if (!task.response_field().empty()) o.response_field = task.response_field();
  o.system = task.system_prompt();
  o.max_seq_len = max_seq_len;
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
  const bool decoder = IsDecoderCheckpoint(model_dir);
  if (!model.architecture().empty()) {
    std::string model_type;
    if (decoder) {
      FEDLORA_ASSIGN_OR_RETURN(DecoderConfig config, ReadDecoderCheckpointConfig(model_dir));
      model_type = config.model_type;
    } else {
      FEDLORA_ASSIGN_OR_RETURN(BertConfig config, ReadBertConfig(model_dir + "/config.json"));
      model_type = config.model_type;
    }
    if (model_type != model.architecture()) {
      return absl::FailedPreconditionError(absl::StrCat(model_dir, " has model_type \"", model_type,
                                                        "\" but the run's model.architecture is \"",
                                                        model.architecture(), "\""));
    }
  }
  if (!model.sha256().empty()) {
    const std::string weights =
        decoder ? DecoderWeightsFile(model_dir) : model_dir + "/model.safetensors";
    FEDLORA_ASSIGN_OR_RETURN(std::string actual, Sha256FileHex(weights));
    if (actual != model.sha256()) {
      return absl::FailedPreconditionError(absl::StrCat(weights, " has SHA-256 ", actual,
                                                        " but the run's model.sha256 is ",
                                                        model.sha256(), ": not the run's model"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckModelFitsTask(const std::string& path, const v1::TaskConfig& task) {
  const bool decoder = IsDecoderCheckpoint(path);
  if (task.kind() == v1::TaskConfig::CAUSAL_LM && !decoder) {
    return absl::FailedPreconditionError(
        absl::StrCat(path,
                     " is not a decoder checkpoint (a .gguf file or a llama/qwen2 directory): "
                     "task.kind CAUSAL_LM needs one"));
  }
  if (task.kind() != v1::TaskConfig::CAUSAL_LM && decoder) {
    return absl::FailedPreconditionError(absl::StrCat(
        path,
        " is a decoder checkpoint: task.kind SEQUENCE_CLASSIFICATION takes a BERT-family encoder; "
        "a decoder runs as CAUSAL_LM (classification by generation: the label as the response)"));
  }
  return absl::OkStatus();
}

}  // namespace fedlora
