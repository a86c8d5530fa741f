// The coordinator's upload half: BeginUpload (the free disk and the upload's row read outside the
// lock, then UploadAdmission's decision over a snapshot taken under it: server/upload_admission.h),
// the per-client byte quota as a stream goes, opening and validating a complete sealed update
// before it enters blobs/, its durable acceptance, upload status, and the sweep of partial uploads
// that can no longer complete.
#include <sys/statvfs.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compression/sparsify.h"
#include "compression/update_io.h"
#include "core/file.h"
#include "core/logging.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "crypto/envelope.h"
#include "crypto/sealed_update.h"
#include "proto/wire.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"
#include "server/crash_point.h"
#include "server/update_spec.h"

namespace fedlora {
namespace {

// Bytes available to an unprivileged writer on the file system holding `dir`.
absl::StatusOr<int64_t> FreeDiskBytes(const std::string& dir) {
  struct statvfs st;
  if (::statvfs(dir.c_str(), &st) != 0) return ErrnoToStatus(errno, "statvfs", dir);
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Downloads and uploads

absl::StatusOr<v1::AdapterManifest> Coordinator::AdapterManifestFor(const std::string& sha256) {
  absl::MutexLock lock(&mu_);
  auto it = downloadable_.find(sha256);
  if (it == downloadable_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no global adapter with SHA-256 '", sha256.substr(0, 80), "'"));
  }
  return ManifestLocked(sha256, it->second.round, it->second.bytes);
}

absl::StatusOr<UploadPlan> Coordinator::BeginUpload(const std::string& client_id,
                                                    const v1::UploadHeader& header) {
  if (!IsValidPartialId(header.upload_id())) {
    return absl::InvalidArgumentError(
        "upload_id must be 1-128 characters of [A-Za-z0-9._-], not starting with '.'");
  }
  const std::string& id = header.upload_id();
  // Disk and store reads before mu_ is taken. The row read may be stale by the time mu_ is held
  // (another stream of this upload_id just ended): the store's own checks below keep that from
  // counting anything twice, and the client is told to retry.
  UploadSnapshot snapshot;
  FEDLORA_ASSIGN_OR_RETURN(snapshot.free_disk_bytes, options_.free_disk_bytes_for_test
                                                         ? options_.free_disk_bytes_for_test()
                                                         : FreeDiskBytes(options_.data_dir));
  snapshot.existing = store_->GetUpload(id);
  if (!snapshot.existing.ok() && !absl::IsNotFound(snapshot.existing.status()))
    return snapshot.existing.status();
  UploadRecord record;
  FEDLORA_ASSIGN_OR_RETURN(UploadPlan plan,
                           AdmitUpload(client_id, header, std::move(snapshot), &record));
  if (plan.duplicate_ack.has_value()) {
    // The row may come from a concurrent acceptance still waiting for its fsync.
    FEDLORA_RETURN_IF_ERROR(store_->SyncCommitted());
    return plan;
  }
  // The upload_id is locked to this stream now; its "receiving" row is written outside mu_ (the
  // store refuses it should the round have closed meanwhile). Not awaited: see the header.
  DurabilityTicket not_awaited;
  absl::StatusOr<UploadRecord> stored = store_->BeginUpload(record, &not_awaited);
  if (stored.ok() && static_cast<int64_t>(header.start_chunk()) > stored->chunks_received) {
    stored = absl::FailedPreconditionError(
        absl::StrCat("upload '", id, "' can resume at chunk ", stored->chunks_received,
                     " at the latest, not ", header.start_chunk()));
  }
  if (!stored.ok()) {
    EndUpload(id);
    return stored.status();
  }
  plan.chunks_durable = stored->chunks_received;
  plan.bytes_durable = stored->bytes;
  return plan;
}

absl::StatusOr<UploadPlan> Coordinator::AdmitUpload(const std::string& client_id,
                                                    const v1::UploadHeader& header,
                                                    UploadSnapshot snapshot, UploadRecord* record) {
  const std::string& id = header.upload_id();
  absl::MutexLock lock(&mu_);
  SnapshotUploadLocked(client_id, id, &snapshot);
  UploadDecision d = upload_admission_.Decide(client_id, header, snapshot);
  ClientEntry* c = clients_.Find(client_id);  // non-null once the checks reached the quotas
  if (d.quota_round.has_value()) c->StartQuotaRound(*d.quota_round);
  if (d.quota_refused) metrics_->quota_refusals.fetch_add(1);
  if (!d.status.ok()) return d.status;
  UploadPlan plan;
  if (d.duplicate_ack.has_value()) {
    plan.duplicate_ack = std::move(d.duplicate_ack);
    metrics_->updates_duplicate.fetch_add(1);
    return plan;
  }
  *record = std::move(d.record);
  active_uploads_[id] = {client_id, d.reserved_bytes};
  disk_reserved_ += d.reserved_bytes;
  ++c->uploads_in_flight;
  if (d.new_upload) ++c->uploads_this_round;
  metrics_->uploads_streaming.store(static_cast<int64_t>(active_uploads_.size()));
  return plan;
}

void Coordinator::SnapshotUploadLocked(const std::string& client_id, const std::string& upload_id,
                                       UploadSnapshot* s) {
  s->restored = restored_;
  s->finished = finished_;
  s->run_id = run_id_;
  s->now_ms = Now();
  if (auto rej = rejected_.find(upload_id); rej != rejected_.end())
    s->rejected = UploadSnapshot::Rejection{rej->second.client_id, rej->second.reason};
  if (round_ != nullptr) {
    const RoundInfo& r = *round_;
    UploadSnapshot::Round& o = s->round.emplace();
    o.round = r.round;
    o.state = r.state;
    o.deadline_ms = r.deadline_ms;
    o.selected = r.selected.count(client_id) != 0;
    if (o.selected) o.task_id = TaskIdFor(r.round, client_id);
    if (auto acc = r.accepted.find(client_id); acc != r.accepted.end())
      o.accepted_upload = acc->second;
    o.trains_from = broadcast_hash_;
    if (r.key != nullptr) o.key_id = r.key->key_id;
  }
  s->last_committed_round = last_committed_round_;
  s->spec = &spec_;
  s->streaming = active_uploads_.count(upload_id) != 0;
  if (const ClientEntry* c = clients_.Find(client_id)) {
    s->client = UploadQuota{c->quota_round, c->bytes_this_round, c->uploads_this_round,
                            c->uploads_in_flight};
  }
  s->disk_reserved = disk_reserved_;
}

absl::Status Coordinator::QuotaRefused(std::string message) const {
  metrics_->quota_refusals.fetch_add(1);
  return absl::ResourceExhaustedError(std::move(message));
}

absl::Status Coordinator::ChargeUploadBytes(const std::string& client_id, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  ClientEntry* c = clients_.Find(client_id);
  if (c == nullptr)
    return absl::UnauthenticatedError(absl::StrCat("unknown client '", client_id, "'"));
  c->StartQuotaRound(round_ ? round_->round : last_committed_round_);
  c->last_seen_ms = Now();  // a client streaming its update is alive, heartbeat or not
  if (c->bytes_this_round + bytes > options_.max_client_bytes_per_round) {
    return QuotaRefused(absl::StrCat("client '", client_id, "' passed its limit of ",
                                     options_.max_client_bytes_per_round,
                                     " update bytes in this round"));
  }
  c->bytes_this_round += bytes;
  return absl::OkStatus();
}

absl::Status Coordinator::RecordUploadProgress(const std::string& upload_id, int64_t chunks,
                                               int64_t bytes) {
  return store_->RecordUploadProgress(upload_id, chunks, bytes);
}

void Coordinator::EndUpload(const std::string& upload_id) {
  absl::MutexLock lock(&mu_);
  auto it = active_uploads_.find(upload_id);
  if (it == active_uploads_.end()) return;
  if (ClientEntry* c = clients_.Find(it->second.client_id)) --c->uploads_in_flight;
  disk_reserved_ -= it->second.reserved_bytes;
  active_uploads_.erase(it);
  metrics_->uploads_streaming.store(static_cast<int64_t>(active_uploads_.size()));
}

void Coordinator::RejectUpload(const std::string& client_id, const std::string& upload_id,
                               const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  metrics_->updates_rejected.fetch_add(1);
  if (ClientEntry* c = clients_.Find(client_id)) ++c->updates_rejected;
  if (!upload_id.empty()) {
    if (round_) ++round_->rejected;  // a complete update refused at validation
    rejected_[upload_id] = {client_id, std::string(why.message()),
                            round_ ? round_->round : last_committed_round_};
  }
}

namespace {

// A sparsified update keeps exactly the run's fraction: KeptCount of each tensor, or of the
// whole update with global top-k. More would undo the compression the run asked for.
absl::Status CheckKeptCounts(const std::vector<UpdateTensorInfo>& table,
                             const CodecOptions& codec) {
  // Low-rank counts follow from the header's rank and each shape; the decoder checked them.
  if (codec.sparsifier == Sparsifier::kNone || codec.sparsifier == Sparsifier::kLowRank)
    return absl::OkStatus();
  int64_t total = 0, kept = 0;
  for (const UpdateTensorInfo& t : table) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    total += n;
    kept += t.kept;
    if (!codec.global_top_k && t.kept != KeptCount(n, codec.fraction)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "update tensor '", t.name, "' keeps ", t.kept, " of ", n, " entries; the run's ",
          codec.Describe(), " keeps ", KeptCount(n, codec.fraction)));
    }
  }
  if (codec.global_top_k && kept != KeptCount(total, codec.fraction)) {
    return absl::InvalidArgumentError(absl::StrCat("update keeps ", kept, " of ", total,
                                                   " entries; the run's ", codec.Describe(),
                                                   " keeps ", KeptCount(total, codec.fraction)));
  }
  return absl::OkStatus();
}

}  // namespace

crypto::UpdatePlace Coordinator::PlaceOf(const std::string& client_id,
                                         const v1::UploadHeader& header) const {
  return {run_id_, header.round(), client_id, header.upload_id(), header.num_examples()};
}

absl::StatusOr<std::shared_ptr<const AggregationKey>> Coordinator::KeyFor(int64_t round) const {
  absl::MutexLock lock(&mu_);
  if (round_ == nullptr || round_->round != round || round_->key == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round, " is not open: its aggregation key is destroyed"));
  }
  return round_->key;
}

absl::Status Coordinator::ValidateUpload(const std::string& client_id,
                                         const v1::UploadHeader& header,
                                         std::string_view blob) const {
  FEDLORA_ASSIGN_OR_RETURN(std::string_view ephemeral, crypto::SealedBlobEphemeralKey(blob));
  if (ephemeral != header.encryption().ephemeral_public_key()) {
    return absl::InvalidArgumentError(
        "the sealed update's ephemeral key differs from its header's");
  }
  FEDLORA_ASSIGN_OR_RETURN(const size_t size, crypto::SealedBlobPlaintextSize(blob));
  FEDLORA_ASSIGN_OR_RETURN(const std::shared_ptr<const AggregationKey> key,
                           KeyFor(static_cast<int64_t>(header.round())));
  FEDLORA_ASSIGN_OR_RETURN(MappedBuffer plain, MappedBuffer::Create(size));
  // Opened in memory only: nothing of the plaintext reaches the disk. The sealed bytes (a file
  // mapping, BlobWriter::Verify) are dropped from this process as decryption passes them, so a
  // large update is resident about once, not twice.
  const size_t sealed_prefix =
      blob.size() - size - crypto::kGcmTagBytes;  // key and envelope header
  uint64_t blob_dropped = 0;
  FEDLORA_RETURN_IF_ERROR(crypto::OpenUpdateBlobInto(
      key->private_key, PlaceOf(client_id, header), blob, plain.data(), size,
      [&](size_t decrypted) {
        DropPagesBefore(blob.data(), sealed_prefix + decrypted, &blob_dropped);
      }));
  DropPagesBefore(blob.data(), blob.size(), &blob_dropped);
  const std::string_view bytes = plain.view();
  if (secagg_.has_value()) {
    const v1::CodecSpec& run = config_.codec();
    const v1::CodecSpec& declared = header.codec();
    const bool same = declared.stages_size() == run.stages_size() &&
                      (run.stages_size() == 0 ||
                       (declared.stages(0).id() == run.stages(0).id() &&
                        declared.stages(0).quant().bits() == run.stages(0).quant().bits()));
    if (!same) {
      return absl::InvalidArgumentError(
          "a masked update must declare the run's codec (empty, or its QUANT stage)");
    }
    return secagg_->ValidateMasked(bytes, spec_elements_);
  }
  FEDLORA_ASSIGN_OR_RETURN(UpdateHeader codec_header, ParseUpdateHeader(bytes, DecodeLimits{}));
  const CodecOptions encoded = codec_header.options();
  FEDLORA_ASSIGN_OR_RETURN(CodecOptions declared, CodecOptionsFromSpec(header.codec()));
  if (!encoded.SameWireFormat(declared)) {
    return absl::InvalidArgumentError(absl::StrCat("update is encoded as ", encoded.Describe(),
                                                   " but the header declares ",
                                                   declared.Describe()));
  }
  const CodecOptions& run_codec = run_.codecs.uplink;
  if (!declared.SameWireFormat(run_codec) || declared.fraction != run_codec.fraction ||
      declared.global_top_k != run_codec.global_top_k) {
    return absl::InvalidArgumentError(absl::StrCat("update is encoded as ", declared.Describe(),
                                                   " but the run's codec is ",
                                                   run_codec.Describe()));
  }
  // Every check DecodeAndValidate makes, without materialising the values; AggregateAndCommit
  // decodes it later. Pages already checked go back to the OS as validation moves on.
  uint64_t dropped = 0;
  FEDLORA_ASSIGN_OR_RETURN(
      std::vector<UpdateTensorInfo> table,
      ValidateUpdate(bytes, LimitsForSpec(spec_, spec_elements_), [&](uint64_t consumed) {
        DropPagesBefore(bytes.data(), consumed, &dropped);
      }));
  FEDLORA_RETURN_IF_ERROR(MatchSpec(table, spec_));
  return CheckKeptCounts(table, run_codec);
}

absl::StatusOr<v1::UploadAck> Coordinator::CompleteUpload(const std::string& client_id,
                                                          const v1::UploadHeader& header,
                                                          const std::string& blob_hash,
                                                          int64_t blob_size) {
  // The row is committed under mu_ but its fsync is waited for after mu_ is released, so that the
  // acceptances of concurrent uploads share one WAL fsync instead of queueing on the lock. Nothing
  // leaves this function (no ack) before the row is durable; the in-memory round may count it a
  // moment earlier, and whatever the round does with it next (closing, aggregating) is itself a
  // synced transaction that makes this row durable first.
  DurabilityTicket ticket;
  absl::StatusOr<v1::UploadAck> result =
      CompleteUploadLocked(client_id, header, blob_hash, static_cast<size_t>(blob_size), &ticket);
  if (!result.ok()) return result;
  FEDLORA_RETURN_IF_ERROR(result->duplicate() ? store_->SyncCommitted()
                                              : store_->WaitDurable(ticket));
  if (!result->duplicate()) MaybeCrashAt("after_ack");  // durable, not yet acknowledged
  return result;
}

absl::StatusOr<v1::UploadAck> Coordinator::CompleteUploadLocked(const std::string& client_id,
                                                                const v1::UploadHeader& header,
                                                                const std::string& blob_hash,
                                                                size_t blob_size,
                                                                DurabilityTicket* ticket) {
  absl::MutexLock lock(&mu_);
  const int64_t round = static_cast<int64_t>(header.round());
  // The round may have closed while the bytes were streaming.
  if (round_ == nullptr || round_->round != round || round_->state != RoundState::kTraining) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round, " closed before the upload completed; the update is stale"));
  }
  if (Now() >= round_->deadline_ms) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round, " passed its deadline; the update is stale"));
  }
  if (const ClientEntry* c = clients_.Find(client_id); c != nullptr && c->blocked)
    return BlockedError(client_id);
  if (const SecAggRound* s = round_->secagg.get(); s != nullptr) {
    // A masked update only counts from a client whose keys are in the round's key sharing (U2).
    if (!s->MayUpload(client_id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("round ", round, ": '", client_id,
                       "' cannot upload a masked update (the key sharing did not include it)"));
    }
  }
  UploadRecord record;
  record.upload_id = header.upload_id();
  record.run_id = run_id_;
  record.round = round;
  record.client_id = client_id;
  record.task_id = header.task_id();
  record.num_examples = static_cast<int64_t>(header.num_examples());
  record.blob_hash = blob_hash;
  record.bytes = static_cast<int64_t>(blob_size);
  record.chunks_received = header.manifest().num_chunks();
  MaybeCrashAt("before_ack");
  absl::Status s = store_->RecordAccepted(record, ticket);
  v1::UploadAck ack;
  ack.set_upload_id(header.upload_id());
  ack.set_state(v1::UPLOAD_STATE_ACCEPTED);
  ack.set_chunks_acknowledged(header.manifest().num_chunks());
  ack.set_bytes_acknowledged(static_cast<uint64_t>(blob_size));
  if (absl::IsAlreadyExists(s)) {
    ack.set_duplicate(true);
    metrics_->updates_duplicate.fetch_add(1);
    return ack;
  }
  FEDLORA_RETURN_IF_ERROR(s);
  round_->accepted[client_id] = header.upload_id();
  if (ClientEntry* c = clients_.Find(client_id)) c->reported = v1::CLIENT_STATE_IDLE;
  metrics_->updates_accepted.fetch_add(1);
  metrics_->update_fp32_bytes.fetch_add(spec_elements_ * static_cast<int64_t>(sizeof(float)));
  FEDLORA_LOG(DEBUG) << "round " << round << ": accepted update " << header.upload_id() << " from "
                     << client_id << " (" << round_->accepted.size() << "/" << Target() << ")";
  absl::Status close = MaybeCloseRoundLocked();
  if (!close.ok()) {
    FEDLORA_LOG(ERROR) << "closing round " << round << ": " << close;
  }
  return ack;
}

absl::StatusOr<v1::UploadStatusResponse> Coordinator::GetUploadStatus(
    const std::string& client_id, const std::string& upload_id) {
  v1::UploadStatusResponse response;
  response.set_upload_id(upload_id);
  // Ownership first: another client's upload, refused or not, reads as unknown.
  {
    absl::MutexLock lock(&mu_);
    if (auto it = rejected_.find(upload_id); it != rejected_.end()) {
      if (it->second.client_id != client_id) {
        response.set_state(v1::UPLOAD_STATE_UNKNOWN);
        return response;
      }
      response.set_state(v1::UPLOAD_STATE_REJECTED);
      response.set_reason(it->second.reason);
      return response;
    }
  }
  // Report only durable state: rows other streams committed may still wait for their fsync.
  FEDLORA_RETURN_IF_ERROR(store_->SyncCommitted());
  absl::StatusOr<UploadRecord> record = store_->GetUpload(upload_id);
  if (absl::IsNotFound(record.status())) {
    response.set_state(v1::UPLOAD_STATE_UNKNOWN);
    return response;
  }
  FEDLORA_RETURN_IF_ERROR(record.status());
  if (record->client_id != client_id || record->run_id != run_id_) {
    response.set_state(v1::UPLOAD_STATE_UNKNOWN);
    return response;
  }
  response.set_state(record->state == UploadState::kAccepted ? v1::UPLOAD_STATE_ACCEPTED
                                                             : v1::UPLOAD_STATE_IN_PROGRESS);
  response.set_chunks_acknowledged(static_cast<uint32_t>(record->chunks_received));
  response.set_bytes_acknowledged(static_cast<uint64_t>(record->bytes));
  response.set_round(static_cast<uint64_t>(record->round));
  response.set_task_id(record->task_id);
  return response;
}

void Coordinator::SweepPartials() {
  int64_t training_round = 0;
  {
    absl::MutexLock lock(&mu_);
    if (round_ != nullptr && round_->state == RoundState::kTraining) training_round = round_->round;
  }
  absl::StatusOr<std::vector<std::string>> ids = blobs_->ListPartials();
  if (!ids.ok()) {
    FEDLORA_LOG(WARNING) << "listing partial uploads: " << ids.status();
    return;
  }
  for (const std::string& id : *ids) {
    absl::StatusOr<UploadRecord> u = store_->GetUpload(id);
    if (u.ok() && u->run_id == run_id_ && u->state == UploadState::kReceiving &&
        u->round == training_round)
      continue;
    if (!u.ok() && !absl::IsNotFound(u.status())) continue;  // a store hiccup: try again next time
    {
      absl::MutexLock lock(&mu_);
      // A stream that is still open discards its own partial when its upload fails.
      if (active_uploads_.count(id) != 0) continue;
    }
    absl::Status s = blobs_->DiscardPartial(id);
    if (!s.ok()) {
      FEDLORA_LOG(WARNING) << "discarding partial upload " << id << ": " << s;
      continue;
    }
    metrics_->partial_uploads_discarded.fetch_add(1);
  }
}

}  // namespace fedlora
