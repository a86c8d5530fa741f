// The sealed form of an update on the wire and in the server's blob store: the client's fresh
// X25519 public key (32 bytes), then the envelope of crypto/envelope.h (AES-256-GCM under a key
// from X25519 with the round's aggregation key and HKDF-SHA256), whose associated data binds the
// update to its run, round, client, upload and weight. Only the aggregation server opens it, and only at
// the place it was sealed for: a replayed, moved or tampered blob does not authenticate.
//
//   FEDLORA_ASSIGN_OR_RETURN(SealedBlob sealed, SealUpdateBlob(server_public_key, place, encoded));
//   ... upload sealed.blob with EncryptionSpec{X25519_HKDF_AES256GCM, sealed.ephemeral_public_key} ...
//   FEDLORA_RETURN_IF_ERROR(OpenUpdateBlobInto(server_private_key, place, blob, out, size));
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fedlora::crypto {

// Where an update belongs and the FedAvg weight its client claims (UploadHeader.num_examples);
// sealed into its associated data, so that no one on the way can change either.
struct UpdatePlace {
  std::string_view run_id;
  uint64_t round = 0;
  std::string_view client_id;
  std::string_view upload_id;
  uint64_t num_examples = 0;
};

struct SealedBlob {
  std::string ephemeral_public_key;  // 32 bytes, also the blob's first 32 bytes
  std::string blob;                  // ephemeral key, then the envelope
};

// Bytes a sealed blob adds to its plaintext.
size_t SealedBlobOverheadBytes();

absl::StatusOr<SealedBlob> SealUpdateBlob(std::string_view server_public_key,
                                          const UpdatePlace& place, std::string_view plaintext);

// The ephemeral public key a blob starts with (InvalidArgument when it is too short to be one).
absl::StatusOr<std::string_view> SealedBlobEphemeralKey(std::string_view blob);
// The plaintext size, from the envelope header; InvalidArgument for a malformed blob.
absl::StatusOr<size_t> SealedBlobPlaintextSize(std::string_view blob);

// Opens `blob` into `out` (exactly SealedBlobPlaintextSize bytes). PermissionDenied when it does not
// authenticate for `place` under this server key; InvalidArgument when malformed.
// `progress` as for OpenUpdateInto (crypto/envelope.h): plaintext bytes decrypted so far.
absl::Status OpenUpdateBlobInto(std::string_view server_private_key, const UpdatePlace& place,
                                std::string_view blob, char* out, size_t out_size,
                                const std::function<void(size_t)>& progress = nullptr);
absl::StatusOr<std::string> OpenUpdateBlob(std::string_view server_private_key,
                                           const UpdatePlace& place, std::string_view blob);

// The id that names an aggregation public key (TrainTask.aggregation_key.key_id): "x25519-"
// and the first 16 hex digits of its SHA-256.
std::string AggregationKeyId(std::string_view public_key);

}  // namespace fedlora::crypto
