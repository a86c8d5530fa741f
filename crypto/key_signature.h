// The aggregation key's authenticity: a server with TLS signs each round's aggregation key with its
// certificate's private key, and a client seals its update only to a key signed by a certificate
// it trusts as the server's. Without this a proxy that terminates TLS could hand clients its own
// key and read their updates.
//
//   server: FEDLORA_ASSIGN_OR_RETURN(std::string sig, SignAggregationKey(key_pem, run_id, round, public_key));
//   client: FEDLORA_RETURN_IF_ERROR(VerifyAggregationKey(trust, signer_chain_pem, sig, run_id, round, public_key));
//
// The signed statement is ("fedlora/v1 aggregation key", run_id, round, public_key), each field
// length-prefixed (round as 8 bytes little-endian), so a signature is valid for one key of one
// round of one run only. The signer is trusted when its certificate chains to the client's CA and
// either its SubjectPublicKeyInfo hashes to the client's pin or, unpinned, it names the server
// the client dialed. Only a pin stops a proxy that holds a certificate the same CA issued for the
// same name: see docs/security.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fedlora::crypto {

// Signs the statement with the PEM private key (EC, RSA or Ed25519; SHA-256 where the algorithm
// takes a digest). InvalidArgument for a key that does not load.
absl::StatusOr<std::string> SignAggregationKey(std::string_view key_pem, std::string_view run_id,
                                               uint64_t round, std::string_view public_key);

struct AggregationKeyTrust {
  std::string root_ca_pem;    // PEM bundle the signer's certificate must chain to
  std::string expected_host;  // name or IP the signer's certificate must be valid for; empty: any
  std::string
      pin_sha256_hex;  // SHA-256 of the signer's SubjectPublicKeyInfo, lowercase hex; empty: none
};

// PermissionDenied unless `signer_chain_pem` (the signer's certificate first, then intermediates)
// chains to trust.root_ca_pem, matches the pin (or, without one, expected_host), and `signature`
// verifies over the statement for (run_id, round, public_key). InvalidArgument for malformed input.
absl::Status VerifyAggregationKey(const AggregationKeyTrust& trust,
                                  std::string_view signer_chain_pem, std::string_view signature,
                                  std::string_view run_id, uint64_t round,
                                  std::string_view public_key);

// A certificate's pin: SHA-256 of its DER SubjectPublicKeyInfo, lowercase hex (the first
// certificate of a PEM chain). Stable across renewals that keep the key.
absl::StatusOr<std::string> CertificatePin(std::string_view cert_pem);

}  // namespace fedlora::crypto
