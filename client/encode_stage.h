// A task's encode-and-seal stage: the trained delta encoded with the task's codec (through the
// run's error-feedback residual when the codec keeps one; top-k and quantization on the GPU when
// ClientOptions.encode_on_cuda), then sealed (AES-256-GCM) to the round's aggregation key for this
// run, round, identity and upload only. The key is checked first: it must be named by its id and,
// over TLS, signed by the server (crypto/key_signature.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/session.h"
#include "compression/error_feedback.h"
#include "crypto/sealed_update.h"
#include "fedlora/client_trainer.h"
#include "fedlora/v1/federation.pb.h"

namespace fedlora {
namespace kernels {
class Backend;
}

// FailedPrecondition unless the task offers an X25519_HKDF_AES256GCM key named by its id and, over
// TLS, signed by the server's key.
absl::Status CheckAggregationKey(Session& session, const v1::TrainTask& task);

// `encoded` sealed to the task's aggregation key for (run, round, identity, upload_id, examples).
absl::StatusOr<crypto::SealedBlob> SealForTask(const Session& session, const v1::TrainTask& task,
                                               const std::string& upload_id,
                                               int64_t claimed_examples,
                                               const std::string& encoded);

class UpdateEncoder {
 public:
  explicit UpdateEncoder(Session& session) : session_(session) {}
  ~UpdateEncoder();

  // The delta encoded with the task's codec; a delta that does not fit the codec (its names or
  // shapes) is a "local" failure (client/task_failure.h).
  absl::StatusOr<std::string> Encode(const v1::TrainTask& task,
                                     const std::vector<NamedTensor>& delta);
  // After the server accepted the update: what the codec did not send waits for the next update
  // (saved in state_dir when set). Nothing to do when the codec keeps no residual.
  void Commit();

 private:
  // The error-feedback residual of this run: loaded from state_dir the first time, or empty.
  absl::StatusOr<ErrorFeedback*> Feedback();
  std::string FeedbackPath() const;
  // The GPU for the top-k and quantization stages (made at the first update) with encode_on_cuda,
  // else null (the host).
  absl::StatusOr<kernels::Backend*> EncodeDevice();

  Session& session_;
  std::optional<ErrorFeedback> feedback_;
  std::string feedback_run_;                  // the run id feedback_ belongs to
  ErrorFeedback* pending_ = nullptr;          // the residual the last Encode used, until Commit
  std::shared_ptr<kernels::Backend> device_;  // EncodeDevice()'s, once made
};

}  // namespace fedlora
