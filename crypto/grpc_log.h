// gRPC's own log lines through fedlora's log (core/logging.h: its format, its file, its level),
// instead of gRPC's raw "E1207 ... ssl_transport_security.cc:1501]" lines on stderr. The TLS
// handshake failures that fedlora reports itself, better (the server's refusal with the
// certificate named, crypto/tls.h; the client's classified error, crypto/tls_probe.h), go to DEBUG.
// ServerTls::Create and ClientChannelCredentials install it; idempotent, thread-safe.
#pragma once

namespace fedlora::crypto {

void RouteGrpcLogs();

}  // namespace fedlora::crypto
