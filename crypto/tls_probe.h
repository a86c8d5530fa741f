// Why a connection to a server fails, when TLS is the reason: a short TLS handshake of our own
// (OpenSSL, a few seconds) with the same CA, certificate and key the gRPC channel uses, its result
// turned into an error a person can act on. gRPC reports every such failure as UNAVAILABLE ("Socket
// closed", "failed to connect to all addresses"), which a client would retry for minutes.
//
//   absl::Status s = FromGrpcStatus(stub->Join(...));
//   if (absl::IsUnavailable(s)) s = ExplainConnectionFailure(s, probe_options);  // classified, or s
//
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace fedlora::crypto {

struct TlsProbeOptions {
  std::string address;      // host:port, or [v6]:port
  std::string server_name;  // the name the server certificate must carry; empty: the address's host
  // What the client presents and trusts (PEM). root_ca_pem empty: the client speaks plaintext, and
  // the probe only asks whether the server speaks TLS.
  std::string root_ca_pem, cert_pem, key_pem;
  // How messages name the files, e.g. "--ca runs/certs/ca.pem" and "--cert runs/certs/site-a.pem".
  std::string ca_label = "the root CA", cert_label = "this site's certificate";
  int64_t timeout_ms = 3'000;  // for connecting, the handshake, and the server's first bytes
};

// One handshake with `options`:
// - OK: TLS is not the problem (the server accepted the handshake and spoke HTTP/2; or, probing
//   as a plaintext client, the server does not speak TLS);
// - Unavailable: no TLS conversation took place (nothing listens, the address does not resolve,
//   a timeout): a transient error, as gRPC's own;
// - FailedPrecondition: the server's certificate is not signed by the root CA, is not valid for
//   the server name, has expired or is not yet valid; a TLS client talks to a plaintext server, or
//   a plaintext client to a TLS server;
// - PermissionDenied: the server refused this site's certificate (the alert it sent, or it closed
//   the connection right after the handshake), with what this side can see of why (expired,
//   issued by another CA than the server's);
// - InvalidArgument: `options` are unusable (an address that is not host:port, a key that does
//   not load).
// Messages name the address, the certificates (CN, issuer, serial) and what to fix; never
// pointers or library internals.
absl::Status ProbeTls(const TlsProbeOptions& options);

// `failure` unless it is Unavailable and ProbeTls finds a TLS reason for it; then that reason. A
// reason read from the server closing the connection (which a server shutting down does too) is
// believed only when a second probe, 200 ms later, ends the same way.
absl::Status ExplainConnectionFailure(const absl::Status& failure, const TlsProbeOptions& options);

}  // namespace fedlora::crypto
