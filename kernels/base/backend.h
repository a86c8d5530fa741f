// The device a model computes on, as the model sees it: memory, copies and one stream. The model
// (model/bert.cc, model/decoder*.cc) is written against this interface; the CPU backend is the
// reference, the CUDA backend runs the same code on a GPU.
//
//   FEDLORA_ASSIGN_OR_RETURN(auto backend, kernels::Backend::Create(Device::kCuda));
//   FEDLORA_ASSIGN_OR_RETURN(auto acts, kernels::DeviceArray<float>::Zeros(*backend, n));
//   FEDLORA_RETURN_IF_ERROR(backend->Upload(ids_dev.data(), ids.data(), bytes));
//   // An op of kernels/ (here kernels/layernorm.h), on the backend's stream:
//   FEDLORA_RETURN_IF_ERROR(kernels::LayerNormForward(backend->ctx(), {...}));
//   FEDLORA_RETURN_IF_ERROR(backend->Download(&loss, loss_dev.data(), sizeof(float)));
//
// - kCpu: memory is host memory (256-byte aligned, zero-filled), copies are memcpy, kernels run on
//   the context's pool. A pointer is its own device pointer, so a CPU model reads its inputs and
//   parameters where they are, with no copy.
// - kCuda: memory is device memory, every copy and kernel is enqueued on the backend's own
//   stream (one per backend, so one per trainer), and only Download waits for it. Out of memory
//   is ResourceExhausted naming the bytes asked for and the bytes free.
//
// A backend is used by one thread at a time (like the model that owns it). DeviceArrays (and the
// DeviceMirrors of kernels/mirror.h) must not outlive the backend that allocated them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/base/context.h"

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

}  // namespace fedlora::kernels
