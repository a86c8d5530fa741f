// Robust aggregation: statistics of a round's updates that a minority of malicious sites cannot
// move far, behind the strategy seam (aggregation/update_aggregator.h).
//
//   MEDIAN        coordinate-wise median (the mean of the two middle values for an even count).
//   TRIMMED_MEAN  coordinate-wise mean after dropping the k = floor(trim_fraction * n) smallest and
//                 k largest values; a round with k = 0 is refused (it would be the plain mean).
//   KRUM          the update whose n - f - 2 nearest neighbours (squared L2) are closest
//                 (Blanchard et al. 2017); n >= 2f + 3.
//   MULTI_KRUM    the mean of the m updates with the best Krum scores (m = n - f when unset).
//   BULYAN        Krum applied repeatedly to pick theta = n - 2f updates, then per coordinate the
//                 mean of the beta = theta - 2f values closest to their median (El Mhamdi et al.
//                 2018); n >= 4f + 3. Each repeated Krum scores the updates still unpicked against
//                 max(r - f - 2, 1) neighbours, r being how many remain.
//
// Each keeps every update until Finish, as dense fp32 rows in the adapter's tensor order: memory is
// 4 bytes x elements x updates (held_bytes()). Updates weigh the same: Add refuses a weight other
// than 1. Finish refuses a round with fewer updates than the rule's bound (FailedPrecondition,
// naming the bound): the coordinator retries and then abandons it, never aggregating it otherwise.
//
// Determinism: the result depends only on the set of updates, not on the order they are added in:
// coordinate values are sorted before they are summed (in double), a pair's distance is computed
// once, and between equal Krum scores the lexicographically smaller update ranks first.
//
// Thread-safety: one aggregator per aggregation, used from one thread. Runs on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "aggregation/fedavg.h"
#include "aggregation/update_aggregator.h"
#include "compression/codec.h"

namespace fedlora {

enum class RobustRule { kMedian, kTrimmedMean, kKrum, kMultiKrum, kBulyan };

struct RobustOptions {
  RobustRule rule = RobustRule::kMedian;
  double trim_fraction = 0;     // kTrimmedMean: in (0, 0.5)
  int64_t byzantine = 0;        // f, for kKrum, kMultiKrum and kBulyan: >= 1
  int64_t multi_krum_keep = 0;  // m for kMultiKrum; 0: n - f
};

// The fewest updates `o`'s rule aggregates: 1 for MEDIAN, ceil(1 / trim_fraction) for
// TRIMMED_MEAN, 2f + 3 for KRUM and MULTI_KRUM (and m + f when m is set), 4f + 3 for BULYAN.
int64_t RobustMinUpdates(const RobustOptions& o);

// Krum's score of each row: the sum of its squared L2 distances to its `neighbours` nearest other
// rows (in double). Rows are equal-length; 1 <= neighbours <= rows - 1.
std::vector<double> KrumScores(const std::vector<const std::vector<float>*>& rows,
                               int64_t neighbours);

class RobustAggregator final : public UpdateAggregator {
 public:
  // InvalidArgument on an empty or malformed spec, a trim_fraction outside (0, 0.5), f < 1 for the
  // Krum family and Bulyan, or a negative multi_krum_keep.
  static absl::StatusOr<std::unique_ptr<RobustAggregator>> Create(std::vector<TensorSpec> spec,
                                                                  RobustOptions options);

  std::string_view name() const override;
  bool needs_all_updates() const override { return true; }
  // InvalidArgument when the weight is not 1, the update does not match the spec (a missing,
  // extra or repeated tensor, a shape, a value count, a sparse index out of order or range) or a
  // value is not finite. A refused update is not held.
  absl::Status Add(std::vector<KeptTensor> update, int64_t weight) override;
  int64_t num_updates() const override { return static_cast<int64_t>(rows_.size()); }
  // FailedPrecondition when nothing was added or fewer than RobustMinUpdates updates were.
  absl::StatusOr<std::vector<UpdateTensor>> Finish() override;

  // Bytes of the updates held: the O(updates x adapter) memory figure.
  int64_t held_bytes() const {
    return static_cast<int64_t>(rows_.size()) * elements_ * static_cast<int64_t>(sizeof(float));
  }

 private:
  RobustAggregator(std::vector<TensorSpec> spec, std::vector<int64_t> offsets,
                   RobustOptions options);
  std::vector<float> CoordinateWise(const std::vector<const std::vector<float>*>& rows) const;
  std::vector<const std::vector<float>*> KrumPicks() const;
  std::vector<const std::vector<float>*> BulyanPicks() const;

  std::vector<TensorSpec> spec_;
  std::vector<int64_t> offsets_;  // spec_[i] starts at offsets_[i] in a row; back() = elements_
  int64_t elements_ = 0;
  RobustOptions o_;
  std::vector<std::vector<float>> rows_;  // the updates, dense, in spec order
};

}  // namespace fedlora
