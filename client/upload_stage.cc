#include "client/upload_stage.h"

#include <string_view>

#include "absl/strings/str_cat.h"
#include "client/task_failure.h"
#include "config/defaults.h"
#include "core/sha256.h"
#include "core/status.h"
#include "core/strings.h"

namespace fedlora {
namespace {

// One attempt: `chunk_sha256` holds each chunk's hex digest, computed once for all attempts.
absl::Status UploadAttempt(Session& session, const v1::UploadHeader& base, const std::string& blob,
                           const std::vector<std::string>& chunk_sha256, bool* accepted) {
  *accepted = false;
  // Where to start: what the server already holds durably.
  v1::UploadStatusRequest status_request;
  status_request.set_upload_id(base.upload_id());
  v1::UploadStatusResponse status;
  FEDLORA_RETURN_IF_ERROR(session.transport().GetUploadStatus(
      session.Meta(session.options().call_deadline_ms), status_request, &status));
  if (status.state() == v1::UPLOAD_STATE_ACCEPTED) {
    *accepted = true;
    return absl::OkStatus();
  }
  if (status.state() == v1::UPLOAD_STATE_REJECTED) {
    return absl::FailedPreconditionError(absl::StrCat("update was rejected: ", status.reason()));
  }
  const uint32_t start =
      status.state() == v1::UPLOAD_STATE_IN_PROGRESS ? status.chunks_acknowledged() : 0;
  v1::UploadChunk header;
  *header.mutable_header() = base;
  header.mutable_header()->set_start_chunk(start);
  const uint64_t chunk = base.manifest().chunk_size_bytes();
  uint32_t i = start;
  auto next = [&](v1::UploadChunk* message) {
    if (i >= base.manifest().num_chunks()) return false;
    message->Clear();
    v1::UploadData* data = message->mutable_data();
    data->set_chunk_index(i);
    data->set_offset_bytes(i * chunk);
    data->set_data(blob.substr(i * chunk, chunk));
    data->set_sha256(chunk_sha256[i]);
    ++i;
    return true;
  };
  v1::UploadAck ack;
  FEDLORA_RETURN_IF_ERROR(session.transport().UploadUpdate(
      session.Meta(session.options().transfer_deadline_ms), header, next, &ack));
  if (ack.state() == v1::UPLOAD_STATE_ACCEPTED) {
    *accepted = true;
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat("upload stream ended at chunk ",
                                             ack.chunks_acknowledged(), " of ",
                                             base.manifest().num_chunks(), "; resuming"));
}

}  // namespace

absl::Status UploadUpdate(Session& session, const v1::TrainTask& task, const SealedUpload& update,
                          const std::vector<NamedTensor>& delta) {
  const std::string& blob = update.blob;
  const v1::ServerLimits& limits = session.join().limits();
  if (limits.max_update_bytes() > 0 && blob.size() > limits.max_update_bytes()) {
    return WithFailureKind(
        absl::ResourceExhaustedError(absl::StrCat(
            "the sealed update of ", blob.size(), " bytes exceeds the server's limit of ",
            limits.max_update_bytes(), " bytes (ServerLimits.max_update_bytes); not uploaded")),
        "local");
  }
  v1::UploadHeader header;
  header.set_upload_id(update.upload_id);
  header.set_round(task.round());
  header.set_task_id(task.task_id());
  header.set_num_examples(static_cast<uint64_t>(update.num_examples));
  *header.mutable_codec() = task.codec();
  v1::EncryptionSpec* encryption = header.mutable_encryption();
  encryption->set_scheme(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
  encryption->set_ephemeral_public_key(update.ephemeral_public_key);
  encryption->set_server_key_id(task.aggregation_key().key_id());
  header.set_base_adapter_sha256(task.global_adapter().sha256());
  v1::AdapterManifest* m = header.mutable_manifest();
  for (const NamedTensor& t : delta) {
    v1::TensorSpec* spec = m->add_tensors();
    spec->set_name(t.name);
    spec->set_dtype("F32");
    for (int64_t d : t.shape) spec->add_shape(d);
  }
  const uint32_t chunk =
      limits.chunk_size_bytes() > 0 ? limits.chunk_size_bytes() : kDefaultChunkSizeBytes;
  m->set_total_bytes(blob.size());
  // The blob's digest and every chunk's in one pass over the bytes.
  std::vector<std::string> chunk_sha256;
  Sha256 whole;
  for (size_t off = 0; off < blob.size(); off += chunk) {
    const Sha256DigestBytes d = whole.UpdateAndDigest(std::string_view(blob).substr(off, chunk));
    chunk_sha256.push_back(ToHex(d));
  }
  const Sha256DigestBytes digest = whole.Final();
  m->set_sha256(ToHex(digest));
  m->set_chunk_size_bytes(chunk);
  m->set_num_chunks(static_cast<uint32_t>((blob.size() + chunk - 1) / chunk));
  m->set_round(task.round());
  return session.Retry("UploadUpdate", [&]() -> absl::Status {
    bool accepted = false;
    FEDLORA_RETURN_IF_ERROR(UploadAttempt(session, header, blob, chunk_sha256, &accepted));
    return accepted ? absl::OkStatus() : absl::UnavailableError("upload not accepted yet");
  });
}

}  // namespace fedlora
