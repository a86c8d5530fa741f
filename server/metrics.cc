#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fedlora {
namespace {

void AppendMetric(std::string& out, const char* name, const char* type, const char* help, int64_t value) {
  absl::StrAppend(&out, "# HELP fedlora_", name, " ", help, "\n# TYPE fedlora_", name, " ", type,
                  "\nfedlora_", name, " ", value, "\n");
}

// How long one scrape connection may take to send its request, milliseconds. A real scraper sends
// its ~100-byte request at once; a peer that dribbles bytes is cut off so it cannot hold the thread.
constexpr int kRequestTimeoutMs = 2000;
// How often the accept loop wakes to check for shutdown, milliseconds.
constexpr int kPollIntervalMs = 100;

}  // namespace

std::string ServerMetrics::ToPrometheusText() const {
  std::string out;
  AppendMetric(out, "rounds_committed_total", "counter", "Rounds aggregated and committed.", rounds_committed.load());
  AppendMetric(out, "rounds_abandoned_total", "counter", "Round attempts abandoned at the deadline.",
               rounds_abandoned.load());
  AppendMetric(out, "current_round", "gauge", "Round in progress (0 before the first).", current_round.load());
  AppendMetric(out, "clients_registered", "gauge", "Clients known to the server.", clients_registered.load());
  AppendMetric(out, "clients_live", "gauge", "Clients heard from within the heartbeat timeout.", clients_live.load());
  AppendMetric(out, "joins_total", "counter", "Successful Join calls.", joins.load());
  AppendMetric(out, "updates_accepted_total", "counter", "Updates accepted, each counted once.",
               updates_accepted.load());
  AppendMetric(out, "updates_rejected_total", "counter", "Upload attempts refused.", updates_rejected.load());
  AppendMetric(out, "updates_duplicate_total", "counter", "Re-sent uploads answered with the original ack.",
               updates_duplicate.load());
  AppendMetric(out, "upload_bytes_total", "counter", "Update bytes received in chunks.", upload_bytes.load());
  AppendMetric(out, "download_bytes_total", "counter", "Adapter bytes sent in chunks.", download_bytes.load());
  AppendMetric(out, "store_bytes", "gauge", "Bytes of the store's files: database, blobs, partial uploads.",
               store_bytes.load());
  AppendMetric(out, "partial_uploads_discarded_total", "counter",
               "Partial uploads deleted because their round closed or they were refused.",
               partial_uploads_discarded.load());
  AppendMetric(out, "quota_refusals_total", "counter",
               "Uploads and reports refused for a per-client quota or the free-disk watermark.", quota_refusals.load());
  AppendMetric(out, "uploads_streaming", "gauge", "Upload streams admitted and not yet ended.",
               uploads_streaming.load());
  AppendMetric(out, "tls_handshakes_refused_total", "counter",
               "TLS connections refused for a revoked certificate or a client id not allowed.",
               tls_handshakes_refused.load());
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& address,
                                                                            Renderer render) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", address, "' is not host:port"));
  }
  const std::string host = address.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", address, "' has a bad port"));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "': host must be an IPv4 literal such as 127.0.0.1"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("metrics socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("metrics endpoint cannot bind ", address, ": ", std::strerror(err)));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(fd, ntohs(addr.sin_port), std::move(render)));
}

MetricsHttpServer::MetricsHttpServer(int fd, int port, Renderer render)
    : fd_(fd), port_(port), render_(std::move(render)) {
  thread_ = std::thread([this] { Loop(); });
}

MetricsHttpServer::~MetricsHttpServer() {
  stop_.store(true);
  thread_.join();
  close(fd_);
}

void MetricsHttpServer::Loop() {
  while (!stop_.load()) {
    pollfd pfd{fd_, POLLIN, 0};
    if (poll(&pfd, 1, kPollIntervalMs) <= 0) continue;
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    Serve(conn);
    close(conn);
  }
}

void MetricsHttpServer::Serve(int conn) {
  // Read until the end of the request head (a blank line) or 8 KiB, whichever comes first.
  std::string request;
  char buf[1024];
  while (request.size() < 8192 && request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos) {
    pollfd pfd{conn, POLLIN, 0};
    if (poll(&pfd, 1, kRequestTimeoutMs) <= 0) return;
    const ssize_t n = read(conn, buf, sizeof(buf));
    if (n <= 0) break;
    request.append(buf, static_cast<size_t>(n));
  }
  std::string status_line;
  std::string body;
  if (request.rfind("GET /metrics ", 0) == 0 || request.rfind("GET / ", 0) == 0) {
    status_line = "HTTP/1.0 200 OK";
    body = render_();
  } else {
    status_line = "HTTP/1.0 404 Not Found";
    body = "only GET /metrics is served\n";
  }
  const std::string response =
      absl::StrCat(status_line, "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: ", body.size(),
                   "\r\nConnection: close\r\n\r\n", body);
  size_t sent = 0;
  while (sent < response.size()) {
    const ssize_t n = send(conn, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

}  // namespace fedlora
