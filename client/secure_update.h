// The client's side of a secure-aggregation round's update (TrainTask.secure_aggregation): the
// trained delta as one vector in the adapter's name order, clipped to the task's L2 norm, plus the
// client's share of distributed DP noise, clamped to the fixed-point range and encoded as integers
// mod 2^m with stochastic rounding (crypto/secagg_fixed_point.h). The noise and the rounding draw
// from fresh OpenSSL randomness, never from the task's seed, which the server knows.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "fedlora/client_trainer.h"
#include "fedlora/v1/federation.pb.h"

namespace fedlora {

// InvalidArgument when the delta's element count is not the task's vector length, or a value is not
// finite.
absl::StatusOr<std::vector<uint64_t>> EncodeSecureUpdate(const std::vector<NamedTensor>& delta,
                                                         const v1::SecureAggregationTask& task);

}  // namespace fedlora
