// Randomness and tokens from OpenSSL's CSPRNG, and a constant-time comparison for secrets.
//
//   FEDLORA_ASSIGN_OR_RETURN(std::string nonce, crypto::RandomBytes(12));
//   FEDLORA_ASSIGN_OR_RETURN(std::string token, crypto::RandomHex(32));   // 64 hex characters
//   if (!crypto::ConstantTimeEquals(presented, expected)) return absl::PermissionDeniedError(...);
//
// The generator fails closed: when RAND_bytes cannot deliver, the call returns Internal (with
// OpenSSL's error text) and never falls back to a weaker source. Thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fedlora::crypto {

// `n` bytes from RAND_bytes (any n, including 0).
absl::StatusOr<std::string> RandomBytes(size_t n);

// 2n lowercase hex characters encoding n random bytes (session tokens, upload ids).
absl::StatusOr<std::string> RandomHex(size_t n);

// Compares the bytes with CRYPTO_memcmp, whose time does not depend on where they differ.
// Strings of different lengths compare unequal at once: lengths are not treated as secret.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace fedlora::crypto
