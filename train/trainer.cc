#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "train/train_loop.h"

namespace fedlora {
namespace {

std::string JsonNumber(double x) {
  return std::isfinite(x) ? absl::StrFormat("%.9g", x) : std::string("null");
}

absl::Status CheckDataset(const TokenizedDataset& data, const BertClassifier& model,
                          std::string_view what) {
  const int num_labels = model.options().num_labels;
  const int max_seq = model.options().max_seq;
  for (int64_t i = 0; i < data.size(); ++i) {
    const TokenizedExample& ex = data.examples[i];
    if (ex.label < 0 || ex.label >= num_labels) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), " example ", i,
                                                     " has label ", ex.label, " but the model has ",
                                                     num_labels, " labels"));
    }
    if (ex.input_ids.empty() || static_cast<int>(ex.input_ids.size()) > max_seq) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), " example ", i, " has ",
                                                     ex.input_ids.size(),
                                                     " tokens; the model takes 1 to ", max_seq));
    }
    if (!ex.token_type_ids.empty() && ex.token_type_ids.size() != ex.input_ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), " example ", i, " has ",
                                                     ex.token_type_ids.size(), " token types for ",
                                                     ex.input_ids.size(), " tokens"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizedDataset> TokenizeDataset(const Dataset& data,
                                                 const WordPieceTokenizer& tokenizer,
                                                 int max_seq_len) {
  if (max_seq_len < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_seq_len must be >= 2 ([CLS] and [SEP]), got ", max_seq_len));
  }
  TokenizedDataset out;
  out.num_labels = static_cast<int>(data.label_names.size());
  out.label_names = data.label_names;
  out.examples.reserve(data.examples.size());
  for (const Example& ex : data.examples) {
    std::optional<std::string_view> pair;
    if (ex.text_pair.has_value()) pair = std::string_view(*ex.text_pair);
    WordPieceTokenizer::Encoding enc = tokenizer.Encode(ex.text, pair, max_seq_len);
    out.examples.push_back(
        {std::move(enc.input_ids), std::move(enc.token_type_ids), static_cast<int32_t>(ex.label)});
  }
  return out;
}

BertClassifier::Batch MakeBatch(const TokenizedDataset& data, std::span<const int64_t> indices,
                                int32_t pad_id) {
  BertClassifier::Batch batch;
  batch.batch_size = static_cast<int>(indices.size());
  size_t longest = 0;
  for (int64_t i : indices) longest = std::max(longest, data.examples[i].input_ids.size());
  batch.seq_len = static_cast<int>(longest);
  const size_t cells = indices.size() * longest;
  batch.input_ids.assign(cells, pad_id);
  batch.token_type_ids.assign(cells, 0);
  batch.attention_mask.assign(cells, 0);
  batch.labels.reserve(indices.size());
  for (size_t row = 0; row < indices.size(); ++row) {
    const TokenizedExample& ex = data.examples[indices[row]];
    const size_t off = row * longest;
    std::copy(ex.input_ids.begin(), ex.input_ids.end(), batch.input_ids.begin() + off);
    if (!ex.token_type_ids.empty()) {
      std::copy(ex.token_type_ids.begin(), ex.token_type_ids.end(),
                batch.token_type_ids.begin() + off);
    }
    std::fill_n(batch.attention_mask.begin() + off, ex.input_ids.size(), 1);
    batch.labels.push_back(ex.label);
  }
  return batch;
}

std::vector<int64_t> EpochOrder(const TokenizedDataset& data, const TrainOptions& options,
                                int epoch) {
  std::vector<int64_t> lengths;
  lengths.reserve(data.examples.size());
  for (const TokenizedExample& e : data.examples)
    lengths.push_back(static_cast<int64_t>(e.input_ids.size()));
  return EpochOrderOfLengths(lengths, options, epoch);
}

absl::Status TrainOptions::Validate() const {
  auto bad = [](std::string_view field, auto value, std::string_view rule) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), " must be ", std::string(rule), ", got ", value));
  };
  if (epochs < 0) return bad("epochs", epochs, ">= 0");
  if (max_steps < 0) return bad("max_steps", max_steps, ">= 0");
  if (epochs == 0 && max_steps == 0)
    return absl::InvalidArgumentError("one of epochs or max_steps must be > 0");
  if (batch_size < 1) return bad("batch_size", batch_size, ">= 1");
  if (eval_batch_size < 1) return bad("eval_batch_size", eval_batch_size, ">= 1");
  if (max_seq_len < 2) return bad("max_seq_len", max_seq_len, ">= 2 ([CLS] and [SEP])");
  if (!std::isfinite(lr) || lr <= 0.0f) return bad("lr", lr, "finite and > 0");
  if (!std::isfinite(weight_decay) || weight_decay < 0.0f)
    return bad("weight_decay", weight_decay, ">= 0");
  if (warmup_steps < 0) return bad("warmup_steps", warmup_steps, ">= 0");
  if (!std::isfinite(grad_clip)) return bad("grad_clip", grad_clip, "finite");
  if (grad_accumulation < 1) return bad("grad_accumulation", grad_accumulation, ">= 1");
  auto unit = [](float b) { return std::isfinite(b) && b >= 0.0f && b < 1.0f; };
  if (!unit(adam_beta1)) return bad("adam_beta1", adam_beta1, "in [0, 1)");
  if (!unit(adam_beta2)) return bad("adam_beta2", adam_beta2, "in [0, 1)");
  if (!unit(momentum)) return bad("momentum", momentum, "in [0, 1)");
  if (!std::isfinite(adam_epsilon) || adam_epsilon == 0.0f)
    return bad("adam_epsilon", adam_epsilon, "finite and > 0 (< 0: the optimizer's default)");
  if (!std::isfinite(logit_adjustment) || logit_adjustment < 0.0f)
    return bad("logit_adjustment", logit_adjustment, "finite and >= 0");
  if (!std::isfinite(proximal_mu) || proximal_mu < 0.0f)
    return bad("proximal_mu", proximal_mu, "finite and >= 0");
  return absl::OkStatus();
}

std::string EpochReport::ToJson() const {
  std::string out = absl::StrCat("{\"epoch\":", epoch, ",\"steps\":", steps,
                                 ",\"train_loss\":", JsonNumber(train_loss),
                                 ",\"seconds\":", JsonNumber(seconds));
  if (has_eval) absl::StrAppend(&out, ",\"eval\":", eval.ToJson());
  absl::StrAppend(&out, "}");
  return out;
}

std::vector<float> LogitAdjustmentOffsets(const TokenizedDataset& data, float tau) {
  if (tau == 0.0f || data.num_labels <= 0) return {};
  std::vector<int64_t> counts(static_cast<size_t>(data.num_labels), 0);
  for (const TokenizedExample& e : data.examples) {
    if (e.label >= 0 && e.label < data.num_labels) ++counts[static_cast<size_t>(e.label)];
  }
  const double total = static_cast<double>(data.size() + data.num_labels);
  std::vector<float> offsets(counts.size());
  for (size_t c = 0; c < counts.size(); ++c) {
    offsets[c] = static_cast<float>(tau * std::log(static_cast<double>(counts[c] + 1) / total));
  }
  return offsets;
}

Trainer::Trainer(BertClassifier& model, TrainOptions options)
    : model_(model), options_(std::move(options)) {}

int64_t Trainer::StepsPerEpoch(int64_t n) const { return StepsPerEpochOf(options_, n); }

absl::Status Trainer::Train(const TokenizedDataset& train, const TokenizedDataset* eval) {
  FEDLORA_RETURN_IF_ERROR(options_.Validate());
  if (train.size() == 0) return absl::InvalidArgumentError("training set is empty");
  if (options_.batch_size > model_.options().max_batch) {
    return absl::InvalidArgumentError(absl::StrCat("batch_size ", options_.batch_size,
                                                   " exceeds the model's max_batch ",
                                                   model_.options().max_batch));
  }
  FEDLORA_RETURN_IF_ERROR(CheckDataset(train, model_, "training"));
  if (eval != nullptr) FEDLORA_RETURN_IF_ERROR(CheckDataset(*eval, model_, "eval"));
  // The model keeps the offsets only for this run: a pooled model trains other clients next.
  FEDLORA_RETURN_IF_ERROR(
      model_.SetTrainingLogitOffsets(LogitAdjustmentOffsets(train, options_.logit_adjustment)));
  absl::Cleanup clear_offsets = [this] { model_.SetTrainingLogitOffsets({}).IgnoreError(); };

  const int32_t pad_id = static_cast<int32_t>(model_.config().pad_token_id);
  TrainLoop loop = ModelTrainLoop(model_, train,
                                  [pad_id](const TokenizedDataset& d, std::span<const int64_t> i) {
                                    return MakeBatch(d, i, pad_id);
                                  });
  loop.on_step = on_step;
  loop.after_epoch = [&](int epoch, int64_t steps, double train_loss,
                         double seconds) -> absl::Status {
    EpochReport report;
    report.epoch = epoch;
    report.steps = steps;
    report.train_loss = train_loss;
    report.seconds = seconds;
    if (eval != nullptr && eval->size() > 0) {
      FEDLORA_ASSIGN_OR_RETURN(report.eval, Evaluate(model_, *eval, options_.eval_batch_size));
      report.has_eval = true;
    }
    history_.push_back(report);
    if (on_epoch) on_epoch(report);
    return absl::OkStatus();
  };
  history_.clear();
  return RunTrainLoop(options_, loop, &optimizer_);
}

absl::StatusOr<EvalResult> Evaluate(BertClassifier& model, const TokenizedDataset& data,
                                    int batch_size) {
  if (data.size() == 0) return absl::InvalidArgumentError("evaluation set is empty");
  if (batch_size < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("eval batch size must be >= 1, got ", batch_size));
  batch_size = std::min(batch_size, model.options().max_batch);
  FEDLORA_RETURN_IF_ERROR(CheckDataset(data, model, "eval"));
  const int32_t pad_id = static_cast<int32_t>(model.config().pad_token_id);
  MetricsAccumulator acc(model.options().num_labels);
  std::vector<int64_t> idx;
  for (int64_t pos = 0; pos < data.size(); pos += batch_size) {
    const int64_t end = std::min<int64_t>(pos + batch_size, data.size());
    idx.resize(end - pos);
    std::iota(idx.begin(), idx.end(), pos);
    const BertClassifier::Batch batch = MakeBatch(data, idx, pad_id);
    FEDLORA_ASSIGN_OR_RETURN(std::vector<float> logits, model.Logits(batch));
    FEDLORA_RETURN_IF_ERROR(acc.AddLogits(logits, batch.labels));
  }
  return acc.Result();
}

}  // namespace fedlora
