// gRPC transport security for the federation port: mTLS server credentials with a CRL and an
// allow-list of client ids, and client channel credentials. (The plaintext rule: proto/address.h.)
//
//   ServerTlsFiles files;
//   files.cert_file = "server.pem";  // also key_file, client_ca_file, and optionally crl_file
//   FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<ServerTls> tls, ServerTls::Create(files));
//   builder.AddListeningPort(address, tls->credentials());
//   ...on SIGHUP: tls->ReloadCrl();
//
// The TLS stack requires a client certificate and verifies its chain to client_ca_file and its
// validity period; then ServerTls refuses the connection when the certificate's serial is on the
// CRL or its CN is not an allowed client id. The caller's identity is the certificate's CN, seen
// by handlers as the AuthContext's "x509_common_name" property. Thread-safe.
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
  std::string cert_file;                        // PEM server certificate (chain)
  std::string key_file;                         // PEM private key of cert_file
  std::string client_ca_file;                   // PEM CA bundle that signs client certificates
  std::string crl_file;                         // PEM CRL signed by the client CA; empty: no revocation list
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

  // Connections refused by the CRL or the allow-list since Create. Handshakes the TLS stack
  // refuses itself (no certificate, unknown CA, expired) are not counted here.
  int64_t refused_handshakes() const;
  // Serials on the CRL in force.
  size_t revoked_count() const;

  struct State;  // shared with the verifier that gRPC owns

 private:
  ServerTls() = default;
  std::shared_ptr<State> state_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
};

// TLS channel credentials that trust root_ca_file for the server and present cert_file/key_file as
// the client certificate. All three are required. Errors as for ServerTls::Create.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientChannelCredentials(const std::string& root_ca_file,
                                                                                   const std::string& cert_file,
                                                                                   const std::string& key_file);

}  // namespace fedlora::crypto
