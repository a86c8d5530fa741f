// The coordinator's side of secure aggregation (config.privacy.secure_aggregation): it starts the
// round's SecAggRound (server/secagg_round.h) when the selection closes, lets the round clock and
// the SecureAggregation RPC move it through its key steps, and on the aggregation thread feeds it
// the masked uploads and collects the unmasking step.
#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "crypto/sealed_update.h"
#include "crypto/secagg_fixed_point.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"

namespace fedlora {

absl::Status Coordinator::StartSecAggLocked() {
  RoundInfo& r = *round_;
  const uint32_t n = static_cast<uint32_t>(r.selected.size());
  absl::StatusOr<v1::SecAggParams> params =
      SecAggRound::Params(r.round, n, spec_elements_, *secagg_, MinClients());
  if (!params.ok())
    return AbandonRoundLocked(
        absl::StrCat("secure aggregation over ", n, " clients: ", params.status().message()));
  FEDLORA_ASSIGN_OR_RETURN(
      r.secagg, SecAggRound::Start(r.round, r.selected, *params, *secagg_, config_.privacy().dp(),
                                   SecAggRound::StepMs(options_.round_deadline_ms), Now()));
  return absl::OkStatus();
}

absl::Status Coordinator::AdvanceSecAggLocked() {
  if (round_ == nullptr || round_->secagg == nullptr) return absl::OkStatus();
  if (absl::Status st = round_->secagg->Advance(Now()); !st.ok()) {
    return AbandonRoundLocked(std::string(st.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::SecureAggregationResponse> Coordinator::SecureAggregation(
    const std::string& client_id, const v1::SecureAggregationRequest& request) {
  absl::MutexLock lock(&mu_);
  ClientEntry* c = clients_.Find(client_id);
  if (c == nullptr)
    return absl::UnauthenticatedError(absl::StrCat("unknown client '", client_id, "'"));
  c->last_seen_ms = Now();
  const int64_t round = static_cast<int64_t>(request.round());
  if (round_ == nullptr || round_->round != round || round_->secagg == nullptr) {
    return SecAggRound::Done(
        absl::StrCat("round ", round, " has no secure aggregation in progress"));
  }
  const std::optional<uint32_t> i = round_->secagg->IndexOf(client_id);
  if (!i.has_value() || request.task_id() != TaskIdFor(round, client_id)) {
    return absl::PermissionDeniedError(absl::StrCat("client '", client_id, "' holds no task ",
                                                    request.task_id(), " in round ", round));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::optional<v1::SecureAggregationResponse> settled,
                           round_->secagg->Receive(*i, request));
  if (settled.has_value()) return *std::move(settled);
  FEDLORA_RETURN_IF_ERROR(AdvanceSecAggLocked());
  if (round_ == nullptr || round_->round != round || round_->secagg == nullptr) {
    return SecAggRound::Done(absl::StrCat("round ", round, " was abandoned"));
  }
  return round_->secagg->Answer(*i, round_->accepted.count(client_id) != 0);
}

void Coordinator::ExcludeMisbehaving(int64_t round, const std::vector<uint32_t>& misbehaving,
                                     const std::map<std::string, uint32_t>& index) {
  if (misbehaving.empty()) return;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, i] : index) {
    if (!std::binary_search(misbehaving.begin(), misbehaving.end(), i)) continue;
    FEDLORA_LOG(WARNING) << "round " << round << ": " << id
                         << " revealed wrong secure-aggregation shares; the sum "
                         << "was rebuilt without them, and " << id << " sits out round "
                         << round + 1;
    metrics_->secagg_misbehaving_clients.fetch_add(1);
    if (ClientEntry* c = clients_.Find(id)) c->excluded_through_round = round + 1;
  }
}

absl::StatusOr<std::vector<UpdateTensor>> Coordinator::AggregateSecAgg(
    int64_t round, const std::vector<UploadRecord>& uploads, int64_t* survivors) {
  std::unique_ptr<crypto::SecAggServer> server;
  std::map<std::string, uint32_t> index;
  int64_t step_ms = 0;
  FEDLORA_ASSIGN_OR_RETURN(const std::shared_ptr<const AggregationKey> key, KeyFor(round));
  {
    absl::MutexLock lock(&mu_);
    if (round_ != nullptr && round_->round == round && round_->secagg != nullptr) {
      server = round_->secagg->TakeServer();
      index = round_->secagg->index();
      step_ms = round_->secagg->step_ms();
    }
  }
  if (server == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", round, ": its secure aggregation cannot be tried twice (its keys are spent)"));
  }
  // Step 2: the masked inputs of the accepted uploads.
  for (const UploadRecord& u : uploads) {
    auto it = index.find(u.client_id);
    if (it == index.end()) continue;
    FEDLORA_ASSIGN_OR_RETURN(std::string sealed, blobs_->Get(u.blob_hash));
    v1::SecAggMaskedInputResponse masked;
    masked.set_client_index(it->second);
    FEDLORA_ASSIGN_OR_RETURN(*masked.mutable_masked_input(),
                             OpenAccepted(u, *key, std::move(sealed)));
    if (absl::Status st = server->ReceiveMaskedInput(masked); !st.ok()) {
      FEDLORA_LOG(WARNING) << "round " << round << ": masked update of " << u.client_id
                           << " left out: " << st;
    }
    FEDLORA_RETURN_IF_ERROR(CheckNotShuttingDown());
  }
  FEDLORA_RETURN_IF_ERROR_CTX(server->CloseMaskedInput(), "secure aggregation");
  FEDLORA_ASSIGN_OR_RETURN(v1::SecAggUnmaskingRequest request, server->UnmaskingRequest());
  const size_t expected = static_cast<size_t>(request.survivors_size());
  FEDLORA_ASSIGN_OR_RETURN(auto responses, CollectUnmasking(round, request, expected, step_ms));
  for (const auto& [i, response] : responses) {
    if (absl::Status st = server->ReceiveUnmasking(response); !st.ok()) {
      FEDLORA_LOG(WARNING) << "round " << round << ": unmasking shares of client index " << i
                           << " left out: " << st;
    }
  }
  absl::StatusOr<std::vector<uint64_t>> finished = server->Finish();
  ExcludeMisbehaving(round, server->misbehaving(), index);
  FEDLORA_ASSIGN_OR_RETURN(std::vector<uint64_t> sum, std::move(finished));
  FEDLORA_ASSIGN_OR_RETURN(
      std::vector<double> total,
      crypto::DecodeSecAggFixedPointSum(sum, secagg_->frac_bits, secagg_->modulus_bits));
  const int64_t n = static_cast<int64_t>(server->survivors().size());
  FEDLORA_LOG(INFO) << "round " << round << ": secure aggregation unmasked the sum of " << n
                    << " updates (" << responses.size() << " of " << expected
                    << " survivors answered step 3)";
  if (absl::Status st = secagg_->CheckUnmaskedSum(round, total, n, config_.privacy().dp());
      !st.ok()) {
    metrics_->secagg_implausible_sums.fetch_add(1);
    return st;
  }
  *survivors = n;
  return UnmaskedMean(total, n, spec_);
}

absl::StatusOr<std::map<uint32_t, v1::SecAggUnmaskingResponse>> Coordinator::CollectUnmasking(
    int64_t round, const v1::SecAggUnmaskingRequest& request, size_t expected, int64_t step_ms) {
  {
    absl::MutexLock lock(&mu_);
    if (round_ == nullptr || round_->round != round || round_->secagg == nullptr) {
      return absl::AbortedError(absl::StrCat("round ", round, " is no longer open"));
    }
    round_->secagg->OpenUnmasking(request);
  }
  // Step 3: wait for every survivor's shares, or for the step's time.
  const int64_t until = Now() + step_ms;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return absl::CancelledError("the server is shutting down");
      if (round_ == nullptr || round_->secagg == nullptr)
        return absl::AbortedError("the round closed");
      if (auto responses = round_->secagg->CollectUnmasking(expected, Now() >= until)) {
        return *std::move(responses);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace fedlora
