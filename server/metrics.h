// Server counters and their Prometheus text endpoint (cpp-httplib: GET /metrics).
//
//   ServerMetrics metrics;
//   metrics.updates_accepted.fetch_add(1);
//   FEDLORA_ASSIGN_OR_RETURN(auto http, MetricsHttpServer::Start("127.0.0.1:0",
//       [&] { return metrics.ToPrometheusText(); }));
//   // curl http://127.0.0.1:<http->port()>/metrics
//
// With MetricsHttpOptions the same listener serves more pages (the live view, server/live_view.h),
// and under TLS speaks HTTPS.
//
// Counters are std::atomic and may be bumped from any thread. The HTTP server accepts on its own
// thread and answers on a small pool, so several scrapers are served at once. Every connection is
// bounded (see metrics.cc for the limits): a peer that sends nothing, or dribbles its request, is
// cut off, holds one pool thread at most for that long, and never delays the server's shutdown.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace fedlora {

struct ServerMetrics {
  // Rounds committed since the run began (restored from the store at start).
  std::atomic<int64_t> rounds_committed{0};
  // Round attempts abandoned because the deadline passed with fewer than min_clients updates.
  std::atomic<int64_t> rounds_abandoned{0};
  std::atomic<int64_t> clients_failed{0};  // Leave with an error
  std::atomic<int64_t> current_round{0};
  // Clients known to the registry, and of them those heard from within the heartbeat timeout.
  std::atomic<int64_t> clients_registered{0};
  std::atomic<int64_t> clients_live{0};
  std::atomic<int64_t> joins{0};
  // Updates accepted (each counted once, however often it was re-sent) and refused (each attempt).
  std::atomic<int64_t> updates_accepted{0};
  std::atomic<int64_t> updates_rejected{0};
  std::atomic<int64_t> updates_duplicate{0};
  // Accepted updates found corrupt or missing in the blob store at aggregation, and left out.
  std::atomic<int64_t> updates_corrupt{0};
  // Payload bytes received in upload chunks and sent in download chunks (wire, before decoding).
  std::atomic<int64_t> upload_bytes{0};
  // The accepted updates as dense fp32 values: upload_bytes against it is the codec's saving.
  std::atomic<int64_t> update_fp32_bytes{0};
  std::atomic<int64_t> download_bytes{0};
  // What the completed downloads stand for as full adapters: a full adapter counts its size, a
  // downlink delta chain the adapter it rebuilds (download_bytes against it is the downlink's saving).
  std::atomic<int64_t> download_full_bytes{0};
  // Bytes of the store's files (database, blobs, partial uploads), measured by the round driver
  // about once a second; and partial uploads deleted because their round closed or they were refused.
  std::atomic<int64_t> store_bytes{0};
  std::atomic<int64_t> partial_uploads_discarded{0};
  // Uploads and metrics reports refused for a per-client quota or the free-disk watermark.
  std::atomic<int64_t> quota_refusals{0};
  // Aggregation tries that failed (each try counted; see ServerOptions::max_aggregation_attempts).
  std::atomic<int64_t> aggregation_failures{0};
  // Secure-aggregation sums refused as larger than their clipped updates can make them.
  std::atomic<int64_t> secagg_implausible_sums{0};
  std::atomic<int64_t> secagg_misbehaving_clients{0};
  // Upload streams admitted and not yet ended.
  std::atomic<int64_t> uploads_streaming{0};
  // TLS handshakes refused for the client certificate (crypto::ServerTls::refused_handshakes).
  std::atomic<int64_t> tls_handshakes_refused{0};
  // With differential privacy: epsilon spent by the committed rounds, in millionths; -1 (not
  // exported) without it.
  std::atomic<int64_t> dp_epsilon_micro{-1};

  // Renders every counter in the Prometheus text exposition format (version 0.0.4), names prefixed
  // "fedlora_". Thread-safe.
  std::string ToPrometheusText() const;
};

// A GET of one of MetricsHttpOptions::page_paths, as its handler sees it.
struct HttpPageRequest {
  std::string path;
  std::string host;          // the Host header, as sent
  std::string peer_address;  // numeric (127.0.0.1, ::1), without the port
  bool https = false;
  // Under HTTPS: the client certificate the peer proved it holds (PEM) and the rest of the chain it
  // sent; empty when it sent none. Not verified: the handler decides what to trust.
  std::string client_cert_pem, client_chain_pem;
};

struct HttpPageReply {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

struct MetricsHttpOptions {
  // With cert_file and key_file: HTTPS only, with that certificate (chain) and key. The listener
  // asks for a client certificate (naming client_ca_file's CAs, when set) and takes one, or none,
  // without checking it: /metrics stays open, and the page handler checks what it needs.
  std::string cert_file, key_file, client_ca_file;
  // Paths besides /metrics answered by `pages` (GET and HEAD; other methods 405). Called on the
  // pool's threads, possibly several at once.
  std::vector<std::string> page_paths;
  std::function<HttpPageReply(const HttpPageRequest&)> pages;
};

class MetricsHttpServer {
 public:
  using Renderer = std::function<std::string()>;

  // Binds `address` and starts serving: GET (and HEAD) /metrics answers the renderer's text as
  // "text/plain; version=0.0.4", the page paths their handler's reply, other paths 404, other
  // methods 405. `address` is
  // host:port with an IPv4 literal (127.0.0.1), an IPv6 literal in brackets ([::1]) or localhost
  // (bound as 127.0.0.1); port 0 picks a free port (port() tells which). InvalidArgument for a
  // malformed address or another host name, Unavailable when the bind fails (port in use), naming
  // the address; for HTTPS, the certificate or key file's error. `render` is called on the pool's
  // threads, possibly several at once.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& address,
                                                                  Renderer render,
                                                                  MetricsHttpOptions options = {});
  // Stops accepting, cuts off connections still open, and joins the threads.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }
  bool https() const;

 private:
  struct Impl;
  MetricsHttpServer(int port, std::unique_ptr<Impl> impl);

  int port_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedlora
