// The simulation's workload: the run's model pool, training data, held-out evaluator and the local
// training options, built once by workload/factory.h and shared read-only by every virtual
// client. Local training of a virtual client is the SDK's built-in trainer
// (client/lora/lora_trainer.h) on the client's subset of the training data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "fedlora/v1/config.pb.h"
#include "train/trainer.h"
#include "workload/factory.h"

namespace fedlora::sim {

struct SimData {
  // num_models models on one base; data.train_path tokenized; data.eval_path's evaluator.
  Workload workload;
  // The partition key of each training example (simulation.partition_key_field), when BY_KEY.
  std::vector<std::string> train_keys;
  // Local training settings from config.training (the task's own fields override them per round).
  std::shared_ptr<const TrainOptions> train_options;

  bool causal_lm() const { return workload.kind == v1::TaskConfig::CAUSAL_LM; }
  int64_t train_size() const { return static_cast<int64_t>(workload.train_labels.size()); }
  int64_t eval_size() const { return workload.evaluator ? workload.evaluator->size() : 0; }
  // Labels the partitioner sees: label_names' count, at least 1.
  int num_partition_labels() const;
};

// Loads the run's workload (data.train_path and data.eval_path both required) with `num_models`
// models computing on `device`, the partition keys (BY_KEY) and the training options.
absl::StatusOr<SimData> LoadSimData(const v1::RunConfig& config, Device device, int num_models);

}  // namespace fedlora::sim
