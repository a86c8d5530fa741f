#include "server/aggregation_key.h"

#include <sys/stat.h>

#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/status.h"
#include "crypto/envelope.h"
#include "crypto/sealed_update.h"

namespace fedlora {

absl::StatusOr<AggregationKey> LoadOrCreateAggregationKey(const std::string& store_dir, const std::string& run_id) {
  const std::string dir = store_dir + "/keys";
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoToStatus(errno, "mkdir", dir);
  // Owner only, whoever created the directory (an older server, a restore from backup).
  if (::chmod(dir.c_str(), 0700) != 0) return ErrnoToStatus(errno, "chmod", dir);
  const std::string path = absl::StrCat(dir, "/", run_id, ".x25519");
  AggregationKey key;
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    FEDLORA_ASSIGN_OR_RETURN(key.private_key, ReadFileToString(path));
    if (key.private_key.size() != crypto::kX25519KeyBytes) {
      return absl::DataLossError(absl::StrCat(path, " holds ", key.private_key.size(), " bytes, not a ",
                                              crypto::kX25519KeyBytes, "-byte X25519 key"));
    }
    FEDLORA_ASSIGN_OR_RETURN(key.public_key, crypto::X25519PublicKey(key.private_key));
  } else {
    FEDLORA_ASSIGN_OR_RETURN(crypto::X25519KeyPair pair, crypto::GenerateX25519KeyPair());
    FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(path, pair.private_key));
    if (::chmod(path.c_str(), 0600) != 0) return ErrnoToStatus(errno, "chmod", path);
    key.private_key = std::move(pair.private_key);
    key.public_key = std::move(pair.public_key);
  }
  key.key_id = crypto::AggregationKeyId(key.public_key);
  return key;
}

}  // namespace fedlora
