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

namespace {

// The k-th largest of `mags` (k >= 1); reorders them.
float KthLargest(std::vector<float>& mags, int64_t k) {
  std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end(), std::greater<float>());
  return mags[static_cast<size_t>(k - 1)];
}

}  // namespace

std::vector<int64_t> TopKIndices(const float* x, int64_t n, int64_t k) {
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<int64_t> out;
  if (k == 0) return out;
  // Select on the magnitudes alone (4 bytes each, no indirection), then one pass in index order:
  // everything above the k-th largest, and entries equal to it while places are left.
  std::vector<float> mags(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) mags[i] = std::fabs(x[i]);
  const float threshold = KthLargest(mags, k);
  int64_t above = 0;
  for (int64_t i = 0; i < n; ++i) above += std::fabs(x[i]) > threshold;
  int64_t ties_left = k - above;
  out.reserve(static_cast<size_t>(k));
  for (int64_t i = 0; i < n; ++i) {
    const float m = std::fabs(x[i]);
    if (m > threshold || (m == threshold && ties_left-- > 0)) out.push_back(i);
  }
  return out;
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
  const float threshold = KthLargest(mags, k);
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
  if (left_ <= 0) return n_ - 1;  // only after more than k calls
  // Vitter's Algorithm A ("Faster methods for random sampling", CACM 1984): draw how many entries
  // to skip, S, from P(S >= s) = prod_{j < s} (N - left - j) / (N - j) with one uniform, instead
  // of one draw per entry. The last pick is uniform over what remains.
  double remaining = static_cast<double>(n_ - i_);
  int64_t skip = 0;
  if (left_ == 1) {
    skip = std::min<int64_t>(static_cast<int64_t>(remaining * rng_.Uniform()), n_ - i_ - 1);
  } else {
    const double v = rng_.Uniform();
    double top = remaining - static_cast<double>(left_);
    double quot = top / remaining;
    while (quot > v) {
      ++skip;
      top -= 1.0;
      remaining -= 1.0;
      quot *= top / remaining;
    }
  }
  const int64_t index = i_ + skip;
  i_ = index + 1;
  --left_;
  return index;
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
