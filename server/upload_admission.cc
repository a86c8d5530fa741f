// UploadAdmission: BeginUpload's checks of an upload header, one function per group, in the order
// the header (upload_admission.h) lists.
#include "server/upload_admission.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "compression/update_io.h"
#include "config/config_io.h"
#include "core/logging.h"
#include "core/strings.h"
#include "crypto/envelope.h"
#include "crypto/sealed_update.h"
#include "server/blob_store.h"
#include "server/update_spec.h"

namespace fedlora {
namespace {

// Idempotency first: a replay of an accepted update gets its original ack (`*duplicate`), even
// after its round closed; an upload_id refused before stays refused.
absl::Status CheckReplay(const std::string& client_id, const v1::UploadHeader& header,
                         const UploadSnapshot& s, std::optional<v1::UploadAck>* duplicate) {
  const std::string& id = header.upload_id();
  if (const absl::StatusOr<UploadRecord>& existing = s.existing; existing.ok()) {
    if (existing->client_id != client_id || existing->run_id != s.run_id) {
      return absl::PermissionDeniedError(
          absl::StrCat("upload_id '", id, "' belongs to another client"));
    }
    if (existing->state == UploadState::kAccepted) {
      if (existing->blob_hash != header.manifest().sha256()) {
        return absl::AlreadyExistsError(absl::StrCat("upload_id '", id, "' was accepted for blob ",
                                                     existing->blob_hash, ", not ",
                                                     header.manifest().sha256()));
      }
      v1::UploadAck ack;
      ack.set_upload_id(id);
      ack.set_state(v1::UPLOAD_STATE_ACCEPTED);
      ack.set_chunks_acknowledged(static_cast<uint32_t>(existing->chunks_received));
      ack.set_bytes_acknowledged(static_cast<uint64_t>(existing->bytes));
      ack.set_duplicate(true);
      *duplicate = std::move(ack);
      return absl::OkStatus();
    }
  }
  if (s.rejected.has_value()) {
    if (s.rejected->client_id != client_id) {
      return absl::PermissionDeniedError(
          absl::StrCat("upload_id '", id, "' belongs to another client"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("upload '", id, "' was rejected: ", s.rejected->reason));
  }
  return absl::OkStatus();
}

// Round binding: the open round, in training, the client's task in it, before its deadline, its
// first update, from the adapter the round trains from.
absl::Status CheckRound(const std::string& client_id, const v1::UploadHeader& header,
                        const UploadSnapshot& s) {
  const int64_t round = static_cast<int64_t>(header.round());
  if (s.finished)
    return absl::FailedPreconditionError("the run is finished; no more updates are accepted");
  if (!s.round.has_value() || round != s.round->round) {
    return absl::FailedPreconditionError(
        absl::StrCat("update is for round ", round, " but the current round is ",
                     s.round ? s.round->round : s.last_committed_round, "; it is stale"));
  }
  const UploadSnapshot::Round& r = *s.round;
  if (r.state != RoundState::kTraining) {
    return absl::FailedPreconditionError(absl::StrCat("round ", round, " is ",
                                                      ToAbsl(RoundStateName(r.state)),
                                                      " and no longer accepts updates"));
  }
  if (!r.selected) {
    return absl::PermissionDeniedError(
        absl::StrCat("client '", client_id, "' was not selected for round ", round));
  }
  if (header.task_id() != r.task_id) {
    return absl::PermissionDeniedError(absl::StrCat("task '", header.task_id(), "' of round ",
                                                    round, " was not assigned to client '",
                                                    client_id, "'"));
  }
  if (s.now_ms >= r.deadline_ms) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round, " passed its deadline; the update is stale"));
  }
  if (r.accepted_upload.has_value()) {
    return absl::AlreadyExistsError(absl::StrCat("client '", client_id, "' already has update '",
                                                 *r.accepted_upload, "' accepted for round ",
                                                 round));
  }
  if (header.base_adapter_sha256() != r.trains_from) {
    return absl::FailedPreconditionError(
        absl::StrCat("update is a delta from adapter ", header.base_adapter_sha256().substr(0, 80),
                     " but round ", round, " trains from ", r.trains_from));
  }
  return absl::OkStatus();
}

// The claimed number of examples (the update's weight).
absl::Status CheckClaim(const UploadLimits& limits, const std::string& client_id,
                        const v1::UploadHeader& header) {
  if (header.num_examples() < 1 ||
      header.num_examples() > static_cast<uint64_t>(StreamingFedAvg::kMaxWeight)) {
    return absl::InvalidArgumentError(absl::StrCat("num_examples ", header.num_examples(),
                                                   " is outside [1, ", StreamingFedAvg::kMaxWeight,
                                                   "]"));
  }
  if (limits.one_example_each && header.num_examples() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_examples ", header.num_examples(),
                     ": under secure aggregation or differential privacy every update "
                     "weighs the same and a site claims 1 example, so that the size of its data is "
                     "not disclosed"));
  }
  if (const uint64_t cap = limits.max_examples_per_client;
      limits.weight_by_examples && header.num_examples() > cap) {
    FEDLORA_LOG(WARNING) << "client '" << client_id << "' claims " << header.num_examples()
                         << " examples in round " << header.round()
                         << "; its update weighs aggregation.max_examples_per_client = " << cap;
  }
  return absl::OkStatus();
}

// Every update is sealed to the round's aggregation key: the store holds nothing a TLS-terminating
// proxy could read, and nothing of a closed round that a copied disk could.
absl::Status CheckSeal(const v1::UploadHeader& header, const UploadSnapshot::Round& r) {
  const v1::EncryptionSpec& enc = header.encryption();
  if (enc.scheme() != v1::EncryptionSpec::X25519_HKDF_AES256GCM) {
    return absl::InvalidArgumentError(
        absl::StrCat("update is not sealed (encryption scheme ",
                     v1::EncryptionSpec::Scheme_IsValid(enc.scheme())
                         ? v1::EncryptionSpec::Scheme_Name(enc.scheme())
                         : std::to_string(enc.scheme()),
                     "); this server takes X25519_HKDF_AES256GCM only"));
  }
  if (enc.server_key_id() != r.key_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("update is sealed to key '", enc.server_key_id().substr(0, 80), "'; round ",
                     r.round, "'s aggregation key is '", r.key_id, "'"));
  }
  if (enc.ephemeral_public_key().size() != crypto::kX25519KeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("encryption.ephemeral_public_key has ",
                                                   enc.ephemeral_public_key().size(),
                                                   " bytes, not ", crypto::kX25519KeyBytes));
  }
  return absl::OkStatus();
}

// The manifest must describe the adapter exactly and be cut the way the server expects.
absl::Status CheckManifest(const UploadLimits& limits, const v1::AdapterManifest& m,
                           const std::vector<TensorSpec>& spec) {
  if (!IsValidBlobHash(m.sha256()))
    return absl::InvalidArgumentError("manifest.sha256 is not 64 lowercase hex digits");
  if (m.total_bytes() > static_cast<uint64_t>(limits.max_upload_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat("update of ", m.total_bytes(),
                                                     " bytes exceeds the limit of ",
                                                     limits.max_upload_bytes, " bytes"));
  }
  if (m.total_bytes() < kUpdateHeaderSize + crypto::SealedBlobOverheadBytes()) {
    return absl::InvalidArgumentError(absl::StrCat("update of ", m.total_bytes(),
                                                   " bytes is shorter than a sealed ",
                                                   kUpdateHeaderSize, "-byte codec header"));
  }
  if (m.chunk_size_bytes() != static_cast<uint64_t>(limits.chunk_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("manifest.chunk_size_bytes is ",
                                                   m.chunk_size_bytes(), "; this server uses ",
                                                   limits.chunk_bytes));
  }
  const int64_t chunks =
      (static_cast<int64_t>(m.total_bytes()) + limits.chunk_bytes - 1) / limits.chunk_bytes;
  if (m.num_chunks() != static_cast<uint64_t>(chunks)) {
    return absl::InvalidArgumentError(absl::StrCat("manifest.num_chunks is ", m.num_chunks(),
                                                   " for ", m.total_bytes(), " bytes in chunks of ",
                                                   limits.chunk_bytes));
  }
  for (const v1::TensorSpec& t : m.tensors()) {
    if (!InSpec(spec, t.name())) return NotInSpec("manifest tensor", t.name());
  }
  if (m.tensors_size() != static_cast<int>(spec.size())) {
    return absl::InvalidArgumentError(absl::StrCat("manifest lists ", m.tensors_size(),
                                                   " tensors; the adapter has ", spec.size()));
  }
  std::map<std::string, const v1::TensorSpec*> by_name;
  for (const v1::TensorSpec& t : m.tensors()) by_name[t.name()] = &t;
  for (const TensorSpec& g : spec) {
    auto it = by_name.find(g.name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest lacks adapter tensor '", g.name, "'"));
    }
    const v1::TensorSpec& t = *it->second;
    std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    if (shape != g.shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", g.name, "' has shape ",
                                                     ShapeText(shape), "; the adapter's is ",
                                                     ShapeText(g.shape)));
    }
    if (t.dtype() != "F32") {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", g.name, "' is declared ",
                                                     t.dtype(), "; decoded updates are F32"));
    }
  }
  return absl::OkStatus();
}

absl::Status QuotaRefusal(UploadDecision* d, std::string message) {
  d->quota_refused = true;
  return absl::ResourceExhaustedError(std::move(message));
}

// The stream (this upload_id not streaming elsewhere, a known client), the client's quotas and the
// free-disk watermark. Sets d's quota fields and, when admitted, the disk it reserves.
absl::Status CheckStreamAndQuotas(const UploadLimits& limits, const std::string& client_id,
                                  const v1::UploadHeader& header, const UploadSnapshot& s,
                                  UploadDecision* d) {
  const std::string& id = header.upload_id();
  const int64_t round = static_cast<int64_t>(header.round());
  if (s.streaming) {
    return absl::AbortedError(
        absl::StrCat("upload '", id, "' is already streaming on another call; retry later"));
  }
  if (!s.client.has_value())
    return absl::UnauthenticatedError(absl::StrCat("unknown client '", client_id, "'"));
  UploadQuota q = *s.client;
  if (q.uploads_in_flight >= limits.max_client_uploads_in_flight) {
    return QuotaRefusal(
        d, absl::StrCat("client '", client_id, "' already streams ", q.uploads_in_flight,
                        " uploads; the limit is ", limits.max_client_uploads_in_flight));
  }
  d->quota_round = round;
  if (q.round != round) q.bytes_this_round = q.uploads_this_round = 0;
  const bool new_upload = !s.existing.ok();  // a resume continues a row this quota already counted
  if (new_upload && q.uploads_this_round >= limits.max_client_uploads_per_round) {
    return QuotaRefusal(d, absl::StrCat("client '", client_id, "' began ", q.uploads_this_round,
                                        " uploads in round ", round, "; the limit is ",
                                        limits.max_client_uploads_per_round));
  }
  const v1::AdapterManifest& m = header.manifest();
  if (q.bytes_this_round + static_cast<int64_t>(m.total_bytes()) -
          static_cast<int64_t>(header.start_chunk()) * limits.chunk_bytes >
      limits.max_client_bytes_per_round) {
    return QuotaRefusal(
        d, absl::StrCat("client '", client_id, "' streamed ", q.bytes_this_round,
                        " bytes in round ", round, "; this upload would pass the limit of ",
                        limits.max_client_bytes_per_round));
  }
  // The free-disk watermark: refuse a new upload rather than fill the disk under the store. The
  // free space was read before the coordinator's lock; the uploads admitted since and still
  // streaming have not written yet, so their sizes are reserved against it.
  const int64_t size = static_cast<int64_t>(m.total_bytes());
  if (s.free_disk_bytes - s.disk_reserved < limits.min_free_disk_bytes + size) {
    return QuotaRefusal(
        d,
        absl::StrCat("the store's disk has ", s.free_disk_bytes, " bytes free, ", s.disk_reserved,
                     " of them reserved for uploads streaming; an update of ", size,
                     " bytes would leave less than the watermark of ", limits.min_free_disk_bytes));
  }
  d->reserved_bytes = size;
  d->new_upload = new_upload;
  return absl::OkStatus();
}

}  // namespace

UploadLimits UploadLimitsFor(const ServerOptions& options, const v1::RunConfig& config) {
  UploadLimits l;
  l.max_upload_bytes = options.max_upload_bytes;
  l.chunk_bytes = options.chunk_bytes;
  l.max_client_uploads_in_flight = options.max_client_uploads_in_flight;
  l.max_client_uploads_per_round = options.max_client_uploads_per_round;
  l.max_client_bytes_per_round = options.max_client_bytes_per_round;
  l.min_free_disk_bytes = options.min_free_disk_bytes;
  l.one_example_each = HidesPerClientStatistics(config);
  l.weight_by_examples = config.aggregation().weight_by_examples();
  l.max_examples_per_client = config.aggregation().max_examples_per_client();
  return l;
}

UploadDecision UploadAdmission::Decide(const std::string& client_id, const v1::UploadHeader& header,
                                       const UploadSnapshot& s) const {
  UploadDecision d;
  if (!s.restored) {
    d.status = absl::UnavailableError("server is restoring its state; retry");
    return d;
  }
  d.status = CheckReplay(client_id, header, s, &d.duplicate_ack);
  if (!d.status.ok() || d.duplicate_ack.has_value()) return d;
  d.status = CheckRound(client_id, header, s);
  if (d.status.ok()) d.status = CheckClaim(limits_, client_id, header);
  if (d.status.ok()) d.status = CheckSeal(header, *s.round);
  if (d.status.ok()) d.status = CheckManifest(limits_, header.manifest(), *s.spec);
  if (d.status.ok()) d.status = CodecOptionsFromSpec(header.codec()).status();
  if (d.status.ok()) d.status = CheckStreamAndQuotas(limits_, client_id, header, s, &d);
  if (!d.status.ok()) return d;
  UploadRecord& record = d.record;
  record.upload_id = header.upload_id();
  record.run_id = s.run_id;
  record.round = static_cast<int64_t>(header.round());
  record.client_id = client_id;
  record.task_id = header.task_id();
  record.num_examples = static_cast<int64_t>(header.num_examples());
  return d;
}

}  // namespace fedlora
