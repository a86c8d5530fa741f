// gRPC transport security for the federation port: mTLS server credentials with a CRL and an
// allow-list of client ids, and client channel credentials. (The plaintext rule: proto/address.h.)
//
//   ServerTlsFiles files;
//   files.cert_file = "server.pem";  // also key_file, client_ca_file, and optionally crl_file
//   FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<ServerTls> tls, ServerTls::Create(files));
//   builder.AddListeningPort(address, tls->credentials());
//   ...on SIGHUP: tls->ReloadCrl();
//
// The TLS stack asks for a client certificate and checks that the client holds its key; ServerTls
// then checks the certificate itself: its chain to client_ca_file and validity (OpenSSL's
// X509_verify_cert, as libssl would, crypto/chain_check.h), its serial against the CRL, its CN
// against the allowed client ids. Each refusal is counted and logged as a WARNING naming the reason
// and the certificate's CN, issuer and serial (the same reason again within a minute at DEBUG; gRPC
// does not give the verifier the peer's address). The caller's identity is the certificate's CN, seen by handlers as the AuthContext's
// "x509_common_name" property. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace fedlora::crypto {

struct ServerTlsFiles {
  std::string cert_file;       // PEM server certificate (chain)
  std::string key_file;        // PEM private key of cert_file
  std::string client_ca_file;  // PEM CA bundle that signs client certificates
  std::string crl_file;        // PEM CRL signed by the client CA; empty: no revocation list
  std::vector<std::string> allowed_client_ids;  // empty: every certificate the CA signed
};

class ServerTls {
 public:
  // Reads and checks every file: NotFound / PermissionDenied for a missing or unreadable file;
  // InvalidArgument when a file does not parse, the key does not match the certificate, the client
  // CA file holds no CA certificate, or an allowed id is not a valid site id; FailedPrecondition
  // when the CRL is not signed by the client CA. Each message names the file.
  static absl::StatusOr<std::shared_ptr<ServerTls>> Create(const ServerTlsFiles& files);

  ~ServerTls();
  ServerTls(const ServerTls&) = delete;
  ServerTls& operator=(const ServerTls&) = delete;

  // For ServerBuilder::AddListeningPort. The same object on every call.
  std::shared_ptr<grpc::ServerCredentials> credentials() const;

  // Re-reads crl_file now (the server calls it on SIGHUP). On error the previous CRL stays in
  // force, the error is logged and returned. OK and nothing done when there is no crl_file.
  // Besides, each handshake stats crl_file and re-reads it when its mtime, size or inode changed.
  absl::Status ReloadCrl();

  // Handshakes refused since Create for the client's certificate (each logged as a WARNING, the
  // same reason again within a minute at DEBUG): none, not signed by the client
  // CA, expired or not yet valid, not usable as a client certificate, revoked, not on the list.
  // (A peer that does not speak TLS or cannot prove it holds its key is refused by the TLS stack
  // before any certificate check, and not counted.)
  int64_t refused_handshakes() const;
  // Serials on the CRL in force.
  size_t revoked_count() const;

  // The same check as a handshake's, for a certificate presented elsewhere (the metrics listener's
  // HTTPS, server/live_view.h): chain to the client CA, validity, CRL, allow-list. Returns the
  // certificate's CN, or PermissionDenied with the reason. Not counted in refused_handshakes().
  absl::StatusOr<std::string> CheckClientCertificate(std::string_view leaf_pem,
                                                     std::string_view chain_pem) const;

  struct State;  // shared with the verifier that gRPC owns

 private:
  ServerTls() = default;
  std::shared_ptr<State> state_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
};

// TLS channel credentials that trust root_ca_file for the server and present cert_file/key_file as
// the client certificate. All three are required. Errors as for ServerTls::Create.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientChannelCredentials(
    const std::string& root_ca_file, const std::string& cert_file, const std::string& key_file);

}  // namespace fedlora::crypto
