// Frozen weights may be stored in fp32, bf16, or a ggml block-quantized format (Q8_0, Q4_1, ...:
// core/ggml_quant.h), to fit edge devices. A WeightPtr names one of them. Linear and LoRA linear
// accept all three (the GEMM widens panels of rows, or multiplies in bf16 where a bf16 weight
// allows it: WithBf16Math, or in int8 where a Q8_0 weight does: WithInt8Math); the BERT embedding
// kernel takes fp32 or bf16.
//
//   kernels::WeightPtr w = kernels::WeightPtr::F32(dense_weight);    // or ::BF16(bits)
//   kernels::WeightPtr q = kernels::WeightPtr::Quant(blocks, GgmlType::kQ4_1);  // rows of blocks
#pragma once

#include <cstdint>
#include <cstring>

#include "core/ggml_quant.h"

// Inline helpers callable from CUDA device code too. (Not FEDLORA_HOST_DEVICE: core/rng.h owns
// that name, without the inline.)
#if defined(__CUDACC__)
#define FEDLORA_KERNELS_INLINE __host__ __device__ __forceinline__
#else
#define FEDLORA_KERNELS_INLINE inline
#endif

namespace fedlora::kernels {

struct WeightPtr {
  const float* f32 = nullptr;      // exactly one of f32 / bf16 / quant is set
  const uint16_t* bf16 = nullptr;  // bf16 bit patterns
  const uint8_t* quant = nullptr;  // rows of ggml blocks of quant_type, packed
  GgmlType quant_type = GgmlType::kF32;
  // bf16 only: GEMMs with this weight may round their other operand to bf16 (GemmArgs::bf16_math).
  bool bf16_math = false;
  // Q8_0 only: forward GEMMs with this weight may quantize their other operand to int8
  // (GemmArgs::int8_math).
  bool int8_math = false;

  static WeightPtr F32(const float* p) { return WeightPtr{p, nullptr, nullptr}; }
  static WeightPtr BF16(const uint16_t* p) { return WeightPtr{nullptr, p, nullptr}; }
  static WeightPtr Quant(const uint8_t* p, GgmlType type) {
    return WeightPtr{nullptr, nullptr, p, type};
  }
  WeightPtr WithBf16Math(bool on) const {
    WeightPtr w = *this;
    w.bf16_math = on && bf16 != nullptr;
    return w;
  }
  WeightPtr WithInt8Math(bool on) const {
    WeightPtr w = *this;
    w.int8_math = on && quant != nullptr && quant_type == GgmlType::kQ8_0;
    return w;
  }
  bool is_bf16() const { return bf16 != nullptr; }
  bool is_quant() const { return quant != nullptr; }
  // Exactly one pointer set.
  bool valid() const { return (f32 != nullptr) + (bf16 != nullptr) + (quant != nullptr) == 1; }
};

// bf16 -> fp32 is exact: the bf16 bits are the high half of the fp32 bits. Inline (and usable in
// CUDA device code) because the CPU GEMM panel conversion calls it per element. core/tensor.h has
// the bulk and rounding conversions for everything else.
FEDLORA_KERNELS_INLINE float Bf16BitsToF32(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

}  // namespace fedlora::kernels
