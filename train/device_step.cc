#include "train/device_step.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/adamw.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace fedlora {

absl::StatusOr<std::unique_ptr<DeviceAdamW>> DeviceAdamW::Create(DeviceParams& params,
                                                                 const Optimizer& optimizer,
                                                                 bool proximal) {
  if (optimizer.name() != "adamw") {
    return absl::InvalidArgumentError(absl::StrCat(
        "the device step is AdamW's; '", std::string(optimizer.name()), "' steps on the host"));
  }
  if (!params.resident())
    return absl::FailedPreconditionError("DeviceAdamW: the params are not held on the device");
  std::unique_ptr<DeviceAdamW> d(new DeviceAdamW(params, optimizer.options()));
  kernels::Backend& be = params.backend();
  const OptimizerState state = optimizer.ExportState();
  d->step_ = state.step;
  size_t largest = 1;
  for (int i = 0; i < params.size(); ++i) {
    const Param& p = params.param(i);
    const size_t n = p.frozen ? 0 : p.value.size();  // a frozen param has no state
    largest = std::max(largest, n);
    FEDLORA_ASSIGN_OR_RETURN(auto m,
                             kernels::DeviceArray<float>::Zeros(be, std::max<size_t>(n, 1)));
    FEDLORA_ASSIGN_OR_RETURN(auto v,
                             kernels::DeviceArray<float>::Zeros(be, std::max<size_t>(n, 1)));
    for (const OptimizerStateTensor& t : state.tensors) {
      if (n == 0) break;
      kernels::DeviceArray<float>* slot = t.name == p.name + ".exp_avg"      ? &m
                                          : t.name == p.name + ".exp_avg_sq" ? &v
                                                                             : nullptr;
      if (slot == nullptr) continue;
      if (t.value.size() != n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state ", t.name, " has ", t.value.size(), " values for a param of ", n));
      }
      FEDLORA_RETURN_IF_ERROR(be.Upload(slot->data(), t.value.data(), n * sizeof(float)));
    }
    d->m_.push_back(std::move(m));
    d->v_.push_back(std::move(v));
    if (proximal) {
      // The host values are the device's: the params were uploaded when they were acquired.
      FEDLORA_ASSIGN_OR_RETURN(auto a,
                               kernels::DeviceArray<float>::Zeros(be, std::max<size_t>(n, 1)));
      FEDLORA_RETURN_IF_ERROR(be.Upload(a.data(), p.value.data(), n * sizeof(float)));
      d->anchor_.push_back(std::move(a));
    }
  }
  if (proximal) {
    FEDLORA_ASSIGN_OR_RETURN(d->scratch_, kernels::DeviceArray<float>::Zeros(be, largest));
  }
  FEDLORA_ASSIGN_OR_RETURN(d->sum_, kernels::DeviceArray<float>::Zeros(be, 1));
  return d;
}

absl::Status DeviceAdamW::Average(float factor) {
  const kernels::ExecContext& ctx = params_.backend().ctx();
  for (int i = 0; i < params_.size(); ++i) {
    const int64_t n = Trained(i);
    if (n == 0) continue;
    FEDLORA_RETURN_IF_ERROR(kernels::Scale(ctx, {.n = n, .alpha = factor, .x = params_.Grad(i)}));
  }
  return absl::OkStatus();
}

absl::Status DeviceAdamW::AddProximal(float mu) {
  if (anchor_.empty() && params_.size() > 0) {
    return absl::FailedPreconditionError(
        "DeviceAdamW: AddProximal without an anchor (Create with proximal)");
  }
  const kernels::ExecContext& ctx = params_.backend().ctx();
  for (int i = 0; i < params_.size(); ++i) {
    const int64_t n = Trained(i);
    if (n == 0) continue;
    // (value - anchor) first, then scaled onto the gradient: the host loop's order.
    FEDLORA_RETURN_IF_ERROR(kernels::Add(ctx, {.n = n,
                                               .a = params_.Value(i),
                                               .b = anchor_[i].data(),
                                               .alpha = -1.0f,
                                               .out = scratch_.data()}));
    FEDLORA_RETURN_IF_ERROR(kernels::Add(
        ctx,
        {.n = n, .a = params_.Grad(i), .b = scratch_.data(), .alpha = mu, .out = params_.Grad(i)}));
  }
  return absl::OkStatus();
}

absl::StatusOr<float> DeviceAdamW::GradNorm() {
  kernels::Backend& be = params_.backend();
  std::vector<const float*> grads;
  std::vector<int64_t> sizes;
  for (int i = 0; i < params_.size(); ++i) {
    const int64_t n = Trained(i);
    if (n == 0) continue;
    grads.push_back(params_.Grad(i));
    sizes.push_back(n);
  }
  FEDLORA_RETURN_IF_ERROR(
      kernels::SumSquaresMany(be.ctx(), {.tensors = static_cast<int64_t>(grads.size()),
                                         .x = grads.data(),
                                         .n = sizes.data(),
                                         .result = sum_.data()}));
  float sum = 0.0f;
  FEDLORA_RETURN_IF_ERROR(be.Download(&sum, sum_.data(), sizeof(float)));
  return std::sqrt(sum);
}

absl::Status DeviceAdamW::Step(float lr, float grad_scale) {
  const kernels::ExecContext& ctx = params_.backend().ctx();
  ++step_;
  for (int i = 0; i < params_.size(); ++i) {
    const Param& p = params_.param(i);
    if (Trained(i) == 0) continue;
    kernels::AdamWArgs args;
    args.n = p.numel();
    args.param = params_.Value(i);
    args.grad = params_.Grad(i);
    args.m = m_[i].data();
    args.v = v_[i].data();
    args.lr = lr;
    args.beta1 = options_.beta1;
    args.beta2 = options_.beta2;
    args.eps = options_.eps;
    args.weight_decay = Optimizer::DecaysParam(p, options_) ? options_.weight_decay : 0.0f;
    args.step = step_;
    args.grad_scale = grad_scale;
    FEDLORA_RETURN_IF_ERROR(kernels::AdamWStep(ctx, args));
  }
  return absl::OkStatus();
}

absl::Status DeviceAdamW::ExportTo(Optimizer& optimizer) const {
  OptimizerState state;
  state.optimizer = std::string(optimizer.name());
  state.step = step_;
  kernels::Backend& be = params_.backend();
  for (int i = 0; i < params_.size(); ++i) {
    const Param& p = params_.param(i);
    if (p.frozen) continue;  // the host optimizer keeps no state for it either
    for (const auto& [suffix, slot] :
         {std::pair{".exp_avg", &m_[i]}, std::pair{".exp_avg_sq", &v_[i]}}) {
      OptimizerStateTensor t{p.name + suffix, p.shape, std::vector<float>(p.value.size())};
      FEDLORA_RETURN_IF_ERROR(
          be.Download(t.value.data(), slot->data(), t.value.size() * sizeof(float)));
      state.tensors.push_back(std::move(t));
    }
  }
  return optimizer.ImportState(state);
}

}  // namespace fedlora
