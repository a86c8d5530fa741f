#include "server/round_aggregator.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "aggregation/lora_product.h"
#include "config/defaults.h"
#include "config/robust_options.h"
#include "core/logging.h"
#include "core/status.h"
#include "server/update_spec.h"

namespace fedlora {
namespace {

absl::Status UnknownStrategy(v1::AggregationConfig::Strategy strategy) {
  return absl::InvalidArgumentError(absl::StrCat(
      "aggregation.strategy ", static_cast<int>(strategy), " is not a known strategy"));
}

// Moves the tensors `spec` names out of `adapter` (both sorted by name) and returns them in order;
// `adapter` keeps the others (lora.freeze_a's lora_A), which no update, step or mean touches.
std::vector<UpdateTensor> TakeFederated(std::vector<UpdateTensor>& adapter,
                                        const std::vector<TensorSpec>& spec) {
  std::vector<UpdateTensor> taken, kept;
  size_t s = 0;
  for (UpdateTensor& t : adapter) {
    if (s < spec.size() && t.name == spec[s].name) {
      taken.push_back(std::move(t));
      ++s;
    } else {
      kept.push_back(std::move(t));
    }
  }
  adapter = std::move(kept);
  return taken;
}

// Merges `taken` back into `adapter`, sorted by name.
void PutBack(std::vector<UpdateTensor>& adapter, std::vector<UpdateTensor> taken) {
  std::vector<UpdateTensor> merged;
  merged.reserve(adapter.size() + taken.size());
  const auto by_name = [](const UpdateTensor& a, const UpdateTensor& b) { return a.name < b.name; };
  std::merge(std::make_move_iterator(adapter.begin()), std::make_move_iterator(adapter.end()),
             std::make_move_iterator(taken.begin()), std::make_move_iterator(taken.end()),
             std::back_inserter(merged), by_name);
  adapter = std::move(merged);
}

}  // namespace

absl::StatusOr<std::unique_ptr<UpdateAggregator>> MakeUpdateAggregator(
    const v1::AggregationConfig& a, std::vector<TensorSpec> spec,
    const std::vector<UpdateTensor>& global, Device device) {
  if (std::optional<RobustOptions> robust = RobustOptionsOf(a)) {
    FEDLORA_ASSIGN_OR_RETURN(std::unique_ptr<RobustAggregator> r,
                             RobustAggregator::Create(std::move(spec), *robust));
    return std::unique_ptr<UpdateAggregator>(std::move(r));
  }
  switch (a.strategy()) {
    case v1::AggregationConfig::STRATEGY_UNSPECIFIED:
    case v1::AggregationConfig::FEDAVG:
    case v1::AggregationConfig::FEDPROX:
    case v1::AggregationConfig::FEDADAM:
    case v1::AggregationConfig::FEDYOGI:
    case v1::AggregationConfig::FEDADAGRAD: {
      FEDLORA_ASSIGN_OR_RETURN(std::unique_ptr<FedAvgAggregator> f,
                               FedAvgAggregator::Create(std::move(spec), device));
      return std::unique_ptr<UpdateAggregator>(std::move(f));
    }
    case v1::AggregationConfig::LORA_PRODUCT: {
      FEDLORA_ASSIGN_OR_RETURN(std::unique_ptr<LoraProductAggregator> p,
                               LoraProductAggregator::Create(std::move(spec), global));
      return std::unique_ptr<UpdateAggregator>(std::move(p));
    }
    default:
      return UnknownStrategy(a.strategy());
  }
}

absl::StatusOr<ServerOptimizerOptions> ServerOptimizerOptionsFromConfig(
    const v1::AggregationConfig& a) {
  ServerOptimizerOptions o;
  switch (a.strategy()) {
    case v1::AggregationConfig::STRATEGY_UNSPECIFIED:
    case v1::AggregationConfig::FEDAVG:
    case v1::AggregationConfig::FEDPROX:
    case v1::AggregationConfig::MEDIAN:
    case v1::AggregationConfig::TRIMMED_MEAN:
    case v1::AggregationConfig::KRUM:
    case v1::AggregationConfig::MULTI_KRUM:
    case v1::AggregationConfig::BULYAN:
    case v1::AggregationConfig::LORA_PRODUCT:
      o.kind = ServerOptimizerKind::kSgd;
      break;
    case v1::AggregationConfig::FEDADAM:
      o.kind = ServerOptimizerKind::kAdam;
      break;
    case v1::AggregationConfig::FEDYOGI:
      o.kind = ServerOptimizerKind::kYogi;
      break;
    case v1::AggregationConfig::FEDADAGRAD:
      o.kind = ServerOptimizerKind::kAdagrad;
      break;
    default:
      return UnknownStrategy(a.strategy());
  }
  const bool adaptive = o.kind != ServerOptimizerKind::kSgd;
  o.learning_rate = a.has_server_learning_rate() ? a.server_learning_rate()
                                                 : (adaptive ? kDefaultAdaptiveServerLearningRate
                                                             : kDefaultServerLearningRate);
  o.momentum = a.server_momentum();
  if (a.has_server_beta1()) o.beta1 = a.server_beta1();
  if (a.has_server_beta2()) o.beta2 = a.server_beta2();
  if (a.has_server_tau()) o.tau = a.server_tau();
  return o;
}

absl::StatusOr<RoundAggregator> RoundAggregator::Begin(RoundSnapshot snapshot) {
  if (snapshot.global == nullptr || snapshot.optimizer == nullptr) {
    return absl::InvalidArgumentError(
        "RoundAggregator: the snapshot lacks its adapter or optimizer");
  }
  if (snapshot.downlink.has_value() && snapshot.broadcast == nullptr) {
    return absl::InvalidArgumentError(
        "RoundAggregator: a downlink codec needs the broadcast adapter");
  }
  RoundAggregator a;
  if (!snapshot.masked) {
    FEDLORA_ASSIGN_OR_RETURN(a.rule_, MakeUpdateAggregator(snapshot.aggregation, snapshot.spec,
                                                           *snapshot.global, snapshot.device));
  }
  a.s_ = std::move(snapshot);
  return a;
}

bool RoundAggregator::needs_all_updates() const {
  return rule_ != nullptr && rule_->needs_all_updates();
}

int64_t RoundAggregator::num_updates() const { return rule_ == nullptr ? 0 : rule_->num_updates(); }

absl::Status RoundAggregator::Add(const std::string& upload_id, int64_t num_examples,
                                  std::string body) {
  if (rule_ == nullptr) {
    return absl::FailedPreconditionError(
        s_.masked ? "RoundAggregator: a masked round's updates are summed by secure aggregation"
                  : "RoundAggregator: the round is finished");
  }
  // A sparsified update stays sparse: its kept entries are clipped and added where they go.
  FEDLORA_ASSIGN_OR_RETURN(std::vector<KeptTensor> update,
                           DecodeAndValidate(body, s_.spec, s_.spec_elements));
  std::string().swap(body);
  bool within = false;
  if (s_.dp != nullptr) {
    within = s_.dp->Clip(update);
  } else if (s_.max_update_norm > 0) {
    ClipUpdateNorm(update, s_.max_update_norm);
  }
  const int64_t weight = s_.weight_cap > 0 ? std::min(num_examples, s_.weight_cap) : 1;
  FEDLORA_RETURN_IF_ERROR_CTX(rule_->Add(std::move(update), weight),
                              absl::StrCat("update ", upload_id));
  unclipped_ += within ? 1 : 0;
  return absl::OkStatus();
}

absl::StatusOr<RoundResult> RoundAggregator::Finish() {
  if (rule_ == nullptr) {
    return absl::FailedPreconditionError(
        s_.masked ? "RoundAggregator: a masked round ends with FinishUnmasked"
                  : "RoundAggregator: the round is finished");
  }
  const int64_t n = rule_->num_updates();
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> mean, rule_->Finish());
  rule_.reset();  // the strategy's state (FedAvg: 16 bytes per element) goes before the step
  std::optional<DpRound> dp;
  if (s_.dp != nullptr) {
    FEDLORA_ASSIGN_OR_RETURN(dp, s_.dp->Release(mean, n, unclipped_));
  }
  return Complete(std::move(mean), n, std::move(dp));
}

absl::StatusOr<RoundResult> RoundAggregator::FinishUnmasked(std::vector<UpdateTensor> mean,
                                                            int64_t n, int64_t cohort) {
  if (!s_.masked) {
    return absl::FailedPreconditionError(
        "RoundAggregator: FinishUnmasked on a round without secure aggregation");
  }
  // The clients clipped their updates: an unclipped count does not exist.
  std::optional<DpRound> dp;
  if (s_.dp != nullptr) {
    FEDLORA_ASSIGN_OR_RETURN(dp, s_.dp->Release(mean, n, /*unclipped=*/0, cohort));
  }
  return Complete(std::move(mean), n, std::move(dp));
}

absl::StatusOr<RoundResult> RoundAggregator::Complete(std::vector<UpdateTensor> mean, int64_t n,
                                                      std::optional<DpRound> dp) {
  RoundResult r;
  r.updates = n;
  r.dp = std::move(dp);
  // Step a copy of the optimizer: its state becomes the server's only once the round commits.
  r.optimizer.emplace(*s_.optimizer);
  r.adapter = *s_.global;  // the copy the optimizer steps
  s_.global.reset();
  std::vector<UpdateTensor> trained = TakeFederated(r.adapter, s_.spec);
  FEDLORA_RETURN_IF_ERROR(r.optimizer->Step(mean, trained));
  std::vector<UpdateTensor>().swap(mean);  // not needed past the step: one adapter less held below
  if (!s_.tail.empty()) FEDLORA_RETURN_IF_ERROR(AverageWithTail(trained));
  PutBack(r.adapter, std::move(trained));
  if (s_.downlink.has_value()) {
    FEDLORA_ASSIGN_OR_RETURN(r.downlink,
                             EncodeDownlinkDelta(*s_.broadcast, r.adapter, *s_.downlink));
  }
  s_.broadcast.reset();
  return r;
}

absl::Status RoundAggregator::AverageWithTail(std::vector<UpdateTensor>& adapter) const {
  // The unweighted mean of the federated tensors (`adapter` holds only them), with FedAvg's exact
  // accumulator: the same adapters give the same bits in any order, and Add checks each against
  // the spec.
  FEDLORA_ASSIGN_OR_RETURN(StreamingFedAvg mean, StreamingFedAvg::Create(s_.spec));
  for (const TailAdapter& t : s_.tail) {
    FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> a, t.load());
    FEDLORA_RETURN_IF_ERROR_CTX(mean.Add(TakeFederated(a, s_.spec), 1),
                                absl::StrCat("round ", t.round, "'s committed adapter"));
  }
  FEDLORA_RETURN_IF_ERROR(mean.Add(adapter, 1));
  FEDLORA_ASSIGN_OR_RETURN(adapter, mean.Finish());
  FEDLORA_LOG(INFO) << "round " << s_.round << ": the final adapter is the mean of rounds "
                    << s_.tail.front().round << " to " << s_.round << " (" << s_.tail.size() + 1
                    << " adapters)";
  return absl::OkStatus();
}

}  // namespace fedlora
