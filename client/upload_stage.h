// A task's upload stage: the sealed update streamed in the server's chunk size, each chunk with its
// SHA-256, under one upload id for every retry, resumed after what the server already holds
// durably (GetUploadStatus). An update larger than the server's ServerLimits.max_update_bytes is
// refused before anything is sent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/session.h"
#include "fedlora/client_trainer.h"
#include "fedlora/v1/federation.pb.h"

namespace fedlora {

struct SealedUpload {
  std::string upload_id;
  std::string blob;                  // the sealed bytes
  std::string ephemeral_public_key;  // the blob's sealing key
  int64_t num_examples = 0;          // the FedAvg weight claimed
};

// OK once the server accepted the update. The manifest names `delta`'s tensors. ResourceExhausted,
// marked a "local" failure (client/task_failure.h), when the blob exceeds the server's limit.
absl::Status UploadUpdate(Session& session, const v1::TrainTask& task, const SealedUpload& update,
                          const std::vector<NamedTensor>& delta);

}  // namespace fedlora
