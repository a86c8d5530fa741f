#include "crypto/sealed_update.h"

#include "absl/strings/str_cat.h"
#include "core/sha256.h"
#include "core/status.h"
#include "crypto/envelope.h"

namespace fedlora::crypto {
namespace {

std::string PlaceData(const UpdatePlace& p) {
  return UpdateAssociatedData(p.run_id, p.round, p.client_id, p.upload_id, p.num_examples);
}

}  // namespace

size_t SealedBlobOverheadBytes() { return kX25519KeyBytes + kEnvelopeOverheadBytes; }

absl::StatusOr<SealedBlob> SealUpdateBlob(std::string_view server_public_key,
                                          const UpdatePlace& place, std::string_view plaintext) {
  FEDLORA_ASSIGN_OR_RETURN(SealedUpdate sealed,
                           SealUpdate(server_public_key, PlaceData(place), plaintext));
  SealedBlob out;
  out.blob.reserve(sealed.ephemeral_public_key.size() + sealed.envelope.size());
  out.blob += sealed.ephemeral_public_key;
  out.blob += sealed.envelope;
  out.ephemeral_public_key = std::move(sealed.ephemeral_public_key);
  return out;
}

absl::StatusOr<std::string_view> SealedBlobEphemeralKey(std::string_view blob) {
  if (blob.size() < SealedBlobOverheadBytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sealed update of ", blob.size(), " bytes is shorter than the ",
                     SealedBlobOverheadBytes(), " bytes of key, header and tag"));
  }
  return blob.substr(0, kX25519KeyBytes);
}

absl::StatusOr<size_t> SealedBlobPlaintextSize(std::string_view blob) {
  FEDLORA_RETURN_IF_ERROR(SealedBlobEphemeralKey(blob).status());
  return EnvelopePlaintextSize(blob.substr(kX25519KeyBytes));
}

absl::Status OpenUpdateBlobInto(std::string_view server_private_key, const UpdatePlace& place,
                                std::string_view blob, char* out, size_t out_size,
                                const std::function<void(size_t)>& progress) {
  FEDLORA_ASSIGN_OR_RETURN(std::string_view ephemeral, SealedBlobEphemeralKey(blob));
  return OpenUpdateInto(server_private_key, ephemeral, PlaceData(place),
                        blob.substr(kX25519KeyBytes), out, out_size, progress);
}

absl::StatusOr<std::string> OpenUpdateBlob(std::string_view server_private_key,
                                           const UpdatePlace& place, std::string_view blob) {
  FEDLORA_ASSIGN_OR_RETURN(size_t size, SealedBlobPlaintextSize(blob));
  std::string out(size, '\0');
  FEDLORA_RETURN_IF_ERROR(
      OpenUpdateBlobInto(server_private_key, place, blob, out.data(), out.size()));
  return out;
}

std::string AggregationKeyId(std::string_view public_key) {
  return absl::StrCat("x25519-", Sha256Hex(public_key).substr(0, 16));
}

}  // namespace fedlora::crypto
