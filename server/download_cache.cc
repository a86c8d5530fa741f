#include "server/download_cache.h"

#include "absl/strings/str_cat.h"
#include "core/sha256.h"
#include "core/status.h"

namespace fedlora {

absl::StatusOr<std::shared_ptr<const CachedAdapter>> DownloadCache::Get(const std::string& hash,
                                                                        int64_t chunk_bytes) {
  if (chunk_bytes <= 0)
    return absl::InvalidArgumentError("DownloadCache: chunk size must be positive");
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if ((*it)->hash == hash && (*it)->chunk_bytes == chunk_bytes) {
      entries_.splice(entries_.begin(), entries_, it);
      return entries_.front();
    }
  }
  auto entry = std::make_shared<CachedAdapter>();
  entry->hash = hash;
  entry->chunk_bytes = chunk_bytes;
  FEDLORA_ASSIGN_OR_RETURN(entry->blob, blobs_->MapCommitted(hash));
  const std::string_view bytes = entry->blob->bytes();
  if (Sha256Hex(bytes) != hash) {
    return absl::DataLossError(
        absl::StrCat("blob ", hash, " does not hash to its name; it cannot be served"));
  }
  for (size_t off = 0; off < bytes.size(); off += static_cast<size_t>(chunk_bytes)) {
    entry->chunk_sha256.push_back(Sha256Hex(bytes.substr(off, static_cast<size_t>(chunk_bytes))));
  }
  entries_.push_front(std::move(entry));
  while (static_cast<int>(entries_.size()) > keep_)
    entries_.pop_back();  // still held by its downloads
  return entries_.front();
}

}  // namespace fedlora
