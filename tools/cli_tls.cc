#include "tools/cli_tls.h"

#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/status.h"
#include "crypto/grpc_log.h"
#include "crypto/tls.h"
#include "proto/address.h"

namespace fedlora::tools {

absl::StatusOr<CliTls> CliTlsCredentials(const std::string& address, const std::string& ca,
                                         const std::string& cert, const std::string& key,
                                         bool insecure) {
  crypto::RouteGrpcLogs();
  CliTls tls;
  tls.probe.address = address;
  if (ca.empty() && cert.empty() && key.empty()) {
    FEDLORA_RETURN_IF_ERROR(CheckPlaintextAllowed(address, insecure, "server address"));
    tls.credentials = grpc::InsecureChannelCredentials();
    return tls;
  }
  if (insecure)
    return absl::InvalidArgumentError(
        "--insecure and TLS (--ca, --cert, --key) exclude each other");
  if (ca.empty())
    return absl::InvalidArgumentError("TLS needs --ca, the CA the server certificate chains to");
  if (cert.empty() != key.empty())
    return absl::InvalidArgumentError("--cert and --key go together");
  FEDLORA_ASSIGN_OR_RETURN(tls.probe.root_ca_pem, ReadFileToString(ca));
  tls.probe.ca_label = absl::StrCat("--ca ", ca);
  if (cert.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = tls.probe.root_ca_pem;
    tls.credentials = grpc::SslCredentials(ssl);
    return tls;
  }
  // Checks what the SDK checks: the CA is a CA, the key belongs to the certificate.
  FEDLORA_ASSIGN_OR_RETURN(tls.credentials, crypto::ClientChannelCredentials(ca, cert, key));
  FEDLORA_ASSIGN_OR_RETURN(tls.probe.cert_pem, ReadFileToString(cert));
  FEDLORA_ASSIGN_OR_RETURN(tls.probe.key_pem, ReadFileToString(key));
  tls.probe.cert_label = absl::StrCat("--cert ", cert);
  return tls;
}

}  // namespace fedlora::tools
