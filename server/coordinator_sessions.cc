// Sessions and the client registry: Join, Authenticate, Heartbeat, ReportMetrics, Leave.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "aggregation/fedavg.h"
#include "config/config_io.h"
#include "core/logging.h"
#include "core/sha256.h"
#include "core/status.h"
#include "core/strings.h"
#include "crypto/random.h"
#include "crypto/sealed_update.h"
#include "proto/wire.h"
#include "server/adapter_io.h"
#include "server/coordinator.h"
#include "server/coordinator_internal.h"
#include "server/crash_point.h"

namespace fedlora {

// Join, sessions

absl::StatusOr<v1::JoinResponse> Coordinator::Join(const std::string& client_id,
                                                   const std::string& peer,
                                                   const std::string& cert_fingerprint,
                                                   const v1::JoinRequest& request) {
  if (request.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat("client speaks protocol version ",
                                                      request.protocol_version(),
                                                      ", this server speaks ", kProtocolVersion));
  }
  if (!restored()) return absl::UnavailableError("server is restoring its state; retry");
  // Durable before the session exists, and written (and fsynced, with concurrent joins) outside mu_.
  FEDLORA_ASSIGN_OR_RETURN(ClientRecord record, store_->UpsertClient(client_id, cert_fingerprint));
  FEDLORA_LOG(INFO) << "client " << client_id << " joined from " << peer << " ("
                    << (request.client_version().empty() ? "unknown SDK" : request.client_version())
                    << ", device "
                    << (request.capabilities().device_name().empty()
                            ? "unknown"
                            : request.capabilities().device_name())
                    << ")";
  absl::MutexLock lock(&mu_);
  if (record.state == ClientState::kBlocked) return BlockedError(client_id);
  ClientEntry& c = clients_.FindOrAdd(client_id);
  const int64_t now = Now();
  // 128 bits from OpenSSL's CSPRNG; no session is handed out when it cannot deliver (fails closed).
  FEDLORA_ASSIGN_OR_RETURN(c.session, crypto::RandomHex(16));
  c.peer = peer;
  c.client_version = request.client_version();
  c.cert_fingerprint = record.cert_fingerprint;
  c.device_name = request.capabilities().device_name();
  c.has_cuda = request.capabilities().has_cuda();
  c.joined_ms = now;
  c.last_seen_ms = now;
  c.left = false;
  c.failure.clear();
  c.reported = v1::CLIENT_STATE_IDLE;
  metrics_->joins.fetch_add(1);
  UpdateClientGaugesLocked();

  v1::JoinResponse response;
  response.set_protocol_version(kProtocolVersion);
  response.set_client_id(client_id);
  response.set_session_token(c.session);
  response.set_session_ttl_seconds(
      static_cast<uint32_t>(CeilDiv(options_.heartbeat_timeout_ms, 1000)));
  *response.mutable_run_config() = RedactRunConfigForClients(config_);
  v1::ServerLimits* limits = response.mutable_limits();
  limits->set_max_message_bytes(static_cast<uint32_t>(options_.max_message_bytes));
  limits->set_max_update_bytes(static_cast<uint64_t>(options_.max_upload_bytes));
  limits->set_chunk_size_bytes(static_cast<uint32_t>(options_.chunk_bytes));
  response.set_current_round(round_ ? round_->round : last_committed_round_);
  return response;
}

absl::Status Coordinator::Authenticate(const std::string& client_id,
                                       const std::string& session_token) {
  absl::MutexLock lock(&mu_);
  if (!restored_) return absl::UnavailableError("server is restoring its state; retry");
  ClientEntry* c = clients_.Find(client_id);
  if (c != nullptr && c->blocked) return BlockedError(client_id);
  if (c == nullptr || c->session.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat("client '", client_id, "' has no session; call Join"));
  }
  if (!crypto::ConstantTimeEquals(session_token, c->session)) {
    return absl::UnauthenticatedError(absl::StrCat("session token does not belong to client '",
                                                   client_id, "' (expired or foreign); call Join"));
  }
  const int64_t now = Now();
  if (now - c->last_seen_ms > options_.heartbeat_timeout_ms) {
    // JoinResponse.session_ttl_seconds: a session silent for longer than the heartbeat timeout has
    // been treated as dead (its task may have gone to someone else), so the client starts afresh.
    c->session.clear();
    return absl::UnauthenticatedError(absl::StrCat("session of client '", client_id,
                                                   "' expired after ", now - c->last_seen_ms,
                                                   " ms of silence; call Join"));
  }
  c->last_seen_ms = now;
  return absl::OkStatus();
}

void Coordinator::NoteDownloadChunk(const std::string& client_id, const std::string& sha256,
                                    int64_t bytes, bool last) {
  absl::MutexLock lock(&mu_);
  if (ClientEntry* c = clients_.Find(client_id)) c->last_seen_ms = std::max(c->last_seen_ms, Now());
  if (round_ != nullptr) round_->download_bytes += bytes;
  if (!last) return;
  auto it = downloadable_.find(sha256);
  if (it == downloadable_.end()) return;
  // A full adapter stands for itself; a delta for the broadcast adapter when it is the chain's last.
  int64_t full = it->second.bytes;
  if (it->second.delta) full = it->second.round == broadcast_round_ ? broadcast_bytes_ : 0;
  if (round_ != nullptr) round_->download_full_bytes += full;
  metrics_->download_full_bytes.fetch_add(full);
}

// ------------------------------------------------------------------------------------------------
// Heartbeat, metrics, leave

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const std::string& client_id,
                                                             const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  ClientEntry* c = clients_.Find(client_id);
  if (c == nullptr)
    return absl::UnauthenticatedError(absl::StrCat("unknown client '", client_id, "'"));
  c->last_seen_ms = Now();
  if (request.state() != v1::CLIENT_STATE_UNSPECIFIED &&
      request.state() != v1::CLIENT_STATE_DISCONNECTED &&
      request.state() != v1::CLIENT_STATE_LEFT && request.state() != v1::CLIENT_STATE_FAILED) {
    c->reported = request.state();
  }
  v1::HeartbeatResponse response;
  response.set_action(v1::HeartbeatResponse::CONTINUE);
  response.set_next_heartbeat_seconds(
      static_cast<uint32_t>(CeilDiv(options_.heartbeat_interval_ms, 1000)));
  if (!request.task_id().empty()) {
    const bool current = round_ != nullptr && round_->state == RoundState::kTraining &&
                         round_->selected.count(client_id) != 0 &&
                         request.task_id() == TaskIdFor(round_->round, client_id);
    if (!current) response.set_action(v1::HeartbeatResponse::CANCEL_TASK);
    if (current && !HidesPerClientStatistics(config_)) {
      c->progress_task = request.task_id();
      c->steps_total = request.steps_total();
      c->steps_done = std::min(request.steps_done(), request.steps_total());
    }
  }
  return response;
}

absl::Status Coordinator::ReportMetrics(const std::string& client_id,
                                        const v1::MetricsReport& report) {
  const int64_t round = static_cast<int64_t>(report.round());
  if (HidesPerClientStatistics(config_)) {
    return absl::FailedPreconditionError(
        "metrics reports are refused under secure aggregation or differential privacy: a site's "
        "loss, example "
        "count and timings would disclose what the aggregate hides");
  }
  if (report.extra_size() > options_.max_metrics_per_report) {
    return QuotaRefused(absl::StrCat("metrics report has ", report.extra_size(),
                                     " extra entries; the limit is ",
                                     options_.max_metrics_per_report));
  }
  {
    absl::MutexLock lock(&mu_);
    ClientEntry* c = clients_.Find(client_id);
    if (c == nullptr)
      return absl::UnauthenticatedError(absl::StrCat("unknown client '", client_id, "'"));
    c->StartQuotaRound(round_ ? round_->round : last_committed_round_);
    if (c->reports_this_round >= options_.max_client_reports_per_round) {
      return QuotaRefused(absl::StrCat("client '", client_id, "' sent ", c->reports_this_round,
                                       " metrics reports this round; the limit is ",
                                       options_.max_client_reports_per_round));
    }
    ++c->reports_this_round;
  }
  // Bound to a task this client was really given: its selection for the round is in the store.
  FEDLORA_ASSIGN_OR_RETURN(const bool selected, store_->IsSelected(run_id_, round, client_id));
  if (!selected || report.task_id() != TaskIdFor(round, client_id)) {
    return absl::PermissionDeniedError(
        absl::StrCat("task '", report.task_id().substr(0, 80), "' of round ", round,
                     " was not assigned to client '", client_id, "'"));
  }
  std::vector<std::pair<std::string, double>> values = {
      {"train/loss_first", report.train_loss_first()},
      {"train/loss_last", report.train_loss_last()},
      {"train/examples", static_cast<double>(report.examples_processed())},
      {"train/steps", static_cast<double>(report.steps())},
      {"time/download_s", report.download_seconds()},
      {"time/train_s", report.train_seconds()},
      {"time/encode_s", report.encode_seconds()},
      {"time/upload_s", report.upload_seconds()}};
  if (report.has_local_eval_loss()) values.push_back({"eval/local_loss", report.local_eval_loss()});
  if (report.has_local_eval_accuracy())
    values.push_back({"eval/local_accuracy", report.local_eval_accuracy()});
  for (const auto& [k, v] : report.extra()) {
    if (k.empty() || k.size() > 128) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric name of ", k.size(), " bytes; names are 1-128 bytes"));
    }
    values.push_back({absl::StrCat("extra/", k), v});
  }
  std::vector<MetricRecord> records;
  records.reserve(values.size());
  for (const auto& [key, value] : values) {
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric '", key.substr(0, 140), "' is not finite"));
    }
    records.push_back({run_id_, round, client_id, key, value});
  }
  // One transaction for the whole report; a re-sent report (after a lost response) keeps the first.
  return store_->RecordMetrics(records);
}

absl::Status Coordinator::Leave(const std::string& client_id, const v1::LeaveRequest& request) {
  absl::MutexLock lock(&mu_);
  ClientEntry* c = clients_.Find(client_id);
  if (c == nullptr) return absl::OkStatus();
  c->left = true;
  c->session.clear();
  c->reported = v1::CLIENT_STATE_LEFT;
  if (round_) round_->candidates.erase(client_id);
  UpdateClientGaugesLocked();
  if (request.error().empty()) {
    c->failure.clear();
    FEDLORA_LOG(DEBUG) << "client " << client_id << " left: " << request.reason();
    return absl::OkStatus();
  }
  // The site's own words, shown to operators: bounded, and no control characters in logs.
  c->failure = request.error().substr(0, kMaxFailureBytes);
  for (char& ch : c->failure) {
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
  }
  metrics_->clients_failed.fetch_add(1);
  const bool had_task = round_ != nullptr && round_->state == RoundState::kTraining &&
                        round_->selected.count(client_id) != 0 &&
                        round_->accepted.count(client_id) == 0;
  FEDLORA_LOG(WARNING) << "client " << client_id << " failed and left"
                       << (had_task ? absl::StrCat(" (its task of round ", round_->round,
                                                   " will not be done)")
                                    : "")
                       << ": " << c->failure;
  return absl::OkStatus();
}

}  // namespace fedlora
