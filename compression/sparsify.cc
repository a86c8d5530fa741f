#include "compression/sparsify.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/status.h"
#include "kernels/base/topk.h"

namespace fedlora {

int64_t KeptCount(int64_t numel, double fraction) {
  if (numel <= 0) return 0;
  const double k = std::floor(fraction * static_cast<double>(numel) + 0.5);
  return std::clamp<int64_t>(static_cast<int64_t>(k), 1, numel);
}

std::vector<int64_t> TopKIndices(const float* x, int64_t n, int64_t k) {
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<int64_t> out(static_cast<size_t>(k));
  if (k == 0) return out;
  // kernels::TopK on the CPU: its workspace is n floats, and it refuses nothing a finite x of at
  // most 2^32 entries gives it.
  const kernels::ExecContext cpu;
  std::vector<float> workspace(static_cast<size_t>(n));
  const absl::Status status =
      kernels::TopK(cpu, kernels::TopKArgs{.n = n,
                                           .k = k,
                                           .x = x,
                                           .indices = out.data(),
                                           .workspace = workspace.data(),
                                           .workspace_bytes = workspace.size() * sizeof(float)});
  FEDLORA_CHECK(status.ok());
  return out;
}

std::vector<std::vector<int64_t>> SplitIndices(const std::vector<int64_t>& flat,
                                               const std::vector<int64_t>& sizes) {
  std::vector<std::vector<int64_t>> out(sizes.size());
  size_t t = 0;
  int64_t base = 0;
  for (int64_t i : flat) {  // ascending: the tensors come in order
    while (i >= base + sizes[t]) base += sizes[t++];
    out[t].push_back(i - base);
  }
  return out;
}

std::vector<std::vector<int64_t>> GlobalTopKIndices(
    const std::vector<const std::vector<float>*>& tensors, double fraction) {
  // Top-k over the concatenation: ties go to the earlier tensor and the lower index.
  std::vector<float> all;
  std::vector<int64_t> sizes;
  for (const auto* t : tensors) {
    all.insert(all.end(), t->begin(), t->end());
    sizes.push_back(static_cast<int64_t>(t->size()));
  }
  const int64_t total = static_cast<int64_t>(all.size());
  return SplitIndices(TopKIndices(all.data(), total, KeptCount(total, fraction)), sizes);
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
