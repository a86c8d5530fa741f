#include "workload/factory.h"

#include <algorithm>

#include "core/status.h"
#include "model/bert.h"
#include "model/bert_config.h"
#include "model/decoder.h"
#include "train/dataset.h"
#include "train/lm_data.h"
#include "workload/tokenizer.h"

namespace fedlora {
namespace {

// request.num_models classifiers: one loaded, or several created on one loaded base.
absl::Status LoadClassifiers(const std::string& path, const ModelOptions& options, int count,
                             Workload& out) {
  if (count == 1) {
    FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<BertClassifier> model,
                             BertClassifier::Load(path, options));
    out.models.push_back(std::make_unique<ClassifierModel>(std::move(model)));
    return absl::OkStatus();
  }
  FEDLORA_ASSIGN_OR_RETURN(auto base, BertBase::Load(path, options));
  for (int i = 0; i < count; ++i) {
    FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<BertClassifier> model,
                             BertClassifier::Create(base, options));
    out.models.push_back(std::make_unique<ClassifierModel>(std::move(model)));
  }
  return absl::OkStatus();
}

absl::Status LoadCausalLms(const std::string& path, const DecoderOptions& options, int count,
                           Workload& out) {
  if (count == 1) {
    FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<CausalLm> model, CausalLm::Load(path, options));
    out.models.push_back(std::make_unique<CausalLmModel>(std::move(model)));
    return absl::OkStatus();
  }
  FEDLORA_ASSIGN_OR_RETURN(auto base, DecoderBase::Load(path, options));
  for (int i = 0; i < count; ++i) {
    FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<CausalLm> model, CausalLm::Create(base, options));
    out.models.push_back(std::make_unique<CausalLmModel>(std::move(model)));
  }
  return absl::OkStatus();
}

absl::Status LoadEncoderWorkload(const v1::RunConfig& config, const WorkloadRequest& r,
                                 Workload& out) {
  FEDLORA_ASSIGN_OR_RETURN(out.max_seq_len, RunMaxSeqLen(config, r.model_path));
  ModelOptions model_options = ModelOptionsFromConfig(config, out.max_seq_len, r.role);
  model_options.device = r.device;
  FEDLORA_RETURN_IF_ERROR(LoadClassifiers(r.model_path, model_options, r.num_models, out));
  if (r.train_path.empty() && r.eval_path.empty()) return absl::OkStatus();
  FEDLORA_ASSIGN_OR_RETURN(auto tokenizer, LoadTokenizer(r.model_path));
  const DatasetOptions data_options = DatasetOptionsFromConfig(config.task());
  if (!r.train_path.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(Dataset raw, LoadDataset(r.train_path, data_options));
    FEDLORA_ASSIGN_OR_RETURN(TokenizedDataset train,
                             TokenizeDataset(raw, *tokenizer, out.max_seq_len));
    out.label_names = raw.label_names;
    for (const Example& e : raw.examples) out.train_labels.push_back(e.label);
    out.train = std::make_shared<const TokenizedDataset>(std::move(train));
  }
  if (r.eval_path.empty()) return absl::OkStatus();
  FEDLORA_ASSIGN_OR_RETURN(Dataset raw, LoadDataset(r.eval_path, data_options));
  FEDLORA_ASSIGN_OR_RETURN(TokenizedDataset eval,
                           TokenizeDataset(raw, *tokenizer, out.max_seq_len));
  HeldOutOptions options;
  options.batch_size = ConfiguredEvalBatchSize(config.data());
  options.macro_f1_key = r.macro_f1_key;
  FEDLORA_ASSIGN_OR_RETURN(
      out.evaluator,
      MakeHeldOutEvaluator(std::make_shared<const TokenizedDataset>(std::move(eval)), options));
  return absl::OkStatus();
}

absl::Status LoadDecoderWorkload(const v1::RunConfig& config, const WorkloadRequest& r,
                                 Workload& out) {
  FEDLORA_ASSIGN_OR_RETURN(out.max_seq_len, RunMaxSeqLen(config, r.model_path));
  DecoderOptions options = DecoderOptionsFromConfig(config, out.max_seq_len);
  options.device = r.device;
  FEDLORA_RETURN_IF_ERROR(LoadCausalLms(r.model_path, options, r.num_models, out));
  if (r.train_path.empty() && r.eval_path.empty()) return absl::OkStatus();
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
  FEDLORA_ASSIGN_OR_RETURN(out.evaluator,
                           MakeHeldOutEvaluator(std::make_shared<const LmDataset>(std::move(eval)),
                                                {.batch_size = LmEvalBatchSize(config),
                                                 .exact_match = config.task().exact_match(),
                                                 .tokenizer = out.chat_tokenizer,
                                                 .macro_f1_key = r.macro_f1_key}));
  return absl::OkStatus();
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
