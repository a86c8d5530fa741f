// The aggregation strategy seam: how one round's decoded updates become the aggregate delta that
// the server optimizer then steps with (aggregation/server_optimizer.h).
//
//   std::unique_ptr<UpdateAggregator> a = ...;  // a strategy's class, or the server's factory
//   for (...) FEDLORA_RETURN_IF_ERROR(a->Add(std::move(update), weight));
//   FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> delta, a->Finish());
//
// A streaming sum (FedAvgAggregator, below) folds each update in and keeps O(model) memory; a
// robust statistic (a coordinate-wise median) keeps every update until Finish and says so with
// needs_all_updates(); a buffered asynchronous aggregator weighs each update as it arrives. A new
// strategy is one class implementing this interface and one entry in the server's factory
// (MakeUpdateAggregator, server/round_aggregator.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "aggregation/fedavg.h"
#include "compression/codec.h"
#include "kernels/base/backend.h"

namespace fedlora {

class UpdateAggregator {
 public:
  virtual ~UpdateAggregator() = default;

  // The strategy's name, for logs.
  virtual std::string_view name() const = 0;
  // Whether the strategy holds every update until Finish (memory grows with the cohort) rather
  // than folding each one in as it is added (memory O(model)).
  virtual bool needs_all_updates() const = 0;

  // Adds one update (tensors matched to the adapter by name, a sparsified tensor as its kept
  // entries) with weight `weight` >= 1. InvalidArgument naming the problem when the update does not
  // fit the adapter or a value is out of range; a refused update leaves the aggregate unchanged.
  virtual absl::Status Add(std::vector<KeptTensor> update, int64_t weight) = 0;
  // Updates added so far.
  virtual int64_t num_updates() const = 0;
  // The aggregate delta, in the adapter's tensor order. FailedPrecondition when nothing was added.
  virtual absl::StatusOr<std::vector<UpdateTensor>> Finish() = 0;
};

// Federated averaging: the weighted mean of the updates, summed exactly and order-independently
// by StreamingFedAvg (aggregation/fedavg.h); the same updates give the same bits in any order.
class FedAvgAggregator final : public UpdateAggregator {
 public:
  // Errors as StreamingFedAvg::Create.
  static absl::StatusOr<std::unique_ptr<FedAvgAggregator>> Create(std::vector<TensorSpec> spec,
                                                                  Device device = Device::kCpu);

  std::string_view name() const override { return "fedavg"; }
  bool needs_all_updates() const override { return false; }
  absl::Status Add(std::vector<KeptTensor> update, int64_t weight) override;
  int64_t num_updates() const override { return sum_.num_updates(); }
  absl::StatusOr<std::vector<UpdateTensor>> Finish() override { return sum_.Finish(); }

 private:
  explicit FedAvgAggregator(StreamingFedAvg sum) : sum_(std::move(sum)) {}
  StreamingFedAvg sum_;
};

}  // namespace fedlora
