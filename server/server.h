// The aggregation server: opens the store, starts the gRPC server (Federation, Admin, health), the
// Prometheus endpoint and the round driver, and restores the run before serving anything but health
// checks. Health (grpc.health.v1.Health) answers for "" (the whole server), "fedlora.v1.Federation"
// and "fedlora.v1.Admin": NOT_SERVING until the run is restored, SERVING after, NOT_SERVING again
// from the moment Shutdown begins; any other name is NOT_FOUND. ServerOptions::health_address adds
// a plaintext port that serves only these statuses.
//
//   FEDLORA_ASSIGN_OR_RETURN(v1::RunConfig config, LoadRunConfigFile("run.json"));
//   FEDLORA_ASSIGN_OR_RETURN(ResolvedRunConfig run, ResolveRunConfig(std::move(config)));
//   ServerOptions options = ServerOptionsFromRunConfig(run);
//   FEDLORA_ASSIGN_OR_RETURN(auto server, Server::Create(options, run, initial_adapter));
//   server->WaitUntilFinished(timeout_ms);   // until the run is finished or Shutdown() is called
//
// Thread-safety: every method may be called from any thread; Shutdown is idempotent.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "config/resolved.h"
#include "fedlora/v1/config.pb.h"
#include "server/coordinator.h"
#include "server/data_dir_lock.h"
#include "server/evaluator.h"
#include "server/metrics.h"
#include "server/options.h"

namespace grpc {
class Server;
class CallbackGenericService;
}  // namespace grpc
namespace fedlora::crypto {
class ServerTls;
}

namespace fedlora {

class FederationService;
class AdminService;

// ServerOptions with the addresses, limits, TLS files and timings the run config sets; everything
// else keeps its default. The heartbeat's interval and timeout are the resolved value's.
ServerOptions ServerOptionsFromRunConfig(const ResolvedRunConfig& run);
// The same for a config not resolved yet (the heartbeat from HeartbeatIntervalMs and
// HeartbeatTimeoutMs, as ResolveRunConfig derives it).
ServerOptions ServerOptionsFromRunConfig(const v1::RunConfig& config);

class Server {
 public:
  // `initial_adapter` seeds a new run (ignored when the store already holds the run). `evaluator`
  // may be null; it is not owned and must outlive the server. Errors: the store's (opening,
  // restoring), Unavailable when the address cannot be bound, InvalidArgument for inconsistent
  // options (a chunk that does not fit in a message, TLS files missing). The coordinator keeps
  // `run` and reads the run's codecs from it.
  static absl::StatusOr<std::unique_ptr<Server>> Create(ServerOptions options,
                                                        ResolvedRunConfig run,
                                                        std::vector<UpdateTensor> initial_adapter,
                                                        Evaluator* evaluator = nullptr,
                                                        Clock clock = nullptr);
  // The same for a config not resolved yet: ResolveRunConfig first, whose error (a codec spec that
  // cannot be carried out) refuses the start before anything else is checked.
  static absl::StatusOr<std::unique_ptr<Server>> Create(ServerOptions options, v1::RunConfig config,
                                                        std::vector<UpdateTensor> initial_adapter,
                                                        Evaluator* evaluator = nullptr,
                                                        Clock clock = nullptr);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound gRPC port, health port and metrics port (0 when that endpoint is disabled).
  int port() const { return port_; }
  int health_port() const { return health_port_; }
  int metrics_port() const;
  std::string address() const;

  // Blocks until the run has finished (then the server keeps answering RunFinished until Shutdown)
  // or Shutdown() was called. Returns true when the run finished.
  bool WaitUntilFinished(int64_t timeout_ms);
  // Turns health NOT_SERVING, stops the driver (joining it after its current tick), releases
  // held long polls, and shuts the gRPC server down: new calls are refused, calls in flight get up
  // to 2 s and are then cancelled (an upload cut off resumes from its last checkpoint when the
  // client retries against a restarted server). Then stops the metrics endpoint, waits for an
  // aggregation to stop, and releases the data directory's lock (server/data_dir_lock.h). Idempotent.
  void Shutdown();

  // Re-reads the TLS CRL file now (SIGHUP); the previous CRL stays in force when the new one does
  // not load. FailedPrecondition without TLS.
  absl::Status ReloadCrl();

  // The Prometheus text of metrics(), with the TLS refusal count brought up to date (what the
  // metrics endpoint serves).
  std::string MetricsText();

  Coordinator& coordinator() { return *coordinator_; }
  // The store and blobs the run lives in, for reading its committed rounds (`fedlora server
  // --out`); both thread-safe, and open until the server is destroyed.
  Store& store() { return *store_; }
  BlobStore& blobs() { return *blobs_; }
  const ServerMetrics& metrics() const { return metrics_; }

 private:
  Server() = default;
  // Create's steps once the services exist: the main gRPC server (with TLS when configured), the
  // health port (when ServerOptions::health_address is set), and the metrics listener with the live
  // view (when ServerOptions::metrics_address is set). Each fails when its address cannot be bound.
  absl::Status StartGrpc();
  absl::Status StartHealthPort();
  absl::Status StartMetricsHttp();
  void DriverLoop();
  // Sets every health name of both gRPC servers (the main one and the health port's).
  void SetServing(bool serving);

  ServerOptions options_;
  ServerMetrics metrics_;
  std::unique_ptr<DataDirLock> dir_lock_;  // held from Create until Shutdown (or destruction)
  std::unique_ptr<Store> store_;
  std::unique_ptr<BlobStore> blobs_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<FederationService> federation_;
  std::unique_ptr<AdminService> admin_;
  std::shared_ptr<crypto::ServerTls> tls_;  // null without TLS
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<grpc::CallbackGenericService> health_others_;  // outlives health_server_
  std::unique_ptr<grpc::Server> health_server_;  // null without ServerOptions::health_address
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  int port_ = 0;
  int health_port_ = 0;

  std::mutex driver_mu_;
  std::condition_variable driver_cv_;
  bool stopping_ = false;
  std::thread driver_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace fedlora
