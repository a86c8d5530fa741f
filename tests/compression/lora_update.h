// A realistic LoRA update for the codec tests: the A and B deltas of q and v in six layers (rank 8,
// width 384) plus a small bias-like tensor, with exact ties (values on a 2^-12 grid), zeros and
// values equal across tensors, so that top-k's tie rule and the quantizer's edge cases are met.
// Deterministic: the same tensors on every run (std::mt19937 and integer arithmetic only).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"

namespace fedlora::testing {

inline std::vector<UpdateTensor> LoraUpdate() {
  std::mt19937 rng(20261203);
  std::vector<UpdateTensor> out;
  auto values = [&rng](size_t n, int scale_log2) {
    std::vector<float> v(n);
    for (float& x : v) {
      const uint32_t r = rng();
      const int32_t grid = static_cast<int32_t>(r % 4001) - 2000;  // [-2000, 2000]: ties and zeros
      x = (r >> 30) == 0
              ? 0.0f
              : static_cast<float>(grid) * static_cast<float>(1.0 / (1 << (12 - scale_log2)));
    }
    return v;
  };
  for (int layer = 0; layer < 6; ++layer) {
    for (const char* proj : {"q", "v"}) {
      const std::string base = "layer" + std::to_string(layer) + "." + proj;
      out.push_back({base + ".lora_A", {8, 384}, values(8 * 384, layer % 3)});
      out.push_back({base + ".lora_B", {384, 8}, values(384 * 8, -(layer % 2))});
    }
  }
  out.push_back({"classifier.bias", {5}, {0.25f, -0.25f, 0.25f, 0.0f, -0.0f}});
  return out;
}

// Codec settings that exercise every stage with a GPU path (and a few without).
inline std::vector<CodecOptions> DeviceCodecs() {
  return {
      {.sparsifier = Sparsifier::kTopK,
       .fraction = 0.05,
       .codec = CodecId::kQuant,
       .quant_bits = 8,
       .quant_block_size = 256,
       .quant_stochastic = true,
       .seed = 42},
      {.sparsifier = Sparsifier::kTopK,
       .fraction = 0.02,
       .global_top_k = true,
       .codec = CodecId::kQuant,
       .quant_bits = 1,
       .quant_block_size = 64,
       .quant_stochastic = false,
       .seed = 7},
      {.codec = CodecId::kQuant,
       .quant_bits = 4,
       .quant_block_size = 128,
       .quant_stochastic = false},
      {.sparsifier = Sparsifier::kRandomK,
       .fraction = 0.1,
       .codec = CodecId::kQuant,
       .quant_bits = 2,
       .quant_block_size = 32,
       .quant_stochastic = true,
       .seed = 9},
      {.sparsifier = Sparsifier::kTopK, .fraction = 0.01, .codec = CodecId::kBF16},
      {.sparsifier = Sparsifier::kTopK,
       .fraction = 0.03,
       .global_top_k = true,
       .codec = CodecId::kQuant,
       .quant_bits = 1,
       .quant_block_size = 8,
       .quant_stochastic = true,
       .seed = 3},
      {.codec = CodecId::kQuant,
       .quant_bits = 8,
       .quant_block_size = 256,
       .quant_stochastic = true,
       .seed = 0xfeedface12345ull},
  };
}

}  // namespace fedlora::testing
