// Frozen weights may be stored in fp32 or bf16 (to fit edge devices). A WeightPtr names one of
// the two; kernels that read frozen weights (linear, LoRA linear, embedding) accept either.
//
//   kernels::WeightPtr w = kernels::WeightPtr::F32(dense_weight);    // or ::BF16(bits)
#pragma once

#include <cstdint>
#include <cstring>

// Inline helpers callable from CUDA device code too. (Not FEDLORA_HOST_DEVICE: core/rng.h owns
// that name, without the inline.)
#if defined(__CUDACC__)
#define FEDLORA_KERNELS_INLINE __host__ __device__ __forceinline__
#else
#define FEDLORA_KERNELS_INLINE inline
#endif

namespace fedlora::kernels {

struct WeightPtr {
  const float* f32 = nullptr;      // exactly one of f32 / bf16 is set
  const uint16_t* bf16 = nullptr;  // bf16 bit patterns

  static WeightPtr F32(const float* p) { return WeightPtr{p, nullptr}; }
  static WeightPtr BF16(const uint16_t* p) { return WeightPtr{nullptr, p}; }
  bool is_bf16() const { return bf16 != nullptr; }
  // Exactly one pointer set.
  bool valid() const { return (f32 != nullptr) != (bf16 != nullptr); }
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
