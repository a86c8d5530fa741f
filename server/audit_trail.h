// The audit trail (ServerConfig.audit_public_key_file): for operators who must keep every update
// that counted, although the server deletes sealed updates once their round closes. When the server
// opens an accepted update to aggregate it, it re-seals the plaintext to an offline X25519 audit
// public key (crypto/sealed_update.h's form: a fresh ephemeral key, associated data binding run,
// round, client, upload and num_examples), puts it in the blob store and records it
// (Store::RecordAuditCopies) before the round commits. The audit private key never reaches the
// server: a copy of the store opens none of these copies; `fedlora audit open` with the offline key
// does.
//
//   FEDLORA_ASSIGN_OR_RETURN(std::string pub, LoadAuditPublicKey(options.audit_public_key_file));
//   FEDLORA_ASSIGN_OR_RETURN(AuditCopyRecord rec, SealAuditCopy(pub, place, plaintext, blobs));
//   FEDLORA_RETURN_IF_ERROR(store.RecordAuditCopies({rec}));               // before CommitRound
//   ... offline:
//   FEDLORA_ASSIGN_OR_RETURN(std::string update, OpenAuditCopy(private_key, rec, blobs));
//
// Key files are PEM (crypto/x25519_pem.h): `fedlora certs audit-key` or `openssl genpkey -algorithm
// X25519` makes them. Not with privacy.secure_aggregation: that server never sees one update.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crypto/sealed_update.h"
#include "fedlora/v1/config.pb.h"
#include "server/blob_store.h"
#include "server/options.h"
#include "server/store.h"

namespace fedlora {

// The raw 32-byte public key of a PEM X25519 public key file. InvalidArgument naming the file when
// it does not hold one; the file error (naming it) when it cannot be read.
absl::StatusOr<std::string> LoadAuditPublicKey(const std::string& path);
// The raw private key of a PEM X25519 private key file; errors as LoadAuditPublicKey.
absl::StatusOr<std::string> LoadAuditPrivateKey(const std::string& path);

// OK when the options ask for no audit trail; otherwise InvalidArgument under secure aggregation,
// and LoadAuditPublicKey's errors.
absl::Status CheckAuditSettings(const ServerOptions& options, const v1::RunConfig& config);

// Seals `plaintext` (the client's encoded update) to `audit_public_key` for `place`, puts it in
// `blobs` (durably) and returns the record to store. Nothing is recorded here.
absl::StatusOr<AuditCopyRecord> SealAuditCopy(std::string_view audit_public_key,
                                              const crypto::UpdatePlace& place,
                                              std::string_view plaintext, BlobStore& blobs);

// Reads and opens the copy `record` names: the client's encoded update bytes. PermissionDenied when
// it does not open under `audit_private_key` for the record's place (wrong key, tampered blob, or
// a row that names another place); the blob store's errors when it cannot be read.
absl::StatusOr<std::string> OpenAuditCopy(std::string_view audit_private_key,
                                          const AuditCopyRecord& record, const BlobStore& blobs);

}  // namespace fedlora
