#include "server/audit_trail.h"

#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/status.h"
#include "crypto/x25519_pem.h"

namespace fedlora {
namespace {

absl::StatusOr<std::string> LoadKey(const std::string& path, bool is_private) {
  absl::StatusOr<std::string> pem = ReadFileToString(path);
  if (!pem.ok()) {
    return Annotate(pem.status(), absl::StrCat("reading the audit ",
                                               is_private ? "private" : "public", " key ", path));
  }
  absl::StatusOr<std::string> raw =
      is_private ? crypto::X25519PrivateKeyFromPem(*pem) : crypto::X25519PublicKeyFromPem(*pem);
  if (!raw.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("audit key file ", path, " does not hold a PEM X25519 ",
                     is_private ? "private" : "public", " key: ", raw.status().message()));
  }
  return raw;
}

}  // namespace

absl::StatusOr<std::string> LoadAuditPublicKey(const std::string& path) {
  return LoadKey(path, false);
}
absl::StatusOr<std::string> LoadAuditPrivateKey(const std::string& path) {
  return LoadKey(path, true);
}

absl::Status CheckAuditSettings(const ServerOptions& options, const v1::RunConfig& config) {
  if (options.audit_public_key_file.empty()) return absl::OkStatus();
  if (config.privacy().secure_aggregation()) {
    return absl::InvalidArgumentError(
        "server.audit_public_key_file cannot be used with privacy.secure_aggregation: the server "
        "never sees an "
        "individual update there, so it has none to keep");
  }
  return LoadAuditPublicKey(options.audit_public_key_file).status();
}

absl::StatusOr<AuditCopyRecord> SealAuditCopy(std::string_view audit_public_key,
                                              const crypto::UpdatePlace& place,
                                              std::string_view plaintext, BlobStore& blobs) {
  FEDLORA_ASSIGN_OR_RETURN(crypto::SealedBlob sealed,
                           crypto::SealUpdateBlob(audit_public_key, place, plaintext));
  AuditCopyRecord r;
  FEDLORA_ASSIGN_OR_RETURN(r.blob_hash, blobs.Put(sealed.blob));
  r.upload_id = std::string(place.upload_id);
  r.run_id = std::string(place.run_id);
  r.round = static_cast<int64_t>(place.round);
  r.client_id = std::string(place.client_id);
  r.num_examples = static_cast<int64_t>(place.num_examples);
  return r;
}

absl::StatusOr<std::string> OpenAuditCopy(std::string_view audit_private_key,
                                          const AuditCopyRecord& record, const BlobStore& blobs) {
  FEDLORA_ASSIGN_OR_RETURN(std::string sealed, blobs.Get(record.blob_hash));
  const crypto::UpdatePlace place{record.run_id, static_cast<uint64_t>(record.round),
                                  record.client_id, record.upload_id,
                                  static_cast<uint64_t>(record.num_examples)};
  absl::StatusOr<std::string> opened = crypto::OpenUpdateBlob(audit_private_key, place, sealed);
  if (!opened.ok()) {
    return Annotate(
        opened.status(),
        absl::StrCat("opening the audit copy of upload ", record.upload_id, " (run ", record.run_id,
                     ", round ", record.round, ", client ", record.client_id, ")"));
  }
  return opened;
}

}  // namespace fedlora
