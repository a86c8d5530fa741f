// The store's uploads (receiving, progress, accepted), metrics, audit copies, and the blob hashes
// the rows still reference (what blob GC keeps).
#include <sqlite3.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/strings.h"
#include "server/blob_store.h"
#include "server/store.h"
#include "server/store_internal.h"

namespace fedlora {

using store_internal::AcceptsUploads;
using store_internal::RoundName;
using store_internal::SameBinding;
using store_internal::Stmt;

namespace {

absl::Status ValidateUploadIds(const UploadRecord& u, std::string_view op) {
  if (u.upload_id.empty() || u.run_id.empty() || u.client_id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(op), ": upload_id, run_id and client_id must be non-empty (upload_id '",
                     u.upload_id, "', run_id '", u.run_id, "', client_id '", u.client_id, "')"));
  }
  if (u.round < 1)
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(op), ": round ", u.round, " must be >= 1"));
  return absl::OkStatus();
}

absl::Status BindingMismatch(const UploadRecord& stored, const UploadRecord& u,
                             std::string_view op) {
  return absl::FailedPreconditionError(
      absl::StrCat(ToAbsl(op), ": upload_id '", u.upload_id, "' is bound to client '",
                   stored.client_id, "', task '", stored.task_id, "', ",
                   RoundName(stored.run_id, stored.round), "; refused for client '", u.client_id,
                   "', task '", u.task_id, "', ", RoundName(u.run_id, u.round)));
}

// RecordAccepted's checks of the record itself, before the transaction.
absl::Status CheckAcceptedRecord(const UploadRecord& upload) {
  FEDLORA_RETURN_IF_ERROR(ValidateUploadIds(upload, "RecordAccepted"));
  if (!IsValidBlobHash(upload.blob_hash)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordAccepted('", upload.upload_id, "'): blob_hash '",
                     upload.blob_hash.substr(0, 80), "' is not a SHA-256 hex"));
  }
  if (upload.num_examples < 1 || upload.bytes < 0 || upload.chunks_received < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordAccepted('", upload.upload_id, "'): num_examples ", upload.num_examples,
                     " must be >= 1 and bytes ", upload.bytes, ", chunks_received ",
                     upload.chunks_received, " >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<UploadRecord> Store::BeginUpload(const UploadRecord& upload,
                                                DurabilityTicket* deferred) {
  FEDLORA_RETURN_IF_ERROR(ValidateUploadIds(upload, "BeginUpload"));
  if (upload.num_examples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BeginUpload: num_examples ", upload.num_examples, " < 0"));
  }
  DurabilityTicket ticket;
  auto result = DeferredTransaction(&ticket, [&]() -> absl::StatusOr<UploadRecord> {
    FEDLORA_ASSIGN_OR_RETURN(std::optional<UploadRecord> existing,
                             impl_->FindUpload(upload.upload_id));
    if (existing.has_value()) {
      if (!SameBinding(*existing, upload)) return BindingMismatch(*existing, upload, "BeginUpload");
      return *std::move(existing);
    }
    FEDLORA_ASSIGN_OR_RETURN(RoundState st, impl_->RoundStateOf(upload.run_id, upload.round));
    if (!AcceptsUploads(st)) {
      return absl::FailedPreconditionError(
          absl::StrCat("BeginUpload: ", RoundName(upload.run_id, upload.round), " is ",
                       ToAbsl(RoundStateName(st)), " and no longer accepts uploads"));
    }
    {
      std::unique_ptr<Stmt> h;
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s, impl_->Query("INSERT INTO uploads(upload_id, run_id, round, client_id, "
                                 "task_id, num_examples, state, created_ms) "
                                 "VALUES(?, ?, ?, ?, ?, ?, 'receiving', ?)",
                                 h));
      s->Bind(upload.upload_id)
          .Bind(upload.run_id)
          .Bind(upload.round)
          .Bind(upload.client_id)
          .Bind(upload.task_id);
      s->Bind(upload.num_examples).Bind(impl_->Now());
      FEDLORA_RETURN_IF_ERROR(s->Run());
    }
    FEDLORA_ASSIGN_OR_RETURN(std::optional<UploadRecord> stored,
                             impl_->FindUpload(upload.upload_id));
    return *std::move(stored);
  });
  FEDLORA_RETURN_IF_ERROR(result.status());
  FEDLORA_RETURN_IF_ERROR(FinishDurability(ticket, deferred));
  return result;
}

absl::Status Store::RecordUploadProgress(const std::string& upload_id, int64_t chunks_received,
                                         int64_t bytes, DurabilityTicket* deferred) {
  if (chunks_received < 0 || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("RecordUploadProgress('", upload_id,
                                                   "'): chunks_received ", chunks_received,
                                                   " and bytes ", bytes, " must be >= 0"));
  }
  DurabilityTicket ticket;
  auto result = DeferredTransaction(&ticket, [&]() -> absl::Status {
    FEDLORA_ASSIGN_OR_RETURN(std::optional<UploadRecord> existing, impl_->FindUpload(upload_id));
    if (!existing.has_value())
      return absl::NotFoundError(absl::StrCat("upload '", upload_id, "' not found"));
    if (existing->state != UploadState::kReceiving) {
      return absl::FailedPreconditionError(
          absl::StrCat("RecordUploadProgress: upload '", upload_id, "' is already accepted"));
    }
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(
        Stmt * s,
        impl_->Query("UPDATE uploads SET chunks_received = ?, bytes = ? WHERE upload_id = ?", h));
    s->Bind(chunks_received).Bind(bytes).Bind(upload_id);
    return s->Run();
  });
  FEDLORA_RETURN_IF_ERROR(result);
  return FinishDurability(ticket, deferred);
}

absl::Status Store::Impl::CheckNoOtherAccepted(const UploadRecord& upload) {
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(Stmt * s,
                           Query("SELECT upload_id FROM uploads WHERE run_id = ? AND round = ? "
                                 "AND client_id = ? AND task_id = ? AND state = 'accepted'",
                                 h));
  s->Bind(upload.run_id).Bind(upload.round).Bind(upload.client_id).Bind(upload.task_id);
  FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
  if (row) {
    return absl::AlreadyExistsError(absl::StrCat(
        "client '", upload.client_id, "' already has accepted upload '", s->Text(0), "' for task '",
        upload.task_id, "' of ", RoundName(upload.run_id, upload.round)));
  }
  return absl::OkStatus();
}

absl::Status Store::Impl::WriteAccepted(const UploadRecord& upload, bool exists) {
  const int64_t now = Now();
  std::unique_ptr<Stmt> h;
  if (exists) {
    FEDLORA_ASSIGN_OR_RETURN(Stmt * s,
                             Query("UPDATE uploads SET state = 'accepted', num_examples = ?, "
                                   "blob_hash = ?, bytes = ?, chunks_received = ?, "
                                   "accepted_ms = ? WHERE upload_id = ?",
                                   h));
    s->Bind(upload.num_examples)
        .Bind(upload.blob_hash)
        .Bind(upload.bytes)
        .Bind(upload.chunks_received)
        .Bind(now);
    s->Bind(upload.upload_id);
    FEDLORA_RETURN_IF_ERROR(s->Run());
  } else {
    FEDLORA_ASSIGN_OR_RETURN(Stmt * s,
                             Query("INSERT INTO uploads(upload_id, run_id, round, client_id, "
                                   "task_id, num_examples, blob_hash, bytes, state, "
                                   "chunks_received, created_ms, accepted_ms) "
                                   "VALUES(?, ?, ?, ?, ?, ?, ?, ?, 'accepted', ?, ?, ?)",
                                   h));
    s->Bind(upload.upload_id)
        .Bind(upload.run_id)
        .Bind(upload.round)
        .Bind(upload.client_id)
        .Bind(upload.task_id);
    s->Bind(upload.num_examples)
        .Bind(upload.blob_hash)
        .Bind(upload.bytes)
        .Bind(upload.chunks_received);
    s->Bind(now).Bind(now);
    FEDLORA_RETURN_IF_ERROR(s->Run());
  }
  return absl::OkStatus();
}

absl::Status Store::RecordAccepted(const UploadRecord& upload, DurabilityTicket* deferred) {
  FEDLORA_RETURN_IF_ERROR(CheckAcceptedRecord(upload));
  DurabilityTicket ticket;
  auto result = DeferredTransaction(&ticket, [&]() -> absl::Status {
    FEDLORA_ASSIGN_OR_RETURN(std::optional<UploadRecord> existing,
                             impl_->FindUpload(upload.upload_id));
    if (existing.has_value()) {
      if (!SameBinding(*existing, upload))
        return BindingMismatch(*existing, upload, "RecordAccepted");
      if (existing->state == UploadState::kAccepted) {
        return absl::AlreadyExistsError(absl::StrCat("upload '", upload.upload_id,
                                                     "' was already accepted (blob ",
                                                     existing->blob_hash, ")"));
      }
    }
    FEDLORA_ASSIGN_OR_RETURN(RoundState st, impl_->RoundStateOf(upload.run_id, upload.round));
    if (!AcceptsUploads(st)) {
      return absl::FailedPreconditionError(
          absl::StrCat("RecordAccepted: ", RoundName(upload.run_id, upload.round), " is ",
                       ToAbsl(RoundStateName(st)), " and no longer accepts uploads"));
    }
    FEDLORA_RETURN_IF_ERROR(impl_->CheckNoOtherAccepted(upload));
    FEDLORA_RETURN_IF_ERROR(impl_->WriteAccepted(upload, existing.has_value()));
    return impl_->Fault("RecordAccepted:before_commit");
  });
  FEDLORA_RETURN_IF_ERROR(result);
  return FinishDurability(ticket, deferred);
}

absl::StatusOr<UploadRecord> Store::GetUpload(const std::string& upload_id) {
  absl::MutexLock lock(&mu_);
  FEDLORA_ASSIGN_OR_RETURN(std::optional<UploadRecord> u, impl_->FindUpload(upload_id));
  if (!u.has_value())
    return absl::NotFoundError(absl::StrCat("upload '", upload_id, "' not found"));
  return *std::move(u);
}

absl::StatusOr<std::vector<UploadRecord>> Store::ListAcceptedUploads(const std::string& run_id,
                                                                     int64_t round) {
  absl::MutexLock lock(&mu_);
  return impl_->UploadsIn(run_id, round, UploadState::kAccepted);
}

absl::StatusOr<std::vector<UploadRecord>> Store::ListReceivingUploads(const std::string& run_id,
                                                                      int64_t round) {
  absl::MutexLock lock(&mu_);
  return impl_->UploadsIn(run_id, round, UploadState::kReceiving);
}

absl::StatusOr<int64_t> Store::CountAccepted(const std::string& run_id, int64_t round) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(
      Stmt * s,
      impl_->Query(
          "SELECT COUNT(*) FROM uploads WHERE run_id = ? AND round = ? AND state = 'accepted'", h));
  s->Bind(run_id).Bind(round);
  FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
  return row ? s->Int(0) : 0;
}

absl::Status Store::RecordMetric(const MetricRecord& metric) {
  DurabilityTicket* const deferred = nullptr;
  if (metric.key.empty()) return absl::InvalidArgumentError("RecordMetric: empty key");
  return WriteTransaction(deferred, [&]() -> absl::Status {
    FEDLORA_RETURN_IF_ERROR(impl_->RequireRun(metric.run_id));
    return impl_->InsertMetric(metric);
  });
}

absl::Status Store::RecordMetrics(const std::vector<MetricRecord>& metrics) {
  DurabilityTicket* const deferred = nullptr;
  for (const MetricRecord& m : metrics) {
    if (m.key.empty()) return absl::InvalidArgumentError("RecordMetrics: empty key");
  }
  if (metrics.empty()) return absl::OkStatus();
  return WriteTransaction(deferred, [&]() -> absl::Status {
    std::set<std::string> runs;
    for (const MetricRecord& m : metrics) {
      if (runs.insert(m.run_id).second) FEDLORA_RETURN_IF_ERROR(impl_->RequireRun(m.run_id));
      absl::Status s = impl_->InsertMetric(m);
      if (!s.ok() && !absl::IsAlreadyExists(s)) return s;
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<MetricRecord>> Store::ListMetrics(const std::string& run_id,
                                                             int64_t round) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(Stmt * s,
                           impl_->Query("SELECT run_id, round, client_id, key, value FROM metrics "
                                        "WHERE run_id = ? AND round = ? ORDER BY client_id, key",
                                        h));
  s->Bind(run_id).Bind(round);
  std::vector<MetricRecord> out;
  for (;;) {
    FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) break;
    out.push_back(MetricRecord{s->Text(0), s->Int(1), s->Text(2), s->Text(3), s->Double(4)});
  }
  return out;
}

absl::Status Store::RecordAuditCopies(const std::vector<AuditCopyRecord>& copies) {
  for (const AuditCopyRecord& c : copies) {
    if (c.upload_id.empty() || c.blob_hash.empty()) {
      return absl::InvalidArgumentError("RecordAuditCopies: empty upload_id or blob_hash");
    }
  }
  if (copies.empty()) return absl::OkStatus();
  return WriteTransaction(nullptr, [&]() -> absl::Status {
    for (const AuditCopyRecord& c : copies) {
      std::unique_ptr<Stmt> h;
      FEDLORA_ASSIGN_OR_RETURN(
          Stmt * s, impl_->Query("INSERT OR IGNORE INTO audit_copies(upload_id, run_id, round, "
                                 "client_id, num_examples, blob_hash, created_ms) "
                                 "VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 h));
      s->Bind(c.upload_id)
          .Bind(c.run_id)
          .Bind(c.round)
          .Bind(c.client_id)
          .Bind(c.num_examples)
          .Bind(c.blob_hash);
      s->Bind(impl_->Now());
      FEDLORA_RETURN_IF_ERROR(s->Run());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<AuditCopyRecord>> Store::ListAuditCopies(const std::string& run_id,
                                                                    int64_t round) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Stmt> h;
  FEDLORA_ASSIGN_OR_RETURN(
      Stmt * s, impl_->Query("SELECT upload_id, run_id, round, client_id, num_examples, blob_hash "
                             "FROM audit_copies WHERE (? = '' OR run_id = ?) AND "
                             "(? = 0 OR round = ?) ORDER BY run_id, round, upload_id",
                             h));
  s->Bind(run_id).Bind(run_id).Bind(round).Bind(round);
  std::vector<AuditCopyRecord> out;
  for (;;) {
    FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) break;
    out.push_back(
        AuditCopyRecord{s->Text(0), s->Text(1), s->Int(2), s->Text(3), s->Int(4), s->Text(5)});
  }
  return out;
}

absl::StatusOr<absl::flat_hash_set<std::string>> Store::ReferencedBlobHashes() {
  absl::MutexLock lock(&mu_);
  return impl_->ReadTransaction([&]() -> absl::StatusOr<absl::flat_hash_set<std::string>> {
    std::unique_ptr<Stmt> h;
    // A sealed update is referenced only while its round is open: once the round has committed or
    // been abandoned nothing needs it, and keeping it would keep what a copied disk could open.
    FEDLORA_ASSIGN_OR_RETURN(Stmt * s,
                             impl_->Query("SELECT u.blob_hash FROM uploads u JOIN rounds r "
                                          "ON r.run_id = u.run_id AND r.round = u.round "
                                          "WHERE r.state NOT IN ('committed', 'abandoned') UNION "
                                          "SELECT global_adapter_hash FROM rounds UNION "
                                          "SELECT result_adapter_hash FROM rounds UNION "
                                          "SELECT server_state_hash FROM rounds UNION "
                                          "SELECT broadcast_hash FROM rounds UNION "
                                          "SELECT broadcast_delta_hash FROM rounds UNION "
                                          "SELECT blob_hash FROM audit_copies",
                                          h));
    absl::flat_hash_set<std::string> out;
    for (;;) {
      FEDLORA_ASSIGN_OR_RETURN(bool row, s->Step());
      if (!row) break;
      std::string hash = s->Text(0);
      if (!hash.empty()) out.insert(std::move(hash));
    }
    return out;
  });
}

absl::StatusOr<int64_t> Store::PruneRoundBlobs(const std::string& run_id, int64_t before_round) {
  return WriteTransaction(nullptr, [&]() -> absl::StatusOr<int64_t> {
    std::unique_ptr<Stmt> h;
    FEDLORA_ASSIGN_OR_RETURN(
        Stmt * s,
        impl_->Query(
            "UPDATE rounds SET result_adapter_hash = '', global_adapter_hash = '', "
            "server_state_hash = '', broadcast_hash = '', broadcast_delta_hash = '' "
            "WHERE run_id = ? AND round < ? AND state IN ('committed', 'abandoned') AND "
            "(result_adapter_hash != '' OR global_adapter_hash != '' OR server_state_hash != '' "
            "OR broadcast_hash != '' OR broadcast_delta_hash != '')",
            h));
    s->Bind(run_id).Bind(before_round);
    FEDLORA_RETURN_IF_ERROR(s->Run());
    return static_cast<int64_t>(sqlite3_changes(impl_->db));
  });
}

}  // namespace fedlora
