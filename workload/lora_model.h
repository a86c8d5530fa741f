// A model with LoRA adapters, whatever its family and task: what the trainers
// (client/lora/lora_trainer.h), the held-out evaluators (workload/evaluator.h) and the simulator's
// model pool need of it. Two implementations: ClassifierModel (model/bert.h BertClassifier,
// SEQUENCE_CLASSIFICATION) and CausalLmModel (model/decoder.h CausalLm, CAUSAL_LM).
// workload/factory.h builds them for a run.
//
//   std::unique_ptr<LoraModel> m = std::make_unique<ClassifierModel>(std::move(classifier));
//   FEDLORA_RETURN_IF_ERROR(LoadAdapter(global, *m));
//   FEDLORA_ASSIGN_OR_RETURN(LocalOutcome o, m->Train(data, nullptr, options, {}));
//
// The per-batch forward, loss and backward stay in train/'s typed loops (train/trainer.h,
// train/lm_trainer.h), called by Train unchanged: the interface sits at the task, not the batch,
// so the hot path keeps its kernels and float op order.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/named_tensor.h"
#include "fedlora/v1/config.pb.h"
#include "model/adapter_dir.h"
#include "model/bert.h"
#include "model/decoder.h"
#include "train/lm_data.h"
#include "train/trainer.h"

namespace fedlora {

class ThreadPool;  // core/thread_pool.h

// A tokenized data set of the run's task kind, shared read-only: labelled examples
// (SEQUENCE_CLASSIFICATION) or conversations (CAUSAL_LM). Converts from either pointer.
struct TaskData {
  TaskData() = default;
  TaskData(std::shared_ptr<const TokenizedDataset> d) : examples(std::move(d)) {}  // NOLINT
  TaskData(std::shared_ptr<const LmDataset> d) : conversations(std::move(d)) {}    // NOLINT
  std::shared_ptr<const TokenizedDataset> examples;
  std::shared_ptr<const LmDataset> conversations;

  bool empty() const { return examples == nullptr && conversations == nullptr; }
  int64_t size() const;
};

// What one local task did.
struct LocalOutcome {
  int64_t num_examples = 0;        // size of the training (sub)set (the FedAvg weight)
  int64_t steps = 0;               // optimizer steps taken
  int64_t examples_processed = 0;  // examples seen, counting repeats
  double loss_first = 0;           // mean step loss over the first 10% of steps (at least one)
  double loss_last = 0;            // ... over the last 10%
  double loss_mean = 0;            // mean step loss over the whole task
};

// Called after each optimizer step with the steps done and planned.
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

class LoraModel {
 public:
  virtual ~LoraModel() = default;
  // The task the model serves: SEQUENCE_CLASSIFICATION or CAUSAL_LM.
  virtual v1::TaskConfig::Kind kind() const = 0;
  // The LoRA A/B matrices (and a classifier's head) by name, in the model's order. Values may be
  // changed in place; the vector keeps its size and shapes.
  virtual std::vector<Param>& trainable_params() = 0;
  // The pool the model's CPU kernels run on (null: the kernels' default pool).
  virtual void SetThreadPool(ThreadPool* pool) = 0;
  // Fine-tunes on all of `data`, or on data[*indices] when `indices` is not null (errors as
  // TrainLocally). FailedPrecondition when `data` is not of the model's task kind.
  virtual absl::StatusOr<LocalOutcome> Train(const TaskData& data,
                                             const std::vector<int64_t>* indices,
                                             const TrainOptions& options,
                                             const StepProgress& progress) = 0;
  // Writes the adapter as an adapter directory (model/adapter_dir.h SaveAdapterDirectory).
  virtual absl::Status SaveAdapter(const AdapterMetadata& meta, const std::string& dir) const = 0;
};

class ClassifierModel final : public LoraModel {
 public:
  explicit ClassifierModel(std::shared_ptr<BertClassifier> model) : model_(std::move(model)) {}
  v1::TaskConfig::Kind kind() const override { return v1::TaskConfig::SEQUENCE_CLASSIFICATION; }
  std::vector<Param>& trainable_params() override { return model_->trainable_params(); }
  void SetThreadPool(ThreadPool* pool) override { model_->SetThreadPool(pool); }
  absl::StatusOr<LocalOutcome> Train(const TaskData& data, const std::vector<int64_t>* indices,
                                     const TrainOptions& options,
                                     const StepProgress& progress) override;
  absl::Status SaveAdapter(const AdapterMetadata& meta, const std::string& dir) const override {
    return SaveAdapterDirectory(*model_, meta, dir);
  }
  BertClassifier& model() { return *model_; }

 private:
  std::shared_ptr<BertClassifier> model_;
};

class CausalLmModel final : public LoraModel {
 public:
  explicit CausalLmModel(std::shared_ptr<CausalLm> model) : model_(std::move(model)) {}
  v1::TaskConfig::Kind kind() const override { return v1::TaskConfig::CAUSAL_LM; }
  std::vector<Param>& trainable_params() override { return model_->trainable_params(); }
  void SetThreadPool(ThreadPool* pool) override { model_->SetThreadPool(pool); }
  absl::StatusOr<LocalOutcome> Train(const TaskData& data, const std::vector<int64_t>* indices,
                                     const TrainOptions& options,
                                     const StepProgress& progress) override;
  absl::Status SaveAdapter(const AdapterMetadata& meta, const std::string& dir) const override {
    return SaveAdapterDirectory(*model_, meta, dir);
  }
  CausalLm& model() { return *model_; }

 private:
  std::shared_ptr<CausalLm> model_;
};

// A copy of `model`'s adapter (its trainable_params, in their order), as the federation sends it.
template <class Model>
std::vector<NamedTensor> AdapterOf(Model& model) {
  std::vector<NamedTensor> adapter;
  for (const Param& p : model.trainable_params()) adapter.push_back({p.name, p.shape, p.value});
  return adapter;
}

// Copies `adapter` (NamedTensors, or any struct with name, shape and values; names as
// the model's trainable_params) into `model` (a LoraModel, BertClassifier or CausalLm).
// InvalidArgument unless every trainable param is present with its shape and the adapter has no
// other tensor.
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

}  // namespace fedlora
