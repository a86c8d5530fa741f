// The device a model computes on, as the model sees it: memory, copies and one stream. The model
// (model/bert.cc, model/decoder*.cc) is written against this interface; the CPU backend is the
// reference, the CUDA backend runs the same code on a GPU.
//
//   FEDLORA_ASSIGN_OR_RETURN(auto backend, kernels::Backend::Create(Device::kCuda));
//   FEDLORA_ASSIGN_OR_RETURN(auto acts, kernels::DeviceArray<float>::Zeros(*backend, n));
//   FEDLORA_RETURN_IF_ERROR(backend->Upload(ids_dev.data(), ids.data(), bytes));
//   FEDLORA_RETURN_IF_ERROR(kernels::LayerNormForward(backend->ctx(), {...}));  // on its stream
//   FEDLORA_RETURN_IF_ERROR(backend->Download(&loss, loss_dev.data(), sizeof(float)));
//
// - kCpu: memory is host memory (64-byte aligned, zero-filled), copies are memcpy, kernels run on
//   the context's pool. A pointer is its own device pointer, so a CPU model reads its inputs and
//   parameters where they are, with no copy.
// - kCuda: memory is device memory, every copy and kernel is enqueued on the backend's own
//   stream (one per backend, so one per trainer), and only Download waits for it. Out of memory
//   is ResourceExhausted naming the bytes asked for and the bytes free.
//
// A backend is used by one thread at a time (like the model that owns it). DeviceArrays and
// DeviceMirrors must not outlive the backend that allocated them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/context.h"
#include "kernels/weight.h"

namespace fedlora::kernels {

class Backend {
 public:
  // FailedPrecondition naming the reason when `device` is kCuda and CUDA is not usable (not built,
  // no driver, no device).
  static absl::StatusOr<std::shared_ptr<Backend>> Create(Device device);
  ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  Device device() const { return ctx_.device; }
  // The context every kernel of this backend runs on (the device, its stream, the CPU pool).
  const ExecContext& ctx() const { return ctx_; }

  // `bytes` of zero-filled memory on the device, 256-byte aligned (null for 0 bytes).
  absl::StatusOr<void*> Allocate(size_t bytes);
  void Free(void* ptr);
  // Bytes allocated and not yet freed.
  size_t allocated_bytes() const { return allocated_; }

  // Host -> device. The host buffer may be reused as soon as this returns.
  absl::Status Upload(void* dst, const void* host_src, size_t bytes);
  // Device -> host; waits for the work queued before it.
  absl::Status Download(void* host_dst, const void* src, size_t bytes);
  // Device -> device: `rows` rows of `row_bytes`, `src_pitch` and `dst_pitch` bytes apart.
  absl::Status CopyRows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                        size_t row_bytes, size_t rows);
  absl::Status Zero(void* dst, size_t bytes);
  // Waits for everything queued; reports a failed kernel.
  absl::Status Synchronize();

 private:
  explicit Backend(Device device);

  ExecContext ctx_;
  size_t allocated_ = 0;
  absl::flat_hash_map<void*, size_t> sizes_;  // live allocations (for allocated_bytes)
};

// `count` elements of T on a backend, freed with the array. Moves, never copies.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  static absl::StatusOr<DeviceArray> Zeros(Backend& backend, size_t count) {
    DeviceArray a;
    auto p = backend.Allocate(count * sizeof(T));
    if (!p.ok()) return p.status();
    a.backend_ = &backend;
    a.ptr_ = static_cast<T*>(*p);
    a.count_ = count;
    return a;
  }
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      Release();
      backend_ = std::exchange(o.backend_, nullptr);
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { Release(); }

  T* data() const { return ptr_; }
  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  void Release() {
    if (backend_ != nullptr) backend_->Free(ptr_);
    backend_ = nullptr;
    ptr_ = nullptr;
    count_ = 0;
  }

  Backend* backend_ = nullptr;
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

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
