// The one interface an edge site implements: given the round's global LoRA adapter and the task's
// settings, fine-tune locally and return the change (delta) of the adapter. (Named ClientTrainer so
// that it never clashes with train/'s fedlora::Trainer, which a built-in ClientTrainer wraps.)
//
//   class MyTrainer : public fedlora::ClientTrainer {
//    public:
//     absl::StatusOr<fedlora::TrainResult> Train(const fedlora::TrainTask& task,
//                                                const std::vector<fedlora::NamedTensor>& global) override {
//       fedlora::TrainResult result;
//       result.delta = ...;            // same names and shapes as `global`, values = local - global
//       result.num_examples = 1200;    // the FedAvg weight
//       return result;
//     }
//   };
//
// Plain structs only: this header never shows protobuf, gRPC or CUDA types.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/named_tensor.h"  // NamedTensor: one named fp32 tensor

namespace fedlora {

// What the server asks one client to do in one round.
struct TrainTask {
  uint64_t round = 0;   // >= 1
  std::string task_id;  // binds the upload to this assignment
  uint64_t seed = 0;    // for everything random in local training (shuffling, dropout)
  // Local work: exactly one of local_epochs / local_steps is > 0.
  uint32_t local_epochs = 0;
  uint32_t local_steps = 0;
  uint32_t batch_size = 0;     // examples per forward/backward pass
  double learning_rate = 0.0;  // peak learning rate
  double proximal_mu = 0.0;    // FedProx: add (mu / 2) * ||w - w_global||^2 to the loss; 0 = none
  uint32_t deadline_seconds = 0;  // from when the task was received until the upload must be done
  // The run's whole config as the server shares it with clients (model id and hash, LoRA shape, the
  // rest of the training settings), as JSON with snake_case field names (see config.proto).
  std::string run_config_json;
  // Set by the SDK: the trainer may call it after each optimizer step with the steps done and
  // planned (thread-safe, cheap); the client's heartbeats carry the latest figures to the server,
  // except under secure aggregation or DP, where a step count would disclose the data's size.
  std::function<void(int64_t steps_done, int64_t steps_total)> report_progress;
};

struct TrainResult {
  // The adapter's change: local adapter minus `global_adapter`, same names and shapes. A run with
  // lora.freeze_a (in TrainTask::run_config_json) trains no lora_A: leave every one out.
  std::vector<NamedTensor> delta;
  int64_t num_examples = 0;  // training examples the delta was computed from (FedAvg weight), >= 1
  // Mean training loss over the first and last epoch (or 10% of steps); reported to the server.
  double train_loss_first = 0.0;
  double train_loss_last = 0.0;
  int64_t steps = 0;                      // optimizer steps taken
  int64_t examples_processed = 0;         // examples seen, counting repeats over epochs
  std::map<std::string, double> metrics;  // any other named figures, reported as "extra"
};

class ClientTrainer {
 public:
  virtual ~ClientTrainer() = default;
  // Called once the client has joined a run, before it asks for a task, with the run config as
  // TrainTask.run_config_json: checks (and may load) what training will need, so that a site that
  // cannot take part says so at once rather than when its first task arrives. Errors as for Train.
  // The default does nothing.
  virtual absl::Status Prepare(const std::string& run_config_json) {
    (void)run_config_json;
    return absl::OkStatus();
  }
  // Fine-tunes from `global_adapter` and returns the delta. Called from the thread that runs
  // Client::RunUntilDone, one task at a time. An error that trying again cannot fix
  // (InvalidArgument, FailedPrecondition, NotFound, Unimplemented, PermissionDenied, OutOfRange,
  // DataLoss, AlreadyExists: the site's data or model does not fit the run) ends the run for this
  // site: the client leaves with it (the server shows the site FAILED) and RunUntilDone returns it.
  // Any other error (Unavailable, ResourceExhausted, Internal, ...) is logged and the task taken
  // again after a backoff, RetryPolicy.max_attempts times in a row at most.
  virtual absl::StatusOr<TrainResult> Train(const TrainTask& task,
                                            const std::vector<NamedTensor>& global_adapter) = 0;
};

}  // namespace fedlora
