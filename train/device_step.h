// AdamW where a model's params live (model/device_params.h), for a training loop whose model runs
// on a GPU: the gradients never leave the device. Per optimizer step the loop calls Average (the
// mean over micro-batches), AddProximal (FedProx), GradNorm (the global L2 norm: the one value that
// crosses to the host), then Step with the clip factor, which AdamW applies as it reads each
// gradient (kernels::AdamWArgs::grad_scale) instead of in a pass of its own. The moments stay in
// device memory; ExportTo hands them and the step count to the host optimizer, so checkpoints see
// the same state as after a host step.
//
// It runs on the CPU backend as well (the params' own vectors are the "device" copies there), where
// tests compare it with the host loop: the same AdamW kernel on the same gradients, with the norm
// summed per tensor in double and rounded to fp32 per tensor (kernels::SumSquaresMany) instead of over
// all tensors at once, so the params agree to fp32 rounding.
//
// LAMB and SGD have no device step: a GPU loop with them steps on the host (train/train_loop.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/base/backend.h"
#include "model/device_params.h"
#include "train/optim.h"

namespace fedlora {

class DeviceAdamW {
 public:
  // `params` must be held (DeviceParams::Acquire) for as long as this is used. `optimizer` must be
  // an AdamW (InvalidArgument otherwise); its state, if any, becomes the starting moments.
  // `proximal` keeps a copy of the params as they are now, FedProx's anchor.
  static absl::StatusOr<std::unique_ptr<DeviceAdamW>> Create(DeviceParams& params,
                                                             const Optimizer& optimizer,
                                                             bool proximal);

  // grad *= factor, for every param.
  absl::Status Average(float factor);
  // grad += mu * (value - anchor), for every param (Create with proximal).
  absl::Status AddProximal(float mu);
  // sqrt(sum over params of sum grad^2).
  absl::StatusOr<float> GradNorm();
  // One AdamW step at learning rate lr on grad_scale * grad.
  absl::Status Step(float lr, float grad_scale);
  // The moments and step count into `optimizer` (the AdamW given to Create), by ImportState.
  absl::Status ExportTo(Optimizer& optimizer) const;

 private:
  DeviceAdamW(DeviceParams& params, const OptimizerOptions& options)
      : params_(params), options_(options) {}
  // Param i's elements that train: 0 for a frozen one (Param::frozen), which every step skips.
  int64_t Trained(int i) const { return params_.param(i).frozen ? 0 : params_.param(i).numel(); }

  DeviceParams& params_;
  OptimizerOptions options_;  // eps resolved
  int64_t step_ = 0;
  std::vector<kernels::DeviceArray<float>> m_, v_, anchor_;
  kernels::DeviceArray<float> scratch_;  // value - anchor, the largest param's size
  kernels::DeviceArray<float> sum_;      // [1], the squared norm
};

}  // namespace fedlora
