// Element types, devices and a non-owning tensor view, plus fp32 <-> bf16 / fp16 conversion.
//
//   FEDLORA_ASSIGN_OR_RETURN(DType dt, ParseDType("BF16"));       // safetensors spelling
//   FEDLORA_ASSIGN_OR_RETURN(TensorView v, TensorView::Create(ptr, DType::kF32, {4, 8}));
//   v.numel();  // 32
//   uint16_t h = F32ToBF16(1.0f);                                 // 0x3f80
//
// A TensorView never owns memory; whoever made the buffer (an arena, an mmap) keeps it alive.
// Shapes and strides are in elements, not bytes. Views are plain values: copying one is cheap
// and safe from any thread; writing through them is the caller's synchronisation problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fedlora {

enum class DType { kF32, kF16, kBF16, kI8, kU8, kI16, kI32, kI64, kF64, kBool };

// Bytes per element (kBool is one byte, as in safetensors and PyTorch).
size_t DTypeSize(DType dtype);
// The safetensors spelling: "F32", "F16", "BF16", "I8", "U8", "I16", "I32", "I64", "F64", "BOOL".
std::string_view DTypeName(DType dtype);
// Inverse of DTypeName (exact, case-sensitive, as the safetensors format is). InvalidArgument
// naming the text for anything else, including dtypes the format has but we do not (U16, F8_E4M3).
absl::StatusOr<DType> ParseDType(std::string_view name);
bool IsFloatingPoint(DType dtype);

enum class Device { kCpu, kCuda };
std::string_view DeviceName(Device device);  // "cpu", "cuda"

// Product of `shape`. InvalidArgument when a dimension is negative or the product overflows
// int64. The empty shape (a scalar) has one element.
absl::StatusOr<int64_t> CheckedNumel(std::span<const int64_t> shape);
// numel * DTypeSize(dtype), checked the same way.
absl::StatusOr<int64_t> CheckedNbytes(DType dtype, std::span<const int64_t> shape);
// Row-major strides (in elements) for `shape`: the last dimension has stride 1.
std::vector<int64_t> ContiguousStrides(std::span<const int64_t> shape);

class TensorView {
 public:
  // A placeholder to assign to: null data, no elements (numel() == 0, unlike a real scalar view).
  TensorView() = default;

  // Contiguous view. InvalidArgument on a negative dimension or when numel/nbytes overflow int64.
  static absl::StatusOr<TensorView> Create(void* data, DType dtype, std::vector<int64_t> shape,
                                           Device device = Device::kCpu);
  // Read-only contiguous view: mutable_data() on it is a bug (checked).
  static absl::StatusOr<TensorView> CreateConst(const void* data, DType dtype,
                                                std::vector<int64_t> shape,
                                                Device device = Device::kCpu);
  // Strided view. Strides are in elements and must be non-negative; the furthest element offset
  // (sum of (dim - 1) * stride) must fit in int64 bytes as well.
  static absl::StatusOr<TensorView> CreateStrided(void* data, DType dtype,
                                                  std::vector<int64_t> shape,
                                                  std::vector<int64_t> strides,
                                                  Device device = Device::kCpu);

  const void* data() const { return data_; }
  // The writable pointer. FEDLORA_CHECK-fails on a view made with CreateConst.
  void* mutable_data() const;
  template <class T>
  const T* data_as() const {
    return static_cast<const T*>(data_);
  }
  template <class T>
  T* mutable_data_as() const {
    return static_cast<T*>(mutable_data());
  }

  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool read_only() const { return read_only_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  // Size of dimension i; i may be negative (-1 is the last). FEDLORA_CHECKs the range.
  int64_t dim(int i) const;

  int64_t numel() const { return numel_; }
  // Bytes of the numel() elements (not of the strided span they occupy).
  int64_t nbytes() const { return numel_ * static_cast<int64_t>(DTypeSize(dtype_)); }
  // True when the strides are the row-major strides of the shape (dimensions of size 1 may have
  // any stride, as in PyTorch).
  bool is_contiguous() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  bool read_only_ = false;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  int64_t numel_ = 0;
};

// --- Half-precision conversion -------------------------------------------------------------------
// fp32 -> bf16/fp16 round to nearest, ties to even; overflow goes to +-Inf as IEEE rounding does;
// Inf stays Inf; NaN stays NaN (quietened, sign kept). fp16 subnormals are produced and read.
// bf16/fp16 -> fp32 is exact.
uint16_t F32ToBF16(float value);
float BF16ToF32(uint16_t bits);
uint16_t F32ToF16(float value);
float F16ToF32(uint16_t bits);

// Bulk versions; `src` and `dst` must not overlap.
void ConvertF32ToBF16(const float* src, uint16_t* dst, size_t n);
void ConvertBF16ToF32(const uint16_t* src, float* dst, size_t n);
void ConvertF32ToF16(const float* src, uint16_t* dst, size_t n);
void ConvertF16ToF32(const uint16_t* src, float* dst, size_t n);

}  // namespace fedlora
