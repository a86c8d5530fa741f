#include "core/tensor.h"

#include <bit>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/strings.h"

namespace fedlora {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI8:
      return 1;
    case DType::kU8:
      return 1;
    case DType::kI16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kF64:
      return 8;
    case DType::kBool:
      return 1;
  }
  FEDLORA_CHECK(false && "unknown DType");
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kI16:
      return "I16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kF64:
      return "F64";
    case DType::kBool:
      return "BOOL";
  }
  FEDLORA_CHECK(false && "unknown DType");
  return "";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  static constexpr DType kAll[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kI8,
                                   DType::kU8,  DType::kI16, DType::kI32,  DType::kI64,
                                   DType::kF64, DType::kBool};
  for (DType d : kAll) {
    if (DTypeName(d) == name) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", absl::string_view(name.data(), name.size()),
                   "' (supported: F32, F16, BF16, I8, U8, I16, I32, I64, F64, BOOL)"));
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 ||
         dtype == DType::kF64;
}

std::string_view DeviceName(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

absl::StatusOr<int64_t> CheckedNumel(std::span<const int64_t> shape) {
  bool has_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("dimension ", i, " is negative (", shape[i], ")"));
    }
    has_zero |= shape[i] == 0;
  }
  if (has_zero) return 0;  // empty whatever the other dimensions are: nothing to overflow
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (__builtin_mul_overflow(n, shape[i], &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("number of elements overflows int64 at dimension ", i));
    }
  }
  return n;
}

absl::StatusOr<int64_t> CheckedNbytes(DType dtype, std::span<const int64_t> shape) {
  FEDLORA_ASSIGN_OR_RETURN(int64_t n, CheckedNumel(shape));
  int64_t bytes;
  if (__builtin_mul_overflow(n, static_cast<int64_t>(DTypeSize(dtype)), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "byte size of ", n, " ", ToAbsl(DTypeName(dtype)), " elements overflows int64"));
  }
  return bytes;
}

std::vector<int64_t> ContiguousStrides(std::span<const int64_t> shape) {
  std::vector<int64_t> strides(shape.size());
  // Unsigned so that an unchecked, overflowing shape gives garbage strides rather than UB;
  // every caller that builds a view checks the shape first.
  uint64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = static_cast<int64_t>(s);
    s *= static_cast<uint64_t>(shape[i]);
  }
  return strides;
}

absl::StatusOr<TensorView> TensorView::Create(void* data, DType dtype, std::vector<int64_t> shape,
                                              Device device) {
  FEDLORA_RETURN_IF_ERROR(CheckedNbytes(dtype, shape).status());
  std::vector<int64_t> strides = ContiguousStrides(shape);
  return CreateStrided(data, dtype, std::move(shape), std::move(strides), device);
}

absl::StatusOr<TensorView> TensorView::CreateConst(const void* data, DType dtype,
                                                   std::vector<int64_t> shape, Device device) {
  // The const_cast is sound: read_only_ makes mutable_data() refuse to hand the pointer out.
  FEDLORA_ASSIGN_OR_RETURN(TensorView v,
                           Create(const_cast<void*>(data), dtype, std::move(shape), device));
  v.read_only_ = true;
  return v;
}

absl::StatusOr<TensorView> TensorView::CreateStrided(void* data, DType dtype,
                                                     std::vector<int64_t> shape,
                                                     std::vector<int64_t> strides, Device device) {
  if (strides.size() != shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank mismatch: shape has ", shape.size(), " dims, strides ", strides.size()));
  }
  FEDLORA_ASSIGN_OR_RETURN(int64_t numel, CheckedNumel(shape));
  FEDLORA_RETURN_IF_ERROR(CheckedNbytes(dtype, shape).status());
  // The furthest element must be addressable in bytes without overflow (an empty view addresses
  // nothing, so its strides only need to be non-negative).
  int64_t max_offset = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (strides[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("stride ", i, " is negative (", strides[i], ")"));
    }
    int64_t term;
    if (numel > 0 && (__builtin_mul_overflow(shape[i] - 1, strides[i], &term) ||
                      __builtin_add_overflow(max_offset, term, &max_offset))) {
      return absl::InvalidArgumentError(
          absl::StrCat("strided extent overflows int64 at dimension ", i));
    }
  }
  int64_t max_byte;
  if (__builtin_mul_overflow(max_offset, static_cast<int64_t>(DTypeSize(dtype)), &max_byte)) {
    return absl::InvalidArgumentError("strided extent in bytes overflows int64");
  }
  TensorView v;
  v.data_ = data;
  v.dtype_ = dtype;
  v.device_ = device;
  v.shape_ = std::move(shape);
  v.strides_ = std::move(strides);
  v.numel_ = numel;
  return v;
}

void* TensorView::mutable_data() const {
  FEDLORA_CHECK(!read_only_);
  return data_;
}

int64_t TensorView::dim(int i) const {
  const int r = rank();
  if (i < 0) i += r;
  FEDLORA_CHECK(i >= 0 && i < r);
  return shape_[i];
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

// --- Half precision ------------------------------------------------------------------------------

uint16_t F32ToBF16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: truncate and set the quiet bit, so a payload living only in the low 16 bits cannot
    // turn the NaN into an Inf.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. A carry out of
  // the mantissa bumps the exponent, which is exactly the IEEE result (up to and including Inf).
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

float BF16ToF32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t F32ToF16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {
    if (abs == 0x7f800000u) return sign | 0x7c00u;  // Inf
    // NaN: keep the top 10 payload bits and force the quiet bit so it cannot become Inf.
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  // 65520 = 0x477ff000 is halfway between the largest half (65504) and 2^16; ties go to the even
  // neighbour, which is 2^16, i.e. Inf.
  if (abs >= 0x477ff000u) return sign | 0x7c00u;
  if (abs >= 0x38800000u) {  // >= 2^-14: normal half
    const uint32_t exp = (abs >> 23) - 127 + 15;
    const uint32_t mant = abs & 0x7fffffu;
    uint32_t h = (exp << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fffu;                     // the 13 dropped bits
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is correct
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal half: value = m * 2^-24 with m in [0, 1023]. Anything <= 2^-25 (half of the
  // smallest subnormal, a tie that goes to even 0) rounds to zero.
  if (abs <= 0x33000000u) return sign;
  const int e = static_cast<int>(abs >> 23) - 127;      // in [-25, -15]
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;  // 24 significant bits
  const int shift = -(e + 1);                           // in [14, 24]: mant * 2^(e-23) / 2^-24
  uint32_t h = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u)))
    ++h;  // rounding up to 0x400 yields the smallest normal
  return static_cast<uint16_t>(sign | h);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in fp32.
    const float magnitude = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));  // rebias 15 -> 127
}

void ConvertF32ToBF16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = F32ToBF16(src[i]);
}
void ConvertBF16ToF32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = BF16ToF32(src[i]);
}
void ConvertF32ToF16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = F32ToF16(src[i]);
}
void ConvertF16ToF32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(src[i]);
}

}  // namespace fedlora
