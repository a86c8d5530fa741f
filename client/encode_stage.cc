#include "client/encode_stage.h"

#include "absl/strings/str_cat.h"
#include "client/task_failure.h"
#include "compression/codec.h"
#include "compression/update_io.h"
#include "core/logging.h"
#include "core/status.h"
#include "crypto/envelope.h"
#include "crypto/key_signature.h"
#include "kernels/base/backend.h"

namespace fedlora {

absl::Status CheckAggregationKey(Session& session, const v1::TrainTask& task) {
  const v1::AggregationKey& k = task.aggregation_key();
  if (task.encryption_scheme() != v1::EncryptionSpec::X25519_HKDF_AES256GCM ||
      k.public_key().size() != crypto::kX25519KeyBytes) {
    return absl::FailedPreconditionError(
        "the server offers no X25519_HKDF_AES256GCM aggregation key; this client uploads sealed "
        "updates only");
  }
  if (k.key_id() != crypto::AggregationKeyId(k.public_key())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the task's aggregation key id '", k.key_id().substr(0, 80), "' does not name its key"));
  }
  if (const crypto::AggregationKeyTrust* trust = session.transport().KeyTrust()) {
    // Over TLS the key must be the server's own, whatever terminated the TLS connection.
    FEDLORA_RETURN_IF_ERROR_CTX(
        crypto::VerifyAggregationKey(*trust, k.signer_certificate_pem(), k.signature(),
                                     session.run_id(), task.round(), k.public_key()),
        "refusing to seal an update to this round's key");
  }
  return absl::OkStatus();
}

absl::StatusOr<crypto::SealedBlob> SealForTask(const Session& session, const v1::TrainTask& task,
                                               const std::string& upload_id,
                                               int64_t claimed_examples,
                                               const std::string& encoded) {
  const crypto::UpdatePlace place{session.run_id(), task.round(), session.join().client_id(),
                                  upload_id, static_cast<uint64_t>(claimed_examples)};
  return crypto::SealUpdateBlob(task.aggregation_key().public_key(), place, encoded);
}

UpdateEncoder::~UpdateEncoder() = default;

absl::StatusOr<std::string> UpdateEncoder::Encode(const v1::TrainTask& task,
                                                  const std::vector<NamedTensor>& delta) {
  const std::vector<UpdateTensor>& update = delta;
  FEDLORA_ASSIGN_OR_RETURN(CodecOptions codec, CodecOptionsFromSpec(task.codec()));
  codec.seed = task.seed();  // random-k indices and stochastic rounding: reproducible per task
  pending_ = nullptr;
  if (codec.error_feedback) {
    FEDLORA_ASSIGN_OR_RETURN(pending_, Feedback());
  }
  // Low-rank factorisation has no GPU path: such a codec encodes on the host.
  kernels::Backend* device = nullptr;
  if (codec.sparsifier != Sparsifier::kLowRank) {
    FEDLORA_ASSIGN_OR_RETURN(device, EncodeDevice());
  }
  absl::StatusOr<std::string> wire = pending_ != nullptr ? pending_->Encode(update, codec, device)
                                                         : EncodeUpdate(update, codec, device);
  if (!wire.ok()) {
    pending_ = nullptr;
    absl::Status e = Annotate(wire.status(), device != nullptr ? "encoding the update on the GPU"
                                                               : "encoding the update");
    // The trainer's delta does not match the adapter's names or shapes: it will not next time
    // either.
    return absl::IsInvalidArgument(e) ? WithFailureKind(std::move(e), "local") : e;
  }
  return wire;
}

void UpdateEncoder::Commit() {
  if (pending_ == nullptr) return;
  pending_->Commit();
  pending_ = nullptr;
  if (session_.options().state_dir.empty()) return;
  if (absl::Status st = feedback_->Save(FeedbackPath(), feedback_run_); !st.ok()) {
    FEDLORA_LOG(ERROR) << session_.Who()
                       << ": the error-feedback residual was not saved (a restart loses it): "
                       << st;
  }
}

std::string UpdateEncoder::FeedbackPath() const {
  return session_.options().state_dir + "/error_feedback.safetensors";
}

absl::StatusOr<ErrorFeedback*> UpdateEncoder::Feedback() {
  const std::string& run = session_.run_id();
  if (feedback_ && feedback_run_ == run) return &*feedback_;
  feedback_run_ = run;
  if (session_.options().state_dir.empty()) {
    FEDLORA_LOG(WARNING) << session_.Who()
                         << ": the run's codec keeps an error-feedback residual; without a "
                         << "state directory it lives in memory only and a restart loses it";
    feedback_.emplace();
  } else {
    FEDLORA_ASSIGN_OR_RETURN(ErrorFeedback loaded, ErrorFeedback::Load(FeedbackPath(), run));
    feedback_ = std::move(loaded);
  }
  return &*feedback_;
}

absl::StatusOr<kernels::Backend*> UpdateEncoder::EncodeDevice() {
  if (!session_.options().encode_on_cuda) return nullptr;
  if (device_ == nullptr) {
    FEDLORA_ASSIGN_OR_RETURN(device_, kernels::Backend::Create(fedlora::Device::kCuda));
  }
  return device_.get();
}

}  // namespace fedlora
