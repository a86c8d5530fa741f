#include "client/lora/lora_trainer.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/logging.h"
#include "core/status.h"
#include "train/lm_trainer.h"

namespace fedlora {
namespace {

// The outcome of a task whose optimizer steps had these losses.
LocalOutcome OutcomeOf(const std::vector<float>& losses, int64_t examples, int64_t num_examples) {
  LocalOutcome out;
  out.num_examples = num_examples;
  out.steps = static_cast<int64_t>(losses.size());
  out.examples_processed = examples;  // an epoch's last batch may be short
  if (!losses.empty()) {
    const size_t tenth = std::max<size_t>(1, losses.size() / 10);
    auto mean = [](auto b, auto e) {
      return std::accumulate(b, e, 0.0) / static_cast<double>(e - b);
    };
    out.loss_first = mean(losses.begin(), losses.begin() + static_cast<std::ptrdiff_t>(tenth));
    out.loss_last = mean(losses.end() - static_cast<std::ptrdiff_t>(tenth), losses.end());
    out.loss_mean = mean(losses.begin(), losses.end());
  }
  return out;
}

// data[indices], with data's label set (a classification dataset) or nothing more (LM data).
template <class Data>
absl::StatusOr<Data> Subset(const Data& data, std::span<const int64_t> indices) {
  if (indices.empty())
    return absl::InvalidArgumentError("TrainLocally: the client holds no examples");
  Data subset;
  if constexpr (std::is_same_v<Data, TokenizedDataset>) {
    subset.num_labels = data.num_labels;
    subset.label_names = data.label_names;
  }
  subset.examples.reserve(indices.size());
  for (int64_t i : indices) {
    if (i < 0 || i >= data.size()) {
      return absl::OutOfRangeError(
          absl::StrCat("example index ", i, " outside [0, ", data.size(), ")"));
    }
    subset.examples.push_back(data.examples[static_cast<size_t>(i)]);
  }
  return subset;
}

// One task on a site of either kind: lend a model, set its adapter, train, take the delta.
template <class Model, class Data>
absl::StatusOr<TrainResult> RunTask(const LoraSite<Model, Data>& site, const TrainTask& task,
                                    const std::vector<NamedTensor>& global) {
  if (!site.acquire_model || site.data == nullptr || site.options == nullptr) {
    return absl::FailedPreconditionError("LoraTrainer site lacks a model source, data or options");
  }
  const TrainOptions options = TaskTrainOptions(*site.options, task);
  TrainResult result;
  LocalOutcome outcome;
  {
    typename LoraSite<Model, Data>::Lease model = site.acquire_model();
    if (model == nullptr) return absl::FailedPreconditionError("LoraTrainer: no model to train");
    FEDLORA_RETURN_IF_ERROR(LoadAdapter(global, *model));
    if (site.indices.has_value()) {
      FEDLORA_ASSIGN_OR_RETURN(
          outcome, TrainLocally(*model, *site.data, *site.indices, options, task.report_progress));
    } else {
      FEDLORA_ASSIGN_OR_RETURN(outcome,
                               TrainLocally(*model, *site.data, options, task.report_progress));
    }
    result.delta = AdapterDelta(*model, global);
  }
  result.num_examples = outcome.num_examples;
  result.steps = outcome.steps;
  result.examples_processed = outcome.examples_processed;
  result.train_loss_first = outcome.loss_first;
  result.train_loss_last = outcome.loss_last;
  result.metrics["train_loss_mean"] = outcome.loss_mean;
  if (site.log_tasks) {
    FEDLORA_LOG(INFO) << "round " << task.round << ": trained " << result.steps << " steps, loss "
                      << result.train_loss_first << " -> " << result.train_loss_last;
  }
  return result;
}

}  // namespace

TrainOptions TaskTrainOptions(const TrainOptions& base, const TrainTask& task) {
  TrainOptions o = base;
  if (task.local_steps > 0) {
    o.max_steps = task.local_steps;
  } else {
    o.epochs = static_cast<int>(std::max<uint32_t>(1, task.local_epochs));
    o.max_steps = 0;
  }
  if (task.batch_size > 0) o.batch_size = static_cast<int>(task.batch_size);
  if (task.learning_rate > 0) o.lr = static_cast<float>(task.learning_rate);
  o.proximal_mu = static_cast<float>(task.proximal_mu);
  o.seed = task.seed;
  o.progress = false;
  return o;
}

absl::StatusOr<LocalOutcome> TrainLocally(BertClassifier& model, const TokenizedDataset& data,
                                          const TrainOptions& options,
                                          const StepProgress& progress) {
  std::vector<float> losses;
  int64_t examples = 0;
  fedlora::Trainer trainer(model, options);
  trainer.on_step = [&losses, &examples, &progress](const StepReport& r) {
    losses.push_back(r.loss);
    examples += r.examples;
    if (progress) progress(r.step, r.total_steps);
  };
  FEDLORA_RETURN_IF_ERROR(trainer.Train(data, nullptr));
  return OutcomeOf(losses, examples, data.size());
}

absl::StatusOr<LocalOutcome> TrainLocally(CausalLm& model, const LmDataset& data,
                                          const TrainOptions& options,
                                          const StepProgress& progress) {
  std::vector<float> losses;
  int64_t examples = 0;
  LmTrainer trainer(model, options);
  trainer.on_step = [&losses, &examples, &progress](const StepReport& r) {
    losses.push_back(r.loss);
    examples += r.examples;
    if (progress) progress(r.step, r.total_steps);
  };
  FEDLORA_RETURN_IF_ERROR(trainer.Train(data, nullptr, LmEvalOptions{}));
  return OutcomeOf(losses, examples, data.size());
}

absl::StatusOr<LocalOutcome> TrainLocally(BertClassifier& model, const TokenizedDataset& data,
                                          std::span<const int64_t> indices,
                                          const TrainOptions& options,
                                          const StepProgress& progress) {
  FEDLORA_ASSIGN_OR_RETURN(TokenizedDataset subset, Subset(data, indices));
  return TrainLocally(model, subset, options, progress);
}

absl::StatusOr<LocalOutcome> TrainLocally(CausalLm& model, const LmDataset& data,
                                          std::span<const int64_t> indices,
                                          const TrainOptions& options,
                                          const StepProgress& progress) {
  FEDLORA_ASSIGN_OR_RETURN(LmDataset subset, Subset(data, indices));
  return TrainLocally(model, subset, options, progress);
}

LoraTrainer::LoraTrainer(Site site) : site_(std::move(site)) {}

LoraTrainer::LoraTrainer(DecoderSite site) : site_(std::move(site)) {}

LoraTrainer::LoraTrainer(SiteLoader loader) : loader_(std::move(loader)) {}

absl::Status LoraTrainer::Prepare(const std::string& run_config_json) {
  if (site_.has_value()) return absl::OkStatus();
  if (!loader_)
    return absl::FailedPreconditionError("LoraTrainer has neither a site nor a site loader");
  v1::RunConfig config;
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = true;  // a newer server may send fields this client does not know
  if (!google::protobuf::util::JsonStringToMessage(run_config_json, &config, parse).ok()) {
    return absl::InvalidArgumentError(
        "the server's run config is not valid JSON for fedlora.v1.RunConfig");
  }
  FEDLORA_ASSIGN_OR_RETURN(AnySite site, loader_(config));
  site_ = std::move(site);
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> LoraTrainer::Train(const TrainTask& task,
                                               const std::vector<NamedTensor>& global) {
  FEDLORA_RETURN_IF_ERROR(Prepare(task.run_config_json));
  return std::visit([&](const auto& site) { return RunTask(site, task, global); }, *site_);
}

}  // namespace fedlora
