// The TLS side of the commands that call a server with --ca/--cert/--key (`fedlora health`,
// `fedlora status`): credentials checked up front as the client SDK checks its own (the files
// parse, the CA is a CA, the key belongs to the certificate), and a failed call explained by a
// TLS probe (crypto/tls_probe.h) instead of gRPC's UNAVAILABLE.
//
//   FEDLORA_ASSIGN_OR_RETURN(CliTls tls, CliTlsCredentials(server, ca, cert, key, insecure));
//   absl::Status s = FromGrpcStatus(stub->Call(...));
//   if (!s.ok()) return tls.Explain(s);
#pragma once

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crypto/tls_probe.h"

namespace fedlora::tools {

struct CliTls {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  crypto::TlsProbeOptions probe;
  // `failure`, or the TLS reason for it when it is Unavailable and the probe finds one.
  absl::Status Explain(const absl::Status& failure) const {
    return crypto::ExplainConnectionFailure(failure, probe);
  }
};

// No --ca/--cert/--key: plaintext, which --insecure must ask for and only a loopback address
// allows. Else TLS: --ca required, --cert and --key together or neither.
absl::StatusOr<CliTls> CliTlsCredentials(const std::string& address, const std::string& ca,
                                         const std::string& cert, const std::string& key,
                                         bool insecure);

}  // namespace fedlora::tools
