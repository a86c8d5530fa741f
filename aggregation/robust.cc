#include "aggregation/robust.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "aggregation/dense_rows.h"
#include "core/status.h"

namespace fedlora {
namespace {

// The mean of `values` in double, in their order.
float Mean(const float* values, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += values[i];
  return static_cast<float>(sum / static_cast<double>(n));
}

// Whether row a ranks before row b by Krum score: the lower score, and between equal scores the
// lexicographically smaller row (mutual nearest neighbours always tie), so that the ranking depends
// on the rows' values and not on the order they were added in.
bool Better(const std::vector<double>& scores, const std::vector<const std::vector<float>*>& rows,
            size_t a, size_t b) {
  if (scores[a] != scores[b]) return scores[a] < scores[b];
  return *rows[a] < *rows[b];
}

// The median of sorted `v`.
double SortedMedian(const std::vector<float>& v) {
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (static_cast<double>(v[n / 2 - 1]) + v[n / 2]) / 2;
}

}  // namespace

int64_t RobustMinUpdates(const RobustOptions& o) {
  switch (o.rule) {
    case RobustRule::kMedian:
      return 1;
    case RobustRule::kTrimmedMean: {
      if (!(o.trim_fraction > 0)) return 0;
      int64_t n = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(1 / o.trim_fraction)) - 1);
      while (std::floor(o.trim_fraction * static_cast<double>(n)) < 1) ++n;
      return n;
    }
    case RobustRule::kKrum:
      return 2 * o.byzantine + 3;
    case RobustRule::kMultiKrum:
      return std::max(2 * o.byzantine + 3, o.multi_krum_keep + o.byzantine);
    case RobustRule::kBulyan:
      return 4 * o.byzantine + 3;
  }
  return 0;
}

namespace {

// The n x n matrix of squared L2 distances between the rows (in double), each pair computed once.
std::vector<double> SquaredDistances(const std::vector<const std::vector<float>*>& rows) {
  const size_t n = rows.size();
  std::vector<double> d(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      const std::vector<float>& a = *rows[i];
      const std::vector<float>& b = *rows[j];
      double s = 0;
      for (size_t k = 0; k < a.size(); ++k) {
        const double x = static_cast<double>(a[k]) - b[k];
        s += x * x;
      }
      d[i * n + j] = d[j * n + i] = s;
    }
  }
  return d;
}

// Krum's scores of the rows in `subset` (indices into the n x n matrix `d`), each against its
// `neighbours` nearest others in the subset.
std::vector<double> ScoresWithin(const std::vector<double>& d, size_t n,
                                 const std::vector<size_t>& subset, int64_t neighbours) {
  std::vector<double> scores(subset.size(), 0.0);
  std::vector<double> others;
  for (size_t i = 0; i < subset.size(); ++i) {
    others.clear();
    for (size_t j = 0; j < subset.size(); ++j) {
      if (j != i) others.push_back(d[subset[i] * n + subset[j]]);
    }
    const size_t k = std::min<size_t>(static_cast<size_t>(neighbours), others.size());
    std::partial_sort(others.begin(), others.begin() + static_cast<std::ptrdiff_t>(k),
                      others.end());
    for (size_t m = 0; m < k; ++m) scores[i] += others[m];
  }
  return scores;
}

}  // namespace

std::vector<double> KrumScores(const std::vector<const std::vector<float>*>& rows,
                               int64_t neighbours) {
  std::vector<size_t> all(rows.size());
  std::iota(all.begin(), all.end(), 0);
  return ScoresWithin(SquaredDistances(rows), rows.size(), all, neighbours);
}

absl::StatusOr<std::unique_ptr<RobustAggregator>> RobustAggregator::Create(
    std::vector<TensorSpec> spec, RobustOptions options) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<int64_t> offsets, RowOffsets(spec, "RobustAggregator"));
  const bool krum_family = options.rule == RobustRule::kKrum ||
                           options.rule == RobustRule::kMultiKrum ||
                           options.rule == RobustRule::kBulyan;
  if (options.rule == RobustRule::kTrimmedMean &&
      !(options.trim_fraction > 0 && options.trim_fraction < 0.5)) {
    return absl::InvalidArgumentError(absl::StrCat("RobustAggregator: trim_fraction ",
                                                   options.trim_fraction, " is not in (0, 0.5)"));
  }
  if (krum_family && options.byzantine < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("RobustAggregator: the number of Byzantine clients f is ", options.byzantine,
                     "; it must be at least 1"));
  }
  if (options.multi_krum_keep < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RobustAggregator: multi_krum_keep is ", options.multi_krum_keep));
  }
  return std::unique_ptr<RobustAggregator>(
      new RobustAggregator(std::move(spec), std::move(offsets), options));
}

RobustAggregator::RobustAggregator(std::vector<TensorSpec> spec, std::vector<int64_t> offsets,
                                   RobustOptions options)
    : spec_(std::move(spec)), offsets_(std::move(offsets)), o_(options) {
  elements_ = offsets_.back();
}

std::string_view RobustAggregator::name() const {
  switch (o_.rule) {
    case RobustRule::kMedian:
      return "median";
    case RobustRule::kTrimmedMean:
      return "trimmed_mean";
    case RobustRule::kKrum:
      return "krum";
    case RobustRule::kMultiKrum:
      return "multi_krum";
    case RobustRule::kBulyan:
      return "bulyan";
  }
  return "robust";
}

absl::Status RobustAggregator::Add(std::vector<KeptTensor> update, int64_t weight) {
  if (weight != 1) {
    return absl::InvalidArgumentError(absl::StrCat("RobustAggregator: weight ", weight,
                                                   ": robust statistics weigh every update "
                                                   "the same (1)"));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::vector<float> row,
                           DenseRow(update, spec_, offsets_, "RobustAggregator"));
  rows_.push_back(std::move(row));
  return absl::OkStatus();
}

std::vector<float> RobustAggregator::CoordinateWise(
    const std::vector<const std::vector<float>*>& rows) const {
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<float> result(static_cast<size_t>(elements_));
  std::vector<float> v(static_cast<size_t>(n));
  const int64_t trim = static_cast<int64_t>(std::floor(o_.trim_fraction * static_cast<double>(n)));
  const int64_t beta = n - 2 * o_.byzantine;  // Bulyan: rows holds its theta picks
  std::vector<std::pair<double, float>> by_distance;
  for (int64_t e = 0; e < elements_; ++e) {
    for (int64_t r = 0; r < n; ++r) v[static_cast<size_t>(r)] = (*rows[static_cast<size_t>(r)])[e];
    std::sort(v.begin(), v.end());  // every sum below runs in value order
    float x = 0;
    switch (o_.rule) {
      case RobustRule::kMedian:
        x = static_cast<float>(SortedMedian(v));
        break;
      case RobustRule::kTrimmedMean:
        x = Mean(v.data() + trim, n - 2 * trim);
        break;
      case RobustRule::kBulyan: {
        const double median = SortedMedian(v);
        by_distance.clear();
        for (float y : v) by_distance.emplace_back(std::fabs(y - median), y);
        // Sorted by distance, then value: the same beta values whatever the rows' order.
        std::sort(by_distance.begin(), by_distance.end());
        double sum = 0;
        for (int64_t i = 0; i < beta; ++i) sum += by_distance[static_cast<size_t>(i)].second;
        x = static_cast<float>(sum / static_cast<double>(beta));
        break;
      }
      case RobustRule::kKrum:
      case RobustRule::kMultiKrum: {
        x = Mean(v.data(), n);
        break;
      }
    }
    result[static_cast<size_t>(e)] = x;
  }
  return result;
}

std::vector<const std::vector<float>*> RobustAggregator::KrumPicks() const {
  const int64_t n = num_updates();
  std::vector<const std::vector<float>*> rows;
  for (const std::vector<float>& r : rows_) rows.push_back(&r);
  const std::vector<double> scores = KrumScores(rows, n - o_.byzantine - 2);
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return Better(scores, rows, a, b); });
  int64_t keep = 1;
  if (o_.rule == RobustRule::kMultiKrum) {
    keep = o_.multi_krum_keep > 0 ? o_.multi_krum_keep : n - o_.byzantine;
  }
  order.resize(static_cast<size_t>(keep));
  std::vector<const std::vector<float>*> picks;
  for (size_t i : order) picks.push_back(rows[i]);
  return picks;
}

std::vector<const std::vector<float>*> RobustAggregator::BulyanPicks() const {
  const int64_t theta = num_updates() - 2 * o_.byzantine;
  std::vector<const std::vector<float>*> all;
  for (const std::vector<float>& r : rows_) all.push_back(&r);
  const std::vector<double> d = SquaredDistances(all);  // once: each repeated Krum reads it
  std::vector<size_t> remaining(rows_.size());
  std::iota(remaining.begin(), remaining.end(), 0);
  std::vector<const std::vector<float>*> picks;
  while (static_cast<int64_t>(picks.size()) < theta) {
    const int64_t r = static_cast<int64_t>(remaining.size());
    const std::vector<double> scores =
        ScoresWithin(d, all.size(), remaining, std::max<int64_t>(r - o_.byzantine - 2, 1));
    std::vector<const std::vector<float>*> rows;
    for (size_t i : remaining) rows.push_back(all[i]);
    size_t best = 0;
    for (size_t i = 1; i < rows.size(); ++i) {
      if (Better(scores, rows, i, best)) best = i;
    }
    picks.push_back(rows[best]);
    remaining.erase(remaining.begin() + static_cast<std::ptrdiff_t>(best));
  }
  return picks;
}

absl::StatusOr<std::vector<UpdateTensor>> RobustAggregator::Finish() {
  if (rows_.empty()) {
    return absl::FailedPreconditionError("RobustAggregator: no update was added");
  }
  const int64_t bound = RobustMinUpdates(o_);
  if (num_updates() < bound) {
    return absl::FailedPreconditionError(absl::StrCat(
        std::string(name()), " needs at least ", bound, " updates",
        o_.rule == RobustRule::kTrimmedMean
            ? absl::StrCat(" (trim_fraction ", o_.trim_fraction, " trims none of fewer)")
            : absl::StrCat(" with f = ", o_.byzantine),
        "; the round has ", num_updates()));
  }
  std::vector<const std::vector<float>*> rows;
  if (o_.rule == RobustRule::kKrum || o_.rule == RobustRule::kMultiKrum) {
    rows = KrumPicks();
  } else if (o_.rule == RobustRule::kBulyan) {
    rows = BulyanPicks();
  } else {
    for (const std::vector<float>& r : rows_) rows.push_back(&r);
  }
  std::vector<float> flat = CoordinateWise(rows);
  std::vector<UpdateTensor> out;
  out.reserve(spec_.size());
  for (size_t i = 0; i < spec_.size(); ++i) {
    out.push_back({spec_[i].name, spec_[i].shape,
                   std::vector<float>(flat.begin() + offsets_[i], flat.begin() + offsets_[i + 1])});
  }
  return out;
}

}  // namespace fedlora
