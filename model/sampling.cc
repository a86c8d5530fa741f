#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fedlora {

absl::Status CheckSamplingOptions(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature ", o.temperature, " must be >= 0 (0: greedy)"));
  }
  if (o.top_k < 0)
    return absl::InvalidArgumentError(absl::StrCat("top_k ", o.top_k, " must be >= 0 (0: no cut)"));
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p ", o.top_p, " must be in (0, 1] (1: no cut)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> SampleToken(std::span<const float> logits, const SamplingOptions& o,
                                    Rng& rng) {
  if (logits.empty()) return absl::InvalidArgumentError("SampleToken: no logits");
  if (absl::Status s = CheckSamplingOptions(o); !s.ok()) return s;
  auto more_likely = [&](int32_t a, int32_t b) {  // NaN is less likely than anything
    const float x = logits[a], y = logits[b];
    if (std::isnan(y)) return !std::isnan(x);
    return x > y;
  };
  if (o.greedy()) {  // the first maximum
    int32_t best = 0;
    for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) {
      if (more_likely(i, best)) best = i;
    }
    if (std::isnan(logits[best]))
      return absl::InvalidArgumentError("SampleToken: every logit is NaN");
    return best;
  }
  // The candidates, most likely first (ties keep the lower id); NaN last, never drawn.
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  size_t n = ids.size();
  if (o.top_k > 0) n = std::min<size_t>(n, static_cast<size_t>(o.top_k));
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
    return more_likely(a, b) || (!more_likely(b, a) && a < b);
  });
  while (n > 1 && std::isnan(logits[ids[n - 1]])) --n;
  if (std::isnan(logits[ids[0]]))
    return absl::InvalidArgumentError("SampleToken: every logit is NaN");
  // Softmax of logits / temperature over the candidates, in double.
  std::vector<double> p(n);
  const double top = logits[ids[0]] / static_cast<double>(o.temperature);
  double sum = 0;
  for (size_t i = 0; i < n; ++i)
    sum += p[i] = std::exp(logits[ids[i]] / static_cast<double>(o.temperature) - top);
  // Nucleus: the fewest most-likely tokens whose probability reaches top_p (at least one).
  if (o.top_p < 1) {
    double kept = 0;
    size_t m = 0;
    while (m < n && kept < o.top_p * sum) kept += p[m++];
    n = std::max<size_t>(m, 1);
    sum = kept > 0 ? kept : p[0];
  }
  const double u = rng.Uniform() * sum;
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc) return ids[i];
  }
  return ids[n - 1];  // rounding at the very top of the range
}

}  // namespace fedlora
