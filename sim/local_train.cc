#include "sim/local_train.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "core/status.h"
#include "model/bert.h"
#include "model/bert_config.h"
#include "model/decoder.h"
#include "model/decoder_tokenizer.h"
#include "model/tokenizer.h"
#include "train/dataset.h"
#include "train/lm_data.h"
#include "train/lm_trainer.h"
#include "train/metrics.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace fedlora::sim {
namespace {

absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> LoadTokenizerFrom(
    const std::string& model_dir) {
  const std::string json = model_dir + "/tokenizer.json", vocab = model_dir + "/vocab.txt";
  if (std::ifstream(json).good()) return WordPieceTokenizer::FromTokenizerJson(json);
  if (std::ifstream(vocab).good()) return WordPieceTokenizer::FromVocabFile(vocab);
  return absl::NotFoundError(
      absl::StrCat("no tokenizer in ", model_dir, ": neither ", json, " nor ", vocab, " exists"));
}

// The partition key of every example of a JSONL file, in LoadDataset's order (blank lines skipped).
absl::StatusOr<std::vector<std::string>> ReadKeys(const std::string& path,
                                                  const std::string& field) {
  if (!absl::EndsWith(path, ".jsonl")) {
    return absl::UnimplementedError(
        absl::StrCat("BY_KEY partitioning reads JSONL only; ", path, " is not .jsonl"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<std::string> keys;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", line_no);
    FEDLORA_ASSIGN_OR_RETURN(nlohmann::json obj, ParseJson(line, where));
    if (!obj.is_object() || !obj.contains(field)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no partition key field '", field, "'"));
    }
    const nlohmann::json& v = obj[field];
    keys.push_back(v.is_string() ? v.get<std::string>() : v.dump());
  }
  return keys;
}

// Fills the partition keys (BY_KEY) and the local training options, which both kinds share.
absl::Status FinishSimData(const v1::RunConfig& config, SimData& out) {
  if (config.simulation().partition() == v1::SimulationConfig::BY_KEY) {
    FEDLORA_ASSIGN_OR_RETURN(out.train_keys, ReadKeys(config.data().train_path(),
                                                      config.simulation().partition_key_field()));
    if (out.train_keys.size() != out.train_labels.size()) {
      return absl::InternalError(absl::StrCat("read ", out.train_keys.size(), " keys for ",
                                              out.train_labels.size(), " examples of ",
                                              config.data().train_path()));
    }
  }
  auto o =
      std::make_shared<TrainOptions>(TrainOptionsFromConfig(config.training(), out.max_seq_len));
  o->eval_batch_size = ConfiguredEvalBatchSize(config.data());
  FEDLORA_RETURN_IF_ERROR_CTX(o->Validate(), "training config");
  out.train_options = std::move(o);
  return absl::OkStatus();
}

absl::StatusOr<SimData> LoadLmSimData(const v1::RunConfig& config) {
  const std::string& path = config.model().path();
  FEDLORA_ASSIGN_OR_RETURN(DecoderTokenizer tok,
                           LoadChatTokenizer(path, config.task().chat_template()));
  SimData out;
  out.causal_lm = true;
  out.exact_match = config.task().exact_match();
  FEDLORA_ASSIGN_OR_RETURN(out.max_seq_len,
                           DecoderMaxSeqLen(path, ConfiguredMaxSeqLen(config.model())));
  const LmDataOptions options = LmDataOptionsFromConfig(config.task(), out.max_seq_len);
  FEDLORA_ASSIGN_OR_RETURN(LmDataset train,
                           LoadLmDataset(config.data().train_path(), tok, options));
  FEDLORA_ASSIGN_OR_RETURN(LmDataset eval, LoadLmDataset(config.data().eval_path(), tok, options));
  out.train_labels.assign(static_cast<size_t>(train.size()), 0);
  out.lm_train = std::make_shared<const LmDataset>(std::move(train));
  out.lm_eval = std::make_shared<const LmDataset>(std::move(eval));
  out.tokenizer = std::make_shared<const DecoderTokenizer>(std::move(tok));
  FEDLORA_RETURN_IF_ERROR(FinishSimData(config, out));
  return out;
}

}  // namespace

int64_t SimData::eval_size() const {
  if (causal_lm) return lm_eval ? lm_eval->size() : 0;
  return eval ? eval->size() : 0;
}

int SimData::num_partition_labels() const {
  return std::max(1, static_cast<int>(label_names.size()));
}

absl::StatusOr<SimData> LoadSimData(const v1::RunConfig& config) {
  const std::string& model_dir = config.model().path();
  if (config.data().train_path().empty()) {
    return absl::InvalidArgumentError(
        "data.train_path is empty: the simulation partitions it across its clients");
  }
  if (config.data().eval_path().empty()) {
    return absl::InvalidArgumentError(
        "data.eval_path is empty: the simulation reports held-out metrics per round");
  }
  if (config.task().kind() == v1::TaskConfig::CAUSAL_LM) return LoadLmSimData(config);
  FEDLORA_ASSIGN_OR_RETURN(BertConfig bert, ReadBertConfig(model_dir + "/config.json"));
  FEDLORA_ASSIGN_OR_RETURN(auto tokenizer, LoadTokenizerFrom(model_dir));
  SimData out;
  out.max_seq_len = static_cast<int>(
      std::min<int64_t>(ConfiguredMaxSeqLen(config.model()), bert.max_position_embeddings));

  const DatasetOptions options = DatasetOptionsFromConfig(config.task());
  FEDLORA_ASSIGN_OR_RETURN(Dataset train_raw, LoadDataset(config.data().train_path(), options));
  FEDLORA_ASSIGN_OR_RETURN(Dataset eval_raw, LoadDataset(config.data().eval_path(), options));
  FEDLORA_ASSIGN_OR_RETURN(TokenizedDataset train,
                           TokenizeDataset(train_raw, *tokenizer, out.max_seq_len));
  FEDLORA_ASSIGN_OR_RETURN(TokenizedDataset eval,
                           TokenizeDataset(eval_raw, *tokenizer, out.max_seq_len));
  out.label_names = train_raw.label_names;
  for (const Example& e : train_raw.examples) out.train_labels.push_back(e.label);
  out.train = std::make_shared<const TokenizedDataset>(std::move(train));
  out.eval = std::make_shared<const TokenizedDataset>(std::move(eval));
  FEDLORA_RETURN_IF_ERROR(FinishSimData(config, out));
  return out;
}

absl::StatusOr<EvalFigures> EvaluateOnHeldOut(std::span<BertClassifier* const> models,
                                              const SimData& data, int batch_size) {
  if (models.empty()) return absl::InvalidArgumentError("EvaluateOnHeldOut: no model");
  const TokenizedDataset& eval = *data.eval;
  if (eval.size() == 0) return absl::InvalidArgumentError("the held-out set is empty");
  batch_size = std::max(1, std::min(batch_size, models[0]->options().max_batch));
  const int64_t num_batches = (eval.size() + batch_size - 1) / batch_size;
  const int64_t slices = std::min<int64_t>(static_cast<int64_t>(models.size()), num_batches);
  const int num_labels = models[0]->options().num_labels;
  for (const TokenizedExample& e : eval.examples) {
    if (e.label < 0 || e.label >= num_labels) {
      return absl::InvalidArgumentError(
          absl::StrCat("held-out label ", e.label, " outside [0, ", num_labels, ")"));
    }
  }
  std::vector<MetricsAccumulator> acc(static_cast<size_t>(slices), MetricsAccumulator(num_labels));
  std::vector<absl::Status> status(static_cast<size_t>(slices));
  auto run_slice = [&](int64_t s) {
    BertClassifier& model = *models[static_cast<size_t>(s)];
    const int32_t pad_id = static_cast<int32_t>(model.config().pad_token_id);
    std::vector<int64_t> idx;
    for (int64_t b = num_batches * s / slices; b < num_batches * (s + 1) / slices; ++b) {
      const int64_t begin = b * batch_size,
                    end = std::min<int64_t>(begin + batch_size, eval.size());
      idx.resize(static_cast<size_t>(end - begin));
      std::iota(idx.begin(), idx.end(), begin);
      const BertClassifier::Batch batch = MakeBatch(eval, idx, pad_id);
      absl::StatusOr<std::vector<float>> logits = model.Logits(batch);
      if (!logits.ok()) {
        status[static_cast<size_t>(s)] = logits.status();
        return;
      }
      status[static_cast<size_t>(s)] = acc[static_cast<size_t>(s)].AddLogits(*logits, batch.labels);
      if (!status[static_cast<size_t>(s)].ok()) return;
    }
  };
  std::vector<std::thread> threads;
  for (int64_t s = 1; s < slices; ++s) threads.emplace_back(run_slice, s);
  run_slice(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& st : status) FEDLORA_RETURN_IF_ERROR(st);
  for (int64_t s = 1; s < slices; ++s)
    FEDLORA_RETURN_IF_ERROR(acc[0].Merge(acc[static_cast<size_t>(s)]));
  const EvalResult r = acc[0].Result();
  return EvalFigures{r.count, r.loss, r.accuracy, r.macro_f1};
}

absl::StatusOr<EvalFigures> EvaluateOnHeldOut(std::span<CausalLm* const> models,
                                              const SimData& data, int batch_size) {
  if (models.empty()) return absl::InvalidArgumentError("EvaluateOnHeldOut: no model");
  if (!data.causal_lm || data.lm_eval == nullptr) {
    return absl::InvalidArgumentError("EvaluateOnHeldOut: the run's data is not CAUSAL_LM data");
  }
  const LmDataset& eval = *data.lm_eval;
  if (eval.size() == 0) return absl::InvalidArgumentError("the held-out set is empty");
  // Contiguous slices of whole examples, one per model; each example's figures depend on it alone,
  // so the sums below do not depend on the split.
  const int64_t slices = std::min<int64_t>(static_cast<int64_t>(models.size()), eval.size());
  std::vector<absl::StatusOr<LmEvalResult>> results(static_cast<size_t>(slices),
                                                    absl::UnknownError("not run"));
  LmEvalOptions options;
  options.batch_size = batch_size;
  options.exact_match = data.exact_match;
  options.tokenizer = data.tokenizer ? data.tokenizer->tokenizer.get() : nullptr;
  if (data.tokenizer) options.stop_ids = data.tokenizer->stop_ids();
  auto run_slice = [&](int64_t s) {
    LmDataset slice;
    const int64_t begin = eval.size() * s / slices, end = eval.size() * (s + 1) / slices;
    slice.examples.assign(eval.examples.begin() + begin, eval.examples.begin() + end);
    results[static_cast<size_t>(s)] = EvaluateLm(*models[static_cast<size_t>(s)], slice, options);
  };
  std::vector<std::thread> threads;
  for (int64_t s = 1; s < slices; ++s) threads.emplace_back(run_slice, s);
  run_slice(0);
  for (std::thread& t : threads) t.join();
  int64_t count = 0, tokens = 0, matched = 0;
  double nll = 0;
  for (const auto& r : results) {
    FEDLORA_RETURN_IF_ERROR(r.status());
    count += r->count;
    tokens += r->tokens;
    nll += r->loss * static_cast<double>(r->tokens);
    matched += std::llround(r->exact_match * static_cast<double>(r->count));
  }
  EvalFigures out;
  out.count = count;
  out.loss = tokens > 0 ? nll / static_cast<double>(tokens) : std::nan("");
  out.perplexity = std::exp(out.loss);
  out.accuracy =
      data.exact_match ? static_cast<double>(matched) / static_cast<double>(count) : std::nan("");
  out.macro_f1 = std::nan("");
  return out;
}

}  // namespace fedlora::sim
