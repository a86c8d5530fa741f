#include "workload/evaluator.h"

#include <algorithm>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "train/lm_trainer.h"
#include "train/metrics.h"

namespace fedlora {
namespace {

// Runs run_slice(s) for s in [0, slices): slice 0 on the calling thread, the others on threads.
template <class Fn>
void RunSlices(int64_t slices, Fn run_slice) {
  std::vector<std::thread> threads;
  for (int64_t s = 1; s < slices; ++s) threads.emplace_back(run_slice, s);
  run_slice(0);
  for (std::thread& t : threads) t.join();
}

// The models as `Concrete` (their kind was checked).
template <class Concrete>
absl::StatusOr<std::vector<Concrete*>> ModelsOf(std::span<LoraModel* const> models,
                                                v1::TaskConfig::Kind kind) {
  if (models.empty()) return absl::InvalidArgumentError("held-out evaluation: no model");
  std::vector<Concrete*> out;
  for (LoraModel* m : models) {
    if (m == nullptr || m->kind() != kind) {
      return absl::InvalidArgumentError(
          absl::StrCat("held-out evaluation: a model is not of the set's kind ",
                       v1::TaskConfig::Kind_Name(kind)));
    }
    out.push_back(static_cast<Concrete*>(m));
  }
  return out;
}

class ClassificationEvaluator final : public HeldOutEvaluator {
 public:
  ClassificationEvaluator(std::shared_ptr<const TokenizedDataset> eval, HeldOutOptions options)
      : eval_(std::move(eval)), options_(std::move(options)) {}

  absl::StatusOr<EvalFigures> Evaluate(std::span<LoraModel* const> lora) const override;
  std::map<std::string, double> Metrics(const EvalFigures& f) const override {
    return {
        {"eval_accuracy", f.accuracy}, {"eval_loss", f.loss}, {options_.macro_f1_key, f.macro_f1}};
  }
  int64_t size() const override { return eval_->size(); }

 private:
  std::shared_ptr<const TokenizedDataset> eval_;
  HeldOutOptions options_;
};

absl::StatusOr<EvalFigures> ClassificationEvaluator::Evaluate(
    std::span<LoraModel* const> lora) const {
  FEDLORA_ASSIGN_OR_RETURN(
      std::vector<ClassifierModel*> models,
      ModelsOf<ClassifierModel>(lora, v1::TaskConfig::SEQUENCE_CLASSIFICATION));
  const TokenizedDataset& eval = *eval_;
  if (eval.size() == 0) return absl::InvalidArgumentError("the held-out set is empty");
  BertClassifier& first = models[0]->model();
  const int batch_size = std::max(1, std::min(options_.batch_size, first.options().max_batch));
  const int64_t num_batches = (eval.size() + batch_size - 1) / batch_size;
  const int64_t slices = std::min<int64_t>(static_cast<int64_t>(models.size()), num_batches);
  const int num_labels = first.options().num_labels;
  for (const TokenizedExample& e : eval.examples) {
    if (e.label < 0 || e.label >= num_labels) {
      return absl::InvalidArgumentError(
          absl::StrCat("held-out label ", e.label, " outside [0, ", num_labels, ")"));
    }
  }
  std::vector<MetricsAccumulator> acc(static_cast<size_t>(slices), MetricsAccumulator(num_labels));
  std::vector<absl::Status> status(static_cast<size_t>(slices));
  RunSlices(slices, [&](int64_t s) {
    BertClassifier& model = models[static_cast<size_t>(s)]->model();
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
  });
  for (const absl::Status& st : status) FEDLORA_RETURN_IF_ERROR(st);
  for (int64_t s = 1; s < slices; ++s)
    FEDLORA_RETURN_IF_ERROR(acc[0].Merge(acc[static_cast<size_t>(s)]));
  const EvalResult r = acc[0].Result();
  return EvalFigures{.count = r.count,
                     .loss = r.loss,
                     .accuracy = r.accuracy,
                     .macro_f1 = r.macro_f1,
                     .json = r.ToJson()};
}

class LmEvaluator final : public HeldOutEvaluator {
 public:
  LmEvaluator(std::shared_ptr<const LmDataset> eval, HeldOutOptions options)
      : eval_(std::move(eval)), options_(std::move(options)) {}

  absl::StatusOr<EvalFigures> Evaluate(std::span<LoraModel* const> lora) const override;
  std::map<std::string, double> Metrics(const EvalFigures& f) const override {
    std::map<std::string, double> metrics{{"eval_loss", f.loss}, {"eval_perplexity", f.perplexity}};
    if (options_.exact_match) metrics["eval_accuracy"] = f.accuracy;
    return metrics;
  }
  int64_t size() const override { return eval_->size(); }

 private:
  std::shared_ptr<const LmDataset> eval_;
  HeldOutOptions options_;
};

// One slice's figures as they are; several merged per token (loss) and per example (matches).
EvalFigures MergeLmResults(const std::vector<absl::StatusOr<LmEvalResult>>& results,
                           bool exact_match) {
  const double nan = std::nan("");
  if (results.size() == 1) {
    const LmEvalResult& r = *results[0];
    return EvalFigures{.count = r.count,
                       .loss = r.loss,
                       .accuracy = r.has_exact_match ? r.exact_match : nan,
                       .macro_f1 = nan,
                       .perplexity = r.perplexity,
                       .json = r.ToJson()};
  }
  LmEvalResult merged;
  int64_t matched = 0;
  double nll = 0;
  for (const auto& r : results) {
    merged.count += r->count;
    merged.tokens += r->tokens;
    nll += r->loss * static_cast<double>(r->tokens);
    matched += std::llround(r->exact_match * static_cast<double>(r->count));
  }
  merged.loss = merged.tokens > 0 ? nll / static_cast<double>(merged.tokens) : nan;
  merged.perplexity = std::exp(merged.loss);
  merged.has_exact_match = exact_match;
  merged.exact_match =
      exact_match ? static_cast<double>(matched) / static_cast<double>(merged.count) : nan;
  return EvalFigures{.count = merged.count,
                     .loss = merged.loss,
                     .accuracy = merged.exact_match,
                     .macro_f1 = nan,
                     .perplexity = merged.perplexity,
                     .json = merged.ToJson()};
}

absl::StatusOr<EvalFigures> LmEvaluator::Evaluate(std::span<LoraModel* const> lora) const {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<CausalLmModel*> models,
                           ModelsOf<CausalLmModel>(lora, v1::TaskConfig::CAUSAL_LM));
  const LmDataset& eval = *eval_;
  if (eval.size() == 0) return absl::InvalidArgumentError("the held-out set is empty");
  // Contiguous slices of whole examples, one per model; each example's figures depend on it alone,
  // so the sums below do not depend on the split.
  const int64_t slices = std::min<int64_t>(static_cast<int64_t>(models.size()), eval.size());
  std::vector<absl::StatusOr<LmEvalResult>> results(static_cast<size_t>(slices),
                                                    absl::UnknownError("not run"));
  LmEvalOptions options;
  options.batch_size = options_.batch_size;
  options.exact_match = options_.exact_match;
  options.tokenizer = options_.tokenizer ? options_.tokenizer->tokenizer.get() : nullptr;
  if (options_.tokenizer) options.stop_ids = options_.tokenizer->stop_ids();
  RunSlices(slices, [&](int64_t s) {
    CausalLm& model = models[static_cast<size_t>(s)]->model();
    if (slices == 1) {  // the whole set, not a copy
      results[0] = EvaluateLm(model, eval, options);
      return;
    }
    LmDataset slice;
    const int64_t begin = eval.size() * s / slices, end = eval.size() * (s + 1) / slices;
    slice.examples.assign(eval.examples.begin() + begin, eval.examples.begin() + end);
    results[static_cast<size_t>(s)] = EvaluateLm(model, slice, options);
  });
  for (const auto& r : results) FEDLORA_RETURN_IF_ERROR(r.status());
  return MergeLmResults(results, options_.exact_match);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HeldOutEvaluator>> MakeHeldOutEvaluator(TaskData eval,
                                                                       HeldOutOptions options) {
  if (eval.examples != nullptr) {
    return std::make_unique<ClassificationEvaluator>(std::move(eval.examples), std::move(options));
  }
  if (eval.conversations != nullptr) {
    return std::make_unique<LmEvaluator>(std::move(eval.conversations), std::move(options));
  }
  return absl::InvalidArgumentError("held-out evaluation: no data");
}

}  // namespace fedlora
