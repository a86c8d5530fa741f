#include "model/frozen.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/rng.h"
#include "core/status.h"

namespace fedlora {

kernels::WeightPtr FrozenMatrix::ptr() const {
  if (!quant.empty())
    return kernels::WeightPtr::Quant(quant.data(), quant_type).WithInt8Math(int8_math);
  if (!bf16.empty()) return kernels::WeightPtr::BF16(bf16.data()).WithBf16Math(bf16_math);
  return kernels::WeightPtr::F32(f32.data());
}

int64_t FrozenMatrix::bytes() const {
  return static_cast<int64_t>(f32.size() * sizeof(float) + bf16.size() * sizeof(uint16_t) +
                              quant.size());
}

void FrozenMatrix::SetF32(int64_t r, int64_t c, std::vector<float> values, WeightStorage storage) {
  rows = r;
  cols = c;
  f32.clear();
  bf16.clear();
  quant.clear();
  if (storage == WeightStorage::kBF16) {
    bf16.resize(values.size());
    ConvertF32ToBF16(values.data(), bf16.data(), values.size());
  } else if (storage == WeightStorage::kQ8_0 && c > 0 && c % kGgmlQK == 0) {
    quant.resize(static_cast<size_t>(r * *GgmlRowBytes(GgmlType::kQ8_0, c)));
    (void)QuantizeRowsQ8_0(values.data(), r, c, quant.data());  // c is a positive multiple of 32
    quant_type = GgmlType::kQ8_0;
  } else {
    f32 = std::move(values);
  }
}

void FrozenMatrix::SetBF16(int64_t r, int64_t c, std::vector<uint16_t> bits,
                           WeightStorage storage) {
  if (storage == WeightStorage::kF32 || storage == WeightStorage::kQ8_0) {
    std::vector<float> v(bits.size());
    ConvertBF16ToF32(bits.data(), v.data(), bits.size());
    SetF32(r, c, std::move(v), storage);
    return;
  }
  rows = r;
  cols = c;
  f32.clear();
  quant.clear();
  bf16 = std::move(bits);
}

absl::Status FrozenMatrix::SetQuantized(GgmlType type, int64_t r, int64_t c,
                                        std::vector<uint8_t> bytes) {
  if (type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(GgmlTypeName(type)), " is not a block-quantized type (SetF32 / SetBF16)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(int64_t row_bytes, GgmlRowBytes(type, c));
  if (r < 0 || static_cast<uint64_t>(row_bytes) * static_cast<uint64_t>(r) != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("quantized matrix [", r, ", ", c, "] of ",
                                                   std::string(GgmlTypeName(type)), " needs ",
                                                   row_bytes * r, " bytes, got ", bytes.size()));
  }
  rows = r;
  cols = c;
  f32.clear();
  bf16.clear();
  quant = std::move(bytes);
  quant_type = type;
  return absl::OkStatus();
}

void FrozenMatrix::RowToF32(int64_t r, float* dst) const {
  if (!quant.empty()) {
    const int64_t row_bytes = static_cast<int64_t>(quant.size()) / rows;
    (void)DequantizeRow(quant_type, quant.data() + r * row_bytes, cols, dst);
  } else if (!bf16.empty()) {
    ConvertBF16ToF32(bf16.data() + r * cols, dst, static_cast<size_t>(cols));
  } else {
    std::memcpy(dst, f32.data() + r * cols, static_cast<size_t>(cols) * sizeof(float));
  }
}

absl::Status FrozenMatrix::AddTo(kernels::DeviceMirror& mirror) const {
  FEDLORA_RETURN_IF_ERROR(mirror.Add(f32.data(), f32.size() * sizeof(float)));
  FEDLORA_RETURN_IF_ERROR(mirror.Add(bf16.data(), bf16.size() * sizeof(uint16_t)));
  return mirror.Add(quant.data(), quant.size());
}

absl::Status FrozenLinear::AddTo(kernels::DeviceMirror& mirror) const {
  FEDLORA_RETURN_IF_ERROR(w.AddTo(mirror));
  return fedlora::AddTo(bias, mirror);
}

void FillUniform(uint64_t seed, uint64_t stream, float bound, std::vector<float>* v) {
  Rng rng(seed, stream);
  for (float& x : *v) x = static_cast<float>((2.0 * rng.Uniform() - 1.0) * bound);
}

void FillNormal(uint64_t seed, uint64_t stream, float stddev, std::vector<float>* v) {
  Rng rng(seed, stream);
  for (float& x : *v) x = static_cast<float>(rng.Normal(0.0, stddev));
}

std::vector<float> FrozenMatrix::ToF32() const {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) RowToF32(r, out.data() + r * cols);
  return out;
}

}  // namespace fedlora
