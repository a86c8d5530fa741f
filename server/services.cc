#include "server/services.h"

#include <grpcpp/security/auth_context.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "crypto/certs.h"
#include "proto/wire.h"
#include "server/download_reactor.h"
#include "server/grpc_status.h"
#include "server/upload_reactor.h"

namespace fedlora {
namespace {

// A client id from metadata: 1-128 printable characters of a conservative set, so that it is safe
// in logs, metrics labels and file names.
bool IsValidClientId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-' || c == '@';
  });
}

std::string MetadataValue(const grpc::ServerContextBase& context, const char* key) {
  const auto& md = context.client_metadata();
  auto it = md.find(key);
  if (it == md.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

absl::Status QueueFull() {
  return absl::ResourceExhaustedError(
      "the server has too many calls of this kind waiting; retry later");
}

// Runs `answer` (which may touch the store, and wait for its fsync) on `pool`, then finishes the
// call with its status, `*response` filled on success. The gRPC callback thread returns at once.
// When `max_queued` answers already wait for the pool, the call is refused RESOURCE_EXHAUSTED instead.
template <class Response>
grpc::ServerUnaryReactor* AnswerOnPool(grpc::CallbackServerContext* context, ThreadPool& pool,
                                       size_t max_queued, Response* response,
                                       std::function<absl::StatusOr<Response>()> answer) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const bool queued = pool.TrySubmit(
      [reactor, response, answer = std::move(answer)] {
        absl::StatusOr<Response> r = answer();
        if (r.ok()) *response = *std::move(r);
        reactor->Finish(ToGrpcStatus(r.status()));
      },
      max_queued);
  if (!queued) reactor->Finish(ToGrpcStatus(QueueFull()));
  return reactor;
}

// The same for an RPC whose answer is an empty message.
grpc::ServerUnaryReactor* StatusOnPool(grpc::CallbackServerContext* context, ThreadPool& pool,
                                       size_t max_queued, std::function<absl::Status()> answer) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const bool queued = pool.TrySubmit(
      [reactor, answer = std::move(answer)] { reactor->Finish(ToGrpcStatus(answer())); },
      max_queued);
  if (!queued) reactor->Finish(ToGrpcStatus(QueueFull()));
  return reactor;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Identity

bool IsLoopbackPeer(const std::string& peer) {
  return absl::StartsWith(peer, "ipv4:127.") || absl::StartsWith(peer, "ipv6:[::1]") ||
         absl::StartsWith(peer, "ipv6:%5B::1%5D") || absl::StartsWith(peer, "unix:");
}

absl::StatusOr<std::string> CallerIdentity(const grpc::ServerContextBase& context, bool tls) {
  if (tls) {
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    if (auth == nullptr || !auth->IsPeerAuthenticated()) {
      return absl::UnauthenticatedError("the peer presented no verified client certificate");
    }
    for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
      std::vector<grpc::string_ref> values = auth->FindPropertyValues(property);
      if (!values.empty() && values.front().size() > 0) {
        std::string id(values.front().data(), values.front().size());
        if (!IsValidClientId(id)) {
          return absl::UnauthenticatedError(
              absl::StrCat("certificate identity '", id.substr(0, 64),
                           "' has characters outside [A-Za-z0-9._@-]"));
        }
        return id;
      }
    }
    return absl::UnauthenticatedError("the client certificate has neither a CN nor a SAN");
  }
  std::string id = MetadataValue(context, kClientIdMetadataKey);
  if (id.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat("no '", kClientIdMetadataKey, "' metadata entry"));
  }
  if (!IsValidClientId(id)) {
    return absl::UnauthenticatedError(
        absl::StrCat("client id must be 1-128 characters of [A-Za-z0-9._@-]"));
  }
  return id;
}

std::string PeerCertificateFingerprint(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  std::vector<grpc::string_ref> pem = auth->FindPropertyValues("x509_pem_cert");
  if (pem.empty()) return "";
  absl::StatusOr<crypto::CertificateInfo> info =
      crypto::ParseCertificate(std::string_view(pem.front().data(), pem.front().size()));
  return info.ok() ? info->sha256_hex : "";
}

absl::Status CheckOperatorRule(const char* what, bool tls, bool loopback, const std::string& caller,
                               const absl::StatusOr<std::string>& tls_identity,
                               const std::vector<std::string>& operator_ids) {
  if (!tls) {
    // Plaintext serves loopback addresses only; on it there are no certificates to tell callers apart.
    if (loopback) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat(what, " answers loopback callers only without TLS; caller is ", caller));
  }
  // Under TLS only a certificate makes an operator: a site's connection through a sidecar, a proxy
  // or a port forward arrives on loopback too.
  const absl::StatusOr<std::string>& id = tls_identity;
  if (id.ok() && std::find(operator_ids.begin(), operator_ids.end(), *id) != operator_ids.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      what, " answers operators only (server.tls.operator_ids, or the server's --operators); ",
      id.ok() ? absl::StrCat("'", *id, "' is not one")
              : absl::StrCat("caller ", caller, " has no identity (", id.status().message(), ")")));
}

// ------------------------------------------------------------------------------------------------
// Federation

FederationService::FederationService(const ServerOptions& options, Coordinator* coordinator,
                                     BlobStore* blobs, ServerMetrics* metrics)
    : options_(options),
      coordinator_(coordinator),
      blobs_(blobs),
      metrics_(metrics),
      // ThreadPool(n) keeps n - 1 workers.
      upload_pool_(std::max(options.upload_workers, 0) + 1, options.bulk_work_nice),
      sync_pool_(std::max(options.upload_workers, 0) + 1),
      rpc_pool_(std::max(options.io_workers, 0) + 1),
      download_pool_(std::max(options.io_workers, 0) + 1, options.bulk_work_nice),
      download_cache_(blobs, /*keep=*/3),
      download_slots_(options.max_client_downloads_in_flight) {}

bool ClientSlots::TryAcquire(const std::string& client) {
  absl::MutexLock lock(&mu_);
  int& n = open_[client];
  if (n >= max_) return false;
  ++n;
  return true;
}

void ClientSlots::Release(const std::string& client) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(client);
  if (it != open_.end() && --it->second <= 0) open_.erase(it);
}

absl::StatusOr<std::string> FederationService::Authenticate(grpc::CallbackServerContext* context) {
  FEDLORA_ASSIGN_OR_RETURN(std::string id, CallerIdentity(*context, options_.tls.enabled()));
  FEDLORA_RETURN_IF_ERROR(
      coordinator_->Authenticate(id, MetadataValue(*context, kSessionMetadataKey)));
  return id;
}

grpc::ServerUnaryReactor* FederationService::Join(grpc::CallbackServerContext* context,
                                                  const v1::JoinRequest* request,
                                                  v1::JoinResponse* response) {
  absl::StatusOr<std::string> id = CallerIdentity(*context, options_.tls.enabled());
  if (!id.ok()) return FinishWith(context, id.status());
  // Registering the client writes (and fsyncs) its row.
  return AnswerOnPool<v1::JoinResponse>(
      context, rpc_pool_, QueueCap(), response,
      [this, id = *std::move(id), peer = context->peer(),
       fingerprint = PeerCertificateFingerprint(*context),
       request] { return coordinator_->Join(id, peer, fingerprint, *request); });
}

grpc::ServerUnaryReactor* FederationService::WaitForTask(grpc::CallbackServerContext* context,
                                                         const v1::WaitForTaskRequest* request,
                                                         v1::WaitForTaskResponse* response) {
  absl::StatusOr<std::string> id = Authenticate(context);
  if (!id.ok()) return FinishWith(context, id.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Hold at most what the client allows and the server caps, and stop a little before the client's
  // own deadline so that the answer still reaches it.
  int64_t wait_ms = std::min<int64_t>(static_cast<int64_t>(request->max_wait_seconds()) * 1000,
                                      options_.max_long_poll_ms);
  const auto deadline = context->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - std::chrono::system_clock::now())
                             .count();
    wait_ms = std::min<int64_t>(wait_ms, left - 500);  // 500 ms: room for the answer's trip back
  }
  // On the RPC pool: the call may close the round's selection, which writes to the store.
  const bool queued = rpc_pool_.TrySubmit(
      [this, reactor, response, id = *std::move(id), wait_ms = std::max<int64_t>(0, wait_ms),
       held = request->held_adapter_sha256()] {
        coordinator_->WaitForTask(
            id, wait_ms,
            [reactor, response](absl::StatusOr<v1::WaitForTaskResponse> answer) {
              if (answer.ok()) *response = *std::move(answer);
              reactor->Finish(ToGrpcStatus(answer.status()));
            },
            held);
      },
      QueueCap());
  if (!queued) reactor->Finish(ToGrpcStatus(QueueFull()));
  return reactor;
}

grpc::ServerUnaryReactor* FederationService::Heartbeat(grpc::CallbackServerContext* context,
                                                       const v1::HeartbeatRequest* request,
                                                       v1::HeartbeatResponse* response) {
  absl::StatusOr<std::string> id = Authenticate(context);
  if (!id.ok()) return FinishWith(context, id.status());
  absl::StatusOr<v1::HeartbeatResponse> r = coordinator_->Heartbeat(*id, *request);
  if (r.ok()) *response = *std::move(r);
  return FinishWith(context, r.status());
}

grpc::ServerUnaryReactor* FederationService::SecureAggregation(
    grpc::CallbackServerContext* context, const v1::SecureAggregationRequest* request,
    v1::SecureAggregationResponse* response) {
  absl::StatusOr<std::string> id = Authenticate(context);
  if (!id.ok()) return FinishWith(context, id.status());
  // On the RPC pool: a step may close the key phase and abandon the round, a store write.
  return AnswerOnPool<v1::SecureAggregationResponse>(
      context, rpc_pool_, QueueCap(), response, [this, id = *std::move(id), request] {
        return coordinator_->SecureAggregation(id, *request);
      });
}

grpc::ServerWriteReactor<v1::DownloadChunk>* FederationService::DownloadAdapter(
    grpc::CallbackServerContext* context, const v1::DownloadRequest* request) {
  absl::StatusOr<std::string> id = Authenticate(context);
  absl::StatusOr<v1::AdapterManifest> manifest =
      id.ok() ? coordinator_->AdapterManifestFor(request->adapter_sha256()) : id.status();
  DownloadChunkCallback on_chunk;
  std::function<void()> on_done;
  if (id.ok()) {
    on_chunk = [coordinator = coordinator_, client = *id, hash = request->adapter_sha256()](
                   int64_t bytes, bool last) {
      coordinator->NoteDownloadChunk(client, hash, bytes, last);
    };
    // Charged as the stream starts, so that streams a client opens and never reads cannot pile up.
    if (download_slots_.TryAcquire(*id)) {
      on_done = [this, client = *id] { download_slots_.Release(client); };
    } else {
      metrics_->quota_refusals.fetch_add(1);
      manifest = absl::ResourceExhaustedError(
          absl::StrCat("client '", *id, "' already has ", options_.max_client_downloads_in_flight,
                       " downloads open (server.max_client_downloads_in_flight)"));
    }
  }
  return NewDownloadReactor(&download_cache_, metrics_, &download_pool_, QueueCap(),
                            std::move(on_chunk), std::move(on_done), std::move(manifest),
                            request->start_chunk());
}

grpc::ServerReadReactor<v1::UploadChunk>* FederationService::UploadUpdate(
    grpc::CallbackServerContext* context, v1::UploadAck* response) {
  return NewUploadReactor(options_, coordinator_, blobs_, metrics_, &upload_pool_, &sync_pool_,
                          Authenticate(context), response);
}

grpc::ServerUnaryReactor* FederationService::GetUploadStatus(grpc::CallbackServerContext* context,
                                                             const v1::UploadStatusRequest* request,
                                                             v1::UploadStatusResponse* response) {
  absl::StatusOr<std::string> id = Authenticate(context);
  if (!id.ok()) return FinishWith(context, id.status());
  // Reads the upload's row, after an fsync of what was committed before.
  return AnswerOnPool<v1::UploadStatusResponse>(
      context, rpc_pool_, QueueCap(), response, [this, id = *std::move(id), request] {
        return coordinator_->GetUploadStatus(id, request->upload_id());
      });
}

grpc::ServerUnaryReactor* FederationService::ReportMetrics(grpc::CallbackServerContext* context,
                                                           const v1::MetricsReport* request,
                                                           v1::MetricsAck*) {
  absl::StatusOr<std::string> id = Authenticate(context);
  if (!id.ok()) return FinishWith(context, id.status());
  // One store transaction (and fsync) per report.
  return StatusOnPool(context, rpc_pool_, QueueCap(), [this, id = *std::move(id), request] {
    return coordinator_->ReportMetrics(id, *request);
  });
}

grpc::ServerUnaryReactor* FederationService::Leave(grpc::CallbackServerContext* context,
                                                   const v1::LeaveRequest* request,
                                                   v1::LeaveResponse*) {
  absl::StatusOr<std::string> id = Authenticate(context);
  if (!id.ok()) return FinishWith(context, id.status());
  return FinishWith(context, coordinator_->Leave(*id, *request));
}

// ------------------------------------------------------------------------------------------------
// Admin

AdminService::AdminService(const ServerOptions& options, Coordinator* coordinator)
    : options_(options), coordinator_(coordinator), pool_(3) {}

absl::Status AdminService::CheckOperator(grpc::CallbackServerContext* context) const {
  const bool tls = options_.tls.enabled();
  return CheckOperatorRule(
      "the Admin service", tls, IsLoopbackPeer(context->peer()), context->peer(),
      tls ? CallerIdentity(*context, /*tls=*/true) : absl::StatusOr<std::string>(""),
      options_.operator_ids);
}

grpc::ServerUnaryReactor* AdminService::GetStatus(grpc::CallbackServerContext* context,
                                                  const v1::GetStatusRequest* request,
                                                  v1::GetStatusResponse* response) {
  absl::Status allowed = CheckOperator(context);
  if (!allowed.ok()) return FinishWith(context, allowed);
  // Reads the round history from the store.
  return AnswerOnPool<v1::GetStatusResponse>(
      context, pool_, static_cast<size_t>(options_.max_queued_tasks), response,
      [this, request] { return coordinator_->GetStatus(*request); });
}

grpc::ServerUnaryReactor* AdminService::ListClients(grpc::CallbackServerContext* context,
                                                    const v1::ListClientsRequest* request,
                                                    v1::ListClientsResponse* response) {
  absl::Status allowed = CheckOperator(context);
  if (!allowed.ok()) return FinishWith(context, allowed);
  absl::StatusOr<v1::ListClientsResponse> r = coordinator_->ListClients(*request);
  if (r.ok()) *response = *std::move(r);
  return FinishWith(context, r.status());
}

grpc::ServerUnaryReactor* AdminService::BlockClient(grpc::CallbackServerContext* context,
                                                    const v1::BlockClientRequest* request,
                                                    v1::BlockClientResponse* response) {
  absl::Status allowed = CheckOperator(context);
  if (!allowed.ok()) return FinishWith(context, allowed);
  if (!IsValidClientId(request->client_id())) {
    return FinishWith(
        context, absl::InvalidArgumentError("BlockClient: client_id must be 1-128 characters of "
                                            "[A-Za-z0-9._@-]"));
  }
  if (request->reason().size() > 256) {
    return FinishWith(
        context, absl::InvalidArgumentError(absl::StrCat(
                     "BlockClient: reason of ", request->reason().size(), " bytes; at most 256")));
  }
  absl::StatusOr<std::string> by = CallerIdentity(*context, options_.tls.enabled());
  const std::string operator_id = by.ok() ? *by : context->peer();
  // Writes the store, durably.
  return AnswerOnPool<v1::BlockClientResponse>(
      context, pool_, static_cast<size_t>(options_.max_queued_tasks), response,
      [this, request, operator_id] { return coordinator_->BlockClient(*request, operator_id); });
}

}  // namespace fedlora
