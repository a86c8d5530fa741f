// The optimizer-step loop that the classifier Trainer (train/trainer.h) and the causal-LM trainer
// (train/lm_trainer.h) share: epochs in seeded orders, micro-batches accumulated into one step,
// gradient averaging, FedProx's proximal term, global-norm clipping, the schedule, the optimizer,
// the progress display, and the non-finite checks. The model is seen only through callbacks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/device_params.h"
#include "model/param.h"
#include "train/optim.h"
#include "train/trainer.h"

namespace fedlora {

struct TrainLoop {
  // The trainable params (their grads are read and scaled, their values stepped).
  std::vector<Param>* params = nullptr;
  std::function<void()> zero_grad;
  // Runs one micro-batch (the examples at `indices`) in training mode and ADDS the gradient of its
  // mean loss to the params' grads; returns that mean loss.
  std::function<absl::StatusOr<float>(std::span<const int64_t> indices, uint64_t dropout_seed)>
      forward_backward;
  // Token counts of the examples, for group_by_length.
  std::vector<int64_t> lengths;
  // Called after every epoch with epoch, steps so far, mean training loss and seconds.
  std::function<absl::Status(int epoch, int64_t steps, double train_loss, double seconds)>
      after_epoch;
  std::function<void(const StepReport&)> on_step;
  // The model's params where its kernels read them. With step_on_device and an AdamW optimizer,
  // the loop holds them there for the whole run and steps with train/device_step.h (ModelTrainLoop
  // turns it on for a model on a GPU; tests turn it on for the CPU backend); otherwise the
  // gradients come to the host after each backward and the optimizer steps there.
  DeviceParams* device = nullptr;
  bool step_on_device = false;
};

// A loop over `model` (trainable_params, ZeroGrad, ForwardBackward(batch, seed)) training on
// `data` (examples with input_ids), each micro-batch built by make_batch(data, indices).
template <class Model, class Data, class MakeBatchFn>
TrainLoop ModelTrainLoop(Model& model, const Data& data, MakeBatchFn make_batch) {
  TrainLoop loop;
  loop.params = &model.trainable_params();
  loop.zero_grad = [&model] { model.ZeroGrad(); };
  loop.device = &model.device_params();
  loop.step_on_device = !loop.device->on_host();
  loop.forward_backward = [&model, &data, make_batch](std::span<const int64_t> indices,
                                                      uint64_t seed) {
    return model.ForwardBackward(make_batch(data, indices), seed);
  };
  loop.lengths.reserve(data.examples.size());
  for (const auto& e : data.examples)
    loop.lengths.push_back(static_cast<int64_t>(e.input_ids.size()));
  return loop;
}

// Runs the loop over lengths.size() examples under `options` (already validated). Writes the
// optimizer it made into *optimizer. FailedPrecondition when the loss or the gradient norm becomes
// non-finite; the callbacks' errors are returned as they are.
absl::Status RunTrainLoop(const TrainOptions& options, const TrainLoop& loop,
                          std::unique_ptr<Optimizer>* optimizer);

// The epoch order (as EpochOrder) for examples of these lengths.
std::vector<int64_t> EpochOrderOfLengths(std::span<const int64_t> lengths,
                                         const TrainOptions& options, int epoch);

// Optimizer steps per epoch for `n` examples.
int64_t StepsPerEpochOf(const TrainOptions& options, int64_t n);

}  // namespace fedlora
