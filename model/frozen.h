// Frozen base weights, shared by the encoder (model/bert.cc) and the decoder (model/decoder*.cc):
// a matrix held in fp32, bf16 or a ggml block format (the 4-bit base of QLoRA-style training),
// and a linear layer's weight and bias. Written once at load; read-only afterwards, so one copy
// serves any number of trainers on any number of threads.
//
//   FrozenMatrix w;
//   FEDLORA_RETURN_IF_ERROR(w.SetQuantized(GgmlType::kQ4_1, rows, cols, bytes));  // as stored
//   kernels::LinearForward(ctx, {..., .w = w.ptr(), ...});  // the GEMM widens panels of rows
//   w.RowToF32(token_id, out);  // one row, e.g. an embedding lookup
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/ggml_quant.h"
#include "core/tensor.h"
#include "kernels/base/backend.h"
#include "kernels/mirror.h"
#include "kernels/weight.h"

namespace fedlora {

// How a model holds its frozen matrices.
enum class WeightStorage {
  kF32,       // widen everything to fp32
  kBF16,      // round to bf16 (half the memory of fp32)
  kAsStored,  // keep the checkpoint's type: bf16 stays bf16, a GGUF's block-quantized matrices
              // (Q4_1, Q8_0, Q4_K, ...) stay quantized; F32 and F16 are held as fp32
  kQ8_0,      // quantize to Q8_0 (a quarter of fp32's memory; a GGUF's Q8_0 kept as it is, other
              // types widened first); a matrix whose rows are not whole blocks of 32 stays fp32
};

struct FrozenMatrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> quant;  // rows of ggml blocks of quant_type
  GgmlType quant_type = GgmlType::kF32;
  // bf16 storage only: GEMMs with this matrix may multiply in bf16 (kernels::WeightPtr::bf16_math).
  bool bf16_math = false;
  // Q8_0 storage only: forward GEMMs with this matrix may multiply in int8 (WeightPtr::int8_math).
  bool int8_math = false;

  kernels::WeightPtr ptr() const;
  int64_t bytes() const;
  bool empty() const { return f32.empty() && bf16.empty() && quant.empty(); }
  // Takes fp32 values [rows, cols], stored as `storage` says (kAsStored keeps fp32).
  void SetF32(int64_t rows, int64_t cols, std::vector<float> values, WeightStorage storage);
  // Keeps raw bf16 bits (kBF16 and kAsStored), or widens them (kF32; kQ8_0 then quantizes).
  void SetBF16(int64_t rows, int64_t cols, std::vector<uint16_t> bits, WeightStorage storage);
  // Keeps ggml blocks as they are; InvalidArgument when the byte count is not rows whole rows of
  // cols elements (core/ggml_quant.h), Unimplemented for a type the GEMM cannot widen.
  absl::Status SetQuantized(GgmlType type, int64_t rows, int64_t cols, std::vector<uint8_t> bytes);
  // Row r as fp32 into dst[0, cols).
  void RowToF32(int64_t r, float* dst) const;
  // Every value as fp32 (tests, exports).
  std::vector<float> ToF32() const;
  // Adds the storage to `mirror` (kernels/mirror.h), so that ptr() can be translated there.
  absl::Status AddTo(kernels::DeviceMirror& mirror) const;
};

struct FrozenLinear {
  FrozenMatrix w;           // [out, in]
  std::vector<float> bias;  // [out] or empty

  absl::Status AddTo(kernels::DeviceMirror& mirror) const;
};

// Deterministic initialisation (random bases, LoRA A, task heads): each tensor draws from its own
// core/rng.h stream of the seed. U(-bound, bound) and N(0, stddev).
void FillUniform(uint64_t seed, uint64_t stream, float bound, std::vector<float>* v);
void FillNormal(uint64_t seed, uint64_t stream, float stddev, std::vector<float>* v);

// Adds a float array to `mirror`.
inline absl::Status AddTo(const std::vector<float>& v, kernels::DeviceMirror& mirror) {
  return mirror.Add(v.data(), v.size() * sizeof(float));
}

}  // namespace fedlora
