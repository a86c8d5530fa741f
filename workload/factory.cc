#include "workload/factory.h"

#include <algorithm>

#include "core/json.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "model/adapter_dir.h"
#include "model/bert.h"
#include "model/bert_config.h"
#include "model/decoder.h"
#include "model/peft.h"
#include "train/dataset.h"
#include "train/lm_data.h"
#include "workload/tokenizer.h"

namespace fedlora {
namespace {

// request.num_models classifiers: one loaded, or several created on one loaded base; each takes
// the adapter at `adapter` when it is not empty.
absl::Status LoadClassifiers(const std::string& path, const ModelOptions& options, int count,
                             const std::string& adapter, Workload& out) {
  std::vector<std::shared_ptr<BertClassifier>> models;
  if (count == 1) {
    FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<BertClassifier> model,
                             BertClassifier::Load(path, options));
    models.push_back(std::move(model));
  } else {
    FEDLORA_ASSIGN_OR_RETURN(auto base, BertBase::Load(path, options));
    for (int i = 0; i < count; ++i) {
      FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<BertClassifier> model,
                               BertClassifier::Create(base, options));
      models.push_back(std::move(model));
    }
  }
  for (std::shared_ptr<BertClassifier>& model : models) {
    if (!adapter.empty()) FEDLORA_RETURN_IF_ERROR(LoadPeftAdapter(adapter, model.get()));
    out.models.push_back(std::make_unique<ClassifierModel>(std::move(model)));
  }
  return absl::OkStatus();
}

absl::Status LoadCausalLms(const std::string& path, const DecoderOptions& options, int count,
                           const std::string& adapter, Workload& out) {
  std::vector<std::shared_ptr<CausalLm>> models;
  if (count == 1) {
    FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<CausalLm> model, CausalLm::Load(path, options));
    models.push_back(std::move(model));
  } else {
    FEDLORA_ASSIGN_OR_RETURN(auto base, DecoderBase::Load(path, options));
    for (int i = 0; i < count; ++i) {
      FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<CausalLm> model, CausalLm::Create(base, options));
      models.push_back(std::move(model));
    }
  }
  for (std::shared_ptr<CausalLm>& model : models) {
    if (!adapter.empty()) FEDLORA_RETURN_IF_ERROR(LoadPeftAdapter(adapter, model.get()));
    out.models.push_back(std::make_unique<CausalLmModel>(std::move(model)));
  }
  return absl::OkStatus();
}

// The classifier a PEFT adapter directory holds: its LoRA shape (r, lora_alpha, a list of
// target_modules), its labels (the head's rows) and their order (labels.json), into `options` and
// `label_names`. The messages name no command: every command's adapter is read here.
absl::Status ReadClassifierAdapter(const std::string& dir, ModelOptions& options,
                                   std::vector<std::string>& label_names) {
  const std::string config_path = dir + "/" + kPeftConfigFile;
  FEDLORA_ASSIGN_OR_RETURN(nlohmann::json config, ReadJsonFile(config_path));
  FEDLORA_ASSIGN_OR_RETURN(int64_t rank, GetInt(config, "r", config_path));
  FEDLORA_ASSIGN_OR_RETURN(double alpha, GetDouble(config, "lora_alpha", config_path));
  options.lora.rank = static_cast<int>(rank);
  options.lora.alpha = static_cast<float>(alpha);
  if (!config.contains("target_modules") || !config["target_modules"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path,
                     ": target_modules must be a list of module names (a regular expression is not "
                     "supported)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(options.lora.target_modules,
                           GetStringArray(config, "target_modules", config_path));

  const std::string weights_path = dir + "/" + kPeftWeightsFile;
  FEDLORA_ASSIGN_OR_RETURN(auto weights, SafetensorsFile::Open(weights_path));
  FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor classifier,
                           weights->Get("base_model.model.classifier.weight"));
  if (classifier.shape.size() != 2 || classifier.shape[0] < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(weights_path, ": classifier.weight must be [labels >= 2, hidden]"));
  }
  options.num_labels = static_cast<int>(classifier.shape[0]);

  const std::string labels_path = dir + "/" + kLabelsFile;
  FEDLORA_ASSIGN_OR_RETURN(AdapterDirInfo info, ReadAdapterMetadata(dir));
  if (!info.label_names) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " has no ", kLabelsFile, ": the order of its classifier's ", options.num_labels,
        " rows is not recorded, and it is not guessed from the data (a file holding some of the "
        "labels would be scored against the wrong rows). fedlora train, simulate, server --out and "
        "export write it; for another adapter write ",
        labels_path,
        " as {\"label_names\": [row 0's label, row 1's, ...]}, in the order of the run's labels"));
  }
  label_names = *info.label_names;
  if (static_cast<int>(label_names.size()) != options.num_labels) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, " names ", label_names.size(),
                                                   " labels but the classifier has ",
                                                   options.num_labels));
  }
  return absl::OkStatus();
}

// The training data (when asked for) with the task's labels, or without them the data's own, which
// then size the classifier (at least 2 rows) and read the held-out data; then the held-out data and
// its evaluator.
absl::Status LoadEncoderData(const v1::RunConfig& config, const WorkloadRequest& r,
                             DatasetOptions& data_options, ModelOptions& model_options,
                             Workload& out) {
  FEDLORA_ASSIGN_OR_RETURN(auto tokenizer, LoadTokenizer(r.model_path));
  const bool labels_from_data = data_options.label_names.empty();
  if (!r.train_path.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(Dataset raw, LoadDataset(r.train_path, data_options));
    FEDLORA_ASSIGN_OR_RETURN(TokenizedDataset train,
                             TokenizeDataset(raw, *tokenizer, out.max_seq_len));
    out.label_names = raw.label_names;
    for (const Example& e : raw.examples) out.train_labels.push_back(e.label);
    out.train = std::make_shared<const TokenizedDataset>(std::move(train));
    if (labels_from_data) data_options.label_names = raw.label_names;
  }
  if (!r.eval_path.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(Dataset raw, LoadDataset(r.eval_path, data_options));
    FEDLORA_ASSIGN_OR_RETURN(TokenizedDataset eval,
                             TokenizeDataset(raw, *tokenizer, out.max_seq_len));
    out.eval = std::make_shared<const TokenizedDataset>(std::move(eval));
    HeldOutOptions options;
    options.batch_size = ConfiguredEvalBatchSize(config.data());
    options.macro_f1_key = r.macro_f1_key;
    FEDLORA_ASSIGN_OR_RETURN(out.evaluator, MakeHeldOutEvaluator(out.eval, options));
  }
  if (labels_from_data && !r.train_path.empty()) {
    if (out.label_names.size() < 2 && !r.frozen_base) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.train_path, " has ", out.label_names.size(),
                       " distinct label(s); classification needs >= 2"));
    }
    model_options.num_labels = std::max(2, static_cast<int>(out.label_names.size()));
  }
  return absl::OkStatus();
}

absl::Status LoadEncoderWorkload(const v1::RunConfig& config, const WorkloadRequest& r,
                                 Workload& out) {
  FEDLORA_ASSIGN_OR_RETURN(out.max_seq_len, RunMaxSeqLen(config, r.model_path));
  ModelOptions model_options = ModelOptionsFromConfig(config, out.max_seq_len, r.role);
  model_options.device = r.device;
  if (r.bf16_weights) model_options.bf16_weights = true;
  DatasetOptions data_options = DatasetOptionsFromConfig(config.task());
  if (!r.adapter_path.empty()) {
    FEDLORA_RETURN_IF_ERROR(
        ReadClassifierAdapter(r.adapter_path, model_options, data_options.label_names));
    out.label_names = data_options.label_names;
  }
  if (!r.train_path.empty() || !r.eval_path.empty()) {
    FEDLORA_RETURN_IF_ERROR(LoadEncoderData(config, r, data_options, model_options, out));
  }
  return LoadClassifiers(r.model_path, model_options, r.num_models, r.adapter_path, out);
}

absl::Status LoadDecoderData(const v1::RunConfig& config, const WorkloadRequest& r, Workload& out) {
  FEDLORA_ASSIGN_OR_RETURN(DecoderTokenizer tok,
                           LoadChatTokenizer(r.model_path, config.task().chat_template()));
  out.chat_tokenizer = std::make_shared<const DecoderTokenizer>(std::move(tok));
  const LmDataOptions data_options = LmDataOptionsFromConfig(config.task(), out.max_seq_len);
  if (!r.train_path.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(LmDataset train,
                             LoadLmDataset(r.train_path, *out.chat_tokenizer, data_options));
    out.train_labels.assign(static_cast<size_t>(train.size()), 0);
    out.train = std::make_shared<const LmDataset>(std::move(train));
  }
  if (r.eval_path.empty()) return absl::OkStatus();
  FEDLORA_ASSIGN_OR_RETURN(LmDataset eval,
                           LoadLmDataset(r.eval_path, *out.chat_tokenizer, data_options));
  out.eval = std::make_shared<const LmDataset>(std::move(eval));
  FEDLORA_ASSIGN_OR_RETURN(
      out.evaluator, MakeHeldOutEvaluator(out.eval, {.batch_size = LmEvalBatchSize(config),
                                                     .exact_match = config.task().exact_match(),
                                                     .tokenizer = out.chat_tokenizer,
                                                     .macro_f1_key = r.macro_f1_key}));
  return absl::OkStatus();
}

absl::Status LoadDecoderWorkload(const v1::RunConfig& config, const WorkloadRequest& r,
                                 Workload& out) {
  FEDLORA_ASSIGN_OR_RETURN(out.max_seq_len, RunMaxSeqLen(config, r.model_path));
  if (!r.train_path.empty() || !r.eval_path.empty()) {
    FEDLORA_RETURN_IF_ERROR(LoadDecoderData(config, r, out));
  }
  DecoderOptions options = DecoderOptionsFromConfig(config, out.max_seq_len);
  options.device = r.device;
  if (r.bf16_weights && options.weights == WeightStorage::kAsStored) {
    options.weights = WeightStorage::kBF16;
  }
  options.recompute_activations = r.recompute;
  if (!r.adapter_path.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(options.lora, ReadPeftLoraOptions(r.adapter_path));
  }
  return LoadCausalLms(r.model_path, options, r.num_models, r.adapter_path, out);
}

}  // namespace

absl::StatusOr<int> EncoderMaxSeqLen(const std::string& model_dir, int requested) {
  FEDLORA_ASSIGN_OR_RETURN(BertConfig config, ReadBertConfig(model_dir + "/config.json"));
  return static_cast<int>(std::min<int64_t>(requested, config.max_position_embeddings));
}

absl::StatusOr<int> RunMaxSeqLen(const v1::RunConfig& config, const std::string& model_path) {
  const int configured = ConfiguredMaxSeqLen(config.model());
  if (config.task().kind() == v1::TaskConfig::CAUSAL_LM) {
    return DecoderMaxSeqLen(model_path, configured);
  }
  return EncoderMaxSeqLen(model_path, configured);
}

std::string Workload::chat_template_name() const {
  if (chat_tokenizer == nullptr || !chat_tokenizer->chat.has_value()) return "";
  return std::string(chat_tokenizer->chat->name());
}

absl::StatusOr<Workload> LoadWorkload(const v1::RunConfig& config, const WorkloadRequest& request) {
  if (request.num_models < 1) {
    return absl::InvalidArgumentError("LoadWorkload: num_models must be at least 1");
  }
  if (request.frozen_base && !request.adapter_path.empty()) {
    return absl::InvalidArgumentError("LoadWorkload: a frozen base takes no adapter_path");
  }
  FEDLORA_RETURN_IF_ERROR(CheckModelFitsTask(request.model_path, config.task()));
  FEDLORA_RETURN_IF_ERROR(VerifyModelCheckpoint(request.model_path, config.model()));
  Workload out;
  out.kind = config.task().kind() == v1::TaskConfig::CAUSAL_LM
                 ? v1::TaskConfig::CAUSAL_LM
                 : v1::TaskConfig::SEQUENCE_CLASSIFICATION;
  if (out.kind == v1::TaskConfig::CAUSAL_LM) {
    FEDLORA_RETURN_IF_ERROR(LoadDecoderWorkload(config, request, out));
  } else {
    FEDLORA_RETURN_IF_ERROR(LoadEncoderWorkload(config, request, out));
  }
  return out;
}

}  // namespace fedlora
