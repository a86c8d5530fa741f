// X25519 keys as PEM, the form `openssl genpkey -algorithm X25519` writes and `openssl pkey` reads:
// a public key as "PUBLIC KEY" (SubjectPublicKeyInfo), a private key as "PRIVATE KEY" (unencrypted
// PKCS#8). Used for the offline audit key (server/audit_trail.h).
//
//   FEDLORA_ASSIGN_OR_RETURN(X25519KeyPair pair, GenerateX25519KeyPair());
//   FEDLORA_ASSIGN_OR_RETURN(std::string pem, X25519PublicKeyToPem(pair.public_key));
//   FEDLORA_ASSIGN_OR_RETURN(std::string raw, X25519PublicKeyFromPem(pem));   // 32 bytes again
//
// Errors: InvalidArgument for a key that is not 32 bytes, PEM that does not parse, or a key of
// another algorithm (naming what it is); Internal when OpenSSL itself fails.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fedlora::crypto {

absl::StatusOr<std::string> X25519PublicKeyToPem(std::string_view public_key);
absl::StatusOr<std::string> X25519PrivateKeyToPem(std::string_view private_key);
// The raw 32-byte key of a PEM X25519 key.
absl::StatusOr<std::string> X25519PublicKeyFromPem(std::string_view pem);
absl::StatusOr<std::string> X25519PrivateKeyFromPem(std::string_view pem);

}  // namespace fedlora::crypto
