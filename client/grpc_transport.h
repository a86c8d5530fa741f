// The Transport over gRPC: one channel to the server (TLS with a client certificate, or plaintext
// to a loopback address), the identity and session metadata on every call, and the TLS probe that
// explains a connection refused for a certificate (crypto/tls_probe.h).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "client/transport.h"
#include "fedlora/client.h"

namespace fedlora {

// Checks the address and TLS options and opens the channel (no traffic yet). Errors as
// Client::Create's for the same options.
absl::StatusOr<std::unique_ptr<Transport>> CreateGrpcTransport(const ClientOptions& options);

}  // namespace fedlora
