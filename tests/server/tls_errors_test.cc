// TLS failures reach a person at once and say what to fix: the client SDK, given a certificate or
// a CA that does not fit the server, or plaintext against TLS, ends within seconds (not after its
// minutes of retries) with a classified error naming the certificate; the server counts and logs
// each certificate it refuses (crypto_tls_test checks each reason). Loopback only; certificates
// made per test with crypto/certs.h.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>

#include "core/file.h"
#include "core/logging.h"
#include "crypto/certs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::TempDir;

constexpr int64_t kDay = 86'400;
int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

crypto::CertificateRequest Req(const std::string& cn, int64_t not_after, int64_t not_before = 0) {
  return {.common_name = cn,
          .dns_names = {},
          .ip_addresses = {},
          .not_before_unix_s = not_before,
          .not_after_unix_s = not_after};
}

class TlsErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ca_ = crypto::CreateCertificateAuthority(Req("run CA", Now() + kDay)).value();
    other_ca_ = crypto::CreateCertificateAuthority(Req("other CA", Now() + kDay)).value();
    crypto::CertificateRequest server = Req("localhost", Now() + kDay);
    server.dns_names = {"localhost"};
    server.ip_addresses = {"127.0.0.1"};
    Write("ca", ca_);
    Write("other-ca", other_ca_);
    Write("server", crypto::IssueServerCertificate(ca_, server).value());
    Write("site-a", crypto::IssueClientCertificate(ca_, Req("site-a", Now() + kDay)).value());
    Write("foreign",
          crypto::IssueClientCertificate(other_ca_, Req("site-f", Now() + kDay)).value());
    Write(
        "expired",
        crypto::IssueClientCertificate(ca_, Req("site-e", Now() - kDay, Now() - 2 * kDay)).value());
    const crypto::PemPair revoked =
        crypto::IssueClientCertificate(ca_, Req("site-r", Now() + kDay)).value();
    Write("revoked", revoked);
    ASSERT_TRUE(
        WriteFileAtomically(Path("crl.pem"),
                            crypto::RevokeCertificates(ca_, "", {revoked.cert_pem}, kDay).value())
            .ok());
  }
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }
  void Write(const std::string& name, const crypto::PemPair& pair) {
    ASSERT_TRUE(WriteFileAtomically(Path(name + ".pem"), pair.cert_pem).ok());
    ASSERT_TRUE(WriteFileAtomically(Path(name + ".key"), pair.key_pem).ok());
  }

  void StartServer(bool tls) {
    ServerOptions o = testing::TestServerOptions(Path("store"));
    if (tls) {
      o.insecure = false;
      o.tls.cert_file = Path("server.pem");
      o.tls.key_file = Path("server.key");
      o.tls.client_ca_file = Path("ca.pem");
      o.tls.crl_file = Path("crl.pem");
    }
    auto server = Server::Create(o, testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // A TLS client as `site` trusting `ca`, with the SDK's default retry policy (about three
  // minutes of retries for a transient error).
  ClientOptions TlsClient(const std::string& site, const std::string& ca = "ca") const {
    ClientOptions o;
    o.server_address = server_->address();
    o.tls.root_ca_file = Path(ca + ".pem");
    o.tls.cert_file = Path(site + ".pem");
    o.tls.key_file = Path(site + ".key");
    return o;
  }

  // RunUntilDone's error, checked to come within 15 s and to show no pointer.
  absl::Status RunFails(const ClientOptions& options) {
    testing::DeterministicTrainer trainer(0);
    auto client = Client::Create(options, &trainer);
    if (!client.ok()) return client.status();
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<RunSummary> result = (*client)->RunUntilDone();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
    EXPECT_FALSE(result.ok());
    EXPECT_THAT(std::string(result.status().message()), Not(HasSubstr("0x")));
    return result.status();
  }

  TempDir dir_;
  crypto::PemPair ca_, other_ca_;
  std::unique_ptr<Server> server_;
};

TEST_F(TlsErrorsTest, ASiteTrustingAnotherCaIsToldSoAtOnce) {
  StartServer(true);
  // stderr to a file meanwhile: gRPC's own line for the failed handshake ("certificate verify
  // failed") is not shown beside the error that explains it.
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int file = ::open(Path("stderr.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ::dup2(file, 2);
  FEDLORA_LOG(WARNING) << "capture starts";
  const absl::Status s = RunFails(TlsClient("site-a", "other-ca"));
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(file);
  const std::string stderr_text = ReadFileToString(Path("stderr.txt")).value_or("");
  EXPECT_THAT(stderr_text, Not(HasSubstr("certificate verify failed")));
  EXPECT_THAT(stderr_text, HasSubstr("capture starts"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("presented certificate 'localhost' (issuer 'run CA'"),
                    HasSubstr("is not signed by the CA file " + Path("other-ca.pem") +
                              " (its issuer is 'run CA')")));
}

TEST_F(TlsErrorsTest, ACertificateOfAnotherCaIsRefusedAndTheSiteToldSoAtOnce) {
  StartServer(true);
  const absl::Status s = RunFails(TlsClient("foreign"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("it refused this site's certificate " + Path("foreign.pem") +
                              " ('site-f', issuer 'other CA'"),
                    HasSubstr("is issued by 'other CA', not by the CA file " + Path("ca.pem"))));
  EXPECT_THAT(server_->MetricsText(), Not(HasSubstr("fedlora_tls_handshakes_refused_total 0")));
}

TEST_F(TlsErrorsTest, AnExpiredCertificateIsNamedAtOnce) {
  StartServer(true);
  const absl::Status s = RunFails(TlsClient("expired"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("this site's certificate " + Path("expired.pem") + " expired at "));
}

TEST_F(TlsErrorsTest, ARevokedCertificateIsRefusedAtOnce) {
  StartServer(true);
  const absl::Status s = RunFails(TlsClient("revoked"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("('site-r', issuer 'run CA'"), HasSubstr("revoked")));
}

TEST_F(TlsErrorsTest, AServerCertificateForAnotherNameIsNamedAtOnce) {
  StartServer(true);
  ClientOptions o = TlsClient("site-a");
  o.tls.server_name_override = "fl.example.org";
  const absl::Status s = RunFails(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("is for 'localhost', '127.0.0.1', not 'fl.example.org'"));
}

TEST_F(TlsErrorsTest, PlaintextAgainstTlsEitherWayIsNamedAtOnce) {
  StartServer(false);  // plaintext server, TLS client
  absl::Status s = RunFails(TlsClient("site-a"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("does not speak TLS"));
  server_.reset();

  StartServer(true);  // TLS server, plaintext client
  ASSERT_TRUE(SetLogFile(Path("log.txt"), LogLevel::kError).ok());
  s = RunFails(testing::TestClientOptions(server_->address(), "site-a"));
  ASSERT_TRUE(SetLogFile("").ok());
  // The server's line says what happened, in fedlora's log (not gRPC's raw line on stderr).
  EXPECT_THAT(ReadFileToString(Path("log.txt")).value_or(""),
              HasSubstr("TLS handshake failed: the peer does not speak TLS (a plaintext client?)"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("speaks TLS and this client plaintext"));
}

TEST_F(TlsErrorsTest, AKeyThatDoesNotMatchItsCertificateIsRefusedUpFrontWithoutInternals) {
  StartServer(true);
  ClientOptions o = TlsClient("site-a");
  o.tls.key_file = Path("revoked.key");
  testing::DeterministicTrainer trainer(0);
  const absl::Status s = Client::Create(o, &trainer).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("does not match"), Not(HasSubstr("0x"))));
}

TEST_F(TlsErrorsTest, AValidSiteStillRunsAndNothingListeningIsStillRetried) {
  StartServer(true);
  testing::DeterministicTrainer trainer(0);
  auto client = Client::Create(TlsClient("site-a"), &trainer);
  ASSERT_TRUE(client.ok()) << client.status();
  auto result = (*client)->RunUntilDone();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tasks_completed, 1);
  EXPECT_THAT(server_->MetricsText(), HasSubstr("fedlora_tls_handshakes_refused_total 0"));

  ClientOptions o = TlsClient("site-a");
  server_.reset();  // nothing listens at o.server_address now
  o.retry.max_attempts = 3;
  o.retry.initial_backoff_ms = 10;
  testing::DeterministicTrainer again(0);
  auto gone = Client::Create(o, &again);
  ASSERT_TRUE(gone.ok());
  const absl::Status s = (*gone)->RunUntilDone().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("gave up after 3 attempts"));
}

#ifdef FEDLORA_BINARY_PATH
// Runs `command` with stderr merged; its exit code and output.
std::pair<int, std::string> RunCommand(const std::string& command) {
  FILE* f = popen((command + " 2>&1").c_str(), "r");
  if (f == nullptr) return {-1, ""};
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  const int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The same errors through the `fedlora` command: `client`, `health` and `status`.
TEST_F(TlsErrorsTest, TheCommandsSayWhatIsWrongAtOnce) {
  const char* source = std::getenv("FEDLORA_SOURCE_DIR");
  const std::string root = source != nullptr ? source : ".";
  StartServer(true);
  const std::string bin = FEDLORA_BINARY_PATH;
  const std::string tls = " --server " + server_->address() + " --ca " + Path("other-ca.pem") +
                          " --cert " + Path("site-a.pem") + " --key " + Path("site-a.key");
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& command :
       {bin + " health" + tls, bin + " status" + tls,
        bin + " client --model " + root + "/models/all-MiniLM-L6-v2 --data " + root + "/README.md" +
            tls}) {
    auto [rc, out] = RunCommand(command);
    EXPECT_NE(rc, 0) << command;
    EXPECT_THAT(out, AllOf(HasSubstr("is not signed by "),
                           HasSubstr(Path("other-ca.pem") + " (its issuer is 'run CA')"),
                           Not(HasSubstr("0x"))))
        << command;
  }
  auto [rc, out] =
      RunCommand(bin + " health --server " + server_->address() + " --ca " + Path("ca.pem") +
                 " --cert " + Path("site-a.pem") + " --key " + Path("revoked.key"));
  EXPECT_NE(rc, 0);
  EXPECT_THAT(out, AllOf(HasSubstr("does not match"), Not(HasSubstr("0x"))));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}
#endif  // FEDLORA_BINARY_PATH

}  // namespace
}  // namespace fedlora
