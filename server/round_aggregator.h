// One round's aggregation, from a snapshot of what it starts from to the round's result, with no
// store and no lock: the coordinator snapshots under its lock, feeds the accepted updates in
// canonical (upload_id) order with no lock held, and commits the result.
//
//   FEDLORA_ASSIGN_OR_RETURN(RoundAggregator a, RoundAggregator::Begin(std::move(snapshot)));
//   for (const Body& b : accepted)
//     FEDLORA_RETURN_IF_ERROR(a.Add(b.upload_id, b.examples, b.plain));
//   FEDLORA_ASSIGN_OR_RETURN(RoundResult r, a.Finish());  // adapter, optimizer state, downlink
//
// Each update is decoded and matched to the adapter, clipped (DP's clip norm, else
// aggregation.max_update_norm), weighted (its claimed examples up to the cap, else 1) and handed to
// the round's UpdateAggregator (aggregation/update_aggregator.h: the strategy seam; FedAvg's exact
// mean today). Finish releases DP noise on the aggregate, steps a copy of the server optimizer,
// averages with earlier rounds' adapters on the run's last round (aggregation.average_last_rounds)
// and encodes the downlink delta. A secure-aggregation round, whose server only learns the
// survivors' unmasked mean, skips Add: FinishUnmasked takes that mean instead.
//
// Thread-safety: one RoundAggregator per aggregation try, used from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "aggregation/fedavg.h"
#include "aggregation/robust.h"
#include "aggregation/server_optimizer.h"
#include "aggregation/update_aggregator.h"
#include "compression/codec.h"
#include "compression/downlink.h"
#include "fedlora/v1/config.pb.h"
#include "server/differential_privacy.h"

namespace fedlora {

// The strategy seam's factory: the UpdateAggregator that aggregation.strategy names (FedAvg's mean
// for FEDAVG, FEDPROX and the adaptive server optimizers, which differ only in the server step;
// aggregation/robust.h's rules for MEDIAN, TRIMMED_MEAN, KRUM, MULTI_KRUM and BULYAN, with their
// trim_fraction, krum_byzantine_clients and multi_krum_keep; aggregation/lora_product.h's for
// LORA_PRODUCT, which reads `global`, the adapter the round started from). `device` holds FedAvg's
// sums; the other rules run on the host whatever it is. Errors of the aggregator's Create.
absl::StatusOr<std::unique_ptr<UpdateAggregator>> MakeUpdateAggregator(
    const v1::AggregationConfig& a, std::vector<TensorSpec> spec,
    const std::vector<UpdateTensor>& global, Device device);

// The server optimizer aggregation.strategy asks for (its defaults: server_learning_rate 1.0 for
// FEDAVG / FEDPROX, the robust rules and LORA_PRODUCT, whose aggregate takes the mean's place in a
// plain step;
// 0.01 for the adaptive ones). InvalidArgument on an unknown strategy.
absl::StatusOr<ServerOptimizerOptions> ServerOptimizerOptionsFromConfig(
    const v1::AggregationConfig& a);

// An earlier committed round's adapter, read when the tail average needs it.
struct TailAdapter {
  int64_t round = 0;
  std::function<absl::StatusOr<std::vector<UpdateTensor>>()> load;
};

// What one aggregation starts from. Nothing pointed to is written while the aggregation runs.
struct RoundSnapshot {
  int64_t round = 0;
  // The adapter's federated tensors (config/federated_tensors.h), sorted by name: what updates,
  // the mean, the server step and the tail average cover. The global adapter's other tensors
  // (lora.freeze_a's lora_A) pass through every round unchanged.
  std::vector<TensorSpec> spec;
  int64_t spec_elements = 0;
  // The global adapter the server step starts from (sorted by name), and, with a downlink codec,
  // the broadcast adapter the clients hold (compression/downlink.h).
  std::shared_ptr<const std::vector<UpdateTensor>> global, broadcast;
  // The server optimizer with its state after the last committed round: copied and stepped by
  // Finish. Must outlive the aggregator.
  const ServerOptimizer* optimizer = nullptr;
  // Differential privacy (clipping, the noise and the accountant's step); null without it. Must
  // outlive the aggregator.
  const ServerDp* dp = nullptr;
  // Policies. The aggregation section (its strategy and the strategy's settings); the device of
  // FedAvg's sums; each update's weight is its claimed
  // num_examples capped at weight_cap, or 1 when weight_cap is 0; without DP, updates are clipped
  // to max_update_norm when it is > 0.
  v1::AggregationConfig aggregation;
  Device device = Device::kCpu;
  int64_t weight_cap = 0;
  double max_update_norm = 0;
  // Secure aggregation: the round ends with FinishUnmasked; Add is refused.
  bool masked = false;
  // The downlink codec, seeded for this round; unset without one.
  std::optional<CodecOptions> downlink;
  // On the run's last round with aggregation.average_last_rounds > 1: the earlier committed
  // adapters the final one is averaged with, oldest first. Empty otherwise.
  std::vector<TailAdapter> tail;
};

// What a round produced, for the coordinator to store and commit.
struct RoundResult {
  int64_t updates = 0;                // updates aggregated
  std::vector<UpdateTensor> adapter;  // the next global adapter, sorted by name
  // The stepped optimizer: the server's once the round commits (its state is saved with it).
  std::optional<ServerOptimizer> optimizer;
  // With a downlink codec: the delta from the broadcast adapter and the next broadcast adapter.
  std::optional<DownlinkDelta> downlink;
  // With differential privacy: what the round released (metrics, and the accountant's step).
  std::optional<DpRound> dp;
};

class RoundAggregator {
 public:
  // InvalidArgument when the snapshot lacks its adapter or optimizer; the strategy's errors
  // (MakeUpdateAggregator) otherwise.
  static absl::StatusOr<RoundAggregator> Begin(RoundSnapshot snapshot);

  RoundAggregator(RoundAggregator&&) = default;
  RoundAggregator& operator=(RoundAggregator&&) = default;

  // Whether the strategy holds every update until Finish (UpdateAggregator::needs_all_updates).
  bool needs_all_updates() const;
  // Adds accepted update `upload_id` from its opened body. The body's decoding and matching
  // errors as they come; the strategy's refusal annotated with the upload id. A refused update
  // leaves the aggregate unchanged. FailedPrecondition on a masked round.
  absl::Status Add(const std::string& upload_id, int64_t num_examples, std::string body);
  int64_t num_updates() const;
  // The round's result from the updates added. FailedPrecondition when none was added.
  absl::StatusOr<RoundResult> Finish();
  // A masked round's result from the unmasked mean of its `n` survivors out of a cohort of
  // `cohort` clients.
  absl::StatusOr<RoundResult> FinishUnmasked(std::vector<UpdateTensor> mean, int64_t n,
                                             int64_t cohort);

 private:
  RoundAggregator() = default;
  // From the aggregate delta on: the optimizer step, the tail average, the downlink.
  absl::StatusOr<RoundResult> Complete(std::vector<UpdateTensor> mean, int64_t n,
                                       std::optional<DpRound> dp);
  absl::Status AverageWithTail(std::vector<UpdateTensor>& adapter) const;

  RoundSnapshot s_;
  std::unique_ptr<UpdateAggregator> rule_;  // null on a masked round, and after Finish
  int64_t unclipped_ = 0;                   // with DP: updates that were within the clip norm
};

}  // namespace fedlora
