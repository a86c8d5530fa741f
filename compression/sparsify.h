// The sparsifying stages of the update wire format (compression/codec.h): which entries of a
// tensor travel. Top-k keeps the entries of largest magnitude and sends their indices; random-k
// keeps k entries drawn from a seed, and only the seed travels. Neither rescales what it keeps:
// both are biased towards zero on their own and meant for use with error feedback.
//
// Index lists are ascending. On the wire, top-k indices are LEB128 varints of the gaps: the first
// index itself, then each index minus the previous one minus 1 (a kept fraction f costs about one
// byte per index when f >= 1/128).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"

namespace fedlora {

// Entries kept of `numel` at fraction f: f * numel rounded to nearest, at least 1 (0 when numel is
// 0), at most numel. Rounding to nearest keeps 0.01 * 100 at 1 although the product is
// 1.0000000000000002 in double.
int64_t KeptCount(int64_t numel, double fraction);

// The k entries of x[0, n) with the largest |x|, ties broken towards the lower index; ascending.
// x must be finite and n at most 2^32. kernels::TopK on the CPU (kernels/base/topk.h).
std::vector<int64_t> TopKIndices(const float* x, int64_t n, int64_t k);

// Top-k over several tensors at once (global selection): KeptCount(total, fraction) entries of
// largest |x| over all of them, ties towards the earlier tensor and lower index; one ascending
// list per tensor.
std::vector<std::vector<int64_t>> GlobalTopKIndices(
    const std::vector<const std::vector<float>*>& tensors, double fraction);
// Splits an ascending index list over the concatenation of tensors of `sizes` entries into one
// ascending list per tensor (GlobalTopKIndices's last step).
std::vector<std::vector<int64_t>> SplitIndices(const std::vector<int64_t>& flat,
                                               const std::vector<int64_t>& sizes);

// k distinct indices of [0, n), every k-subset equally likely, yielded in ascending order by
// sequential sampling (Vitter's Algorithm A: one draw per pick, O(n) cheap steps in all) from
// core/rng.h stream (seed, 0). O(1) memory, so that a decoder streams them.
class RandomKSampler {
 public:
  RandomKSampler(uint64_t seed, int64_t n, int64_t k);
  // The next index; call at most k times.
  int64_t Next();

 private:
  Rng rng_;
  int64_t n_, left_, i_ = 0;
};

// All k indices of RandomKSampler(seed, n, k). The encoder and the decoder use the same sampler.
std::vector<int64_t> RandomKIndices(uint64_t seed, int64_t n, int64_t k);

// Appends the gap varints of the ascending list `indices`.
void AppendIndexGaps(const std::vector<int64_t>& indices, std::string& out);

}  // namespace fedlora
