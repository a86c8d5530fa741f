#include "client/lora_trainer.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/logging.h"
#include "core/status.h"

namespace fedlora {

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
                                          const TrainOptions& options) {
  std::vector<float> losses;
  int64_t examples = 0;
  fedlora::Trainer trainer(model, options);
  trainer.on_step = [&losses, &examples](const StepReport& r) {
    losses.push_back(r.loss);
    examples += r.examples;
  };
  FEDLORA_RETURN_IF_ERROR(trainer.Train(data, nullptr));

  LocalOutcome out;
  out.num_examples = data.size();
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

absl::StatusOr<LocalOutcome> TrainLocally(BertClassifier& model, const TokenizedDataset& data,
                                          std::span<const int64_t> indices,
                                          const TrainOptions& options) {
  if (indices.empty())
    return absl::InvalidArgumentError("TrainLocally: the client holds no examples");
  TokenizedDataset subset;
  subset.num_labels = data.num_labels;
  subset.label_names = data.label_names;
  subset.examples.reserve(indices.size());
  for (int64_t i : indices) {
    if (i < 0 || i >= data.size()) {
      return absl::OutOfRangeError(
          absl::StrCat("example index ", i, " outside [0, ", data.size(), ")"));
    }
    subset.examples.push_back(data.examples[static_cast<size_t>(i)]);
  }
  return TrainLocally(model, subset, options);
}

std::vector<NamedTensor> AdapterDelta(BertClassifier& model,
                                      const std::vector<NamedTensor>& global) {
  std::map<std::string_view, const NamedTensor*> by_name;
  for (const NamedTensor& g : global) by_name[g.name] = &g;
  std::vector<NamedTensor> delta;
  for (const Param& p : model.trainable_params()) {
    const NamedTensor& g = *by_name.at(p.name);  // LoadAdapter checked every name and shape
    NamedTensor d{p.name, p.shape, std::vector<float>(p.value.size())};
    for (size_t i = 0; i < d.values.size(); ++i) d.values[i] = p.value[i] - g.values[i];
    delta.push_back(std::move(d));
  }
  return delta;
}

LoraTrainer::LoraTrainer(Site site) : site_(std::move(site)) {}

LoraTrainer::LoraTrainer(SiteLoader loader) : loader_(std::move(loader)) {}

absl::StatusOr<TrainResult> LoraTrainer::Train(const TrainTask& task,
                                               const std::vector<NamedTensor>& global) {
  if (!site_.has_value()) {
    if (!loader_)
      return absl::FailedPreconditionError("LoraTrainer has neither a site nor a site loader");
    v1::RunConfig config;
    google::protobuf::util::JsonParseOptions parse;
    parse.ignore_unknown_fields = true;  // a newer server may send fields this client does not know
    if (!google::protobuf::util::JsonStringToMessage(task.run_config_json, &config, parse).ok()) {
      return absl::InvalidArgumentError(
          "the server's run config is not valid JSON for fedlora.v1.RunConfig");
    }
    FEDLORA_ASSIGN_OR_RETURN(Site site, loader_(config));
    site_ = std::move(site);
  }
  const Site& site = *site_;
  if (!site.acquire_model || site.data == nullptr || site.options == nullptr) {
    return absl::FailedPreconditionError("LoraTrainer site lacks a model source, data or options");
  }
  const TrainOptions options = TaskTrainOptions(*site.options, task);
  TrainResult result;
  LocalOutcome outcome;
  {
    ModelLease model = site.acquire_model();
    if (model == nullptr) return absl::FailedPreconditionError("LoraTrainer: no model to train");
    FEDLORA_RETURN_IF_ERROR(LoadAdapter(global, *model));
    if (site.indices.has_value()) {
      FEDLORA_ASSIGN_OR_RETURN(outcome, TrainLocally(*model, *site.data, *site.indices, options));
    } else {
      FEDLORA_ASSIGN_OR_RETURN(outcome, TrainLocally(*model, *site.data, options));
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

}  // namespace fedlora
