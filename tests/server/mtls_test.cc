// Identity over mutual TLS: the server takes a client's identity from its certificate's CN, never
// from metadata or a message body; revoked sites and sites not on the run's list are refused at the
// handshake while the others finish the run. Certificates are made per test
// with fedlora's own tooling (a throwaway CA, a server certificate for 127.0.0.1, client certificates).
#include <ctime>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "core/file.h"
#include "core/sha256.h"
#include "crypto/certs.h"
#include "crypto/key_signature.h"
#include "fedlora/v1/admin.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::TempDir;

constexpr int64_t kDay = 86'400;

bool Write(const std::string& path, const std::string& text) {
  return WriteFileAtomically(path, text).ok();
}

// Writes ca.pem/key, server.pem/key (for 127.0.0.1 and localhost) and <name>.pem/key for each
// client name into `dir`, with fedlora's certificate tooling (crypto/certs.h).
bool MakeCertificates(const std::string& dir, const std::vector<std::string>& clients) {
  const std::string d = dir + "/";
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  auto ca = crypto::CreateCertificateAuthority({.common_name = "test-ca",
                                                .dns_names = {},
                                                .ip_addresses = {},
                                                .not_before_unix_s = 0,
                                                .not_after_unix_s = now + kDay});
  if (!ca.ok() || !Write(d + "ca.pem", ca->cert_pem) || !Write(d + "ca.key", ca->key_pem))
    return false;
  auto server = crypto::IssueServerCertificate(*ca, {.common_name = "localhost",
                                                     .dns_names = {"localhost"},
                                                     .ip_addresses = {"127.0.0.1"},
                                                     .not_before_unix_s = 0,
                                                     .not_after_unix_s = now + kDay});
  if (!server.ok() || !Write(d + "server.pem", server->cert_pem) ||
      !Write(d + "server.key", server->key_pem)) {
    return false;
  }
  for (const std::string& c : clients) {
    auto cert = crypto::IssueClientCertificate(*ca, {.common_name = c,
                                                     .dns_names = {},
                                                     .ip_addresses = {},
                                                     .not_before_unix_s = 0,
                                                     .not_after_unix_s = now + kDay});
    if (!cert.ok() || !Write(d + c + ".pem", cert->cert_pem) ||
        !Write(d + c + ".key", cert->key_pem))
      return false;
  }
  return true;
}

// The test server's options with mutual TLS on the files MakeCertificates wrote into `dir`.
ServerOptions MtlsOptions(const std::string& dir) {
  ServerOptions o = testing::TestServerOptions(dir + "/store");
  o.insecure = false;
  o.tls.cert_file = dir + "/server.pem";
  o.tls.key_file = dir + "/server.key";
  o.tls.client_ca_file = dir + "/ca.pem";
  return o;
}

ClientOptions TlsClient(const std::string& address, const std::string& dir,
                        const std::string& site) {
  ClientOptions co = testing::TestClientOptions(address, "someone-else");  // ignored under TLS
  co.insecure = false;
  co.tls.root_ca_file = dir + "/ca.pem";
  co.tls.cert_file = dir + "/" + site + ".pem";
  co.tls.key_file = dir + "/" + site + ".key";
  return co;
}

// `site` runs the one-round, one-client run over TLS with its certificate: its update makes the
// global adapter, and the server knows it, by its certificate's CN, as its only client.
void RunsTheRoundAsTheOnlyClient(Server& server, const std::string& dir, const std::string& site,
                                 const std::string& server_pin = "") {
  testing::DeterministicTrainer trainer(0);
  ClientOptions co = TlsClient(server.address(), dir, site);
  co.tls.server_key_pin = server_pin;
  auto client = Client::Create(co, &trainer);
  ASSERT_TRUE(client.ok()) << client.status();
  auto result = client.value()->RunUntilDone();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tasks_completed, 1);
  EXPECT_TRUE(
      testing::SameBits(server.coordinator().global_adapter(), testing::ExpectedAdapter({0}, 1)));
  v1::ListClientsRequest all;
  all.set_include_inactive(true);
  auto clients = server.coordinator().ListClients(all);
  ASSERT_TRUE(clients.ok());
  ASSERT_EQ(clients->clients_size(), 1);
  EXPECT_EQ(clients->clients(0).client_id(), site);
}

// SHA-256 of a PEM certificate's DER: the base64 body between its BEGIN and END lines, decoded.
std::string DerSha256(const std::string& pem) {
  std::string body, der;
  for (absl::string_view line : absl::StrSplit(pem, '\n')) {
    if (!line.empty() && line[0] != '-') body.append(line.data(), line.size());
  }
  EXPECT_TRUE(absl::Base64Unescape(body, &der));
  return Sha256Hex(der);
}

TEST(MtlsTest, IdentityIsTheCertificateCommonNameNotTheClaimedId) {
  TempDir dir;
  ASSERT_TRUE(MakeCertificates(dir.path(), {"hospital-7"}));
  auto server = Server::Create(MtlsOptions(dir.path()), testing::TestRunConfig(1, 1, 1),
                               testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();

  RunsTheRoundAsTheOnlyClient(**server, dir.path(), "hospital-7");
  // The store keeps the fingerprint of the certificate the client joined with.
  absl::StatusOr<std::string> pem = ReadFileToString(dir.path() + "/hospital-7.pem");
  ASSERT_TRUE(pem.ok());
  absl::StatusOr<ClientRecord> record = (*server)->store().GetClient("hospital-7");
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->cert_fingerprint, DerSha256(*pem));
  // And the admin view shows it.
  v1::ListClientsRequest list;
  list.set_include_inactive(true);
  absl::StatusOr<v1::ListClientsResponse> clients = (*server)->coordinator().ListClients(list);
  ASSERT_TRUE(clients.ok()) << clients.status();
  ASSERT_EQ(clients->clients_size(), 1);
  EXPECT_EQ(clients->clients(0).cert_fingerprint(), DerSha256(*pem));
  // A server restarted on the same store restores it with the client.
  (*server)->Shutdown();
  server->reset();
  auto restarted = Server::Create(MtlsOptions(dir.path()), testing::TestRunConfig(1, 1, 1),
                                  testing::InitialAdapter());
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  clients = (*restarted)->coordinator().ListClients(list);
  ASSERT_TRUE(clients.ok()) << clients.status();
  ASSERT_EQ(clients->clients_size(), 1);
  EXPECT_EQ(clients->clients(0).client_id(), "hospital-7");
  EXPECT_EQ(clients->clients(0).cert_fingerprint(), DerSha256(*pem));
}

TEST(MtlsTest, AClientPinnedToTheServersKeySealsToTheKeysItSigned) {
  // The server signs each round's key with its certificate's key; a client pinned to that key
  // checks the signature before sealing (the refusals are crypto_key_signature_test's).
  TempDir dir;
  ASSERT_TRUE(MakeCertificates(dir.path(), {"hospital-7"}));
  auto server = Server::Create(MtlsOptions(dir.path()), testing::TestRunConfig(1, 1, 1),
                               testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  std::ifstream in(dir.path() + "/server.pem");
  auto pin = crypto::CertificatePin(std::string(std::istreambuf_iterator<char>(in), {}));
  ASSERT_TRUE(pin.ok()) << pin.status();
  RunsTheRoundAsTheOnlyClient(**server, dir.path(), "hospital-7", *pin);
}

TEST(MtlsTest, ClientWithoutCertificateIsRefused) {
  TempDir dir;
  ASSERT_TRUE(MakeCertificates(dir.path(), {}));
  auto server = Server::Create(MtlsOptions(dir.path()), testing::TestRunConfig(1, 1, 1),
                               testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  // Server-authenticated TLS only, with a claimed id in metadata: the handshake fails.
  grpc::SslCredentialsOptions ssl;
  std::ifstream ca(dir.path() + "/ca.pem");
  ssl.pem_root_certs.assign(std::istreambuf_iterator<char>(ca), {});
  auto stub =
      v1::Federation::NewStub(grpc::CreateChannel((*server)->address(), grpc::SslCredentials(ssl)));
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

// The Admin service over TLS with `site`'s certificate, from 127.0.0.1: the status code of GetStatus
// (BlockClient's must be the same).
grpc::StatusCode AdminStatusAs(const Server& server, const std::string& dir,
                               const std::string& site) {
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = read(dir + "/ca.pem");
  ssl.pem_cert_chain = read(dir + "/" + site + ".pem");
  ssl.pem_private_key = read(dir + "/" + site + ".key");
  auto stub = v1::Admin::NewStub(grpc::CreateChannel(server.address(), grpc::SslCredentials(ssl)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetStatusRequest req;
  v1::GetStatusResponse resp;
  const grpc::Status s = stub->GetStatus(&ctx, req, &resp);
  if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr("operators only")) << site;
  }
  // Blocking a site answers the same callers.
  grpc::ClientContext block_ctx;
  block_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::BlockClientRequest block;
  block.set_client_id("site-never-seen");
  block.set_blocked(true);
  v1::BlockClientResponse blocked;
  EXPECT_EQ(stub->BlockClient(&block_ctx, block, &blocked).error_code(), s.error_code()) << site;
  return s.error_code();
}

TEST(MtlsTest, UnderTlsOnlyOperatorCertificatesReachTheAdminServiceEvenFromLoopback) {
  TempDir dir;
  ASSERT_TRUE(MakeCertificates(dir.path(), {"hospital-7", "ops"}));
  ServerOptions o = MtlsOptions(dir.path());
  o.operator_ids = {"ops"};
  auto server = Server::Create(o, testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  // A site's certificate on a loopback connection (as through a sidecar or a port forward) lists
  // nothing; the operator's does.
  EXPECT_EQ(AdminStatusAs(**server, dir.path(), "hospital-7"), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(AdminStatusAs(**server, dir.path(), "ops"), grpc::StatusCode::OK);
}

TEST(MtlsTest, IncompleteTlsOptionsAreRefused) {
  TempDir dir;
  ServerOptions o = testing::TestServerOptions(dir.path());
  o.insecure = false;
  o.tls.cert_file = dir.path() + "/server.pem";  // key and client CA missing
  auto server = Server::Create(o, testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

// The run's CRL and allowed list, through the real server: a site revoked while the server runs
// (the CRL file rewritten, no restart) and a valid site not on the list are refused with nothing
// served, and the allowed, unrevoked site finishes the run alone.
TEST(MtlsTest, RevokedAndUnlistedSitesAreRefusedAndTheRunGoesOn) {
  TempDir dir;
  ASSERT_TRUE(MakeCertificates(dir.path(), {"site-a", "site-b", "site-c"}));
  const std::string d = dir.path() + "/";
  const std::string ca_cert = ReadFileToString(d + "ca.pem").value_or(""),
                    ca_key = ReadFileToString(d + "ca.key").value_or("");
  const crypto::PemPair ca{ca_cert, ca_key};
  auto empty_crl = crypto::RevokeCertificates(ca, "", {}, kDay);
  ASSERT_TRUE(empty_crl.ok()) << empty_crl.status();
  ASSERT_TRUE(Write(d + "crl.pem", *empty_crl));

  ServerOptions o = MtlsOptions(dir.path());
  o.tls.crl_file = d + "crl.pem";
  o.tls.allowed_client_ids = {"site-a", "site-b"};
  auto server = Server::Create(o, testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();

  // site-b is revoked after the server started.
  auto crl = crypto::RevokeCertificates(ca, *empty_crl,
                                        {ReadFileToString(d + "site-b.pem").value_or("")}, kDay);
  ASSERT_TRUE(crl.ok()) << crl.status();
  ASSERT_TRUE(Write(d + "crl.pem", *crl));

  auto refused = [&](const std::string& site) {
    testing::DeterministicTrainer trainer(1);
    ClientOptions co = TlsClient((*server)->address(), dir.path(), site);
    co.retry.max_attempts = 2;
    auto client = Client::Create(co, &trainer);
    EXPECT_TRUE(client.ok()) << client.status();
    auto result = (*client)->RunUntilDone();
    EXPECT_FALSE(result.ok()) << site;
    // Told at once, not retried: the server closed the connection after the handshake.
    EXPECT_TRUE(absl::IsPermissionDenied(result.status())) << site << ": " << result.status();
    EXPECT_THAT(std::string(result.status().message()),
                ::testing::HasSubstr("it refused this site's certificate"));
  };
  auto refusals = [&] {
    const std::string text = (*server)->MetricsText();
    const std::string key = "\nfedlora_tls_handshakes_refused_total ";
    const size_t at = text.find(key);
    return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + key.size());
  };
  refused("site-b");  // revoked
  const int64_t after_b = refusals();
  EXPECT_GE(after_b, 1);  // the SDK's connection, and its probe (tls_errors_test)
  refused("site-c");      // a valid certificate of the run's CA, not on allowed_client_ids
  EXPECT_GT(refusals(), after_b);

  // Neither refused site ever reached Join: site-a is the only client the server knows.
  RunsTheRoundAsTheOnlyClient(**server, dir.path(), "site-a");
  EXPECT_TRUE((*server)->ReloadCrl().ok());
}

}  // namespace
}  // namespace fedlora
