#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A TCP connection to the loopback address of `family` (AF_INET: 127.0.0.1, AF_INET6: ::1); -1 when
// it cannot connect.
int Connect(int port, int family = AF_INET) {
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int rc;
  if (family == AF_INET6) {
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    addr.sin6_addr = in6addr_loopback;
    rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  if (rc != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A TCP connection to 127.0.0.1:port from `source`, another loopback address (127.0.0.2 ...): a
// second peer as the server sees it. -1 when it cannot connect.
int ConnectFrom(int port, const char* source) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

// Reads until the peer closes (or 20 s pass without a byte: the test then fails on the content).
std::string ReadToEof(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20'000) <= 0) break;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Sends `request` on a new connection and returns everything the server sent back before closing.
// `half_close`: then shuts the sending side, so that the server sees the end of the requests.
std::string Exchange(int port, const std::string& request, int family = AF_INET,
                     bool half_close = true) {
  const int fd = Connect(port, family);
  EXPECT_GE(fd, 0) << "cannot connect to port " << port;
  if (fd < 0) return "";
  SendAll(fd, request);
  if (half_close) shutdown(fd, SHUT_WR);
  std::string out = ReadToEof(fd);
  close(fd);
  return out;
}

std::string Get(int port, const std::string& path, int family = AF_INET) {
  return Exchange(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                  family);
}

// Whether the server closed `fd` (EOF or reset) within 20 s; bytes it sent first are skipped.
bool ClosedByPeer(int fd) {
  char buf[4096];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
  return false;
}

bool HaveIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

TEST(ServerMetricsTest, RendersEveryCounterInPrometheusTextFormat) {
  ServerMetrics m;
  m.updates_accepted = 12;
  m.upload_bytes = 3456;
  m.rounds_committed = 3;
  const std::string text = m.ToPrometheusText();
  EXPECT_THAT(
      text,
      HasSubstr(
          "# TYPE fedlora_updates_accepted_total counter\nfedlora_updates_accepted_total 12\n"));
  EXPECT_THAT(text, HasSubstr("fedlora_upload_bytes_total 3456\n"));
  EXPECT_THAT(text, HasSubstr("fedlora_rounds_committed_total 3\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE fedlora_clients_live gauge\nfedlora_clients_live 0\n"));
}

TEST(MetricsHttpServerTest, ServesMetricsAndNothingElse) {
  std::atomic<int> calls{0};
  auto http = MetricsHttpServer::Start("127.0.0.1:0", [&] {
    ++calls;
    return std::string("fedlora_x 1\n");
  });
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  ASSERT_GT(port, 0);
  const std::string ok = Get(port, "/metrics");
  EXPECT_THAT(ok, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(ok, HasSubstr("Content-Type: text/plain; version=0.0.4\r\n"));
  EXPECT_THAT(ok, HasSubstr("Content-Length: 12\r\n"));
  EXPECT_THAT(ok, EndsWith("\r\n\r\nfedlora_x 1\n"));
  // HEAD: the same head, no body.
  const std::string head = Exchange(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(head, EndsWith("\r\n\r\n"));
  EXPECT_EQ(calls.load(), 2);

  EXPECT_THAT(Get(port, "/"), StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(Get(port, "/secrets"), StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(Get(port, "/metrics/x"), StartsWith("HTTP/1.1 404"));
  for (const char* method : {"POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"}) {
    const std::string r =
        Exchange(port, std::string(method) + " /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
    EXPECT_THAT(r, StartsWith("HTTP/1.1 405")) << method;
    EXPECT_THAT(r, HasSubstr("Allow: GET, HEAD\r\n")) << method;
  }
  EXPECT_THAT(Exchange(port, "POST /other HTTP/1.0\r\nContent-Length: 0\r\n\r\n"),
              StartsWith("HTTP/1.1 404"));
  // A body is read (not taken for the next request): the second request on the connection is answered.
  const std::string two =
      Exchange(port,
               "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
               "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(two, StartsWith("HTTP/1.1 405"));
  EXPECT_THAT(two, HasSubstr("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(two, EndsWith("fedlora_x 1\n"));
  // A malformed request is refused, and the connection closed after the answer.
  const std::string bad = Exchange(port, "garbage\r\n\r\n", AF_INET, /*half_close=*/false);
  EXPECT_THAT(bad, StartsWith("HTTP/1.1 400"));
  EXPECT_THAT(bad, HasSubstr("Connection: close\r\n"));
  EXPECT_THAT(bad, Not(HasSubstr("Keep-Alive")));
  EXPECT_EQ(calls.load(), 3);
}

TEST(MetricsHttpServerTest, KeepsAConnectionAliveForSeveralScrapes) {
  auto http = MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string("fedlora_x 1\n"); });
  ASSERT_TRUE(http.ok()) << http.status();
  const std::string out = Exchange((*http)->port(),
                                   "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                                   "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                                   "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  size_t responses = 0;
  for (size_t at = out.find("HTTP/1.1 200 OK"); at != std::string::npos;
       at = out.find("HTTP/1.1 200 OK", at + 1)) {
    ++responses;
  }
  EXPECT_EQ(responses, 3u) << out;
  EXPECT_THAT(out, HasSubstr("Keep-Alive: timeout="));
}

TEST(MetricsHttpServerTest, BindsIpv6LoopbackAndLocalhost) {
  auto local = MetricsHttpServer::Start("localhost:0", [] { return std::string("fedlora_x 2\n"); });
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_THAT(Get((*local)->port(), "/metrics"), EndsWith("fedlora_x 2\n"));
  if (!HaveIpv6Loopback()) GTEST_SKIP() << "this host has no IPv6 loopback";
  auto v6 = MetricsHttpServer::Start("[::1]:0", [] { return std::string("fedlora_x 6\n"); });
  ASSERT_TRUE(v6.ok()) << v6.status();
  ASSERT_GT((*v6)->port(), 0);
  const std::string r = Get((*v6)->port(), "/metrics", AF_INET6);
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(r, EndsWith("fedlora_x 6\n"));
  // Bound to ::1 only, not to IPv4.
  const int v4 = Connect((*v6)->port(), AF_INET);
  EXPECT_LT(v4, 0);
  if (v4 >= 0) close(v4);
  auto busy = MetricsHttpServer::Start("[::1]:" + std::to_string((*v6)->port()), [] { return ""; });
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kUnavailable) << busy.status();
}

TEST(MetricsHttpServerTest, BadOrBusyAddressesAreErrors) {
  for (const char* bad : {"localhost", "example.org:80", "127.0.0.1:99999", "::1:0", "[::1]",
                          "[127.0.0.1]:0", "[localhost]:0", "127.0.0.1:", ":9464", "300.1.1.1:0"}) {
    const absl::Status s = MetricsHttpServer::Start(bad, [] { return ""; }).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(bad)) << s;
  }
  auto first = MetricsHttpServer::Start("127.0.0.1:0", [] { return ""; });
  ASSERT_TRUE(first.ok());
  const std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsHttpServer::Start(taken, [] { return ""; });
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(taken));
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("in use"));
}

// Dribbles a request that never ends, one byte every 100 ms, until the server cuts it off (or 20 s
// pass). Returns whether the server closed the connection.
bool Dribble(int fd) {
  const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  const std::string filler = "X-Slow: 1\r\n";
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (size_t i = 0; std::chrono::steady_clock::now() < until; ++i) {
    const char c = i < head.size() ? head[i] : filler[(i - head.size()) % filler.size()];
    if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) return true;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buf[256];
      if (recv(fd, buf, sizeof(buf), 0) <= 0) return true;
    }
  }
  return false;
}

TEST(MetricsHttpServerTest, SlowPeersCannotHoldTheEndpoint) {
  std::atomic<int> calls{0};
  auto http = MetricsHttpServer::Start("127.0.0.1:0", [&] {
    ++calls;
    return std::string("fedlora_x 1\n");
  });
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  // One peer connects and sends nothing; another dribbles a request that never ends.
  const int silent = ConnectFrom(port, "127.0.0.2");
  ASSERT_GE(silent, 0);
  const int dribbler = ConnectFrom(port, "127.0.0.3");
  ASSERT_GE(dribbler, 0);
  std::atomic<bool> dribbler_cut{false};
  std::thread dribble([&] { dribbler_cut = Dribble(dribbler); });

  // Meanwhile several scrapers at once all get their answers.
  constexpr int kScrapers = 6;
  constexpr int kScrapesEach = 5;
  std::atomic<int> answered{0};
  std::vector<std::thread> scrapers;
  for (int i = 0; i < kScrapers; ++i) {
    scrapers.emplace_back([&] {
      for (int j = 0; j < kScrapesEach; ++j) {
        const std::string r = Get(port, "/metrics");
        if (r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0 && r.size() >= 12 &&
            r.substr(r.size() - 12) == "fedlora_x 1\n") {
          ++answered;
        }
      }
    });
  }
  for (auto& t : scrapers) t.join();
  EXPECT_EQ(answered.load(), kScrapers * kScrapesEach);
  EXPECT_EQ(calls.load(), kScrapers * kScrapesEach);

  // Both slow peers are cut off by the server, the dribbler however steadily it sends.
  EXPECT_TRUE(ClosedByPeer(silent));
  dribble.join();
  EXPECT_TRUE(dribbler_cut.load());
  close(silent);
  close(dribbler);
  EXPECT_THAT(Get(port, "/metrics"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

// 64 connections of one peer dribbling requests: the peer keeps 8, the rest are closed as they are
// accepted, and a scrape from another address meanwhile answers at once. Before the per-peer cap,
// the 64 queued behind httplib's 8 threads and a scrape waited 20 s and more.
TEST(MetricsHttpServerTest, ADribblingFloodDoesNotDelayOtherScrapes) {
  auto http = MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string("fedlora_x 1\n"); });
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  constexpr int kFlood = 64;
  std::vector<int> flood;
  for (int i = 0; i < kFlood; ++i) {
    const int fd = ConnectFrom(port, "127.0.0.2");
    ASSERT_GE(fd, 0);
    SendAll(fd, "GET /metrics HTTP/1.1\r\n");  // a request that has begun and does not end
    flood.push_back(fd);
  }
  std::vector<std::thread> dribblers;
  std::atomic<bool> stop{false};
  for (int fd : flood) {
    dribblers.emplace_back([fd, &stop] {
      while (!stop.load()) {
        if (send(fd, "X", 1, MSG_NOSIGNAL) != 1) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  for (int i = 0; i < 3; ++i) {
    const auto before = std::chrono::steady_clock::now();
    const std::string r = Get(port, "/metrics");
    const double took_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
    EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK\r\n"));
    EXPECT_LT(took_s, 1.0) << "scrape " << i << " waited behind the flood";
  }
  // All but kMaxConnectionsPerPeer (8) of the flood were closed without being served (and a served
  // dribbler may since have hit the request deadline, hence at least).
  int closed_at_once = 0;
  for (int fd : flood) {
    pollfd p{fd, POLLIN, 0};
    char byte;
    if (poll(&p, 1, 0) == 1 && recv(fd, &byte, 1, MSG_DONTWAIT) <= 0) ++closed_at_once;
  }
  EXPECT_GE(closed_at_once, kFlood - 8);
  stop = true;
  for (auto& t : dribblers) t.join();
  for (int fd : flood) close(fd);
}

TEST(MetricsHttpServerTest, StoppingDoesNotWaitForSlowPeers) {
  auto http = MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string("fedlora_x 1\n"); });
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  const int silent = Connect(port);
  const int dribbler = Connect(port);
  ASSERT_GE(silent, 0);
  ASSERT_GE(dribbler, 0);
  std::atomic<bool> dribbler_cut{false};
  std::thread dribble([&] { dribbler_cut = Dribble(dribbler); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both connections are being served
  const auto before = std::chrono::steady_clock::now();
  http->reset();
  const double stop_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  // Waiting the peers out would take the request deadline (2 s) for the dribbler.
  EXPECT_LT(stop_s, 1.5);
  EXPECT_TRUE(ClosedByPeer(silent));
  dribble.join();
  EXPECT_TRUE(dribbler_cut.load());
  close(silent);
  close(dribbler);
  EXPECT_LT(Connect(port), 0) << "still listening after the destructor";
}

}  // namespace
}  // namespace fedlora
