#include "aggregation/update_aggregator.h"

#include <memory>
#include <utility>

#include "core/status.h"

namespace fedlora {

absl::StatusOr<std::unique_ptr<FedAvgAggregator>> FedAvgAggregator::Create(
    std::vector<TensorSpec> spec, Device device) {
  FEDLORA_ASSIGN_OR_RETURN(StreamingFedAvg sum, StreamingFedAvg::Create(std::move(spec), device));
  return std::unique_ptr<FedAvgAggregator>(new FedAvgAggregator(std::move(sum)));
}

absl::Status FedAvgAggregator::Add(std::vector<KeptTensor> update, int64_t weight) {
  return sum_.Add(update, weight);
}

}  // namespace fedlora
