#include "compression/sparsify.h"

#include <algorithm>
#include <cmath>
#include <numeric>


namespace fedlora {

int64_t KeptCount(int64_t numel, double fraction) {
  if (numel <= 0) return 0;
  const double k = std::floor(fraction * static_cast<double>(numel) + 0.5);
  return std::clamp<int64_t>(static_cast<int64_t>(k), 1, numel);
}

std::vector<int64_t> TopKIndices(const float* x, int64_t n, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), int64_t{0});
  k = std::clamp<int64_t>(k, 0, n);
  if (k < n) {
    auto larger = [x](int64_t a, int64_t b) {
      const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
      return fa > fb || (fa == fb && a < b);
    };
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(), larger);
    idx.resize(static_cast<size_t>(k));
  }
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<std::vector<int64_t>> GlobalTopKIndices(const std::vector<const std::vector<float>*>& tensors,
                                                     double fraction) {
  std::vector<std::vector<int64_t>> out(tensors.size());
  int64_t total = 0;
  for (const auto* t : tensors) total += static_cast<int64_t>(t->size());
  int64_t k = KeptCount(total, fraction);
  if (k == 0) return out;
  // The k-th largest magnitude; everything above it is kept, and entries equal to it fill the
  // remaining places in (tensor, index) order.
  std::vector<float> mags;
  mags.reserve(static_cast<size_t>(total));
  for (const auto* t : tensors) {
    for (float v : *t) mags.push_back(std::fabs(v));
  }
  std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end(), std::greater<float>());
  const float threshold = mags[static_cast<size_t>(k - 1)];
  std::vector<float>().swap(mags);
  int64_t above = 0;
  for (const auto* t : tensors) {
    for (float v : *t) above += std::fabs(v) > threshold;
  }
  int64_t ties_left = k - above;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const std::vector<float>& t = *tensors[ti];
    for (size_t i = 0; i < t.size(); ++i) {
      const float m = std::fabs(t[i]);
      if (m > threshold || (m == threshold && ties_left-- > 0)) out[ti].push_back(static_cast<int64_t>(i));
    }
  }
  return out;
}

RandomKSampler::RandomKSampler(uint64_t seed, int64_t n, int64_t k)
    : rng_(seed, 0), n_(n), left_(std::clamp<int64_t>(k, 0, n)) {}

int64_t RandomKSampler::Next() {
  while (i_ < n_) {
    const int64_t i = i_++;
    // Taken when u * (entries left) < (picks left): certain once every remaining entry is needed.
    if (rng_.Uniform() * static_cast<double>(n_ - i) < static_cast<double>(left_)) {
      --left_;
      return i;
    }
  }
  return n_ - 1;  // only after more than k calls
}

std::vector<int64_t> RandomKIndices(uint64_t seed, int64_t n, int64_t k) {
  RandomKSampler sampler(seed, n, k);
  std::vector<int64_t> out(static_cast<size_t>(std::clamp<int64_t>(k, 0, n)));
  for (int64_t& i : out) i = sampler.Next();
  return out;
}

void AppendIndexGaps(const std::vector<int64_t>& indices, std::string& out) {
  int64_t next = 0;  // the smallest index the next entry may have
  for (int64_t i : indices) {
    uint64_t gap = static_cast<uint64_t>(i - next);
    while (gap >= 0x80) {
      out.push_back(static_cast<char>((gap & 0x7F) | 0x80));
      gap >>= 7;
    }
    out.push_back(static_cast<char>(gap));
    next = i + 1;
  }
}

}  // namespace fedlora
