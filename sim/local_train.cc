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
#include "model/tokenizer.h"
#include "train/dataset.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace fedlora::sim {
namespace {

absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> LoadTokenizerFrom(const std::string& model_dir) {
  const std::string json = model_dir + "/tokenizer.json", vocab = model_dir + "/vocab.txt";
  if (std::ifstream(json).good()) return WordPieceTokenizer::FromTokenizerJson(json);
  if (std::ifstream(vocab).good()) return WordPieceTokenizer::FromVocabFile(vocab);
  return absl::NotFoundError(absl::StrCat("no tokenizer in ", model_dir, ": neither ", json, " nor ", vocab, " exists"));
}

std::string OptimizerName(v1::TrainingConfig::Optimizer o) {
  switch (o) {
    case v1::TrainingConfig::LAMB:
      return "lamb";
    case v1::TrainingConfig::SGD:
      return "sgd";
    default:
      return "adamw";
  }
}

std::string ScheduleName(v1::TrainingConfig::Schedule s) {
  switch (s) {
    case v1::TrainingConfig::LINEAR:
      return "linear";
    case v1::TrainingConfig::COSINE:
      return "cosine";
    default:
      return "constant";  // config.proto's default
  }
}

// The partition key of every example of a JSONL file, in LoadDataset's order (blank lines skipped).
absl::StatusOr<std::vector<std::string>> ReadKeys(const std::string& path, const std::string& field) {
  if (!absl::EndsWith(path, ".jsonl")) {
    return absl::UnimplementedError(absl::StrCat("BY_KEY partitioning reads JSONL only; ", path, " is not .jsonl"));
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
      return absl::InvalidArgumentError(absl::StrCat(where, ": no partition key field '", field, "'"));
    }
    const nlohmann::json& v = obj[field];
    keys.push_back(v.is_string() ? v.get<std::string>() : v.dump());
  }
  return keys;
}

}  // namespace

int64_t SimData::eval_size() const { return eval ? eval->size() : 0; }

absl::StatusOr<SimData> LoadSimData(const v1::RunConfig& config) {
  const std::string& model_dir = config.model().path();
  if (config.data().train_path().empty()) {
    return absl::InvalidArgumentError("data.train_path is empty: the simulation partitions it across its clients");
  }
  if (config.data().eval_path().empty()) {
    return absl::InvalidArgumentError("data.eval_path is empty: the simulation reports held-out accuracy per round");
  }
  FEDLORA_ASSIGN_OR_RETURN(BertConfig bert, ReadBertConfig(model_dir + "/config.json"));
  FEDLORA_ASSIGN_OR_RETURN(auto tokenizer, LoadTokenizerFrom(model_dir));
  SimData out;
  out.max_seq_len = static_cast<int>(std::min<int64_t>(config.model().has_max_seq_len() ? config.model().max_seq_len() : 128,
                                                       bert.max_position_embeddings));

  DatasetOptions options;
  options.text_field = config.task().text_field().empty() ? "text" : config.task().text_field();
  options.label_field = config.task().label_field().empty() ? "label" : config.task().label_field();
  if (!config.task().pair_field().empty()) options.pair_field = config.task().pair_field();
  options.label_names.assign(config.task().labels().begin(), config.task().labels().end());
  FEDLORA_ASSIGN_OR_RETURN(Dataset train_raw, LoadDataset(config.data().train_path(), options));
  FEDLORA_ASSIGN_OR_RETURN(Dataset eval_raw, LoadDataset(config.data().eval_path(), options));
  FEDLORA_ASSIGN_OR_RETURN(TokenizedDataset train, TokenizeDataset(train_raw, *tokenizer, out.max_seq_len));
  FEDLORA_ASSIGN_OR_RETURN(TokenizedDataset eval, TokenizeDataset(eval_raw, *tokenizer, out.max_seq_len));
  out.label_names = train_raw.label_names;
  for (const Example& e : train_raw.examples) out.train_labels.push_back(e.label);
  if (config.simulation().partition() == v1::SimulationConfig::BY_KEY) {
    FEDLORA_ASSIGN_OR_RETURN(out.train_keys,
                             ReadKeys(config.data().train_path(), config.simulation().partition_key_field()));
    if (out.train_keys.size() != out.train_labels.size()) {
      return absl::InternalError(absl::StrCat("read ", out.train_keys.size(), " keys for ", out.train_labels.size(),
                                              " examples of ", config.data().train_path()));
    }
  }
  out.train = std::make_shared<const TokenizedDataset>(std::move(train));
  out.eval = std::make_shared<const TokenizedDataset>(std::move(eval));

  const v1::TrainingConfig& t = config.training();
  auto o = std::make_shared<TrainOptions>();
  o->batch_size = static_cast<int>(t.has_batch_size() ? t.batch_size() : 16);
  o->eval_batch_size = static_cast<int>(config.data().has_eval_batch_size() ? config.data().eval_batch_size() : 64);
  o->max_seq_len = out.max_seq_len;
  o->lr = static_cast<float>(t.has_learning_rate() ? t.learning_rate() : 5e-4);
  o->optimizer = OptimizerName(t.optimizer());
  o->weight_decay = static_cast<float>(t.weight_decay());
  o->warmup_steps = t.warmup_steps();
  o->schedule = ScheduleName(t.schedule());
  o->grad_clip = static_cast<float>(t.has_grad_clip_norm() ? t.grad_clip_norm() : 1.0);
  o->grad_accumulation = static_cast<int>(t.has_grad_accumulation() ? t.grad_accumulation() : 1);
  o->progress = false;
  FEDLORA_RETURN_IF_ERROR_CTX(o->Validate(), "training config");
  out.train_options = std::move(o);
  return out;
}

absl::StatusOr<LocalOutcome> TrainLocally(BertClassifier& model, const SimData& data, std::span<const int64_t> indices,
                                          const LocalWork& work) {
  if (indices.empty()) return absl::InvalidArgumentError("TrainLocally: the client holds no examples");
  TokenizedDataset subset;
  subset.num_labels = data.train->num_labels;
  subset.label_names = data.train->label_names;
  subset.examples.reserve(indices.size());
  for (int64_t i : indices) {
    if (i < 0 || i >= data.train->size()) return absl::OutOfRangeError(absl::StrCat("example index ", i));
    subset.examples.push_back(data.train->examples[static_cast<size_t>(i)]);
  }
  TrainOptions o = *data.train_options;
  if (work.local_steps > 0) {
    o.max_steps = work.local_steps;
  } else {
    o.epochs = static_cast<int>(std::max<uint32_t>(1, work.local_epochs));
    o.max_steps = 0;
  }
  if (work.batch_size > 0) o.batch_size = static_cast<int>(work.batch_size);
  if (work.learning_rate > 0) o.lr = static_cast<float>(work.learning_rate);
  o.seed = work.seed;
  o.progress = false;

  std::vector<float> losses;
  fedlora::Trainer trainer(model, o);
  trainer.on_step = [&losses](const StepReport& r) { losses.push_back(r.loss); };
  FEDLORA_RETURN_IF_ERROR(trainer.Train(subset, nullptr));

  LocalOutcome out;
  out.num_examples = static_cast<int64_t>(indices.size());
  out.steps = static_cast<int64_t>(losses.size());
  // Epoch mode visits every example once per epoch; step mode takes full batches (cycling epochs).
  out.examples_processed = work.local_steps > 0 ? out.steps * o.batch_size * o.grad_accumulation
                                                : int64_t{o.epochs} * out.num_examples;
  if (!losses.empty()) {
    const size_t tenth = std::max<size_t>(1, losses.size() / 10);
    auto mean = [](auto b, auto e) { return std::accumulate(b, e, 0.0) / static_cast<double>(e - b); };
    out.loss_first = mean(losses.begin(), losses.begin() + static_cast<std::ptrdiff_t>(tenth));
    out.loss_last = mean(losses.end() - static_cast<std::ptrdiff_t>(tenth), losses.end());
    out.loss_mean = mean(losses.begin(), losses.end());
  }
  return out;
}

absl::StatusOr<EvalFigures> EvaluateOnHeldOut(std::span<BertClassifier* const> models, const SimData& data,
                                              int batch_size) {
  if (models.empty()) return absl::InvalidArgumentError("EvaluateOnHeldOut: no model");
  const TokenizedDataset& eval = *data.eval;
  if (eval.size() == 0) return absl::InvalidArgumentError("the held-out set is empty");
  batch_size = std::max(1, std::min(batch_size, models[0]->options().max_batch));
  const int64_t num_batches = (eval.size() + batch_size - 1) / batch_size;
  const int64_t slices = std::min<int64_t>(static_cast<int64_t>(models.size()), num_batches);
  const int num_labels = models[0]->options().num_labels;
  for (const TokenizedExample& e : eval.examples) {
    if (e.label < 0 || e.label >= num_labels) {
      return absl::InvalidArgumentError(absl::StrCat("held-out label ", e.label, " outside [0, ", num_labels, ")"));
    }
  }
  std::vector<MetricsAccumulator> acc(static_cast<size_t>(slices), MetricsAccumulator(num_labels));
  std::vector<absl::Status> status(static_cast<size_t>(slices));
  auto run_slice = [&](int64_t s) {
    BertClassifier& model = *models[static_cast<size_t>(s)];
    const int32_t pad_id = static_cast<int32_t>(model.config().pad_token_id);
    std::vector<int64_t> idx;
    for (int64_t b = num_batches * s / slices; b < num_batches * (s + 1) / slices; ++b) {
      const int64_t begin = b * batch_size, end = std::min<int64_t>(begin + batch_size, eval.size());
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
  for (int64_t s = 1; s < slices; ++s) FEDLORA_RETURN_IF_ERROR(acc[0].Merge(acc[static_cast<size_t>(s)]));
  const EvalResult r = acc[0].Result();
  return EvalFigures{r.count, r.loss, r.accuracy, r.macro_f1};
}

}  // namespace fedlora::sim
