// Choosing the next token from a decoder's logits: greedy (temperature 0), or sampled from the
// softmax of logits / temperature, cut to the top_k most likely tokens and then to the smallest
// set whose probability reaches top_p (nucleus sampling), as transformers' TemperatureLogitsWarper,
// TopKLogitsWarper and TopPLogitsWarper do, in that order.
//
//   SamplingOptions s{.temperature = 0.7f, .top_p = 0.9f, .seed = 17};
//   Rng rng(s.seed);
//   FEDLORA_ASSIGN_OR_RETURN(int32_t tok, SampleToken(logits, s, rng));
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "core/rng.h"

namespace fedlora {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy (the first maximum); > 0: sample
  int top_k = 0;             // 0: no cut; else keep the k most likely tokens
  float top_p = 1.0f;        // (0, 1]; 1: no cut
  uint64_t seed = 0;         // the sampling's random stream (same seed, same tokens)
  bool greedy() const { return temperature == 0.0f; }
};

// InvalidArgument for a negative or non-finite temperature, a negative top_k, a top_p outside
// (0, 1], or empty logits.
absl::Status CheckSamplingOptions(const SamplingOptions& options);

// The next token for `logits` (one row, the vocabulary). Greedy ignores `rng`; sampling draws one
// uniform number from it. Ties keep the lower id; NaN logits are never chosen.
absl::StatusOr<int32_t> SampleToken(std::span<const float> logits, const SamplingOptions& options,
                                    Rng& rng);

}  // namespace fedlora
