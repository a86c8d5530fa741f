// Tests of the gRPC TLS credentials (crypto/tls.h) against a real server on 127.0.0.1: who is
// served (and seen with which identity), who is refused before any handler runs, and how the CRL
// follows its file. Plus the plaintext rule.
#include "crypto/tls.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/file.h"
#include "core/logging.h"
#include "crypto/certs.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace fedlora::crypto {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kDay = 86400;
int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

// Answers every method with the caller's "x509_common_name" (what server/services.cc's
// CallerIdentity reads) and counts the calls it served.
class IdentityService : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    std::string cn;
    bool authenticated = false;
    if (std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context()) {
      authenticated = auth->IsPeerAuthenticated();
      std::vector<grpc::string_ref> values = auth->FindPropertyValues("x509_common_name");
      if (!values.empty()) cn.assign(values.front().data(), values.front().size());
    }
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
      authenticated_ = authenticated;
    }
    return new Reactor(cn);
  }

  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  bool last_authenticated() {
    absl::MutexLock lock(&mu_);
    return authenticated_;
  }

 private:
  class Reactor : public grpc::ServerGenericBidiReactor {
   public:
    explicit Reactor(const std::string& cn) {
      grpc::Slice slice(cn);
      response_ = grpc::ByteBuffer(&slice, 1);
      StartRead(&request_);
    }
    void OnReadDone(bool ok) override {
      if (ok) {
        StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
      } else {
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "no request"));
      }
    }
    void OnDone() override { delete this; }

   private:
    grpc::ByteBuffer request_, response_;
  };

  absl::Mutex mu_;
  int calls_ = 0;
  bool authenticated_ = false;
};

// A certificate for `cn` signed by `issuer`'s key, with OpenSSL directly (crypto/certs.h issues
// from its own CAs only): a client certificate, or with `ca` an intermediate CA. cert_pem holds the
// new certificate and then `issuer`'s chain, as a client presents it.
PemPair SignedBy(const PemPair& issuer, const std::string& cn, bool ca = false) {
  auto read_cert = [](const std::string& pem) {
    BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
    X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    return x;
  };
  BIO* kbio = BIO_new_mem_buf(issuer.key_pem.data(), static_cast<int>(issuer.key_pem.size()));
  EVP_PKEY* issuer_key = PEM_read_bio_PrivateKey(kbio, nullptr, nullptr, nullptr);
  BIO_free(kbio);
  X509* issuer_cert = read_cert(issuer.cert_pem);
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 4242);
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), kDay);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(x, X509_get_subject_name(issuer_cert));
  X509_set_pubkey(x, key);
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer_cert, x, nullptr, nullptr, 0);
  for (auto [nid, value] :
       {std::pair{NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE"},
        std::pair{NID_key_usage, ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature"},
        std::pair{NID_ext_key_usage, ca ? "clientAuth,serverAuth" : "clientAuth"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
  }
  X509_sign(x, issuer_key, EVP_sha256());
  auto pem = [](auto write) {
    BIO* bio = BIO_new(BIO_s_mem());
    write(bio);
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio, &data);
    std::string out(data, static_cast<size_t>(n));
    BIO_free(bio);
    return out;
  };
  PemPair out;
  out.cert_pem = pem([&](BIO* b) { PEM_write_bio_X509(b, x); }) + issuer.cert_pem;
  out.key_pem =
      pem([&](BIO* b) { PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr); });
  X509_free(x);
  X509_free(issuer_cert);
  EVP_PKEY_free(key);
  EVP_PKEY_free(issuer_key);
  return out;
}

struct CallResult {
  grpc::Status status;
  std::string body;  // the CN the server saw
};

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "fedlora_tls_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    const int64_t later = Now() + kDay;
    ca_ = CreateCertificateAuthority(Req("test CA", later)).value();
    other_ca_ = CreateCertificateAuthority(Req("test CA", later)).value();  // same name, other key
    CertificateRequest server = Req("", later);
    server.ip_addresses = {"127.0.0.1"};
    server.dns_names = {"localhost"};
    WritePair("server", IssueServerCertificate(ca_, server).value());
    WritePair("site-a", IssueClientCertificate(ca_, Req("site-a", later)).value());
    WritePair("site-b", IssueClientCertificate(ca_, Req("site-b", later)).value());
    WritePair("foreign", IssueClientCertificate(other_ca_, Req("site-a", later)).value());
    WritePair("expired",
              IssueClientCertificate(ca_, Req("site-a", Now() - kDay, Now() - 2 * kDay)).value());
    WritePair("not-yet",
              IssueClientCertificate(ca_, Req("site-a", Now() + 2 * kDay, Now() + kDay)).value());
    WritePair("self-signed", CreateCertificateAuthority(Req("site-a", later)).value());
    CertificateRequest as_server = Req("site-a", later);
    as_server.dns_names = {"site-a"};
    WritePair("server-usage",
              IssueServerCertificate(ca_, as_server).value());      // EKU serverAuth only
    WritePair("leaf-issued", SignedBy(pems_["site-b"], "site-a"));  // site-b is not a CA
    WritePair("intermediate", SignedBy(ca_, "intermediate CA", /*ca=*/true));
    WritePair("via-intermediate", SignedBy(pems_["intermediate"], "site-i"));
    Write("ca.pem", ca_.cert_pem);
    empty_crl_ = RevokeCertificates(ca_, "", {}, kDay).value();
    revoked_b_crl_ = RevokeCertificates(ca_, empty_crl_, {pems_["site-b"].cert_pem}, kDay).value();
  }
  void TearDown() override {
    if (server_ != nullptr)
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  static CertificateRequest Req(const std::string& cn, int64_t not_after, int64_t not_before = 0) {
    CertificateRequest r;
    r.common_name = cn;
    r.not_before_unix_s = not_before;
    r.not_after_unix_s = not_after;
    return r;
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  void Write(const std::string& name, const std::string& bytes) {
    ASSERT_TRUE(WriteFileAtomically(Path(name), bytes).ok()) << name;
  }
  void WritePair(const std::string& name, const PemPair& pair) {
    pems_[name] = pair;
    Write(name + ".pem", pair.cert_pem);
    Write(name + ".key", pair.key_pem);
  }

  ServerTlsFiles Files(bool with_crl) const {
    ServerTlsFiles f;
    f.cert_file = Path("server.pem");
    f.key_file = Path("server.key");
    f.client_ca_file = Path("ca.pem");
    if (with_crl) f.crl_file = Path("crl.pem");
    return f;
  }

  // Starts the identity service on 127.0.0.1 with `files`' credentials.
  void Start(const ServerTlsFiles& files) {
    absl::StatusOr<std::shared_ptr<ServerTls>> tls = ServerTls::Create(files);
    ASSERT_TRUE(tls.ok()) << tls.status();
    tls_ = *tls;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", tls_->credentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  // One call on a fresh channel (its own subchannel pool: a new connection, a new handshake).
  CallResult Call(std::shared_ptr<grpc::ChannelCredentials> creds) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_), creds, args);
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice slice(std::string("who"));
    grpc::ByteBuffer request(&slice, 1), response;
    CallResult result;
    absl::Notification done;
    stub.UnaryCall(&context, "/fedlora.test.Identity/Who", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status status) {
                     result.status = std::move(status);
                     done.Notify();
                   });
    done.WaitForNotification();
    std::vector<grpc::Slice> slices;
    if (result.status.ok() && response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices)
        result.body.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    return result;
  }
  CallResult CallAs(const std::string& name) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
        ClientChannelCredentials(Path("ca.pem"), Path(name + ".pem"), Path(name + ".key"));
    EXPECT_TRUE(creds.ok()) << creds.status();
    return Call(*creds);
  }

  // Asserts that a call as `name` fails and that no handler ran.
  void ExpectRefused(const std::string& name) {
    const int before = service_.calls();
    const CallResult r = CallAs(name);
    EXPECT_FALSE(r.status.ok()) << name << " was served as '" << r.body << "'";
    EXPECT_EQ(service_.calls(), before) << name << ": a handler ran";
  }
  void ExpectServedAs(const std::string& name, const std::string& cn) {
    const int before = service_.calls();
    const CallResult r = CallAs(name);
    EXPECT_TRUE(r.status.ok()) << name << ": " << r.status.error_code() << " "
                               << r.status.error_message();
    EXPECT_EQ(r.body, cn) << name;
    EXPECT_EQ(service_.calls(), before + 1) << name;
  }

  std::string dir_;
  PemPair ca_, other_ca_;
  std::map<std::string, PemPair> pems_;
  std::string empty_crl_, revoked_b_crl_;
  IdentityService service_;
  std::shared_ptr<ServerTls> tls_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(TlsTest, ValidClientIsServedAndItsCnIsTheAuthContextIdentity) {
  Start(Files(false));
  ExpectServedAs("site-a", "site-a");
  EXPECT_TRUE(service_.last_authenticated());
  ExpectServedAs("site-b", "site-b");
  EXPECT_EQ(tls_->refused_handshakes(), 0);
}

// A client whose certificate an intermediate CA of the client CA issued presents the chain and is
// served; a client CA file holding only that intermediate accepts it too (as gRPC's TLS stack did).
TEST_F(TlsTest, AChainThroughAnIntermediateCaIsServed) {
  Start(Files(false));
  ExpectServedAs("via-intermediate", "site-i");
  EXPECT_EQ(tls_->refused_handshakes(), 0);
}

TEST_F(TlsTest, AnIntermediateAsTheClientCaIsATrustAnchor) {
  Write("intermediate-only.pem",
        pems_["intermediate"].cert_pem.substr(
            0, pems_["intermediate"].cert_pem.find("-----END CERTIFICATE-----") + 26));
  ServerTlsFiles files = Files(false);
  files.client_ca_file = Path("intermediate-only.pem");
  Start(files);
  ExpectServedAs("via-intermediate", "site-i");
  ExpectRefused("site-a");  // the root's own client certificates are not under the intermediate
}

TEST_F(TlsTest, NoClientCertificateIsRefused) {
  Start(Files(false));
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ca_.cert_pem;
  const CallResult r = Call(grpc::SslCredentials(ssl));
  EXPECT_FALSE(r.status.ok()) << "served as '" << r.body << "'";
  EXPECT_EQ(service_.calls(), 0);
}

TEST_F(TlsTest, CertificateOfAnotherCaIsRefused) {
  Start(Files(false));
  // ClientChannelCredentials would accept the pair; the server's TLS stack must not.
  ExpectRefused("foreign");
}

TEST_F(TlsTest, ExpiredCertificateIsRefused) {
  Start(Files(false));
  ExpectRefused("expired");
}

TEST_F(TlsTest, PlaintextClientIsRefused) {
  Start(Files(false));
  const CallResult r = Call(grpc::InsecureChannelCredentials());
  EXPECT_FALSE(r.status.ok());
  EXPECT_EQ(service_.calls(), 0);
}

// Every certificate the TLS stack refused before fedlora checked chains itself is still refused;
// each refusal is counted once and logged once, naming the reason and the certificate.
TEST_F(TlsTest, EveryRefusalIsCountedAndLoggedWithItsReasonAndTheCertificate) {
  Write("crl.pem", revoked_b_crl_);
  ServerTlsFiles files = Files(true);
  files.allowed_client_ids = {"site-a", "site-b"};
  WritePair("unlisted", IssueClientCertificate(ca_, Req("site-z", Now() + kDay)).value());
  Start(files);
  ASSERT_TRUE(SetLogFile(Path("log.txt"), LogLevel::kError).ok());
  struct Case {
    std::string name, reason;
  };
  const std::vector<Case> cases = {
      {"foreign", "'site-a' (issuer 'test CA', serial " +
                      ParseCertificate(pems_["foreign"].cert_pem)->serial_hex +
                      ") is not signed by the client CA (client_ca_file " + Path("ca.pem")},
      {"expired", "'site-a' (issuer 'test CA', serial " +
                      ParseCertificate(pems_["expired"].cert_pem)->serial_hex + ") expired at "},
      {"not-yet", "'site-a' (issuer 'test CA', serial " +
                      ParseCertificate(pems_["not-yet"].cert_pem)->serial_hex +
                      ") is not valid before "},
      {"self-signed", "'site-a' (issuer 'site-a', serial " +
                          ParseCertificate(pems_["self-signed"].cert_pem)->serial_hex +
                          ") is not signed by the client CA"},
      {"server-usage", "'site-a' (issuer 'test CA', serial " +
                           ParseCertificate(pems_["server-usage"].cert_pem)->serial_hex +
                           ") does not allow this use"},
      {"leaf-issued",
       "'site-a' (issuer 'site-b', serial 1092) has an issuer that may not issue certificates: "
       "the certificate 'site-b' of its chain is not a CA"},
      {"site-b", "'site-b' (issuer 'test CA', serial " +
                     ParseCertificate(pems_["site-b"].cert_pem)->serial_hex + ") is revoked by " +
                     Path("crl.pem")},
      {"unlisted", "'site-z' (issuer 'test CA', serial " +
                       ParseCertificate(pems_["unlisted"].cert_pem)->serial_hex +
                       "): client id 'site-z' is not on the allowed client list"},
  };
  int64_t refused = 0;
  for (const Case& c : cases) {
    ExpectRefused(c.name);
    EXPECT_EQ(tls_->refused_handshakes(), ++refused) << c.name;
  }
  grpc::SslCredentialsOptions no_certificate;
  no_certificate.pem_root_certs = ca_.cert_pem;
  EXPECT_FALSE(Call(grpc::SslCredentials(no_certificate)).status.ok());
  EXPECT_EQ(tls_->refused_handshakes(), ++refused);
  ExpectServedAs("site-a", "site-a");
  EXPECT_EQ(tls_->refused_handshakes(), refused);
  // The same certificate again within a minute (a client retrying): counted, not logged again.
  ExpectRefused("expired");
  ExpectRefused("expired");
  EXPECT_EQ(tls_->refused_handshakes(), refused + 2);
  ASSERT_TRUE(SetLogFile("").ok());

  const std::string log = ReadFileToString(Path("log.txt")).value_or("");
  std::vector<std::string> lines;
  for (size_t at = 0, end; (end = log.find('\n', at)) != std::string::npos; at = end + 1) {
    if (log.compare(at, 1, "W") == 0 && log.find("TLS handshake refused: ", at) < end)
      lines.push_back(log.substr(at, end - at));
  }
  ASSERT_EQ(lines.size(), cases.size() + 1) << log;
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_THAT(lines[i], HasSubstr("TLS handshake refused: client certificate " + cases[i].reason))
        << cases[i].name;
  }
  EXPECT_THAT(lines.back(),
              HasSubstr("TLS handshake refused: the client presented no certificate"));
  EXPECT_THAT(log, Not(HasSubstr("0x")));
}

TEST_F(TlsTest, CertificateRevokedBeforeStartIsRefused) {
  Write("crl.pem", revoked_b_crl_);
  Start(Files(true));
  EXPECT_EQ(tls_->revoked_count(), 1u);
  ExpectRefused("site-b");
  EXPECT_EQ(tls_->refused_handshakes(), 1);
  ExpectServedAs("site-a", "site-a");
}

TEST_F(TlsTest, CertificateRevokedAfterStartIsRefusedOnTheNextConnection) {
  Write("crl.pem", empty_crl_);
  Start(Files(true));
  ExpectServedAs("site-b", "site-b");
  Write("crl.pem", revoked_b_crl_);  // no restart, no ReloadCrl: the handshake notices the new file
  ExpectRefused("site-b");
  EXPECT_EQ(tls_->refused_handshakes(), 1);
  EXPECT_EQ(tls_->revoked_count(), 1u);
  ExpectServedAs("site-a", "site-a");

  // Rewritten in place (same inode) back to the empty list: noticed too.
  {
    std::ofstream out(Path("crl.pem"), std::ios::trunc);
    out << empty_crl_;
  }
  ExpectServedAs("site-b", "site-b");
}

TEST_F(TlsTest, ReloadCrlAppliesANewListAndKeepsTheOldOneOnErrors) {
  Write("crl.pem", empty_crl_);
  Start(Files(true));
  EXPECT_EQ(tls_->revoked_count(), 0u);
  Write("crl.pem", revoked_b_crl_);
  ASSERT_TRUE(tls_->ReloadCrl().ok());
  EXPECT_EQ(tls_->revoked_count(), 1u);  // loaded by ReloadCrl, before any handshake
  ExpectRefused("site-b");

  // A broken, foreign or missing CRL is an error, and the list in force stays: no fail-open.
  Write("crl.pem", "not a CRL");
  absl::Status garbage = tls_->ReloadCrl();
  EXPECT_EQ(garbage.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(garbage.message(), HasSubstr("crl_file"));
  EXPECT_EQ(tls_->revoked_count(), 1u);
  ExpectRefused("site-b");  // nor does the next handshake retry that file version

  Write("crl.pem", RevokeCertificates(other_ca_, "", {}, kDay).value());
  absl::Status foreign = tls_->ReloadCrl();
  EXPECT_EQ(foreign.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(foreign.message(), HasSubstr("not signed"));
  ExpectRefused("site-b");

  fs::remove(Path("crl.pem"));
  EXPECT_EQ(tls_->ReloadCrl().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tls_->revoked_count(), 1u);
  ExpectRefused("site-b");
  ExpectServedAs("site-a", "site-a");
}

TEST_F(TlsTest, ValidCertificateNotOnTheAllowListIsRefused) {
  ServerTlsFiles files = Files(false);
  files.allowed_client_ids = {"site-a"};
  Start(files);
  ExpectRefused("site-b");
  EXPECT_EQ(tls_->refused_handshakes(), 1);
  ExpectServedAs("site-a", "site-a");
}

TEST_F(TlsTest, CreateChecksEveryFileUpFront) {
  auto create_error = [](const ServerTlsFiles& f) { return ServerTls::Create(f).status(); };
  ServerTlsFiles f = Files(false);
  f.cert_file = Path("missing.pem");
  EXPECT_EQ(create_error(f).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(create_error(f).message(), HasSubstr("missing.pem"));

  f = Files(false);
  f.key_file = Path("site-a.key");
  EXPECT_THAT(create_error(f).message(), HasSubstr("does not match"));

  f = Files(false);
  f.client_ca_file = Path("site-a.key");  // a key, no certificate
  EXPECT_THAT(create_error(f).message(), HasSubstr("holds no PEM certificate"));
  f.client_ca_file = Path("site-a.pem");  // a leaf, not a CA
  EXPECT_THAT(create_error(f).message(), HasSubstr("is not a CA"));

  f = Files(true);
  EXPECT_EQ(create_error(f).code(), absl::StatusCode::kNotFound);  // no crl.pem yet
  Write("crl.pem", "garbage");
  EXPECT_THAT(create_error(f).message(), HasSubstr("crl_file"));
  Write("crl.pem", RevokeCertificates(other_ca_, "", {}, kDay).value());
  EXPECT_EQ(create_error(f).code(), absl::StatusCode::kFailedPrecondition);
  Write("crl.pem", empty_crl_);
  EXPECT_TRUE(create_error(f).ok());

  f = Files(false);
  f.allowed_client_ids = {"bad id"};
  EXPECT_THAT(create_error(f).message(), HasSubstr("allowed client id 'bad id'"));
  f = Files(false);
  f.cert_file.clear();
  EXPECT_THAT(create_error(f).message(), HasSubstr("cert_file is not set"));
}

TEST_F(TlsTest, ClientChannelCredentialsChecksItsFiles) {
  EXPECT_TRUE(
      ClientChannelCredentials(Path("ca.pem"), Path("site-a.pem"), Path("site-a.key")).ok());
  EXPECT_EQ(ClientChannelCredentials(Path("nope.pem"), Path("site-a.pem"), Path("site-a.key"))
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(ClientChannelCredentials(Path("ca.pem"), Path("site-a.pem"), Path("site-b.key"))
                  .status()
                  .message(),
              HasSubstr("does not match"));
  EXPECT_THAT(ClientChannelCredentials(Path("site-b.pem"), Path("site-a.pem"), Path("site-a.key"))
                  .status()
                  .message(),
              HasSubstr("is not a CA"));
}

}  // namespace
}  // namespace fedlora::crypto
