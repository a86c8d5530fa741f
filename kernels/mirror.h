// Device copies of a base model's frozen host arrays (DeviceMirror), made once per device and
// shared (MirrorCache). On the CPU nothing is copied: every lookup answers the host pointer.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/base/backend.h"
#include "kernels/weight.h"

namespace fedlora::kernels {

// Device copies of host arrays that never change (a base model's frozen weights), made once and
// then looked up by their host address: the model keeps calling kernels with the host weight's
// pointers and translates them here. On the CPU nothing is copied and every lookup answers the
// host pointer itself. Built by Add calls, then read-only: lookups from many threads are safe.
class DeviceMirror {
 public:
  explicit DeviceMirror(std::shared_ptr<Backend> backend) : backend_(std::move(backend)) {}

  // Uploads `bytes` at `host` (kCuda); no-op on the CPU or for an empty array.
  absl::Status Add(const void* host, size_t bytes);
  // The device copy of the array that starts at `host`; the host pointer itself on the CPU; null
  // for null. Internal error naming the address when it was never added (a bug in the model).
  absl::StatusOr<const void*> Find(const void* host) const;
  template <class T>
  absl::StatusOr<const T*> Get(const T* host) const {
    auto p = Find(host);
    if (!p.ok()) return p.status();
    return static_cast<const T*>(*p);
  }
  // The weight with its pointer translated (format and math flags kept).
  absl::StatusOr<WeightPtr> Get(const WeightPtr& w) const;
  size_t bytes() const { return bytes_; }
  const std::shared_ptr<Backend>& backend() const { return backend_; }

 private:
  std::shared_ptr<Backend> backend_;
  absl::flat_hash_map<const void*, DeviceArray<uint8_t>> copies_;
  size_t bytes_ = 0;
};

// A base model's mirrors, one per device, each made by the first Get for its device (with its own
// backend, `fill` adding the arrays) and shared by every later one. Thread-safe.
class MirrorCache {
 public:
  absl::StatusOr<std::shared_ptr<const DeviceMirror>> Get(
      Device device, const std::function<absl::Status(DeviceMirror&)>& fill) const;

 private:
  mutable std::mutex mu_;
  mutable std::array<std::shared_ptr<const DeviceMirror>, 2> mirrors_;  // by Device
};

}  // namespace fedlora::kernels
