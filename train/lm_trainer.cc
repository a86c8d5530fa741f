#include "train/lm_trainer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "train/train_loop.h"

namespace fedlora {
namespace {

std::string JsonNumber(double x) {
  return std::isfinite(x) ? absl::StrFormat("%.9g", x) : std::string("null");
}

absl::Status CheckLmDataset(const LmDataset& data, const CausalLm& model, std::string_view what) {
  const int max_seq = model.options().max_seq;
  for (int64_t i = 0; i < data.size(); ++i) {
    const LmExample& ex = data.examples[i];
    if (ex.labels.size() != ex.input_ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), " example ", i, " has ",
                                                     ex.labels.size(), " labels for ",
                                                     ex.input_ids.size(), " tokens"));
    }
    if (ex.input_ids.empty() || static_cast<int>(ex.input_ids.size()) > max_seq) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), " example ", i, " has ",
                                                     ex.input_ids.size(),
                                                     " tokens; the model takes 1 to ", max_seq));
    }
  }
  return absl::OkStatus();
}

int32_t PadId(const LmEvalOptions& options) {
  if (options.tokenizer != nullptr && options.tokenizer->pad_id() >= 0)
    return options.tokenizer->pad_id();
  return 0;
}

}  // namespace

std::string LmEvalResult::ToJson() const {
  std::string out =
      absl::StrCat("{\"count\":", count, ",\"tokens\":", tokens, ",\"loss\":", JsonNumber(loss),
                   ",\"perplexity\":", JsonNumber(perplexity));
  if (has_exact_match) absl::StrAppend(&out, ",\"exact_match\":", JsonNumber(exact_match));
  absl::StrAppend(&out, "}");
  return out;
}

std::string LmEpochReport::ToJson() const {
  std::string out = absl::StrCat("{\"epoch\":", epoch, ",\"steps\":", steps,
                                 ",\"train_loss\":", JsonNumber(train_loss),
                                 ",\"seconds\":", JsonNumber(seconds));
  if (has_eval) absl::StrAppend(&out, ",\"eval\":", eval.ToJson());
  absl::StrAppend(&out, "}");
  return out;
}

LmTrainer::LmTrainer(CausalLm& model, TrainOptions options)
    : model_(model), options_(std::move(options)) {}

absl::Status LmTrainer::Train(const LmDataset& train, const LmDataset* eval,
                              const LmEvalOptions& eval_options) {
  FEDLORA_RETURN_IF_ERROR(options_.Validate());
  if (options_.logit_adjustment != 0.0f) {
    return absl::InvalidArgumentError(
        "logit_adjustment is a classification option; a causal LM does not take it");
  }
  if (train.size() == 0) return absl::InvalidArgumentError("training set is empty");
  if (options_.batch_size > model_.options().max_batch) {
    return absl::InvalidArgumentError(absl::StrCat("batch_size ", options_.batch_size,
                                                   " exceeds the model's max_batch ",
                                                   model_.options().max_batch));
  }
  FEDLORA_RETURN_IF_ERROR(CheckLmDataset(train, model_, "training"));
  if (eval != nullptr) FEDLORA_RETURN_IF_ERROR(CheckLmDataset(*eval, model_, "eval"));
  const int32_t pad_id = PadId(eval_options);
  TrainLoop loop =
      ModelTrainLoop(model_, train, [pad_id](const LmDataset& d, std::span<const int64_t> i) {
        return MakeLmBatch(d, i, pad_id);
      });
  loop.on_step = on_step;
  loop.after_epoch = [&](int epoch, int64_t steps, double train_loss,
                         double seconds) -> absl::Status {
    LmEpochReport report;
    report.epoch = epoch;
    report.steps = steps;
    report.train_loss = train_loss;
    report.seconds = seconds;
    if (eval != nullptr && eval->size() > 0) {
      FEDLORA_ASSIGN_OR_RETURN(report.eval, EvaluateLm(model_, *eval, eval_options));
      report.has_eval = true;
    }
    history_.push_back(report);
    if (on_epoch) on_epoch(report);
    return absl::OkStatus();
  };
  history_.clear();
  return RunTrainLoop(options_, loop, &optimizer_);
}

absl::StatusOr<LmEvalResult> EvaluateLm(CausalLm& model, const LmDataset& data,
                                        const LmEvalOptions& options) {
  if (data.size() == 0) return absl::InvalidArgumentError("evaluation set is empty");
  if (options.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval batch size must be >= 1, got ", options.batch_size));
  }
  if (options.exact_match && options.tokenizer == nullptr) {
    return absl::InvalidArgumentError("exact-match evaluation needs the tokenizer");
  }
  FEDLORA_RETURN_IF_ERROR(CheckLmDataset(data, model, "eval"));
  const int batch_size = std::min(options.batch_size, model.options().max_batch);
  const int32_t pad_id = PadId(options);
  LmEvalResult result;
  double nll = 0.0;
  std::vector<int64_t> idx;
  for (int64_t pos = 0; pos < data.size(); pos += batch_size) {
    const int64_t end = std::min<int64_t>(pos + batch_size, data.size());
    idx.resize(end - pos);
    std::iota(idx.begin(), idx.end(), pos);
    FEDLORA_ASSIGN_OR_RETURN(CausalLm::LossSum sum, model.Evaluate(MakeLmBatch(data, idx, pad_id)));
    nll += sum.nll;
    result.tokens += sum.tokens;
  }
  result.count = data.size();
  result.loss = result.tokens > 0 ? nll / static_cast<double>(result.tokens) : 0.0;
  result.perplexity = std::exp(result.loss);
  if (options.exact_match) {
    const int max_seq = model.options().max_seq;
    int64_t hits = 0;
    for (const LmExample& ex : data.examples) {
      const int prompt = static_cast<int>(ex.prompt_ids.size());
      // Room for the response as the data tokenized it, its end-of-turn token, and one more.
      const int want = static_cast<int>(ex.input_ids.size()) - prompt + 2;
      const int room = max_seq - prompt;
      if (room < 1) continue;  // the prompt alone fills the context: no completion, a miss
      CausalLm::GenerateOptions g{.max_new_tokens = std::max(1, std::min(want, room)),
                                  .stop_ids = options.stop_ids};
      FEDLORA_ASSIGN_OR_RETURN(std::vector<int32_t> out, model.Generate(ex.prompt_ids, g));
      if (!out.empty() &&
          std::find(g.stop_ids.begin(), g.stop_ids.end(), out.back()) != g.stop_ids.end()) {
        out.pop_back();
      }
      const std::string completion = options.tokenizer->Decode(out, /*skip_special=*/true);
      if (absl::StripAsciiWhitespace(completion) == absl::StripAsciiWhitespace(ex.response)) ++hits;
    }
    result.has_exact_match = true;
    result.exact_match = static_cast<double>(hits) / static_cast<double>(data.size());
  }
  return result;
}

}  // namespace fedlora
