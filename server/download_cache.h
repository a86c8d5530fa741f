// The global adapters being downloaded, each mapped once and indexed by chunk: every client of a
// round downloads the same blob, so its bytes are verified against their name and its chunks hashed
// once, on the first download, and each chunk after that is a copy out of the page cache (no read,
// no hash, at any chunk a resumed download starts from).
//
//   DownloadCache cache(blobs, /*keep=*/3);
//   FEDLORA_ASSIGN_OR_RETURN(std::shared_ptr<const CachedAdapter> a, cache.Get(hash, chunk_bytes));
//   std::string_view chunk = a->Chunk(i);  const std::string& sha = a->chunk_sha256[i];
//
// Errors: BlobStore's (NotFound, ...); DataLoss when the blob's bytes do not hash to its name.
// Thread-safety: Get is thread-safe; concurrent first downloads of one blob wait for one index.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/blob_store.h"

namespace fedlora {

struct CachedAdapter {
  std::string hash;
  int64_t chunk_bytes = 0;
  std::unique_ptr<MappedBlob> blob;
  std::vector<std::string> chunk_sha256;  // lowercase hex, one per chunk

  std::string_view Chunk(size_t index) const {
    return blob->bytes().substr(index * static_cast<size_t>(chunk_bytes),
                                static_cast<size_t>(chunk_bytes));
  }
};

class DownloadCache {
 public:
  // Keeps the `keep` most recently used adapters mapped (>= 1): the current one, and the previous
  // ones for clients still finishing their download.
  DownloadCache(const BlobStore* blobs, int keep) : blobs_(blobs), keep_(keep < 1 ? 1 : keep) {}

  absl::StatusOr<std::shared_ptr<const CachedAdapter>> Get(const std::string& hash,
                                                           int64_t chunk_bytes);

 private:
  const BlobStore* const blobs_;
  const int keep_;
  absl::Mutex mu_;  // held while an adapter is indexed: a second downloader waits, not re-hashes
  std::list<std::shared_ptr<const CachedAdapter>> entries_
      ABSL_GUARDED_BY(mu_);  // most recent first
};

}  // namespace fedlora
