// The sealed-update envelope and the primitives under it (all from OpenSSL 3's EVP API): X25519,
// HKDF-SHA256 and AES-256-GCM.
//
// A client seals an update to the server's long-term X25519 public key; only that server's private
// key opens it, and only under the same associated data (run, round, client, upload):
//
//   std::string aad = crypto::UpdateAssociatedData(run_id, round, client_id, upload_id);
//   FEDLORA_ASSIGN_OR_RETURN(crypto::SealedUpdate sealed, crypto::SealUpdate(server_public, aad, bytes));
//   ...  // send sealed.ephemeral_public_key and sealed.envelope
//   FEDLORA_ASSIGN_OR_RETURN(std::string bytes, crypto::OpenUpdate(server_private, eph, aad, envelope));
//
// Each seal draws a fresh ephemeral key pair and nonce. The AES key is
// HKDF-SHA256(ikm = X25519(ephemeral, server), salt = ephemeral_public || server_public,
// info = "fedlora/v1 sealed update", 32 bytes). Envelope layout:
//
//   "FLSE" (4) | version 1 (1) | 3 zero bytes | nonce (12) | ciphertext | GCM tag (16)
//
// The GCM associated data is the 20-byte header followed by `aad`, so the header is authenticated.
// Errors: InvalidArgument for malformed input (naming the field), PermissionDenied when an
// envelope or ciphertext does not authenticate, Internal when OpenSSL itself fails. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fedlora::crypto {

inline constexpr size_t kX25519KeyBytes = 32;
inline constexpr size_t kAes256KeyBytes = 32;
inline constexpr size_t kGcmNonceBytes = 12;
inline constexpr size_t kGcmTagBytes = 16;
inline constexpr size_t kEnvelopeHeaderBytes = 20;
inline constexpr size_t kEnvelopeOverheadBytes = kEnvelopeHeaderBytes + kGcmTagBytes;  // 20 + 16
inline constexpr uint8_t kEnvelopeVersion = 1;

// Raw 32-byte keys (RFC 7748 encoding).
struct X25519KeyPair {
  std::string private_key;
  std::string public_key;
};

absl::StatusOr<X25519KeyPair> GenerateX25519KeyPair();
// The public key X25519(private_key, 9).
absl::StatusOr<std::string> X25519PublicKey(std::string_view private_key);
// X25519(private_key, peer_public_key), 32 bytes. InvalidArgument for a key that is not 32 bytes
// and for a peer key of small order (the shared secret would be all zero).
absl::StatusOr<std::string> X25519SharedSecret(std::string_view private_key,
                                               std::string_view peer_public_key);

// HKDF-SHA256 (RFC 5869), extract then expand. `ikm` must not be empty; `length` must be 1..8160
// (255 * 32). Empty `salt` and `info` are allowed.
absl::StatusOr<std::string> HkdfSha256(std::string_view ikm, std::string_view salt,
                                       std::string_view info, size_t length);

// AES-256-GCM with a 32-byte key and a 12-byte nonce; returns ciphertext || 16-byte tag. Any size
// up to GCM's limit (2^36 - 32 bytes of plaintext); inputs above 2 GiB are fed to EVP in pieces.
// Never reuse a (key, nonce) pair.
absl::StatusOr<std::string> Aes256GcmSeal(std::string_view key, std::string_view nonce,
                                          std::string_view aad, std::string_view plaintext);
// The inverse: PermissionDenied when the tag does not verify, InvalidArgument for wrong sizes.
absl::StatusOr<std::string> Aes256GcmOpen(std::string_view key, std::string_view nonce,
                                          std::string_view aad,
                                          std::string_view ciphertext_and_tag);

// The canonical associated data binding a sealed update to its run, round, client, upload and
// FedAvg weight: each of "fedlora/v2 update", run_id, client_id and upload_id as its length (8 bytes
// little-endian) and bytes, in the order label, run_id, round, client_id, upload_id, num_examples,
// with round and num_examples as 8 bytes little-endian. Distinct inputs give distinct encodings.
std::string UpdateAssociatedData(std::string_view run_id, uint64_t round,
                                 std::string_view client_id, std::string_view upload_id,
                                 uint64_t num_examples);

struct SealedUpdate {
  std::string ephemeral_public_key;  // 32 bytes
  std::string envelope;              // plaintext size + kEnvelopeOverheadBytes
};

// Seals `plaintext` to `server_public_key` under `aad` (see the top of this file).
absl::StatusOr<SealedUpdate> SealUpdate(std::string_view server_public_key, std::string_view aad,
                                        std::string_view plaintext);

// The plaintext size of an envelope from its header and length, without decrypting.
// InvalidArgument when it is too short, its magic is not "FLSE" or its version is unknown.
absl::StatusOr<size_t> EnvelopePlaintextSize(std::string_view envelope);

// Opens an envelope from SealUpdate. PermissionDenied when it does not authenticate: tampered, or
// sealed for another run, round, client, upload or server key.
absl::StatusOr<std::string> OpenUpdate(std::string_view server_private_key,
                                       std::string_view ephemeral_public_key, std::string_view aad,
                                       std::string_view envelope);
// As OpenUpdate, decrypting into `out`, which must hold exactly EnvelopePlaintextSize(envelope)
// bytes and must not overlap `envelope`. On any error the contents of `out` are not to be trusted;
// when decryption ran but the tag did not verify, `out` is zeroed.
// `progress`, when set, is called with the plaintext bytes decrypted so far after every
// kProgressPieceBytes (they are not authenticated until the call returns OK): a caller opening a
// large mapped envelope can drop the pages it has passed.
using DecryptProgress = std::function<void(size_t decrypted)>;
inline constexpr size_t kProgressPieceBytes = size_t{8} << 20;
absl::Status OpenUpdateInto(std::string_view server_private_key,
                            std::string_view ephemeral_public_key, std::string_view aad,
                            std::string_view envelope, char* out, size_t out_size,
                            const DecryptProgress& progress = nullptr);

}  // namespace fedlora::crypto
