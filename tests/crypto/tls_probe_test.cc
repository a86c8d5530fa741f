// Tests of the TLS probe (crypto/tls_probe.h) against real gRPC servers on 127.0.0.1: fedlora's
// mTLS server (ServerTls), a server-authenticated gRPC SSL server (for an expired server
// certificate and the TLS stack's own alerts), a plaintext server, and a closed port. Each
// failure is classified with a message that says what to fix, within the probe's timeout.
#include "crypto/tls_probe.h"

#include <netinet/in.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/file.h"
#include "crypto/certs.h"
#include "crypto/tls.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace fedlora::crypto {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kDay = 86400;
int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

CertificateRequest Req(const std::string& cn, int64_t not_after, int64_t not_before = 0) {
  CertificateRequest r;
  r.common_name = cn;
  r.not_after_unix_s = not_after;
  r.not_before_unix_s = not_before;
  return r;
}

// Answers every call UNIMPLEMENTED: the probe only needs a listening gRPC server.
class NoService : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() { Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "")); }
      void OnDone() override { delete this; }
    };
    return new Reactor();
  }
};

class TlsProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const int64_t later = Now() + kDay;
    ca_ = CreateCertificateAuthority(Req("run CA", later)).value();
    other_ca_ = CreateCertificateAuthority(Req("other CA", later)).value();
    CertificateRequest server = Req("", later);
    server.ip_addresses = {"127.0.0.1"};
    server.dns_names = {"localhost"};
    server_ = IssueServerCertificate(ca_, server).value();
    server.not_after_unix_s = Now() - kDay;
    server.not_before_unix_s = Now() - 2 * kDay;
    expired_server_ = IssueServerCertificate(ca_, server).value();
    site_ = IssueClientCertificate(ca_, Req("site-a", later)).value();
    foreign_site_ = IssueClientCertificate(other_ca_, Req("site-a", later)).value();
    expired_site_ =
        IssueClientCertificate(ca_, Req("site-a", Now() - kDay, Now() - 2 * kDay)).value();
    revoked_site_ = IssueClientCertificate(ca_, Req("site-r", later)).value();
    ASSERT_TRUE(WriteFileAtomically(dir_.path() + "/ca.pem", ca_.cert_pem).ok());
    ASSERT_TRUE(WriteFileAtomically(dir_.path() + "/server.pem", server_.cert_pem).ok());
    ASSERT_TRUE(WriteFileAtomically(dir_.path() + "/server.key", server_.key_pem).ok());
    ASSERT_TRUE(
        WriteFileAtomically(dir_.path() + "/crl.pem",
                            RevokeCertificates(ca_, "", {revoked_site_.cert_pem}, kDay).value())
            .ok());
  }
  void TearDown() override {
    if (grpc_server_ != nullptr)
      grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  void StartServer(std::shared_ptr<grpc::ServerCredentials> creds) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", std::move(creds), &port_);
    services_.push_back(std::make_unique<NoService>());  // one per server
    builder.RegisterCallbackGenericService(services_.back().get());
    grpc_server_ = builder.BuildAndStart();
    ASSERT_NE(grpc_server_, nullptr);
  }
  // fedlora's own mTLS server, with a CRL revoking site-r.
  void StartMtls() {
    ServerTlsFiles f{dir_.path() + "/server.pem",
                     dir_.path() + "/server.key",
                     dir_.path() + "/ca.pem",
                     dir_.path() + "/crl.pem",
                     {}};
    auto tls = ServerTls::Create(f);
    ASSERT_TRUE(tls.ok()) << tls.status();
    tls_ = *tls;
    StartServer(tls_->credentials());
  }
  // A gRPC SSL server whose TLS stack does the checking.
  void StartSsl(const PemPair& identity, grpc_ssl_client_certificate_request_type request) {
    grpc::SslServerCredentialsOptions ssl(request);
    ssl.pem_root_certs = ca_.cert_pem;
    ssl.pem_key_cert_pairs.push_back({identity.key_pem, identity.cert_pem});
    StartServer(grpc::SslServerCredentials(ssl));
  }

  TlsProbeOptions As(const PemPair& site, const PemPair& trusted) const {
    TlsProbeOptions o;
    o.address = "127.0.0.1:" + std::to_string(port_);
    o.root_ca_pem = trusted.cert_pem;
    o.cert_pem = site.cert_pem;
    o.key_pem = site.key_pem;
    o.ca_label = "--ca ca.pem";
    o.cert_label = "--cert site.pem";
    return o;
  }
  // ProbeTls, checked to end within its timeout and to name no pointer.
  absl::Status Probe(const TlsProbeOptions& o) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = ProbeTls(o);
    EXPECT_LT(std::chrono::steady_clock::now() - start,
              std::chrono::milliseconds(o.timeout_ms + 1000));
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr("0x")));
    return s;
  }

  coretest::TempDir dir_;
  PemPair ca_, other_ca_, server_, expired_server_, site_, foreign_site_, expired_site_,
      revoked_site_;
  std::vector<std::unique_ptr<NoService>> services_;
  std::shared_ptr<ServerTls> tls_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int port_ = 0;
};

TEST_F(TlsProbeTest, AValidSiteIsFine) {
  StartMtls();
  EXPECT_TRUE(Probe(As(site_, ca_)).ok()) << Probe(As(site_, ca_));
  EXPECT_EQ(tls_->refused_handshakes(), 0);
}

TEST_F(TlsProbeTest, AServerCertificateOfAnotherCaIsNamed) {
  StartMtls();
  const absl::Status s = Probe(As(site_, other_ca_));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("presented certificate 'localhost' (issuer 'run CA'"),
                    HasSubstr("is not signed by --ca ca.pem (its issuer is 'run CA')"),
                    HasSubstr("use the run's CA certificate")));
}

TEST_F(TlsProbeTest, AServerCertificateForAnotherNameIsNamed) {
  StartMtls();
  TlsProbeOptions o = As(site_, ca_);
  o.server_name = "fl.example.org";
  const absl::Status s = Probe(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("is for 'localhost', '127.0.0.1', not 'fl.example.org'"));
}

TEST_F(TlsProbeTest, AnExpiredServerCertificateIsNamed) {
  StartSsl(expired_server_, GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  const absl::Status s = Probe(As(site_, ca_));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("expired at "), HasSubstr("the server's operator must renew it")));
}

TEST_F(TlsProbeTest, ThisSitesCertificateRefusedByTheServerIsNamedWithWhatThisSideSees) {
  StartMtls();
  absl::Status s = Probe(As(foreign_site_, ca_));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(
      std::string(s.message()),
      AllOf(HasSubstr("closed the connection right after the TLS handshake: it refused --cert "
                      "site.pem ('site-a', issuer 'other CA'"),
            HasSubstr("is issued by 'other CA', not by --ca ca.pem")));
  s = Probe(As(expired_site_, ca_));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("--cert site.pem expired at "));
  s = Probe(As(revoked_site_, ca_));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("it refused --cert site.pem ('site-r'"), HasSubstr("revoked")));
  EXPECT_EQ(tls_->refused_handshakes(), 3);
}

TEST_F(TlsProbeTest, NoCertificateIsNamed) {
  StartMtls();
  TlsProbeOptions o = As(site_, ca_);
  o.cert_pem.clear();
  o.key_pem.clear();
  const absl::Status s = Probe(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("it requires a client certificate (give --cert and --key)"));
}

TEST_F(TlsProbeTest, AGrpcTlsStackThatRefusesItselfIsNamedToo) {
  // A gRPC server whose TLS stack checks client certificates (as fedlora's did before) fails the
  // handshake without flushing its alert: the probe sees the connection close.
  StartSsl(server_, GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  const absl::Status s = Probe(As(foreign_site_, ca_));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("it refused --cert site.pem ('site-a', issuer 'other CA'"),
                    HasSubstr("is issued by 'other CA', not by --ca ca.pem")));
  EXPECT_TRUE(Probe(As(site_, ca_)).ok());
}

// A TLS server that is not gRPC (a TLS-terminating proxy, say) checks the client certificate in
// its TLS stack and sends an alert, which the probe reads out. One connection, on its own thread.
class AlertingServer {
 public:
  AlertingServer(const PemPair& identity, const PemPair& ca) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(::listen(listener_, 1), 0);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    ctx_ = SSL_CTX_new(TLS_server_method());
    auto read = [](const std::string& pem, bool key) -> void* {
      BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
      void* out = key ? static_cast<void*>(PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr))
                      : static_cast<void*>(PEM_read_bio_X509(bio, nullptr, nullptr, nullptr));
      BIO_free(bio);
      return out;
    };
    X509* cert = static_cast<X509*>(read(identity.cert_pem, false));
    EVP_PKEY* key = static_cast<EVP_PKEY*>(read(identity.key_pem, true));
    X509* root = static_cast<X509*>(read(ca.cert_pem, false));
    SSL_CTX_use_certificate(ctx_, cert);
    SSL_CTX_use_PrivateKey(ctx_, key);
    X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx_), root);
    X509_free(cert);
    EVP_PKEY_free(key);
    X509_free(root);
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    thread_ = std::thread([this] {
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) return;
      SSL* ssl = SSL_new(ctx_);
      SSL_set_fd(ssl, fd);
      SSL_accept(ssl);  // fails, sending the alert
      SSL_free(ssl);
      ::close(fd);
    });
  }
  ~AlertingServer() {
    thread_.join();
    ::close(listener_);
    SSL_CTX_free(ctx_);
  }
  int port() const { return port_; }

 private:
  int listener_ = -1;
  int port_ = 0;
  SSL_CTX* ctx_ = nullptr;
  std::thread thread_;
};

TEST_F(TlsProbeTest, AnAlertFromTheServersTlsStackIsReadOut) {
  AlertingServer server(server_, ca_);
  TlsProbeOptions o = As(foreign_site_, ca_);
  o.address = "127.0.0.1:" + std::to_string(server.port());
  const absl::Status s = Probe(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("refused the TLS handshake with the alert 'unknown CA'"),
                    HasSubstr("it does not trust the CA that issued --cert site.pem"),
                    HasSubstr("is issued by 'other CA', not by --ca ca.pem")));
}

TEST_F(TlsProbeTest, PlaintextAndTlsMismatchesAreNamed) {
  StartServer(grpc::InsecureServerCredentials());
  absl::Status s = Probe(As(site_, ca_));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("does not speak TLS"));
  TlsProbeOptions plain;
  plain.address = "127.0.0.1:" + std::to_string(port_);
  EXPECT_TRUE(Probe(plain).ok());  // plaintext to plaintext: TLS is not the problem
  grpc_server_->Shutdown(std::chrono::system_clock::now());
  grpc_server_.reset();

  StartMtls();
  plain.address = "127.0.0.1:" + std::to_string(port_);
  s = Probe(plain);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("speaks TLS and this client plaintext"));
}

TEST_F(TlsProbeTest, NothingListeningIsTransientAndKeepsTheOriginalError) {
  StartMtls();
  TlsProbeOptions o = As(site_, ca_);
  grpc_server_->Shutdown(std::chrono::system_clock::now());
  grpc_server_.reset();
  EXPECT_EQ(Probe(o).code(), absl::StatusCode::kUnavailable);
  const absl::Status original = absl::UnavailableError("failed to connect to all addresses");
  EXPECT_EQ(ExplainConnectionFailure(original, o), original);
  EXPECT_EQ(ExplainConnectionFailure(absl::NotFoundError("x"), o), absl::NotFoundError("x"));
}

TEST_F(TlsProbeTest, ExplainConnectionFailureGivesTheProbesReason) {
  StartMtls();
  const absl::Status s =
      ExplainConnectionFailure(absl::UnavailableError("Socket closed"), As(site_, other_ca_));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(
      ExplainConnectionFailure(absl::UnavailableError("Socket closed"), As(site_, ca_)).message() ==
      "Socket closed");
}

TEST_F(TlsProbeTest, BadOptionsAreInvalidArgument) {
  TlsProbeOptions o = As(site_, ca_);
  o.address = "no-port";
  EXPECT_EQ(ProbeTls(o).code(), absl::StatusCode::kInvalidArgument);
  o = As(site_, ca_);
  o.key_pem = foreign_site_.key_pem;
  const absl::Status s = ProbeTls(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("does not load or does not match"));
}

}  // namespace
}  // namespace fedlora::crypto
