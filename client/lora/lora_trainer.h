// The SDK's built-in ClientTrainer: LoRA fine-tuning with train/'s trainers, of a BertClassifier
// (model/bert.h, SEQUENCE_CLASSIFICATION, train/trainer.h) or a CausalLm (model/decoder.h,
// CAUSAL_LM, train/lm_trainer.h). Internal to fedlora::client (it shows model/ and train/ types,
// so it is not under include/fedlora/); used by `fedlora client` (one model, the site's own data
// file) and by `fedlora simulate` (models borrowed from a pool, one example subset per virtual
// client).
//
//   LoraTrainer::Site site;             // LoraTrainer::DecoderSite for a CausalLm
//   site.acquire_model = [&model] {     // an owned model: the lease gives nothing back
//     return LoraTrainer::ModelLease(model.get(), [](BertClassifier*) {});
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

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "fedlora/client_trainer.h"
#include "fedlora/v1/config.pb.h"
#include "model/bert.h"
#include "model/decoder.h"
#include "train/lm_data.h"
#include "train/trainer.h"

namespace fedlora {

// What one local task did.
struct LocalOutcome {
  int64_t num_examples = 0;        // size of the training (sub)set (the FedAvg weight)
  int64_t steps = 0;               // optimizer steps taken
  int64_t examples_processed = 0;  // examples seen, counting repeats
  double loss_first = 0;           // mean step loss over the first 10% of steps (at least one)
  double loss_last = 0;            // ... over the last 10%
  double loss_mean = 0;            // mean step loss over the whole task
};

// `base` (the run config's options) with the task's overrides: local_steps (> 0) or else
// local_epochs (at least 1); batch_size and learning_rate when > 0; the task's proximal_mu and
// seed; no progress.
TrainOptions TaskTrainOptions(const TrainOptions& base, const TrainTask& task);

// Called after each optimizer step with the steps done and planned (TrainTask::report_progress).
using StepProgress = std::function<void(int64_t steps_done, int64_t steps_total)>;

// Fine-tunes `model`'s trainable params (already set to the global adapter) on all of `data`.
// Not thread-safe for one model; distinct models may train concurrently.
absl::StatusOr<LocalOutcome> TrainLocally(BertClassifier& model, const TokenizedDataset& data,
                                          const TrainOptions& options,
                                          const StepProgress& progress = {});
absl::StatusOr<LocalOutcome> TrainLocally(CausalLm& model, const LmDataset& data,
                                          const TrainOptions& options,
                                          const StepProgress& progress = {});
// ... on data[indices]: InvalidArgument when `indices` is empty, OutOfRange for an index
// outside the data.
absl::StatusOr<LocalOutcome> TrainLocally(BertClassifier& model, const TokenizedDataset& data,
                                          std::span<const int64_t> indices,
                                          const TrainOptions& options,
                                          const StepProgress& progress = {});
absl::StatusOr<LocalOutcome> TrainLocally(CausalLm& model, const LmDataset& data,
                                          std::span<const int64_t> indices,
                                          const TrainOptions& options,
                                          const StepProgress& progress = {});

// Copies `adapter` (any struct with name, shape and values, e.g. NamedTensor or UpdateTensor;
// names as the model's trainable_params) into `model` (a BertClassifier or a CausalLm).
// InvalidArgument unless every trainable param is present with its shape and the adapter has no
// other tensor.
template <class Tensor, class Model>
absl::Status LoadAdapter(const std::vector<Tensor>& adapter, Model& model);

// The model's trainable params minus `global` (which LoadAdapter accepted), in the model's order.
template <class Model>
std::vector<NamedTensor> AdapterDelta(Model& model, const std::vector<NamedTensor>& global);

// Where one site trains: a model source, its data and its options.
template <class Model, class Data>
struct LoraSite {
  // A model lent for one task; the deleter gives it back (a pool) or does nothing (an owned model).
  using Lease = std::unique_ptr<Model, std::function<void(Model*)>>;
  // Lends a model whose LoRA shape (and labels) match the run; may block until one is free.
  std::function<Lease()> acquire_model;
  std::shared_ptr<const Data> data;
  // The examples of `data` this site trains on; none: all of them. An empty subset fails every
  // task (InvalidArgument).
  std::optional<std::vector<int64_t>> indices;
  // The run config's options (TrainOptionsFromConfig); each task overrides its own fields.
  std::shared_ptr<const TrainOptions> options;
  bool log_tasks = false;  // one INFO line per task (steps, loss)
};

class LoraTrainer final : public ClientTrainer {
 public:
  using Site = LoraSite<BertClassifier, TokenizedDataset>;
  using DecoderSite = LoraSite<CausalLm, LmDataset>;
  using ModelLease = Site::Lease;
  using DecoderLease = DecoderSite::Lease;
  using AnySite = std::variant<Site, DecoderSite>;
  // Builds the site at the first task, from the run config the server sent
  // (TrainTask::run_config_json), when the model and data depend on it.
  using SiteLoader = std::function<absl::StatusOr<AnySite>(const v1::RunConfig& config)>;

  explicit LoraTrainer(Site site);
  explicit LoraTrainer(DecoderSite site);
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
  std::optional<AnySite> site_;
};

template <class Tensor, class Model>
absl::Status LoadAdapter(const std::vector<Tensor>& adapter, Model& model) {
  std::map<std::string_view, const Tensor*> by_name;
  for (const Tensor& t : adapter) by_name[t.name] = &t;
  for (Param& p : model.trainable_params()) {
    auto it = by_name.find(p.name);
    if (it == by_name.end())
      return absl::InvalidArgumentError(absl::StrCat("global adapter lacks '", p.name, "'"));
    const Tensor& t = *it->second;
    if (t.shape != p.shape || t.values.size() != p.value.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("global adapter tensor '", p.name, "' has the wrong shape"));
    }
    std::copy(t.values.begin(), t.values.end(), p.value.begin());
  }
  if (by_name.size() != model.trainable_params().size()) {
    return absl::InvalidArgumentError(absl::StrCat("global adapter has ", by_name.size(),
                                                   " tensors, the model ",
                                                   model.trainable_params().size()));
  }
  return absl::OkStatus();
}

template <class Model>
std::vector<NamedTensor> AdapterDelta(Model& model, const std::vector<NamedTensor>& global) {
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

}  // namespace fedlora
