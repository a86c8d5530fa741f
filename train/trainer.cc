#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/status.h"

namespace fedlora {
namespace {

// Rng streams (core/rng.h): one per purpose so that shuffling and dropout never share bits.
// Shuffling of epoch e uses stream MakeStream(kShuffleStream, e); the 64-bit dropout seed of
// micro-batch i is words 2i and 2i+1 of stream kDropoutStream.
constexpr uint32_t kShuffleStream = 0x53484646;  // "SHFF"
constexpr uint64_t kDropoutStream = 0x44524f50;  // "DROP"

uint64_t DropoutSeed(uint64_t seed, uint64_t micro_batch) {
  return static_cast<uint64_t>(U32At(seed, kDropoutStream, 2 * micro_batch)) |
         (static_cast<uint64_t>(U32At(seed, kDropoutStream, 2 * micro_batch + 1)) << 32);
}

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
  std::vector<int64_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  Rng rng(options.seed, MakeStream(kShuffleStream, static_cast<uint32_t>(epoch)));
  rng.Shuffle(order);
  if (!options.group_by_length || options.batch_size <= 1) return order;
  // HF's LengthGroupedSampler: chunks of 50 batches, each sorted by decreasing length (stable, so
  // ties keep the shuffled order), then the full batches in a random order. The chunk size is a
  // multiple of batch_size, so only the very last batch can be short; it stays last so that every
  // other batch remains full.
  const int64_t n = data.size(), bs = options.batch_size, chunk = 50 * bs;
  auto longer = [&data](int64_t a, int64_t b) {
    return data.examples[a].input_ids.size() > data.examples[b].input_ids.size();
  };
  for (int64_t begin = 0; begin < n; begin += chunk) {
    std::stable_sort(order.begin() + begin, order.begin() + std::min(n, begin + chunk), longer);
  }
  const int64_t full_batches = n / bs;
  std::vector<int64_t> batch_ids(full_batches);
  std::iota(batch_ids.begin(), batch_ids.end(), 0);
  rng.Shuffle(batch_ids);
  std::vector<int64_t> grouped;
  grouped.reserve(n);
  for (int64_t b : batch_ids)
    grouped.insert(grouped.end(), order.begin() + b * bs, order.begin() + (b + 1) * bs);
  grouped.insert(grouped.end(), order.begin() + full_batches * bs, order.end());
  return grouped;
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

int64_t Trainer::StepsPerEpoch(int64_t n) const {
  const int64_t micro = (n + options_.batch_size - 1) / options_.batch_size;
  return (micro + options_.grad_accumulation - 1) / options_.grad_accumulation;
}

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

  OptimizerOptions opt;
  opt.weight_decay = options_.weight_decay;
  opt.beta1 = options_.adam_beta1;
  opt.momentum = options_.momentum;
  opt.beta2 = options_.adam_beta2;
  opt.eps = options_.adam_epsilon;
  FEDLORA_ASSIGN_OR_RETURN(optimizer_, MakeOptimizer(options_.optimizer, opt));
  const int64_t steps_per_epoch = StepsPerEpoch(train.size());
  const int64_t total_steps =
      options_.max_steps > 0 ? options_.max_steps : options_.epochs * steps_per_epoch;
  FEDLORA_ASSIGN_OR_RETURN(
      LearningRateSchedule schedule,
      MakeSchedule(options_.schedule, {.base_lr = options_.lr,
                                       .warmup_steps = std::min(options_.warmup_steps, total_steps),
                                       .total_steps = total_steps}));
  const int32_t pad_id = static_cast<int32_t>(model_.config().pad_token_id);
  std::vector<Param>& params = model_.trainable_params();
  // FedProx's anchor: the params as this run found them.
  std::vector<std::vector<float>> anchor;
  if (options_.proximal_mu > 0.0f) {
    anchor.reserve(params.size());
    for (const Param& p : params) anchor.push_back(p.value);
  }

  history_.clear();
  int64_t step = 0;          // optimizer steps taken
  uint64_t micro_index = 0;  // micro-batches run, for dropout seeds
  for (int epoch = 1; step < total_steps; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int64_t> order = EpochOrder(train, options_, epoch);
    std::optional<Progress> progress;
    const int64_t epoch_start_step = step;
    if (options_.progress) {
      ProgressOptions progress_options;
      progress_options.unit = "step";
      progress.emplace(absl::StrCat("epoch ", epoch), std::min(steps_per_epoch, total_steps - step),
                       progress_options);
    }
    double loss_sum = 0.0;  // sum over examples of the micro-batch mean loss
    int64_t seen = 0;
    int64_t pos = 0;
    while (pos < train.size() && step < total_steps) {
      model_.ZeroGrad();
      const int64_t step_start = pos;
      int micro = 0;
      double step_loss = 0.0;
      for (; micro < options_.grad_accumulation && pos < train.size(); ++micro) {
        const int64_t end = std::min<int64_t>(pos + options_.batch_size, train.size());
        const BertClassifier::Batch batch =
            MakeBatch(train, std::span<const int64_t>(order).subspan(pos, end - pos), pad_id);
        FEDLORA_ASSIGN_OR_RETURN(
            float loss, model_.ForwardBackward(batch, DropoutSeed(options_.seed, micro_index++)));
        if (!std::isfinite(loss)) {
          return absl::FailedPreconditionError(absl::StrCat("training loss became ", loss,
                                                            " at step ", step + 1, " (epoch ",
                                                            epoch, "); try a lower learning rate"));
        }
        step_loss += loss;
        loss_sum += static_cast<double>(loss) * (end - pos);
        seen += end - pos;
        pos = end;
      }
      // The model added the gradient of each micro-batch's mean loss; average them so the step
      // sees the gradient of the mean, whatever the accumulation.
      if (micro > 1) {
        const float inv = 1.0f / static_cast<float>(micro);
        for (Param& p : params) {
          for (float& g : p.grad) g *= inv;
        }
      }
      if (!anchor.empty()) {
        const float mu = options_.proximal_mu;
        for (size_t i = 0; i < params.size(); ++i) {
          Param& p = params[i];
          const std::vector<float>& w0 = anchor[i];
          for (size_t j = 0; j < p.grad.size(); ++j) p.grad[j] += mu * (p.value[j] - w0[j]);
        }
      }
      const float norm = ClipGradNorm(params, options_.grad_clip);
      if (!std::isfinite(norm)) {
        return absl::FailedPreconditionError(absl::StrCat("gradient norm became ", norm,
                                                          " at step ", step + 1, " (epoch ", epoch,
                                                          "); try a lower learning rate"));
      }
      const float lr = schedule.LearningRateAt(step);
      FEDLORA_RETURN_IF_ERROR(optimizer_->Step(params, lr));
      ++step;
      if (progress) {
        progress->Update(step - epoch_start_step, absl::StrFormat("loss=%.4f lr=%.2e |g|=%.3f",
                                                                  step_loss / micro, lr, norm));
      }
      if (on_step) {
        on_step({.step = step,
                 .total_steps = total_steps,
                 .epoch = epoch,
                 .loss = static_cast<float>(step_loss / micro),
                 .lr = lr,
                 .grad_norm = norm,
                 .examples = pos - step_start});
      }
    }
    if (progress) progress->Finish();
    EpochReport report;
    report.epoch = epoch;
    report.steps = step;
    report.train_loss = seen > 0 ? loss_sum / static_cast<double>(seen) : 0.0;
    report.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (eval != nullptr && eval->size() > 0) {
      FEDLORA_ASSIGN_OR_RETURN(report.eval, Evaluate(model_, *eval, options_.eval_batch_size));
      report.has_eval = true;
    }
    history_.push_back(report);
    if (on_epoch) on_epoch(report);
  }
  return absl::OkStatus();
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
