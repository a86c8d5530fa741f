#include "client/session.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/version.h"
#include "proto/wire.h"

namespace fedlora {

bool IsTransient(const absl::Status& s) {
  // DataLoss: a chunk corrupted on the way; the upload resumes after the last durable chunk.
  // Cancelled: the call reached a server in its shutdown grace (gRPC cancels what is left); the
  // restarted server answers the retry. (Retry checks Stopped() first, so a client that stopped
  // itself does not come here.)
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsAborted(s) ||
         absl::IsDataLoss(s) || absl::IsUnknown(s) || absl::IsCancelled(s);
}

Session::Session(const ClientOptions& options, std::unique_ptr<Transport> transport)
    : options_(options), transport_(std::move(transport)), rng_(std::random_device{}()) {}

const std::string& Session::Who() const {
  return join_.client_id().empty() ? options_.client_id : join_.client_id();
}

absl::Status Session::JoinOnce() {
  v1::JoinRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_client_version(options_.client_version.empty() ? FEDLORA_VERSION
                                                             : options_.client_version);
  request.mutable_capabilities()->set_device_name(options_.device_name);
  request.mutable_capabilities()->set_has_cuda(options_.has_cuda);
  v1::JoinResponse response;
  session_.clear();
  FEDLORA_RETURN_IF_ERROR(transport_->Join(Meta(options_.call_deadline_ms), request, &response));
  if (response.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat("server speaks protocol ",
                                                      response.protocol_version(), ", this client ",
                                                      kProtocolVersion));
  }
  session_ = response.session_token();
  joined_ = true;
  join_ = response;
  return absl::OkStatus();
}

Session::Next Session::AfterFailure(const char* what, int attempt, bool busy_is_transient,
                                    absl::Status& last) {
  // A connection that fails for a TLS reason (a certificate, plaintext against TLS) fails so on
  // every try: the transport says why, and the error is not retried.
  if (absl::IsUnavailable(last)) {
    absl::Status why = transport_->ExplainUnavailable(last);
    if (!absl::IsUnavailable(why)) {
      last = Annotate(why, what);
      return Next::kReturn;
    }
  }
  if (absl::IsUnauthenticated(last) && joined_) {
    FEDLORA_LOG(INFO) << Who() << ": session lost (" << last << "); joining again";
    absl::Status j = JoinOnce();
    if (!j.ok() && !IsTransient(j)) {
      last = j;
      return Next::kReturn;
    }
    return Next::kAgainNow;
  }
  const bool transient =
      IsTransient(last) || (busy_is_transient && absl::IsResourceExhausted(last));
  if (!transient || Stopped()) return Next::kReturn;
  if (attempt == 1) {
    FEDLORA_LOG(WARNING) << Who() << ": " << what << " to " << options_.server_address
                         << " failed (" << last << "); trying again, "
                         << options_.retry.max_attempts - 1 << " more times over about "
                         << (RetryBudgetMs() + 999) / 1000 << " s";
  } else {
    FEDLORA_LOG(DEBUG) << what << " attempt " << attempt << " failed: " << last;
  }
  if (attempt < options_.retry.max_attempts && !SleepFor(Backoff(attempt))) {
    last = absl::CancelledError("client stopped");
    return Next::kReturn;
  }
  return Next::kAgainAfterPause;
}

absl::Status Session::GaveUp(const char* what, const absl::Status& last) const {
  return Annotate(last,
                  absl::StrCat(what, ": gave up after ", options_.retry.max_attempts, " attempts"));
}

bool Session::Stopped() {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

bool Session::SleepFor(int64_t ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stop_; });
}

void Session::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
}

int64_t Session::RetryBudgetMs() const {
  const RetryPolicy& p = options_.retry;
  double total = 0, ms = static_cast<double>(p.initial_backoff_ms);
  for (int i = 1; i < p.max_attempts;
       ++i, ms = std::min(ms * p.multiplier, static_cast<double>(p.max_backoff_ms))) {
    total += std::min(ms, static_cast<double>(p.max_backoff_ms));
  }
  return static_cast<int64_t>(total);
}

int64_t Session::Backoff(int attempt) {
  const RetryPolicy& p = options_.retry;
  double ms = static_cast<double>(p.initial_backoff_ms);
  for (int i = 1; i < attempt && ms < p.max_backoff_ms; ++i) ms *= p.multiplier;
  ms = std::min(ms, static_cast<double>(p.max_backoff_ms));
  std::uniform_real_distribution<double> jitter(1.0 - p.jitter, 1.0 + p.jitter);
  return static_cast<int64_t>(ms * jitter(rng_));
}

}  // namespace fedlora
