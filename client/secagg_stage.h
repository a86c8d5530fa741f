// A task's secure-aggregation session (SecAgg+, crypto/secagg.h), with every client of the round:
// Start advertises fresh keys, shares the secrets and receives the neighbours' shares for the mask
// (steps 0 and 1, before training); MaskedInput is the update as the masked fixed-point vector
// (step 2); Unmask, once the uploads close, reveals the shares the server needs to unmask the sum
// (step 3). Each step is sent, then polled until the answer is not "ask again" or the task's
// deadline plus two minutes passes (DeadlineExceeded).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/session.h"
#include "crypto/secagg.h"
#include "fedlora/client_trainer.h"
#include "fedlora/v1/federation.pb.h"

namespace fedlora {

class SecAggSession {
 public:
  // Steps 0 and 1. FailedPrecondition when the server ends the protocol for this client.
  static absl::StatusOr<std::unique_ptr<SecAggSession>> Start(
      Session& session, const v1::TrainTask& task, std::chrono::steady_clock::time_point until);
  // Step 2: clipped, noised (the client's share of the DP noise), encoded and masked.
  absl::StatusOr<std::string> MaskedInput(const std::vector<NamedTensor>& delta);
  // Step 3, best effort: a failure is logged (the server may unmask without this client's shares).
  void Unmask();

 private:
  SecAggSession(Session& session, const v1::TrainTask& task, crypto::SecAggClient client,
                std::chrono::steady_clock::time_point until);
  // One SecureAggregation call (retried).
  absl::StatusOr<v1::SecureAggregationResponse> Call(const v1::SecureAggregationRequest& request);
  // `request` sent, then polled until the answer is not "ask again" or `until_` passes.
  absl::StatusOr<v1::SecureAggregationResponse> Step(v1::SecureAggregationRequest request);

  Session& session_;
  const v1::TrainTask& task_;
  crypto::SecAggClient client_;
  const std::chrono::steady_clock::time_point until_;
  v1::SecureAggregationRequest base_;  // round and task id
  v1::SecAggMaskedInputRequest masked_request_;
};

}  // namespace fedlora
