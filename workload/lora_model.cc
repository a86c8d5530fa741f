#include "workload/lora_model.h"

#include <algorithm>
#include <numeric>
#include <type_traits>

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

// The step callback both trainers take: collects the losses and examples, reports progress.
template <class Trainer>
void CollectSteps(Trainer& trainer, std::vector<float>& losses, int64_t& examples,
                  const StepProgress& progress) {
  trainer.on_step = [&losses, &examples, &progress](const StepReport& r) {
    losses.push_back(r.loss);
    examples += r.examples;
    if (progress) progress(r.step, r.total_steps);
  };
}

}  // namespace

int64_t TaskData::size() const {
  if (examples != nullptr) return examples->size();
  return conversations != nullptr ? conversations->size() : 0;
}

absl::StatusOr<LocalOutcome> TrainLocally(BertClassifier& model, const TokenizedDataset& data,
                                          const TrainOptions& options,
                                          const StepProgress& progress) {
  std::vector<float> losses;
  int64_t examples = 0;
  fedlora::Trainer trainer(model, options);
  CollectSteps(trainer, losses, examples, progress);
  FEDLORA_RETURN_IF_ERROR(trainer.Train(data, nullptr));
  return OutcomeOf(losses, examples, data.size());
}

absl::StatusOr<LocalOutcome> TrainLocally(CausalLm& model, const LmDataset& data,
                                          const TrainOptions& options,
                                          const StepProgress& progress) {
  std::vector<float> losses;
  int64_t examples = 0;
  LmTrainer trainer(model, options);
  CollectSteps(trainer, losses, examples, progress);
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

absl::StatusOr<LocalOutcome> ClassifierModel::Train(const TaskData& data,
                                                    const std::vector<int64_t>* indices,
                                                    const TrainOptions& options,
                                                    const StepProgress& progress) {
  if (data.examples == nullptr) {
    return absl::FailedPreconditionError(
        "a SEQUENCE_CLASSIFICATION model trains on labelled examples, not conversations");
  }
  if (indices != nullptr) return TrainLocally(*model_, *data.examples, *indices, options, progress);
  return TrainLocally(*model_, *data.examples, options, progress);
}

absl::StatusOr<LocalOutcome> CausalLmModel::Train(const TaskData& data,
                                                  const std::vector<int64_t>* indices,
                                                  const TrainOptions& options,
                                                  const StepProgress& progress) {
  if (data.conversations == nullptr) {
    return absl::FailedPreconditionError(
        "a CAUSAL_LM model trains on conversations, not labelled examples");
  }
  if (indices != nullptr) {
    return TrainLocally(*model_, *data.conversations, *indices, options, progress);
  }
  return TrainLocally(*model_, *data.conversations, options, progress);
}

}  // namespace fedlora
