// The SDK's built-in ClientTrainer: LoRA fine-tuning of a workload/lora_model.h LoraModel (a
// BertClassifier for SEQUENCE_CLASSIFICATION, a CausalLm for CAUSAL_LM): fedlora::client_lora,
// apart from the transport (fedlora::client) so a site with its own trainer links no ML; used by
// `fedlora client` (one model, the site's own data file) and by `fedlora simulate` (models
// borrowed from a pool, one example subset per virtual client).
//
//   LoraTrainer::Site site;
//   site.acquire_model = [model] {      // an owned model: the lease gives nothing back
//     return LoraTrainer::ModelLease(model.get(), [model](LoraModel*) {});
//   };
//   site.data = std::make_shared<const TokenizedDataset>(std::move(tokenized));
//   site.options = std::make_shared<const TrainOptions>(
//       TrainOptionsFromConfig(config.training(), /*max_seq_len=*/128));
//   LoraTrainer trainer(std::move(site));
//   auto client = Client::Create(client_options, &trainer);
//
// Each task: the lent model's adapter is set to the global one, trained with the site's options
// overridden by the task (local work, batch size, learning rate, FedProx mu, seed), and the delta
// returned.
// The optimizer starts afresh every task, as in FedAvg.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fedlora/client_trainer.h"
#include "fedlora/v1/config.pb.h"
#include "train/trainer.h"
#include "workload/lora_model.h"

namespace fedlora {

// `base` (the run config's options) with the task's overrides: local_steps (> 0) or else
// local_epochs (at least 1); batch_size and learning_rate when > 0; the task's proximal_mu and
// seed; no progress.
TrainOptions TaskTrainOptions(const TrainOptions& base, const TrainTask& task);

// The model's trainable params minus `global` (which LoadAdapter accepted), in the model's order,
// leaving out frozen ones (lora.freeze_a's lora_A, which the run does not federate).
template <class Model>
std::vector<NamedTensor> AdapterDelta(Model& model, const std::vector<NamedTensor>& global);

// Where one site trains: a model source, its data and its options.
struct LoraSite {
  // A model lent for one task; the deleter gives it back (a pool) or does nothing (an owned model).
  using Lease = std::unique_ptr<LoraModel, std::function<void(LoraModel*)>>;
  // Lends a model whose LoRA shape (and labels) match the run; may block until one is free.
  std::function<Lease()> acquire_model;
  TaskData data;  // of the model's task kind
  // The examples of `data` this site trains on; none: all of them. An empty subset fails every
  // task (InvalidArgument).
  std::optional<std::vector<int64_t>> indices;
  // The run config's options (TrainOptionsFromConfig); each task overrides its own fields.
  std::shared_ptr<const TrainOptions> options;
  bool log_tasks = false;  // one INFO line per task (steps, loss)
};

class LoraTrainer final : public ClientTrainer {
 public:
  using Site = LoraSite;
  using ModelLease = Site::Lease;
  // Builds the site at the first task, from the run config the server sent
  // (TrainTask::run_config_json), when the model and data depend on it.
  using SiteLoader = std::function<absl::StatusOr<Site>(const v1::RunConfig& config)>;

  explicit LoraTrainer(Site site);
  explicit LoraTrainer(SiteLoader loader);

  // Loads the site (the loader's model and data) for the run, once: a site built with its model
  // and data has nothing to do.
  absl::Status Prepare(const std::string& run_config_json) override;
  // TrainResult: the delta, num_examples, steps, examples_processed, train_loss_first/last from
  // LocalOutcome, and metrics["train_loss_mean"].
  absl::StatusOr<TrainResult> Train(const TrainTask& task,
                                    const std::vector<NamedTensor>& global) override;

 private:
  SiteLoader loader_;
  std::optional<Site> site_;
};

template <class Model>
std::vector<NamedTensor> AdapterDelta(Model& model, const std::vector<NamedTensor>& global) {
  std::map<std::string_view, const NamedTensor*> by_name;
  for (const NamedTensor& g : global) by_name[g.name] = &g;
  std::vector<NamedTensor> delta;
  for (const Param& p : model.trainable_params()) {
    if (p.frozen) continue;
    const NamedTensor& g = *by_name.at(p.name);  // LoadAdapter checked every name and shape
    NamedTensor d{p.name, p.shape, std::vector<float>(p.value.size())};
    for (size_t i = 0; i < d.values.size(); ++i) d.values[i] = p.value[i] - g.values[i];
    delta.push_back(std::move(d));
  }
  return delta;
}

}  // namespace fedlora
