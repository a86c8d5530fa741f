// host:port addresses as the run config and the command line write them, and the one rule for
// plaintext: only on a loopback address, and only when asked for explicitly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace fedlora {

// Splits "host:port" or "[v6]:port". False when malformed: no host, no port, a port outside
// 0-65535, or an unbracketed IPv6 address ("::1:50051" is ambiguous).
bool SplitHostPort(std::string_view address, std::string* host, uint32_t* port);

// Whether `host` (no port; IPv6 with or without brackets) is a loopback address: 127.0.0.0/8,
// ::1 (or ::ffff:127.x.y.z) or "localhost". Names other than "localhost" are not resolved.
bool IsLoopbackHost(std::string_view host);

// The plaintext rule, for a server's listen address and a client's server address alike: OK only
// when `insecure` was asked for and `address` is on loopback. `address` is host:port, [v6]:port or
// a gRPC target (dns:///, ipv4:, ipv6:; unix: counts as local); `what` names it in the message.
// FailedPrecondition saying how to fix it otherwise; InvalidArgument for an empty address.
absl::Status CheckPlaintextAllowed(std::string_view address, bool insecure, std::string_view what);

}  // namespace fedlora
