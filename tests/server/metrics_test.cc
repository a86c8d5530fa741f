#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Get(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[1024];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST(ServerMetricsTest, RendersEveryCounterInPrometheusTextFormat) {
  ServerMetrics m;
  m.updates_accepted = 12;
  m.upload_bytes = 3456;
  m.rounds_committed = 3;
  const std::string text = m.ToPrometheusText();
  EXPECT_THAT(text, HasSubstr("# TYPE fedlora_updates_accepted_total counter\nfedlora_updates_accepted_total 12\n"));
  EXPECT_THAT(text, HasSubstr("fedlora_upload_bytes_total 3456\n"));
  EXPECT_THAT(text, HasSubstr("fedlora_rounds_committed_total 3\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE fedlora_clients_live gauge\nfedlora_clients_live 0\n"));
}

TEST(MetricsHttpServerTest, ServesMetricsAndNothingElse) {
  int calls = 0;
  auto http = MetricsHttpServer::Start("127.0.0.1:0", [&] {
    ++calls;
    return std::string("fedlora_x 1\n");
  });
  ASSERT_TRUE(http.ok()) << http.status();
  const std::string ok = Get((*http)->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(ok, StartsWith("HTTP/1.0 200 OK\r\n"));
  EXPECT_THAT(ok, HasSubstr("Content-Length: 12\r\n"));
  EXPECT_THAT(ok, HasSubstr("\r\n\r\nfedlora_x 1\n"));
  EXPECT_THAT(Get((*http)->port(), "GET /secrets HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.0 404"));
  EXPECT_THAT(Get((*http)->port(), "POST /metrics HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.0 404"));
  EXPECT_EQ(calls, 1);
}

TEST(MetricsHttpServerTest, BadOrBusyAddressesAreErrors) {
  EXPECT_EQ(MetricsHttpServer::Start("localhost", [] { return ""; }).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsHttpServer::Start("example.org:80", [] { return ""; }).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsHttpServer::Start("127.0.0.1:99999", [] { return ""; }).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto first = MetricsHttpServer::Start("127.0.0.1:0", [] { return ""; });
  ASSERT_TRUE(first.ok());
  auto second = MetricsHttpServer::Start("127.0.0.1:" + std::to_string((*first)->port()), [] { return ""; });
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace fedlora
