// A model's trainable params where its kernels read them: on the CPU the params' own vectors; on a
// GPU device copies, uploaded before each call and whose gradients are downloaded after a backward.
// While a training loop that steps on the device holds them (Acquire .. Release), the device
// copies are the params: calls neither upload the values nor download the gradients, and the host
// vectors are stale until Release. Also the staging of host inputs. Shared by BertClassifier and
// CausalLm; the trainers (train/train_loop.h) reach it through the models' device_params().
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/base/backend.h"
#include "model/param.h"

namespace fedlora {

class DeviceParams {
 public:
  explicit DeviceParams(std::vector<Param>& params) : params_(params) {}

  // Allocates the device copies (GPU; nothing on the CPU). Call once the params have their shapes.
  absl::Status Bind(kernels::Backend& backend) {
    backend_ = &backend;
    resident_ = false;
    value_.clear();
    grad_.clear();
    if (on_host()) return absl::OkStatus();
    for (const Param& p : params_) {
      FEDLORA_ASSIGN_OR_RETURN(auto v, kernels::DeviceArray<float>::Zeros(backend, p.value.size()));
      FEDLORA_ASSIGN_OR_RETURN(auto g, kernels::DeviceArray<float>::Zeros(backend, p.grad.size()));
      value_.push_back(std::move(v));
      grad_.push_back(std::move(g));
    }
    return absl::OkStatus();
  }
  bool on_host() const { return backend_ == nullptr || backend_->device() == Device::kCpu; }
  kernels::Backend& backend() { return *backend_; }
  int size() const { return static_cast<int>(params_.size()); }
  const Param& param(int i) const { return params_[i]; }
  float* Value(int i) { return on_host() ? params_[i].value.data() : value_[i].data(); }
  float* Grad(int i) { return on_host() ? params_[i].grad.data() : grad_[i].data(); }

  // The values to the device, and from now on the device copies are the params' truth.
  absl::Status Acquire() {
    if (resident_)
      return absl::FailedPreconditionError("the params are already held on the device");
    FEDLORA_RETURN_IF_ERROR(ToDevice(/*grads=*/false));
    resident_ = true;
    return absl::OkStatus();
  }
  // The values and gradients back to the host, which is the params' truth again.
  absl::Status Release() {
    if (!resident_) return absl::OkStatus();
    resident_ = false;
    if (on_host()) return absl::OkStatus();
    for (size_t i = 0; i < params_.size(); ++i) {
      FEDLORA_RETURN_IF_ERROR(backend_->Download(params_[i].value.data(), value_[i].data(),
                                                 params_[i].value.size() * sizeof(float)));
    }
    return GradsToHost();
  }
  bool resident() const { return resident_; }
  // Zeroes the gradients where they are the truth (the device copies while held).
  absl::Status ZeroGrads() {
    if (!resident_ || on_host()) {
      for (Param& p : params_) std::fill(p.grad.begin(), p.grad.end(), 0.0f);
      return absl::OkStatus();
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      FEDLORA_RETURN_IF_ERROR(backend_->Zero(grad_[i].data(), grad_[i].size() * sizeof(float)));
    }
    return absl::OkStatus();
  }

  // The values (and with `grads` the gradients, which a backward adds to) to the device; nothing
  // while held.
  absl::Status ToDevice(bool grads) {
    if (on_host() || resident_) return absl::OkStatus();
    for (size_t i = 0; i < params_.size(); ++i) {
      const size_t bytes = params_[i].value.size() * sizeof(float);
      FEDLORA_RETURN_IF_ERROR(backend_->Upload(value_[i].data(), params_[i].value.data(), bytes));
      if (grads)
        FEDLORA_RETURN_IF_ERROR(backend_->Upload(grad_[i].data(), params_[i].grad.data(), bytes));
    }
    return absl::OkStatus();
  }
  // The gradients to the host; nothing while held (Release downloads them).
  absl::Status GradsToHost() {
    if (on_host() || resident_) return absl::OkStatus();
    for (size_t i = 0; i < params_.size(); ++i) {
      FEDLORA_RETURN_IF_ERROR(backend_->Download(params_[i].grad.data(), grad_[i].data(),
                                                 params_[i].grad.size() * sizeof(float)));
    }
    return absl::OkStatus();
  }

 private:
  std::vector<Param>& params_;
  kernels::Backend* backend_ = nullptr;
  bool resident_ = false;
  std::vector<kernels::DeviceArray<float>> value_, grad_;
};

// The backend for `device`; *ctx becomes its context, keeping the CPU pool *ctx had.
inline absl::StatusOr<std::shared_ptr<kernels::Backend>> OpenBackend(Device device,
                                                                     kernels::ExecContext* ctx) {
  FEDLORA_ASSIGN_OR_RETURN(auto backend, kernels::Backend::Create(device));
  ThreadPool* pool = ctx->pool;
  *ctx = backend->ctx();
  ctx->pool = pool;
  return backend;
}

// The first `count` values of `host` where the kernels read them: `host` itself on the CPU, its
// copy in `dev` (uploaded now) on a GPU.
template <class T>
absl::StatusOr<const T*> Stage(kernels::Backend& backend, const std::vector<T>& host, size_t count,
                               kernels::DeviceArray<T>& dev) {
  if (backend.device() == Device::kCpu) return host.data();
  if (count > dev.size() || count > host.size()) {
    return absl::InternalError(absl::StrCat("staging ", count, " values into ", dev.size()));
  }
  FEDLORA_RETURN_IF_ERROR(backend.Upload(dev.data(), host.data(), count * sizeof(T)));
  return static_cast<const T*>(dev.data());
}

}  // namespace fedlora
