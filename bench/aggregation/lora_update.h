// A LoRA-shaped update for the aggregation benchmarks: pairs of 8 x m and m x 8 tensors of at most
// `tensor_values` values each, `elements` values in all, Gaussian (sd 1e-3) from `seed`.
#ifndef FEDLORA_BENCH_AGGREGATION_LORA_UPDATE_H_
#define FEDLORA_BENCH_AGGREGATION_LORA_UPDATE_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"

namespace fedlora::bench {

inline std::vector<UpdateTensor> LoraShapedUpdate(int64_t elements, uint32_t seed,
                                                  int64_t tensor_values) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<UpdateTensor> u;
  for (int64_t done = 0, t = 0; done < elements; done += tensor_values, ++t) {
    const int64_t m = std::min(tensor_values, elements - done) / 8;
    UpdateTensor x{"layer" + std::to_string(t / 2) + (t % 2 == 0 ? ".lora_A" : ".lora_B"),
                   t % 2 == 0 ? std::vector<int64_t>{8, m} : std::vector<int64_t>{m, 8},
                   std::vector<float>(static_cast<size_t>(8 * m))};
    for (float& v : x.values) v = normal(rng);
    u.push_back(std::move(x));
  }
  return u;
}

}  // namespace fedlora::bench

#endif  // FEDLORA_BENCH_AGGREGATION_LORA_UPDATE_H_
