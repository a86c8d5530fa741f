#include "kernels/mirror.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace fedlora::kernels {

absl::Status DeviceMirror::Add(const void* host, size_t bytes) {
  if (host == nullptr || bytes == 0 || backend_->device() == Device::kCpu) return absl::OkStatus();
  if (copies_.contains(host)) return absl::OkStatus();
  FEDLORA_ASSIGN_OR_RETURN(auto copy, DeviceArray<uint8_t>::Zeros(*backend_, bytes));
  FEDLORA_RETURN_IF_ERROR(backend_->Upload(copy.data(), host, bytes));
  // Other backends' streams read these copies: they must be complete before Add returns.
  FEDLORA_RETURN_IF_ERROR(backend_->Synchronize());
  bytes_ += bytes;
  copies_.emplace(host, std::move(copy));
  return absl::OkStatus();
}

absl::StatusOr<const void*> DeviceMirror::Find(const void* host) const {
  if (host == nullptr || backend_->device() == Device::kCpu) return host;
  auto it = copies_.find(host);
  if (it == copies_.end()) {
    return absl::InternalError(absl::StrCat("DeviceMirror: no device copy of the host array at 0x",
                                            absl::Hex(reinterpret_cast<uintptr_t>(host))));
  }
  return static_cast<const void*>(it->second.data());
}

absl::StatusOr<std::shared_ptr<const DeviceMirror>> MirrorCache::Get(
    Device device, const std::function<absl::Status(DeviceMirror&)>& fill) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<const DeviceMirror>& slot = mirrors_[device == Device::kCuda ? 1 : 0];
  if (slot == nullptr) {
    FEDLORA_ASSIGN_OR_RETURN(auto backend, Backend::Create(device));
    auto mirror = std::make_shared<DeviceMirror>(std::move(backend));
    FEDLORA_RETURN_IF_ERROR(fill(*mirror));
    slot = std::move(mirror);
  }
  return slot;
}

absl::StatusOr<WeightPtr> DeviceMirror::Get(const WeightPtr& w) const {
  WeightPtr out = w;
  FEDLORA_ASSIGN_OR_RETURN(out.f32, Get(w.f32));
  FEDLORA_ASSIGN_OR_RETURN(out.bf16, Get(w.bf16));
  FEDLORA_ASSIGN_OR_RETURN(out.quant, Get(w.quant));
  return out;
}

}  // namespace fedlora::kernels
