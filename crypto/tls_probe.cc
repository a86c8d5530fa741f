#include "crypto/tls_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <string_view>
#include <thread>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "crypto/certs.h"
#include "crypto/chain_check.h"
#include "crypto/openssl_ptr.h"
#include "proto/address.h"

namespace fedlora::crypto {
namespace {

// Marks a verdict drawn from the server closing the connection, which a server shutting down also
// does: ExplainConnectionFailure asks again before it believes one.
constexpr char kClosedUrl[] = "fedlora.dev/crypto/tls-probe/closed";

absl::Status Closed(absl::Status s) {
  s.SetPayload(kClosedUrl, absl::Cord("1"));
  return s;
}

using SslCtxPtr = OpenSslPtr<SSL_CTX, SSL_CTX_free>;
using SslPtr = OpenSslPtr<SSL, SSL_free>;

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Blocks SIGPIPE in this thread while it lives (a write to a connection the server closed must be
// an error, not the end of the process), and discards one raised meanwhile.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~NoSigpipe() {
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE) == 1 && sigismember(&old_, SIGPIPE) != 1) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_, old_;
};

// A TCP connection within `timeout_ms`, with reads and writes bounded by it too.
absl::StatusOr<int> Connect(const std::string& host, uint32_t port, int64_t timeout_ms,
                            const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string bare =
      host.size() > 1 && host.front() == '[' ? host.substr(1, host.size() - 2) : host;
  if (const int rc = ::getaddrinfo(bare.c_str(), std::to_string(port).c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", address, ": ", gai_strerror(rc)));
  }
  std::string last = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, static_cast<int>(timeout_ms));
      int err = rc == 0 ? ETIMEDOUT : 0;
      socklen_t len = sizeof err;
      if (rc > 0) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      timeval tv{static_cast<time_t>(timeout_ms / 1000),
                 static_cast<suseconds_t>(timeout_ms % 1000 * 1000)};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      ::freeaddrinfo(found);
      return fd;
    }
    last = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("cannot connect to ", address, ": ", last));
}

// The reason code of the last OpenSSL error queued (0: none); empties the queue.
int LastReason() {
  const unsigned long e = ERR_peek_last_error();
  ERR_clear_error();
  return e == 0 ? 0 : ERR_GET_REASON(e);
}

bool IsAlert(int reason) {
  return reason > SSL_AD_REASON_OFFSET && reason < SSL_AD_REASON_OFFSET + 256;
}

std::string PeerChainPem(SSL* ssl) {
  std::string out;
  STACK_OF(X509)* chain = SSL_get_peer_cert_chain(ssl);  // a client's view: the server's leaf first
  for (int i = 0; chain != nullptr && i < sk_X509_num(chain); ++i) {
    BioPtr bio(BIO_new(BIO_s_mem()));
    if (bio == nullptr || PEM_write_bio_X509(bio.get(), sk_X509_value(chain, i)) != 1) continue;
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio.get(), &data);
    out.append(data, static_cast<size_t>(n));
  }
  return out;
}

// What this side can see of why the server refused our certificate: it expired, is not yet
// valid, or is not signed by the CA we trust for the server (then likely of another PKI).
std::string OwnCertificateHint(const TlsProbeOptions& o) {
  absl::StatusOr<CertificateInfo> own = ParseCertificate(o.cert_pem);
  if (!own.ok()) return "";
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  if (own->not_after_unix_s < now) {
    return absl::StrCat("; ", o.cert_label, " expired at ", UtcTime(own->not_after_unix_s),
                        ": ask the run's operator for a new one");
  }
  if (own->not_before_unix_s > now) {
    return absl::StrCat("; ", o.cert_label, " is not valid before ",
                        UtcTime(own->not_before_unix_s), " (check this machine's clock)");
  }
  const ChainVerdict v =
      VerifyChain(o.cert_pem, o.cert_pem, o.root_ca_pem, ChainPurpose::kTlsClient);
  if (v.problem == ChainProblem::kUnknownCa) {
    return absl::StrCat("; ", o.cert_label, " is issued by '", own->issuer_common_name,
                        "', not by ", o.ca_label, ": it is likely from another CA than the run's");
  }
  return "";
}

std::string Own(const TlsProbeOptions& o) {
  absl::StatusOr<CertificateInfo> own = ParseCertificate(o.cert_pem);
  if (!own.ok()) return o.cert_label;
  return absl::StrCat(o.cert_label, " ('", own->common_name, "', issuer '", own->issuer_common_name,
                      "', serial ", own->serial_hex, ")");
}

// The server sent a TLS alert: what it says about us.
absl::Status RefusedByAlert(int reason, const TlsProbeOptions& o) {
  const int alert = reason - SSL_AD_REASON_OFFSET;
  const std::string said =
      absl::StrCat("the server at ", o.address, " refused the TLS handshake with the alert '",
                   SSL_alert_desc_string_long(alert), "'");
  if (o.cert_pem.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat(said, ": it requires a client certificate (give --cert and --key)"));
  }
  switch (alert) {
    case SSL_AD_UNKNOWN_CA:
      return absl::PermissionDeniedError(absl::StrCat(
          said, ": it does not trust the CA that issued ", Own(o), OwnCertificateHint(o)));
    case SSL_AD_CERTIFICATE_EXPIRED:
      return absl::PermissionDeniedError(absl::StrCat(
          said, ": ", Own(o), " has expired or is not valid yet", OwnCertificateHint(o)));
    case SSL_AD_CERTIFICATE_REVOKED:
      return absl::PermissionDeniedError(
          absl::StrCat(said, ": ", Own(o), " is revoked; ask the run's operator for a new one"));
    case SSL_AD_BAD_CERTIFICATE:
    case SSL_AD_CERTIFICATE_UNKNOWN:
    case SSL_AD_UNSUPPORTED_CERTIFICATE:
    case SSL_AD_ACCESS_DENIED:
    case SSL_AD_CERTIFICATE_REQUIRED:
    case SSL_AD_HANDSHAKE_FAILURE:
      return absl::PermissionDeniedError(
          absl::StrCat(said, ": it refused ", Own(o), OwnCertificateHint(o)));
    default:
      return absl::FailedPreconditionError(absl::StrCat(
          said, " (TLS versions, ciphers or ALPN do not match: is it a fedlora server?)"));
  }
}

absl::Status ServerCertificateProblem(SSL* ssl, const TlsProbeOptions& o, const std::string& name) {
  const std::string chain = PeerChainPem(ssl);
  const ChainVerdict v = VerifyChain(chain, chain, o.root_ca_pem, ChainPurpose::kTlsServer);
  const std::string whose =
      absl::StrCat("the server at ", o.address, " presented ", v.Describe(), ", which ");
  switch (v.problem) {
    case ChainProblem::kNone:
      break;
    case ChainProblem::kUnknownCa:
      return absl::FailedPreconditionError(
          absl::StrCat(whose, "is not signed by ", o.ca_label, " (its issuer is '", v.issuer_cn,
                       "'): this site trusts another CA than the one that issued the server's "
                       "certificate; use the run's CA "
                       "certificate (ask the run's operator)"));
    case ChainProblem::kExpired:
    case ChainProblem::kNotYetValid:
      return absl::FailedPreconditionError(
          absl::StrCat(whose, v.detail,
                       ": the server's operator must renew it (or check this machine's clock)"));
    default:
      return absl::FailedPreconditionError(absl::StrCat(whose, v.detail));
  }
  X509* leaf = SSL_get0_peer_certificate(ssl);
  in6_addr ip{};
  const bool is_ip =
      inet_pton(AF_INET, name.c_str(), &ip) == 1 || inet_pton(AF_INET6, name.c_str(), &ip) == 1;
  const int match = is_ip ? X509_check_ip_asc(leaf, name.c_str(), 0)
                          : X509_check_host(leaf, name.data(), name.size(), 0, nullptr);
  ERR_clear_error();
  if (match == 1) return absl::OkStatus();
  absl::StatusOr<CertificateInfo> info = ParseCertificate(chain);
  std::vector<std::string> names;
  if (info.ok()) {
    names = info->dns_names;
    names.insert(names.end(), info->ip_addresses.begin(), info->ip_addresses.end());
  }
  return absl::FailedPreconditionError(
      absl::StrCat(whose, "is for ",
                   names.empty() ? "no name" : absl::StrCat("'", absl::StrJoin(names, "', '"), "'"),
                   ", not '", name,
                   "': connect by a name the certificate carries, or have the server's certificate "
                   "made for this one"));
}

absl::Status NotTls(const TlsProbeOptions& o) {
  return absl::FailedPreconditionError(
      absl::StrCat("the server at ", o.address,
                   " does not speak TLS (it answered the TLS handshake in plaintext or closed "
                   "the connection): it is a plaintext server (started with --insecure?) or not a "
                   "fedlora server; talk to it "
                   "with --insecure on loopback, or start it with TLS"));
}

// After a completed handshake: a gRPC server that accepted us sends its HTTP/2 SETTINGS at once;
// one that refused our certificate sends an alert or closes the connection. Nothing is written:
// a write the server does not read could reset the connection before its alert is read.
absl::Status ServerAcceptsUs(SSL* ssl, const TlsProbeOptions& o) {
  char byte = 0;
  errno = 0;
  if (SSL_read(ssl, &byte, 1) == 1) return absl::OkStatus();
  const int saved_errno = errno;
  const int reason = LastReason();
  if (IsAlert(reason)) return RefusedByAlert(reason, o);
  if (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK)
    return absl::OkStatus();  // silent, but not a refusal
  if (o.cert_pem.empty()) {
    return Closed(absl::PermissionDeniedError(
        absl::StrCat("the server at ", o.address,
                     " closed the connection right after the TLS handshake: it requires a client "
                     "certificate (give --cert and --key)")));
  }
  return Closed(absl::PermissionDeniedError(
      absl::StrCat("the server at ", o.address,
                   " closed the connection right after the TLS handshake: it refused ", Own(o),
                   OwnCertificateHint(o),
                   " (a server refuses a certificate not signed by its client CA, expired, "
                   "revoked, or not on its list of "
                   "sites; its log names the reason)")));
}

absl::Status LoadIdentity(SSL_CTX* ctx, const TlsProbeOptions& o) {
  BioPtr bio(BIO_new_mem_buf(o.cert_pem.data(), static_cast<int>(o.cert_pem.size())));
  X509Ptr leaf(bio != nullptr ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (leaf == nullptr || SSL_CTX_use_certificate(ctx, leaf.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(o.cert_label, " does not parse as a PEM certificate"));
  }
  while (X509* extra = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr))
    SSL_CTX_add0_chain_cert(ctx, extra);
  ERR_clear_error();
  BioPtr kbio(BIO_new_mem_buf(o.key_pem.data(), static_cast<int>(o.key_pem.size())));
  KeyPtr key(kbio != nullptr ? PEM_read_bio_PrivateKey(kbio.get(), nullptr, nullptr, nullptr)
                             : nullptr);
  if (key == nullptr || SSL_CTX_use_PrivateKey(ctx, key.get()) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("the key of ", o.cert_label, " does not load or does not match it"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ProbeTls(const TlsProbeOptions& o) {
  std::string host;
  uint32_t port = 0;
  if (!SplitHostPort(o.address, &host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("server address '", o.address, "' is not host:port"));
  }
  if (!host.empty() && host.front() == '[') host = host.substr(1, host.size() - 2);
  const bool plaintext = o.root_ca_pem.empty();
  SslCtxPtr ctx(SSL_CTX_new(TLS_client_method()));
  if (ctx == nullptr) return absl::ResourceExhaustedError("OpenSSL could not make a TLS context");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);  // checked below, to say what is wrong
  static constexpr unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof kAlpn);
  if (!plaintext && !o.cert_pem.empty()) FEDLORA_RETURN_IF_ERROR(LoadIdentity(ctx.get(), o));

  NoSigpipe no_sigpipe;
  FEDLORA_ASSIGN_OR_RETURN(const int fd, Connect(host, port, o.timeout_ms, o.address));
  Socket socket(fd);
  SslPtr ssl(SSL_new(ctx.get()));
  if (ssl == nullptr || SSL_set_fd(ssl.get(), socket.fd()) != 1)
    return absl::ResourceExhaustedError("OpenSSL SSL_new");
  const std::string name = o.server_name.empty() ? host : o.server_name;
  in6_addr ip{};
  if (inet_pton(AF_INET, name.c_str(), &ip) != 1 && inet_pton(AF_INET6, name.c_str(), &ip) != 1) {
    SSL_set_tlsext_host_name(ssl.get(), name.c_str());
  }
  errno = 0;
  const int rc = SSL_connect(ssl.get());
  const int saved_errno = errno;
  const int error = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl.get(), rc);
  const int reason = rc == 1 ? 0 : LastReason();
  const bool server_speaks_tls =
      rc == 1 || IsAlert(reason) || SSL_get0_peer_certificate(ssl.get()) != nullptr;
  if (plaintext) {
    if (!server_speaks_tls) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "the server at ", o.address,
        " speaks TLS and this client plaintext: give the run's CA and this site's "
        "certificate and key (--ca, --cert, --key; ClientOptions.tls) instead of --insecure"));
  }
  if (rc != 1) {
    if (IsAlert(reason)) return RefusedByAlert(reason, o);
    if (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK) {
      return absl::UnavailableError(
          absl::StrCat("no TLS answer from ", o.address, " within ", o.timeout_ms, " ms"));
    }
    if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG ||
        reason == SSL_R_UNEXPECTED_EOF_WHILE_READING || reason == SSL_R_HTTP_REQUEST ||
        (error == SSL_ERROR_SYSCALL &&
         (saved_errno == 0 || saved_errno == ECONNRESET || saved_errno == EPIPE))) {
      return Closed(NotTls(o));
    }
    const char* why =
        reason != 0 ? ERR_reason_error_string(ERR_PACK(ERR_LIB_SSL, 0, reason)) : nullptr;
    return absl::UnavailableError(absl::StrCat("TLS handshake with ", o.address, " failed: ",
                                               why != nullptr ? why : std::strerror(saved_errno)));
  }
  FEDLORA_RETURN_IF_ERROR(ServerCertificateProblem(ssl.get(), o, name));
  return ServerAcceptsUs(ssl.get(), o);
}

absl::Status ExplainConnectionFailure(const absl::Status& failure, const TlsProbeOptions& options) {
  if (!absl::IsUnavailable(failure)) return failure;
  absl::Status probe = ProbeTls(options);
  if (probe.GetPayload(kClosedUrl).has_value()) {
    // Believed only when a second handshake a moment later ends the same way.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (ProbeTls(options).code() != probe.code()) return failure;
    probe.ErasePayload(kClosedUrl);
  }
  return absl::IsFailedPrecondition(probe) || absl::IsPermissionDenied(probe) ? probe : failure;
}

}  // namespace fedlora::crypto
