#include "crypto/tls.h"

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/file.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/strings.h"
#include "crypto/certs.h"
#include "crypto/chain_check.h"
#include "crypto/grpc_log.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace fedlora::crypto {
namespace {

absl::StatusOr<std::string> ReadNamedFile(const std::string& path, std::string_view field) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(ToAbsl(field), " is not set"));
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) return Annotate(bytes.status(), ToAbsl(field));
  return bytes;
}

// What identifies one version of a file cheaply: a rewrite in place changes mtime (and usually
// size), an atomic replace changes the inode. exists=false: stat failed.
struct FileStamp {
  bool exists = false;
  int64_t mtime_ns = 0;
  int64_t size = 0;
  uint64_t inode = 0;
  bool operator==(const FileStamp&) const = default;
};

FileStamp Stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {true, static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          static_cast<int64_t>(st.st_size), static_cast<uint64_t>(st.st_ino)};
}

// The serials a CRL file revokes, checked against the CA.
absl::StatusOr<std::set<std::string>> LoadCrl(const std::string& crl_file,
                                              const std::string& ca_pem) {
  FEDLORA_ASSIGN_OR_RETURN(std::string crl_pem, ReadNamedFile(crl_file, "crl_file"));
  absl::StatusOr<std::vector<std::string>> serials = RevokedSerials(crl_pem, ca_pem);
  if (!serials.ok()) return Annotate(serials.status(), absl::StrCat("crl_file ", crl_file));
  return std::set<std::string>(serials->begin(), serials->end());
}

}  // namespace

struct ServerTls::State {
  std::string crl_file;  // empty: no CRL
  std::string ca_file;
  std::string ca_pem;
  std::set<std::string> allowed;  // empty: everyone the CA signed
  std::atomic<int64_t> refused{0};

  // When each refusal reason was last logged as a WARNING: the same certificate refused again
  // within a minute (a client retrying, its probe) is logged at DEBUG. Bounded: cleared at 1024.
  absl::Mutex log_mu;
  std::map<std::string, std::chrono::steady_clock::time_point> last_logged ABSL_GUARDED_BY(log_mu);

  // Counts a refusal and logs it: a WARNING the first time in a minute, DEBUG after.
  void Refused(const std::string& refusal) {
    refused.fetch_add(1, std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now();
    bool repeat = false;
    {
      absl::MutexLock lock(&log_mu);
      if (last_logged.size() >= 1024) last_logged.clear();
      auto [it, inserted] = last_logged.emplace(refusal, now);
      repeat = !inserted && now - it->second < std::chrono::minutes(1);
      if (!repeat) it->second = now;
    }
    if (repeat) {
      FEDLORA_LOG(DEBUG) << "TLS handshake refused again: " << refusal;
    } else {
      FEDLORA_LOG(WARNING) << "TLS handshake refused: " << refusal;
    }
  }

  mutable absl::Mutex mu;
  std::set<std::string> revoked ABSL_GUARDED_BY(mu);
  FileStamp stamp ABSL_GUARDED_BY(mu);  // of the file version last tried (loaded or not)

  // Re-reads the CRL when forced or when the file's stamp changed since the last try. On failure
  // the previous serials stay in force.
  absl::Status MaybeReload(bool force) {
    if (crl_file.empty()) return absl::OkStatus();
    const FileStamp now = Stamp(crl_file);
    absl::MutexLock lock(&mu);
    if (!force && now == stamp) return absl::OkStatus();
    stamp = now;  // a failed version is not retried on every handshake; its next change is
    absl::StatusOr<std::set<std::string>> loaded = LoadCrl(crl_file, ca_pem);
    if (!loaded.ok()) {
      FEDLORA_LOG(ERROR) << "CRL reload failed, keeping the previous CRL (" << revoked.size()
                         << " revoked serials): " << loaded.status().message();
      return loaded.status();
    }
    if (*loaded != revoked) {
      FEDLORA_LOG(INFO) << "CRL " << crl_file << " loaded: " << loaded->size()
                        << " revoked serials";
    }
    revoked = *std::move(loaded);
    return absl::OkStatus();
  }

  // Empty when the peer may connect, else why not: its chain to the client CA and validity
  // (OpenSSL's X509_verify_cert, as libssl's own check), then the CRL and the allow-list. The
  // reason names the certificate (CN, issuer, serial).
  std::string Refusal(std::string_view leaf_pem, std::string_view chain_pem) {
    const ChainVerdict v = VerifyChain(leaf_pem, chain_pem, ca_pem, ChainPurpose::kTlsClient);
    switch (v.problem) {
      case ChainProblem::kNone:
        break;
      case ChainProblem::kNoCertificate:
        return "the client presented no certificate";
      case ChainProblem::kUnknownCa:
        return absl::StrCat("client ", v.Describe(),
                            " is not signed by the client CA (client_ca_file ", ca_file,
                            "): its issuer is '", v.issuer_cn, "'",
                            v.subject_cn == v.issuer_cn ? " (self-signed?)" : "");
      default:
        return absl::StrCat("client ", v.Describe(), " ", v.detail);
    }
    MaybeReload(/*force=*/false).IgnoreError();  // logged; the previous CRL stays
    {
      absl::MutexLock lock(&mu);
      if (revoked.count(v.serial_hex) != 0) {
        return absl::StrCat("client ", v.Describe(), " is revoked by ", crl_file);
      }
    }
    if (!allowed.empty() && allowed.count(v.subject_cn) == 0) {
      return absl::StrCat("client ", v.Describe(), ": client id '", v.subject_cn,
                          "' is not on the allowed client list");
    }
    return "";
  }

  // The CN of a certificate Refusal accepts.
  static std::string CommonName(std::string_view leaf_pem) {
    absl::StatusOr<CertificateInfo> info = ParseCertificate(leaf_pem);
    return info.ok() ? info->common_name : "";
  }
};

namespace {

// The server's whole check of a client certificate (the TLS stack requests one but verifies
// nothing itself): every refusal is counted and logged with its reason. gRPC owns the verifier
// object; the state is shared with ServerTls.
class ClientCertificateVerifier : public grpc::experimental::ExternalCertificateVerifier {
 public:
  explicit ClientCertificateVerifier(std::shared_ptr<ServerTls::State> state)
      : state_(std::move(state)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)>, grpc::Status* sync_status) override {
    const grpc::string_ref leaf = request->peer_cert();
    const grpc::string_ref chain = request->peer_cert_full_chain();
    const std::string refusal = state_->Refusal(std::string_view(leaf.data(), leaf.size()),
                                                std::string_view(chain.data(), chain.size()));
    if (refusal.empty()) {
      *sync_status = grpc::Status::OK;
    } else {
      state_->Refused(refusal);
      *sync_status = grpc::Status(grpc::StatusCode::PERMISSION_DENIED, refusal);
    }
    return true;  // synchronous
  }

  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  std::shared_ptr<ServerTls::State> state_;
};

// cert_pem/key_pem read from the named files and checked to match.
absl::Status CheckIdentity(const std::string& cert_file, const std::string& cert_pem,
                           const std::string& key_file, const std::string& key_pem) {
  absl::Status s = CheckKeyMatchesCertificate(cert_pem, key_pem);
  if (!s.ok()) return Annotate(s, absl::StrCat("cert_file ", cert_file, " / key_file ", key_file));
  return absl::OkStatus();
}

absl::Status CheckCa(const std::string& path, const std::string& pem, std::string_view field) {
  absl::StatusOr<CertificateInfo> ca = ParseCertificate(pem);
  if (!ca.ok()) return Annotate(ca.status(), absl::StrCat(ToAbsl(field), " ", path));
  if (!ca->is_ca) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(field), " ", path, ": certificate '",
                                                   ca->common_name,
                                                   "' is not a CA (no basicConstraints CA:TRUE)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<ServerTls>> ServerTls::Create(const ServerTlsFiles& files) {
  RouteGrpcLogs();
  FEDLORA_ASSIGN_OR_RETURN(std::string cert_pem, ReadNamedFile(files.cert_file, "cert_file"));
  FEDLORA_ASSIGN_OR_RETURN(std::string key_pem, ReadNamedFile(files.key_file, "key_file"));
  FEDLORA_ASSIGN_OR_RETURN(std::string ca_pem,
                           ReadNamedFile(files.client_ca_file, "client_ca_file"));
  FEDLORA_RETURN_IF_ERROR(CheckIdentity(files.cert_file, cert_pem, files.key_file, key_pem));
  FEDLORA_ASSIGN_OR_RETURN(CertificateInfo server, ParseCertificate(cert_pem));
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  if (server.not_after_unix_s < now) {
    return absl::FailedPreconditionError(
        absl::StrCat("cert_file ", files.cert_file, ": certificate '", server.common_name,
                     "' expired at unix time ", server.not_after_unix_s));
  }
  FEDLORA_RETURN_IF_ERROR(CheckCa(files.client_ca_file, ca_pem, "client_ca_file"));

  std::shared_ptr<ServerTls> tls(new ServerTls());
  tls->state_ = std::make_shared<State>();
  State& state = *tls->state_;
  for (const std::string& id : files.allowed_client_ids) {
    if (!IsValidSiteId(id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "allowed client id '", id.substr(0, 64), "' is not 1-128 characters of [A-Za-z0-9._@-]"));
    }
    state.allowed.insert(id);
  }
  state.crl_file = files.crl_file;
  state.ca_file = files.client_ca_file;
  state.ca_pem = ca_pem;
  if (!files.crl_file.empty()) {
    absl::MutexLock lock(&state.mu);
    state.stamp = Stamp(files.crl_file);
    FEDLORA_ASSIGN_OR_RETURN(state.revoked, LoadCrl(files.crl_file, ca_pem));
  }

  auto provider = std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
      ca_pem, std::vector<grpc::experimental::IdentityKeyCertPair>{{key_pem, cert_pem}});
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  // Without these two calls the provider's certificates are not used at all.
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  // The TLS stack asks for a client certificate and checks that the client holds its key; the
  // verifier checks the certificate itself (chain, validity, CRL, allow-list) so that every refusal,
  // a missing certificate included, is counted and logged with its reason.
  options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_BUT_DONT_VERIFY);
  options.set_certificate_verifier(
      grpc::experimental::ExternalCertificateVerifier::Create<ClientCertificateVerifier>(
          tls->state_));
  tls->credentials_ = grpc::experimental::TlsServerCredentials(options);
  if (tls->credentials_ == nullptr)
    return absl::InternalError("grpc::experimental::TlsServerCredentials failed");
  return tls;
}

ServerTls::~ServerTls() = default;

std::shared_ptr<grpc::ServerCredentials> ServerTls::credentials() const { return credentials_; }

absl::Status ServerTls::ReloadCrl() { return state_->MaybeReload(/*force=*/true); }

int64_t ServerTls::refused_handshakes() const {
  return state_->refused.load(std::memory_order_relaxed);
}

absl::StatusOr<std::string> ServerTls::CheckClientCertificate(std::string_view leaf_pem,
                                                              std::string_view chain_pem) const {
  const std::string refusal = state_->Refusal(leaf_pem, chain_pem);
  if (!refusal.empty()) return absl::PermissionDeniedError(refusal);
  return State::CommonName(leaf_pem);
}

size_t ServerTls::revoked_count() const {
  absl::MutexLock lock(&state_->mu);
  return state_->revoked.size();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientChannelCredentials(
    const std::string& root_ca_file, const std::string& cert_file, const std::string& key_file) {
  RouteGrpcLogs();
  FEDLORA_ASSIGN_OR_RETURN(std::string ca_pem, ReadNamedFile(root_ca_file, "root CA file"));
  FEDLORA_ASSIGN_OR_RETURN(std::string cert_pem, ReadNamedFile(cert_file, "client cert_file"));
  FEDLORA_ASSIGN_OR_RETURN(std::string key_pem, ReadNamedFile(key_file, "client key_file"));
  FEDLORA_RETURN_IF_ERROR(CheckCa(root_ca_file, ca_pem, "root CA file"));
  FEDLORA_RETURN_IF_ERROR(CheckIdentity(cert_file, cert_pem, key_file, key_pem));
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = std::move(ca_pem);
  ssl.pem_cert_chain = std::move(cert_pem);
  ssl.pem_private_key = std::move(key_pem);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(ssl);
  if (creds == nullptr) return absl::InternalError("grpc::SslCredentials failed");
  return creds;
}

}  // namespace fedlora::crypto
