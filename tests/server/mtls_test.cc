// Identity over mutual TLS: the server takes a client's identity from its certificate's CN, never
// from metadata or a message body. Certificates are made per test with the openssl command line
// (a throwaway CA, a server certificate for 127.0.0.1, client certificates).
#include <cstdlib>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::TempDir;

bool Run(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

// Writes ca.pem, server.pem/key, <name>.pem/key for each client name into `dir`.
bool MakeCertificates(const std::string& dir, const std::vector<std::string>& clients) {
  const std::string d = dir + "/";
  std::ofstream(d + "san.cnf") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  if (!Run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=test-ca -keyout " +
           d + "ca.key -out " + d + "ca.pem")) {
    return false;
  }
  auto issue = [&](const std::string& name, const std::string& cn, bool san) {
    return Run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=" + cn + " -keyout " + d +
               name + ".key -out " + d + name + ".csr") &&
           Run("openssl x509 -req -in " + d + name + ".csr -CA " + d + "ca.pem -CAkey " + d + "ca.key -CAcreateserial -days 1 " +
               (san ? "-extfile " + d + "san.cnf " : "") + "-out " + d + name + ".pem");
  };
  if (!issue("server", "localhost", true)) return false;
  for (const std::string& c : clients) {
    if (!issue(c, c, false)) return false;
  }
  return true;
}

TEST(MtlsTest, IdentityIsTheCertificateCommonNameNotTheClaimedId) {
  TempDir dir;
  if (!MakeCertificates(dir.path(), {"hospital-7"})) GTEST_SKIP() << "the openssl command line is not available";
  ServerOptions o = testing::TestServerOptions(dir.path() + "/store");
  o.tls.cert_file = dir.path() + "/server.pem";
  o.tls.key_file = dir.path() + "/server.key";
  o.tls.client_ca_file = dir.path() + "/ca.pem";
  auto server = Server::Create(o, testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();

  testing::DeterministicTrainer trainer(0);
  ClientOptions co = testing::TestClientOptions((*server)->address(), "someone-else");  // ignored under TLS
  co.tls.root_ca_file = dir.path() + "/ca.pem";
  co.tls.cert_file = dir.path() + "/hospital-7.pem";
  co.tls.key_file = dir.path() + "/hospital-7.key";
  auto client = Client::Create(co, &trainer);
  ASSERT_TRUE(client.ok()) << client.status();
  auto result = (*client)->RunUntilDone();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tasks_completed, 1);
  EXPECT_TRUE(testing::SameBits((*server)->coordinator().global_adapter(), testing::ExpectedAdapter({0}, 1)));

  v1::ListClientsRequest all;
  all.set_include_inactive(true);
  auto clients = (*server)->coordinator().ListClients(all);
  ASSERT_TRUE(clients.ok());
  ASSERT_EQ(clients->clients_size(), 1);
  EXPECT_EQ(clients->clients(0).client_id(), "hospital-7");
}

TEST(MtlsTest, ClientWithoutCertificateIsRefused) {
  TempDir dir;
  if (!MakeCertificates(dir.path(), {})) GTEST_SKIP() << "the openssl command line is not available";
  ServerOptions o = testing::TestServerOptions(dir.path() + "/store");
  o.tls.cert_file = dir.path() + "/server.pem";
  o.tls.key_file = dir.path() + "/server.key";
  o.tls.client_ca_file = dir.path() + "/ca.pem";
  auto server = Server::Create(o, testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  // Server-authenticated TLS only, with a claimed id in metadata: the handshake fails.
  grpc::SslCredentialsOptions ssl;
  std::ifstream ca(dir.path() + "/ca.pem");
  ssl.pem_root_certs.assign(std::istreambuf_iterator<char>(ca), {});
  auto stub = v1::Federation::NewStub(grpc::CreateChannel((*server)->address(), grpc::SslCredentials(ssl)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ctx.AddMetadata(kClientIdMetadataKey, "hospital-7");
  v1::JoinRequest req;
  req.set_protocol_version(kProtocolVersion);
  v1::JoinResponse resp;
  grpc::Status s = stub->Join(&ctx, req, &resp);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // And a plaintext client cannot talk to it at all.
  testing::RawClient plain((*server)->address(), "hospital-7");
  EXPECT_FALSE(plain.Join().ok());
}

TEST(MtlsTest, IncompleteTlsOptionsAreRefused) {
  TempDir dir;
  ServerOptions o = testing::TestServerOptions(dir.path());
  o.tls.cert_file = dir.path() + "/server.pem";  // key and client CA missing
  auto server = Server::Create(o, testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora
