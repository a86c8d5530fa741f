// Fuzzes the metrics endpoint's HTTP server (server/metrics.h, MetricsHttpServer): the request
// parser, routing and keep-alive loop a Prometheus scraper (or anyone who can reach the port) talks
// to. One server runs on 127.0.0.1 for the whole run; each input is sent as it is over a new loopback
// connection, whose sending side is then shut, and the reply is read until the server closes.
//
// Checks beyond "no crash, no sanitizer report":
// - the server answers every connection by closing it (the harness waits at most 10 s);
// - a reply is empty or a sequence of HTTP/1.1 responses, each with a status this server
//   (or httplib: 100 Continue, 206 for a Range) sends;
// - after every input the server still serves GET /metrics with the rendered page.
#include <netinet/in.h>
#include <poll.h>
#include <sanitizer/lsan_interface.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "server/metrics.h"

namespace {

constexpr char kPage[] = "# TYPE fedlora_fuzz gauge\nfedlora_fuzz 1\n";

std::unique_ptr<fedlora::MetricsHttpServer>& Server() {
  static std::unique_ptr<fedlora::MetricsHttpServer> server;
  return server;
}

// At exit, once the server has stopped: its threads no longer hold memory, so a leak check sees
// only what leaked (libFuzzer's own per-input check is off, -detect_leaks=0 in scripts/fuzz.sh).
void Stop() {
  Server().reset();
  if (__lsan_do_recoverable_leak_check() != 0) std::_Exit(1);
}

// Sends `request` over a new connection to the server, shuts the sending side, and returns all the
// server wrote until it closed.
std::string Exchange(std::string_view request) {
  const int sock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(sock >= 0, "socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(Server()->port()));
  // An interrupted connect (EINTR, see below) goes on in the background: wait for its outcome.
  int rc = connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  if (rc != 0 && errno == EINTR) {
    pollfd out{sock, POLLOUT, 0};
    while (poll(&out, 1, 10000) < 0 && errno == EINTR) {
    }
    int err = 0;
    socklen_t len = sizeof(err);
    rc = getsockopt(sock, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 ? 0 : -1;
    if (err != 0) errno = err;
  }
  FUZZ_CHECK(rc == 0, std::string("the server refused a connection: ") + std::strerror(errno));
  // The reply is read only after the whole request went: large requests are sent while reading.
  std::string reply;
  size_t sent = 0;
  bool shut = false;
  char buf[16384];
  while (true) {
    if (sent == request.size() && !shut) {
      shutdown(sock, SHUT_WR);
      shut = true;
    }
    pollfd fd{sock, static_cast<short>(POLLIN | (shut ? 0 : POLLOUT)), 0};
    // libFuzzer's -timeout arms a periodic SIGALRM, which interrupts poll (EINTR): wait again for
    // what is left of the 10 s.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int r;
    do {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      r = poll(&fd, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    } while (r < 0 && errno == EINTR);
    FUZZ_CHECK(r > 0, "the server neither read, answered nor closed within 10 s");
    if ((fd.revents & POLLOUT) != 0 && !shut) {
      const ssize_t n = send(sock, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        sent = request.size();  // the server closed its side: nothing more goes
      }
    }
    if ((fd.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      const ssize_t n = recv(sock, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      reply.append(buf, static_cast<size_t>(n));
    }
  }
  close(sock);
  return reply;
}

// Each response of `reply` starts with an HTTP/1.1 status line this server sends.
void CheckReply(const std::string& reply) {
  static const char* const kLines[] = {
      "HTTP/1.1 100 ", "HTTP/1.1 200 ", "HTTP/1.1 206 ", "HTTP/1.1 400 ", "HTTP/1.1 404 ",
      "HTTP/1.1 405 ", "HTTP/1.1 413 ", "HTTP/1.1 414 ", "HTTP/1.1 416 ", "HTTP/1.1 417 ",
      "HTTP/1.1 431 ", "HTTP/1.1 500 ", "HTTP/1.1 501 ", "HTTP/1.1 505 "};
  if (reply.empty()) return;
  bool known = false;
  for (const char* line : kLines) known = known || reply.rfind(line, 0) == 0;
  FUZZ_CHECK(known, "a reply that is not a status line this server sends: " + reply.substr(0, 80));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto server = fedlora::MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string(kPage); });
  FUZZ_CHECK(server.ok(), server.status());
  Server() = std::move(*server);
  std::atexit(Stop);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string reply = Exchange(std::string_view(reinterpret_cast<const char*>(data), size));
  FUZZ_TRACE("%zu bytes -> %zu bytes: %.40s\n", size, reply.size(), reply.c_str());
  CheckReply(reply);
  const std::string scrape =
      Exchange("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  FUZZ_CHECK(scrape.rfind("HTTP/1.1 200 ", 0) == 0 && scrape.find(kPage) != std::string::npos,
             "the server no longer serves /metrics: " + scrape.substr(0, 80));
  return 0;
}
