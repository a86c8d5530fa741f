#include "server/server.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include <chrono>
#include <filesystem>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/config_io.h"
#include "config/resolved.h"
#include "core/file.h"
#include "core/logging.h"
#include "core/status.h"
#include "crypto/tls.h"
#include "fedlora/v1/admin.grpc.pb.h"
#include "fedlora/v1/federation.grpc.pb.h"
#include "kernels/base/device.h"
#include "proto/address.h"
#include "server/audit_trail.h"
#include "server/live_view.h"
#include "server/services.h"

namespace fedlora {

namespace {

// ServerOptionsFromRunConfig's body, with the heartbeat given.
ServerOptions ServerOptionsFor(const v1::RunConfig& config, int64_t heartbeat_interval_ms,
                               int64_t heartbeat_timeout_ms) {
  ServerOptions o;
  const v1::ServerConfig& s = config.server();
  o.listen_address = s.listen_address().empty() ? kDefaultListenAddress : s.listen_address();
  o.metrics_address = s.metrics_address();
  o.health_address = s.health_address();
  o.data_dir = s.store_dir().empty() ? kDefaultStoreDir : s.store_dir();
  o.key_dir = s.key_dir();
  o.audit_public_key_file = s.audit_public_key_file();
  o.tls.cert_file = s.tls().cert_file();
  o.tls.key_file = s.tls().key_file();
  o.tls.client_ca_file = s.tls().client_ca_file();
  o.tls.crl_file = s.tls().crl_file();
  o.tls.allowed_client_ids.assign(s.tls().allowed_client_ids().begin(),
                                  s.tls().allowed_client_ids().end());
  o.operator_ids.assign(s.tls().operator_ids().begin(), s.tls().operator_ids().end());
  o.insecure = s.insecure();
  if (s.has_max_client_bytes_per_round())
    o.max_client_bytes_per_round = static_cast<int64_t>(s.max_client_bytes_per_round());
  if (s.has_max_client_uploads_in_flight())
    o.max_client_uploads_in_flight = static_cast<int>(s.max_client_uploads_in_flight());
  if (s.has_max_client_uploads_per_round())
    o.max_client_uploads_per_round = static_cast<int>(s.max_client_uploads_per_round());
  if (s.has_max_client_reports_per_round())
    o.max_client_reports_per_round = static_cast<int>(s.max_client_reports_per_round());
  if (s.has_max_metrics_per_report())
    o.max_metrics_per_report = static_cast<int>(s.max_metrics_per_report());
  if (s.has_min_free_disk_bytes())
    o.min_free_disk_bytes = static_cast<int64_t>(s.min_free_disk_bytes());
  if (s.has_grpc_memory_bytes()) o.grpc_memory_bytes = static_cast<int64_t>(s.grpc_memory_bytes());
  if (s.has_grpc_max_threads()) o.grpc_max_threads = static_cast<int>(s.grpc_max_threads());
  if (s.has_max_concurrent_streams())
    o.max_concurrent_streams = static_cast<int>(s.max_concurrent_streams());
  if (s.has_max_client_downloads_in_flight()) {
    o.max_client_downloads_in_flight = static_cast<int>(s.max_client_downloads_in_flight());
  }
  if (s.has_max_aggregation_attempts())
    o.max_aggregation_attempts = static_cast<int>(s.max_aggregation_attempts());
  o.stop_on_aggregation_failure = s.stop_on_aggregation_failure();
  if (s.has_retain_rounds()) o.retain_rounds = static_cast<int64_t>(s.retain_rounds());
  if (s.has_chunk_size_bytes()) {
    o.chunk_bytes = s.chunk_size_bytes();
    o.max_upload_chunk_bytes = s.chunk_size_bytes();
  }
  if (s.has_max_update_bytes()) o.max_upload_bytes = static_cast<int64_t>(s.max_update_bytes());
  if (s.has_max_message_bytes()) o.max_message_bytes = static_cast<int>(s.max_message_bytes());
  const v1::SelectionConfig& sel = config.selection();
  if (sel.has_round_deadline_seconds())
    o.round_deadline_ms = int64_t{1000} * sel.round_deadline_seconds();
  if (sel.has_retry_after_seconds()) o.retry_after_ms = int64_t{1000} * sel.retry_after_seconds();
  o.heartbeat_interval_ms = heartbeat_interval_ms;
  o.heartbeat_timeout_ms = heartbeat_timeout_ms;
  return o;
}

}  // namespace

ServerOptions ServerOptionsFromRunConfig(const ResolvedRunConfig& run) {
  return ServerOptionsFor(run.config, run.heartbeat_interval_ms, run.heartbeat_timeout_ms);
}

ServerOptions ServerOptionsFromRunConfig(const v1::RunConfig& config) {
  return ServerOptionsFor(config, HeartbeatIntervalMs(config), HeartbeatTimeoutMs(config));
}

namespace {

// The health port's catch-all: every method but grpc.health.v1's (registered by gRPC itself, and
// matched first) is UNIMPLEMENTED. Registering it also gives that server the callback queue the
// default health service runs on.
class HealthPortOthers : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    class Refuse : public grpc::ServerGenericBidiReactor {
     public:
      Refuse() {
        Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                            "this port serves grpc.health.v1.Health only"));
      }
      void OnDone() override { delete this; }
    };
    return new Refuse;
  }
};

// Bounds on what peers can make a gRPC server hold: calls per connection (more wait on the
// client's side), and the memory and threads of a resource quota (past its memory gRPC shrinks
// its buffers and refuses new calls).
void ApplyBounds(grpc::ServerBuilder& builder, const char* name, int max_streams,
                 int64_t memory_bytes, int max_threads) {
  grpc::ResourceQuota quota(name);
  quota.Resize(static_cast<size_t>(memory_bytes));
  quota.SetMaxThreads(max_threads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, max_streams);
}

absl::Status ValidateOptions(const ServerOptions& o) {
  if (o.data_dir.empty()) return absl::InvalidArgumentError("ServerOptions.data_dir is empty");
  if (o.aggregation_device == Device::kCuda) {
    FEDLORA_RETURN_IF_ERROR_CTX(kernels::CheckCudaAvailable(),
                                "ServerOptions.aggregation_device is cuda");
  }
  if (o.chunk_bytes < 1 ||
      o.chunk_bytes + int64_t{kChunkMessageOverheadBytes} > o.max_message_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes ", o.chunk_bytes, " plus ", kChunkMessageOverheadBytes,
                     " bytes of framing must fit in max_message_bytes ", o.max_message_bytes));
  }
  if (o.max_upload_chunk_bytes < o.chunk_bytes) {
    return absl::InvalidArgumentError(
        "max_upload_chunk_bytes is below chunk_bytes: no upload could succeed");
  }
  if (o.expected_clients < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected_clients is ", o.expected_clients, "; must be >= 0"));
  }
  if (o.tls.enabled() &&
      (o.tls.cert_file.empty() || o.tls.key_file.empty() || o.tls.client_ca_file.empty())) {
    return absl::InvalidArgumentError(
        "TLS needs cert_file, key_file and client_ca_file: client identity comes from client "
        "certificates");
  }
  if (o.tls.enabled() && o.insecure)
    return absl::InvalidArgumentError("insecure and TLS exclude each other");
  if (!o.tls.enabled()) {
    if (!o.tls.crl_file.empty() || !o.tls.allowed_client_ids.empty()) {
      return absl::InvalidArgumentError("a CRL or an allowed client list needs TLS");
    }
    FEDLORA_RETURN_IF_ERROR(CheckPlaintextAllowed(o.listen_address, o.insecure, "listen address"));
  }
  if (o.max_client_bytes_per_round < o.max_upload_bytes || o.max_client_uploads_in_flight < 1 ||
      o.max_client_reports_per_round < 1 || o.max_metrics_per_report < 0 ||
      o.min_free_disk_bytes < 0 || o.max_aggregation_attempts < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "per-client quotas must admit one update: max_client_bytes_per_round ",
        o.max_client_bytes_per_round, " >= max_upload_bytes ", o.max_upload_bytes,
        ", uploads in flight ", o.max_client_uploads_in_flight, " >= 1, reports per round ",
        o.max_client_reports_per_round, " >= 1, metrics per report ", o.max_metrics_per_report,
        " >= 0, free-disk watermark ", o.min_free_disk_bytes, " >= 0, aggregation tries ",
        o.max_aggregation_attempts, " >= 1"));
  }
  if (o.max_client_downloads_in_flight < 1 || o.max_queued_tasks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_client_downloads_in_flight ", o.max_client_downloads_in_flight,
                     " and max_queued_tasks ", o.max_queued_tasks, " must be >= 1"));
  }
  for (const auto& [name, streams, memory, threads] :
       {std::tuple{"", o.max_concurrent_streams, o.grpc_memory_bytes, o.grpc_max_threads},
        std::tuple{"health_", o.health_max_concurrent_streams, o.health_grpc_memory_bytes,
                   o.health_grpc_max_threads}}) {
    if (streams < 1 || memory < (int64_t{1} << 20) || threads < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "max_concurrent_streams ", streams, " must be >= 1, ", name, "grpc_memory_bytes ",
          memory, " >= 1 MiB, ", name, "grpc_max_threads ", threads, " >= 2"));
    }
  }
  if (o.retain_rounds < 0) {
    return absl::InvalidArgumentError(absl::StrCat("retain_rounds is ", o.retain_rounds,
                                                   "; it counts rounds (0 keeps every round)"));
  }
  if (o.bulk_work_nice < 0 || o.bulk_work_nice > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("bulk_work_nice is ", o.bulk_work_nice, "; niceness steps are 0 to 19"));
  }
  return absl::OkStatus();
}

// What Create checks before it opens the store, in order: the options, the settings the server
// cannot carry out, the aggregation section (a robust rule's bounds and combinations), privacy,
// the audit trail; then the data directory is created.
absl::Status CheckBeforeStore(const ServerOptions& options, const v1::RunConfig& config,
                              const std::vector<UpdateTensor>& initial_adapter) {
  FEDLORA_RETURN_IF_ERROR(ValidateOptions(options));
  // Refused before the store is opened: a run written to the store with a setting the server cannot
  // carry out would stay there.
  if (std::vector<std::string> refused = UnimplementedSettings(config); !refused.empty()) {
    return absl::UnimplementedError(absl::StrJoin(refused, "; "));
  }
  FEDLORA_RETURN_IF_ERROR(ValidateAggregationSettings(config));
  int64_t adapter_elements = 0;
  for (const UpdateTensor& t : initial_adapter)
    adapter_elements += static_cast<int64_t>(t.values.size());
  FEDLORA_RETURN_IF_ERROR(Coordinator::CheckPrivacy(config, adapter_elements));
  FEDLORA_RETURN_IF_ERROR(CheckAuditSettings(options, config));
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create data dir ", options.data_dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options, v1::RunConfig config,
                                                       std::vector<UpdateTensor> initial_adapter,
                                                       Evaluator* evaluator, Clock clock) {
  FEDLORA_ASSIGN_OR_RETURN(ResolvedRunConfig run, ResolveRunConfig(std::move(config)));
  return Create(std::move(options), std::move(run), std::move(initial_adapter), evaluator,
                std::move(clock));
}

absl::StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options, ResolvedRunConfig run,
                                                       std::vector<UpdateTensor> initial_adapter,
                                                       Evaluator* evaluator, Clock clock) {
  FEDLORA_RETURN_IF_ERROR(CheckBeforeStore(options, run.config, initial_adapter));
  std::unique_ptr<Server> server(new Server());
  server->options_ = std::move(options);
  const ServerOptions& o = server->options_;
  FEDLORA_ASSIGN_OR_RETURN(server->dir_lock_, DataDirLock::Acquire(o.data_dir));
  FEDLORA_ASSIGN_OR_RETURN(server->store_, Store::Open(o.data_dir + "/fedlora.db"));
  FEDLORA_ASSIGN_OR_RETURN(server->blobs_, BlobStore::Open(o.data_dir));
  server->coordinator_ = std::make_unique<Coordinator>(
      o, std::move(run), std::move(initial_adapter), server->store_.get(), server->blobs_.get(),
      evaluator, &server->metrics_, std::move(clock));
  server->federation_ = std::make_unique<FederationService>(
      o, server->coordinator_.get(), server->blobs_.get(), &server->metrics_);
  server->admin_ = std::make_unique<AdminService>(o, server->coordinator_.get());

  FEDLORA_RETURN_IF_ERROR(server->StartGrpc());
  FEDLORA_RETURN_IF_ERROR(server->StartHealthPort());
  // Health answers for the whole server ("") and for each service by its full name; every name
  // says NOT_SERVING until the run is restored, and again from the moment Shutdown begins.
  server->SetServing(false);

  FEDLORA_RETURN_IF_ERROR(server->StartMetricsHttp());
  // Restore before serving: until this returns, every Federation/Admin call answers Unavailable and
  // the health service NOT_SERVING.
  FEDLORA_RETURN_IF_ERROR_CTX(server->coordinator_->Restore(), "restoring the run from the store");
  server->SetServing(true);
  server->driver_ = std::thread([s = server.get()] { s->DriverLoop(); });
  FEDLORA_LOG(INFO) << "server listening on port " << server->port_
                    << (o.tls.enabled() ? " (mTLS)" : " (plaintext, loopback identity)");
  return server;
}

absl::Status Server::StartGrpc() {
  const ServerOptions& o = options_;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (o.tls.enabled()) {
    // Chain, expiry, CRL and the allowed ids are checked at every handshake (crypto/tls.h).
    FEDLORA_ASSIGN_OR_RETURN(
        tls_, crypto::ServerTls::Create({o.tls.cert_file, o.tls.key_file, o.tls.client_ca_file,
                                         o.tls.crl_file, o.tls.allowed_client_ids}));
    creds = tls_->credentials();
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen_address, creds, &port_);
  builder.RegisterService(federation_.get());
  builder.RegisterService(admin_.get());
  builder.SetMaxReceiveMessageSize(o.max_message_bytes);
  builder.SetMaxSendMessageSize(o.max_message_bytes);
  // gRPC sets SO_REUSEPORT by default, which would let a second server silently share the port
  // (and split the clients); a busy address must be an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, o.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, o.keepalive_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, o.max_connection_age_ms);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, o.max_connection_age_grace_ms);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             o.min_client_ping_interval_ms);
  ApplyBounds(builder, "fedlora", o.max_concurrent_streams, o.grpc_memory_bytes,
              o.grpc_max_threads);
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", o.listen_address, " (address in use or invalid)"));
  }
  return absl::OkStatus();
}

absl::Status Server::StartHealthPort() {
  const ServerOptions& o = options_;
  if (!o.health_address.empty()) {
    // Plaintext on purpose: it serves the health statuses and nothing else.
    grpc::ServerBuilder health_builder;
    health_others_ = std::make_unique<HealthPortOthers>();
    health_builder.RegisterCallbackGenericService(health_others_.get());
    health_builder.AddListeningPort(o.health_address, grpc::InsecureServerCredentials(),
                                    &health_port_);
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    ApplyBounds(health_builder, "fedlora-health", o.health_max_concurrent_streams,
                o.health_grpc_memory_bytes, o.health_grpc_max_threads);
    health_server_ = health_builder.BuildAndStart();
    if (health_server_ == nullptr || health_port_ == 0 ||
        health_server_->GetHealthCheckService() == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot serve health on ", o.health_address,
                                                 " (address in use or invalid)"));
    }
  }
  return absl::OkStatus();
}

absl::Status Server::StartMetricsHttp() {
  const ServerOptions& o = options_;
  if (!o.metrics_address.empty()) {
    Server* s = this;
    // The live view beside /metrics, for operators (server/live_view.h); HTTPS under TLS.
    MetricsHttpOptions http;
    if (o.tls.enabled()) {
      http.cert_file = o.tls.cert_file;
      http.key_file = o.tls.key_file;
      http.client_ca_file = o.tls.client_ca_file;
    }
    http.page_paths = {kLiveViewPath, kRunJsonPath};
    http.pages = [s, access =
                         LiveViewAccess{s->tls_.get(), o.operator_ids}](const HttpPageRequest& r) {
      return ServeLiveView(r, access, *s->coordinator_);
    };
    FEDLORA_ASSIGN_OR_RETURN(
        metrics_http_, MetricsHttpServer::Start(
                           o.metrics_address, [s] { return s->MetricsText(); }, std::move(http)));
  }
  return absl::OkStatus();
}

Server::~Server() { Shutdown(); }

std::string Server::MetricsText() {
  if (tls_ != nullptr) metrics_.tls_handshakes_refused.store(tls_->refused_handshakes());
  return metrics_.ToPrometheusText();
}

absl::Status Server::ReloadCrl() {
  if (tls_ == nullptr)
    return absl::FailedPreconditionError("the server runs without TLS: there is no CRL to reload");
  return tls_->ReloadCrl();
}

void Server::SetServing(bool serving) {
  for (grpc::Server* g : {grpc_server_.get(), health_server_.get()}) {
    grpc::HealthCheckServiceInterface* health = g != nullptr ? g->GetHealthCheckService() : nullptr;
    if (health == nullptr) continue;
    for (const char* name :
         {"", v1::Federation::service_full_name(), v1::Admin::service_full_name()}) {
      health->SetServingStatus(name, serving);
    }
  }
}

int Server::metrics_port() const { return metrics_http_ ? metrics_http_->port() : 0; }

std::string Server::address() const {
  const std::string& a = options_.listen_address;
  return absl::StrCat(a.substr(0, a.rfind(':')), ":", port_);
}

void Server::DriverLoop() {
  std::unique_lock<std::mutex> lock(driver_mu_);
  while (!stopping_) {
    lock.unlock();
    absl::Status s = coordinator_->Tick();
    if (!s.ok()) {
      FEDLORA_LOG(WARNING) << "round driver: " << s;
    }
    lock.lock();
    driver_cv_.wait_for(lock, std::chrono::milliseconds(options_.tick_ms),
                        [this] { return stopping_; });
  }
}

bool Server::WaitUntilFinished(int64_t timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < until) {
    if (coordinator_->finished()) return true;
    {
      std::unique_lock<std::mutex> lock(driver_mu_);
      if (stopping_) return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return coordinator_->finished();
}

void Server::Shutdown() {
  if (shut_down_.exchange(true)) return;
  // NOT_SERVING for every name at once (open Watch streams are told), and no later change: probes
  // see the server going before it stops answering.
  for (grpc::Server* g : {grpc_server_.get(), health_server_.get()}) {
    if (g == nullptr) continue;
    if (grpc::HealthCheckServiceInterface* health = g->GetHealthCheckService()) health->Shutdown();
  }
  {
    std::lock_guard<std::mutex> lock(driver_mu_);
    stopping_ = true;
  }
  driver_cv_.notify_all();
  if (driver_.joinable()) driver_.join();
  if (coordinator_) coordinator_->ReleaseAllWaiters();
  if (grpc_server_) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc_server_->Wait();
  }
  if (health_server_) {
    health_server_->Shutdown(std::chrono::system_clock::now());
    health_server_->Wait();
  }
  metrics_http_.reset();
  // The run's state is on disk and nothing writes it any more: another server (or `fedlora store`)
  // may take the data directory now, before this object is destroyed.
  if (coordinator_) coordinator_->WaitForAggregation();
  dir_lock_.reset();
}

}  // namespace fedlora
