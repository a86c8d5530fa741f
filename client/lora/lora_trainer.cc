#include "client/lora/lora_trainer.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <utility>

#include "core/logging.h"
#include "core/status.h"

namespace fedlora {
namespace {

// One task: lend a model, set its adapter, train, take the delta.
absl::StatusOr<TrainResult> RunTask(const LoraSite& site, const TrainTask& task,
                                    const std::vector<NamedTensor>& global) {
  if (!site.acquire_model || site.data.empty() || site.options == nullptr) {
    return absl::FailedPreconditionError("LoraTrainer site lacks a model source, data or options");
  }
  const TrainOptions options = TaskTrainOptions(*site.options, task);
  TrainResult result;
  LocalOutcome outcome;
  {
    LoraSite::Lease model = site.acquire_model();
    if (model == nullptr) return absl::FailedPreconditionError("LoraTrainer: no model to train");
    FEDLORA_RETURN_IF_ERROR(LoadAdapter(global, *model));
    FEDLORA_ASSIGN_OR_RETURN(
        outcome, model->Train(site.data, site.indices.has_value() ? &*site.indices : nullptr,
                              options, task.report_progress));
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

LoraTrainer::LoraTrainer(Site site) : site_(std::move(site)) {}

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
  FEDLORA_ASSIGN_OR_RETURN(Site site, loader_(config));
  site_ = std::move(site);
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> LoraTrainer::Train(const TrainTask& task,
                                               const std::vector<NamedTensor>& global) {
  FEDLORA_RETURN_IF_ERROR(Prepare(task.run_config_json));
  return RunTask(*site_, task, global);
}

}  // namespace fedlora
