// The gRPC callback services: Federation (one small reactor class per streaming RPC, in services.cc)
// and Admin. They authenticate the caller, translate messages into Coordinator calls and convert
// statuses with ToGrpcStatus; every decision lives in the Coordinator.
//
// Identity: with TLS the caller is the peer certificate's subject CN (or its first SAN when the CN
// is empty); without TLS (loopback tests, simulation) the "fedlora-client-id" metadata entry. Never
// a message body.
//
// Threads: gRPC calls the handlers on its few callback threads, which run no SQL and never wait
// for the disk. Handlers that only read memory (Heartbeat, Leave, ListClients) answer there; those
// that can reach the store (Join, WaitForTask, SecureAggregation, GetUploadStatus, ReportMetrics,
// GetStatus, BlockClient) answer from a pool, and a full pool queue is RESOURCE_EXHAUSTED; the
// streams read, hash, write and fsync on pools of their own (download_reactor.h, upload_reactor.h).
// The services hold no mutable state of their own besides what the Coordinator guards.
#pragma once

#include <grpcpp/server_context.h>

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/thread_pool.h"
#include "fedlora/v1/admin.grpc.pb.h"
#include "fedlora/v1/federation.grpc.pb.h"
#include "server/blob_store.h"
#include "server/coordinator.h"
#include "server/download_cache.h"
#include "server/metrics.h"
#include "server/options.h"

namespace fedlora {

// The caller's identity (see above). Unauthenticated when absent or malformed.
absl::StatusOr<std::string> CallerIdentity(const grpc::ServerContextBase& context, bool tls);
// The fingerprint (SHA-256 of the DER, crypto::CertificateInfo::sha256_hex) of the client
// certificate the TLS handshake verified; empty without TLS.
std::string PeerCertificateFingerprint(const grpc::ServerContextBase& context);
// True when gRPC reports the peer on a loopback address ("ipv4:127.x.x.x:port", "ipv6:[::1]:port").
bool IsLoopbackPeer(const std::string& peer);

// Who may see the run as an operator (the Admin service, the live view of server/live_view.h):
// without TLS, callers on a loopback address (`loopback`; `caller` names the peer in the refusal);
// under TLS, certificates whose identity (`tls_identity`: the CN, or why there is none) is one of
// `operator_ids`. PermissionDenied naming `what` and the reason otherwise.
absl::Status CheckOperatorRule(const char* what, bool tls, bool loopback, const std::string& caller,
                               const absl::StatusOr<std::string>& tls_identity,
                               const std::vector<std::string>& operator_ids);

// At most `max` of something at once per client: TryAcquire is false past it; Release gives one back.
class ClientSlots {
 public:
  explicit ClientSlots(int max) : max_(max) {}
  bool TryAcquire(const std::string& client);
  void Release(const std::string& client);

 private:
  const int max_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> open_ ABSL_GUARDED_BY(mu_);
};

class FederationService final : public v1::Federation::CallbackService {
 public:
  FederationService(const ServerOptions& options, Coordinator* coordinator, BlobStore* blobs,
                    ServerMetrics* metrics);

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override;
  grpc::ServerUnaryReactor* WaitForTask(grpc::CallbackServerContext* context,
                                        const v1::WaitForTaskRequest* request,
                                        v1::WaitForTaskResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* SecureAggregation(grpc::CallbackServerContext* context,
                                              const v1::SecureAggregationRequest* request,
                                              v1::SecureAggregationResponse* response) override;
  grpc::ServerWriteReactor<v1::DownloadChunk>* DownloadAdapter(
      grpc::CallbackServerContext* context, const v1::DownloadRequest* request) override;
  grpc::ServerReadReactor<v1::UploadChunk>* UploadUpdate(grpc::CallbackServerContext* context,
                                                         v1::UploadAck* response) override;
  grpc::ServerUnaryReactor* GetUploadStatus(grpc::CallbackServerContext* context,
                                            const v1::UploadStatusRequest* request,
                                            v1::UploadStatusResponse* response) override;
  grpc::ServerUnaryReactor* ReportMetrics(grpc::CallbackServerContext* context,
                                          const v1::MetricsReport* request,
                                          v1::MetricsAck* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;

 private:
  // Identity plus session check for every call but Join.
  absl::StatusOr<std::string> Authenticate(grpc::CallbackServerContext* context);

  const ServerOptions& options_;
  Coordinator* const coordinator_;
  BlobStore* const blobs_;
  ServerMetrics* const metrics_;
  // Runs UploadUpdate's message processing off gRPC's callback threads (options.upload_workers).
  ThreadPool upload_pool_;
  // Runs the uploads' periodic checkpoints (fsync, progress row) while their streams go on
  // (options.upload_workers). Separate from upload_pool_: a stream waits for its checkpoint, which
  // must never queue behind waiting streams.
  ThreadPool sync_pool_;
  // Answers the unary RPCs that touch the store (options.io_workers).
  ThreadPool rpc_pool_;
  // Indexes the blobs downloads ask for (options.io_workers).
  ThreadPool download_pool_;
  // The global adapters being downloaded, mapped and chunk-hashed once.
  DownloadCache download_cache_;
  // Open DownloadAdapter streams per client (options.max_client_downloads_in_flight).
  ClientSlots download_slots_;
  size_t QueueCap() const { return static_cast<size_t>(options_.max_queued_tasks); }
};

class AdminService final : public v1::Admin::CallbackService {
 public:
  AdminService(const ServerOptions& options, Coordinator* coordinator);

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest* request,
                                      v1::GetStatusResponse* response) override;
  grpc::ServerUnaryReactor* ListClients(grpc::CallbackServerContext* context,
                                        const v1::ListClientsRequest* request,
                                        v1::ListClientsResponse* response) override;
  grpc::ServerUnaryReactor* BlockClient(grpc::CallbackServerContext* context,
                                        const v1::BlockClientRequest* request,
                                        v1::BlockClientResponse* response) override;

 private:
  absl::Status CheckOperator(grpc::CallbackServerContext* context) const;

  const ServerOptions& options_;
  Coordinator* const coordinator_;
  ThreadPool pool_;  // GetStatus and BlockClient, which touch the store
};

}  // namespace fedlora
