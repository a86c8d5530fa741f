// Server counters and a tiny Prometheus text endpoint (HTTP/1.0, GET /metrics, loopback).
//
//   ServerMetrics metrics;
//   metrics.updates_accepted.fetch_add(1);
//   FEDLORA_ASSIGN_OR_RETURN(auto http, MetricsHttpServer::Start("127.0.0.1:0",
//       [&] { return metrics.ToPrometheusText(); }));
//   // curl http://127.0.0.1:<http->port()>/metrics
//
// Counters are std::atomic and may be bumped from any thread. The HTTP server handles one connection
// at a time on its own thread: scrapes come every few seconds from one Prometheus, so concurrency
// would buy nothing, and a slow or hostile peer is cut off by a short socket timeout.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace fedlora {

struct ServerMetrics {
  // Rounds committed since the run began (restored from the store at start).
  std::atomic<int64_t> rounds_committed{0};
  // Round attempts abandoned because the deadline passed with fewer than min_clients updates.
  std::atomic<int64_t> rounds_abandoned{0};
  std::atomic<int64_t> current_round{0};
  // Clients known to the registry, and of them those heard from within the heartbeat timeout.
  std::atomic<int64_t> clients_registered{0};
  std::atomic<int64_t> clients_live{0};
  std::atomic<int64_t> joins{0};
  // Updates accepted (each counted once, however often it was re-sent) and refused (each attempt).
  std::atomic<int64_t> updates_accepted{0};
  std::atomic<int64_t> updates_rejected{0};
  std::atomic<int64_t> updates_duplicate{0};
  // Payload bytes received in upload chunks and sent in download chunks (wire, before decoding).
  std::atomic<int64_t> upload_bytes{0};
  std::atomic<int64_t> download_bytes{0};
  // Bytes of the store's files (database, blobs, partial uploads), measured by the round driver
  // about once a second; and partial uploads deleted because their round closed or they were refused.
  std::atomic<int64_t> store_bytes{0};
  std::atomic<int64_t> partial_uploads_discarded{0};
  // Uploads and metrics reports refused for a per-client quota or the free-disk watermark.
  std::atomic<int64_t> quota_refusals{0};
  // Upload streams admitted and not yet ended.
  std::atomic<int64_t> uploads_streaming{0};
  // TLS connections refused for a revoked certificate or a client id not on the allowed list.
  std::atomic<int64_t> tls_handshakes_refused{0};

  // Renders every counter in the Prometheus text exposition format (version 0.0.4), names prefixed
  // "fedlora_". Thread-safe.
  std::string ToPrometheusText() const;
};

class MetricsHttpServer {
 public:
  using Renderer = std::function<std::string()>;

  // Binds `address` (host:port; host must be an IPv4 literal such as 127.0.0.1, port 0 picks one)
  // and starts serving. InvalidArgument for a malformed address, Unavailable when the bind fails
  // (port in use), naming the address and errno text.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& address, Renderer render);
  // Stops the thread and closes the socket.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer(int fd, int port, Renderer render);
  void Loop();
  void Serve(int conn);

  int fd_;
  int port_;
  Renderer render_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace fedlora
