#include "client/secagg_stage.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/secure_update.h"
#include "core/logging.h"
#include "core/status.h"

namespace fedlora {

SecAggSession::SecAggSession(Session& session, const v1::TrainTask& task,
                             crypto::SecAggClient client,
                             std::chrono::steady_clock::time_point until)
    : session_(session), task_(task), client_(std::move(client)), until_(until) {
  base_.set_round(task.round());
  base_.set_task_id(task.task_id());
}

absl::StatusOr<std::unique_ptr<SecAggSession>> SecAggSession::Start(
    Session& session, const v1::TrainTask& task, std::chrono::steady_clock::time_point until) {
  const v1::SecureAggregationTask& sa = task.secure_aggregation();
  FEDLORA_ASSIGN_OR_RETURN(crypto::SecAggClient c,
                           crypto::SecAggClient::Create(sa.params(), sa.client_index()));
  std::unique_ptr<SecAggSession> s(new SecAggSession(session, task, std::move(c), until));
  v1::SecureAggregationRequest request = s->base_;
  FEDLORA_ASSIGN_OR_RETURN(*request.mutable_advertise_keys(), s->client_.AdvertiseKeys());
  FEDLORA_ASSIGN_OR_RETURN(v1::SecureAggregationResponse response, s->Step(request));
  if (!response.has_share_keys()) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", task.round(), ": secure aggregation: ", response.done()));
  }
  request = s->base_;
  FEDLORA_ASSIGN_OR_RETURN(*request.mutable_share_keys(),
                           s->client_.ShareKeys(response.share_keys()));
  FEDLORA_ASSIGN_OR_RETURN(response, s->Step(request));
  if (!response.has_masked_input()) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", task.round(), ": secure aggregation: ", response.done()));
  }
  s->masked_request_ = response.masked_input();
  return s;
}

absl::StatusOr<std::string> SecAggSession::MaskedInput(const std::vector<NamedTensor>& delta) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<uint64_t> input,
                           EncodeSecureUpdate(delta, task_.secure_aggregation()));
  FEDLORA_ASSIGN_OR_RETURN(v1::SecAggMaskedInputResponse masked,
                           client_.MaskedInput(masked_request_, input));
  return std::move(*masked.mutable_masked_input());
}

void SecAggSession::Unmask() {
  v1::SecureAggregationRequest poll = base_;
  poll.set_poll(true);
  absl::StatusOr<v1::SecureAggregationResponse> response = Step(poll);
  if (response.ok() && response->has_unmasking()) {
    v1::SecureAggregationRequest request = base_;
    absl::StatusOr<v1::SecAggUnmaskingResponse> shares = client_.Unmask(response->unmasking());
    if (shares.ok()) {
      *request.mutable_unmasking() = *std::move(shares);
      response = Call(request);
    } else {
      response = shares.status();  // an inconsistent request: refused, nothing revealed
    }
  }
  if (!response.ok()) {
    FEDLORA_LOG(WARNING) << session_.Who() << ": round " << task_.round()
                         << ": unmasking: " << response.status();
  }
}

absl::StatusOr<v1::SecureAggregationResponse> SecAggSession::Call(
    const v1::SecureAggregationRequest& request) {
  v1::SecureAggregationResponse response;
  FEDLORA_RETURN_IF_ERROR(session_.Retry("SecureAggregation", [&] {
    return session_.transport().SecureAggregation(
        session_.Meta(session_.options().call_deadline_ms), request, &response);
  }));
  return response;
}

absl::StatusOr<v1::SecureAggregationResponse> SecAggSession::Step(
    v1::SecureAggregationRequest request) {
  while (true) {
    FEDLORA_ASSIGN_OR_RETURN(v1::SecureAggregationResponse response, Call(request));
    if (!response.has_retry_after_ms()) return response;
    if (std::chrono::steady_clock::now() >= until_) {
      return absl::DeadlineExceededError(
          absl::StrCat("round ", request.round(), ": secure aggregation did not move on"));
    }
    request.set_poll(true);  // the message was taken: from now on only ask
    if (!session_.SleepFor(std::max<int64_t>(20, response.retry_after_ms())))
      return absl::CancelledError("client stopped");
  }
}

}  // namespace fedlora
