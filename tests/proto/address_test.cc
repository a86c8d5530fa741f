// The plaintext rule (proto/address.h): loopback hosts, and plaintext only there and only with
// the explicit flag, for host:port, bracketed IPv6 and gRPC target spellings alike.
#include "proto/address.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

TEST(PlaintextRule, LoopbackHosts) {
  for (const char* host :
       {"127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LocalHost", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"0.0.0.0", "::", "192.168.1.10", "10.0.0.1", "fl.example.org",
                           "localhost.example.org", "128.0.0.1", "", "[::1", "127.0.0.1:80"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

TEST(PlaintextRule, OnlyLoopbackAndOnlyWithTheFlag) {
  for (const char* address :
       {"0.0.0.0:50051", "[::]:50051", ":50051", "192.168.1.10:50051", "fl.example.org:50051",
        "dns:///fl.example.org:443", "[fe80::1]:50051"}) {
    for (bool insecure : {false, true}) {
      absl::Status s = CheckPlaintextAllowed(address, insecure, "server listen address");
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << address;
      EXPECT_THAT(s.message(), HasSubstr("server listen address '")) << address;
      EXPECT_THAT(s.message(), HasSubstr("is not a loopback address")) << address;
      EXPECT_THAT(s.message(), HasSubstr("--cert/--key/--client-ca")) << address;
    }
  }
  for (const char* address :
       {"127.0.0.1:50051", "[::1]:50051", "localhost:50051", "dns:///localhost:50051",
        "ipv4:127.0.0.1:5", "unix:/tmp/fedlora.sock"}) {
    absl::Status refused = CheckPlaintextAllowed(address, false, "server address");
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << address;
    EXPECT_THAT(refused.message(), HasSubstr("needs the explicit --insecure flag")) << address;
    EXPECT_THAT(refused.message(), HasSubstr("server address")) << address;
    EXPECT_TRUE(CheckPlaintextAllowed(address, true, "server address").ok()) << address;
  }
  EXPECT_EQ(CheckPlaintextAllowed("", true, "server address").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SplitHostPortTest, Spellings) {
  std::string host;
  uint32_t port = 0;
  EXPECT_TRUE(SplitHostPort("127.0.0.1:50051", &host, &port));
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 50051u);
  EXPECT_TRUE(SplitHostPort("[::1]:0", &host, &port));
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 0u);
  for (const char* bad :
       {"", "127.0.0.1", ":1", "::1:50051", "[::1]50051", "host:65536", "host:12a", "host:"}) {
    EXPECT_FALSE(SplitHostPort(bad, &host, &port)) << bad;
  }
}

}  // namespace
}  // namespace fedlora
